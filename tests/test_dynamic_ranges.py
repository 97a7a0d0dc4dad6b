"""Dynamic-range compiles of every model we have, generated: the class of bug behind issue 29's
NudeNet / flan-t5 ConstantOfShape failures and PP-OCR cls's -Werror build, not only the instances.

Each of the fuzzer's seed models (``scripts.fuzz_models.seed_models``: static, their dims opened)
and each fetched real model (``scripts.fetch_models.MODELS``, whatever the list holds) gets ranges
derived from its static shape (``tests/support/ranges.py``: batch 1..4, spatial dims a range below
the static size, kept where onnxruntime runs the model at both ends and an odd size), is compiled
once with them -- the compile runs the built artifact on its golden cases -- and run at the low
end, the high end and the odd size against onnxruntime (the oracle) on the same seeded feeds, at
the model's own tolerance. A model the compiler cannot take yet is a strict xfail naming today's
failure. Plus the forms behind the instances, built small with onnx.helper: ConstantOfShape of a
shape computed from the input (YOLOv8's anchors, T5's causal mask) feeding Add / Mul, at several
shapes, dynamic and static; a depthwise conv of fewer channels than a vector over a batch range.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler import compile_model
from compiler.passes import FuseElementwise
from runtime import Session
from scripts.fetch_models import INT8_TOLERANCE
from scripts.fetch_models import MODELS
from scripts.fetch_models import RealModel
from scripts.fuzz_models import seed_models
from tests.support.fetched import fetched_model
from tests.support.graphs import Builder
from tests.support.graphs import check
from tests.support.graphs import kinds
from tests.support.ranges import RangePlan
from tests.support.ranges import compare_at
from tests.support.ranges import open_dims
from tests.support.ranges import ort_session
from tests.support.ranges import plan_ranges

SEED_TOLERANCE = (1e-3, 1e-4)

# each model whose ranged compile does not work yet: (the exception type it raises, the cause)
XFAIL: dict[str, tuple[type[Exception], str]] = {}


def _param(name: str, value: Any) -> Any:
    if name not in XFAIL:
        return pytest.param(value, id=name)
    raises, reason = XFAIL[name]
    return pytest.param(value, id=name, marks=pytest.mark.xfail(strict=True, raises=raises, reason=reason))


def _check_ranges(
    model: onnx.ModelProto,
    source: Any,
    shapes: dict[str, tuple[int, ...]],
    binds: dict[str, np.ndarray],
    tolerance: tuple[float, float],
    out: Path,
) -> RangePlan:
    plan = plan_ranges(model, shapes, binds)
    if not plan.ranged:
        pytest.skip(f"onnxruntime runs no dim of it over a range (tried {', '.join(plan.refused) or 'none'})")
    artifact = compile_model(
        source, out, shapes=plan.shapes(), binds={k: v.tolist() for k, v in binds.items()}
    )
    ours, ort = Session(artifact), ort_session(model)
    spread_of = Path(source) if tolerance == INT8_TOLERANCE else None  # dynamically quantized
    bad = []
    for which in ("low", "high", "odd"):
        bad += compare_at(ours, ort, plan, which, binds, tolerance, spread_of).mismatches
    assert not bad, "; ".join(bad[:4])
    return plan


@pytest.mark.parametrize("seed", [_param(m.graph.name, m) for m in seed_models()])
def test_fuzz_seed_model_over_ranges_matches_onnxruntime(seed: onnx.ModelProto, tmp_path: Path) -> None:
    opened = open_dims(seed)
    static = {v.name: tuple(d.dim_value for d in v.type.tensor_type.shape.dim) for v in seed.graph.input}
    _check_ranges(opened, opened, static, {}, SEED_TOLERANCE, tmp_path / "a")


def _bind_arrays(model: onnx.ModelProto, binds: dict[str, int]) -> dict[str, np.ndarray]:
    types = {v.name: v.type.tensor_type.elem_type for v in model.graph.input}
    return {k: np.array(v, helper.tensor_dtype_to_np_dtype(types[k])) for k, v in binds.items()}


@pytest.mark.parametrize("real", [_param(m.name, m) for m in MODELS])
def test_real_model_over_ranges_matches_onnxruntime(real: RealModel, tmp_path: Path) -> None:
    path = fetched_model(real.name)
    model = onnx.load(str(path))
    _check_ranges(
        model,
        path,
        real.shape_options,
        _bind_arrays(model, real.bind_options),
        real.tolerance,
        tmp_path / "a",
    )


# -- the forms behind the instances ------------------------------------------------------------
def _i64(name: str, values: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def anchors_model() -> onnx.ModelProto:
    """YOLOv8's head in small: the strides tensor ConstantOfShape([H*W, 1]) of the feature map's
    size, added to and multiplied with values of that shape, both feeding outputs; and T5's causal
    mask, ConstantOfShape([S, S]) of the sequence length, through Mul and Add."""
    mk = helper.make_node
    nodes = [
        mk("Conv", ["x", "w"], ["f"], strides=[2, 2], name="conv"),  # the feature map: N x 4 x H/2 x W/2
        mk("Shape", ["f"], ["fs"], name="shape"),
        mk("Gather", ["fs", "two"], ["h"], axis=0, name="gather_h"),
        mk("Gather", ["fs", "three"], ["w_"], axis=0, name="gather_w"),
        mk("Mul", ["h", "w_"], ["hw"], name="mul_hw"),
        mk("Unsqueeze", ["hw", "zero"], ["hw1"], name="unsq"),
        mk("Concat", ["hw1", "one"], ["cshape"], axis=0, name="concat"),
        mk(
            "ConstantOfShape",
            ["cshape"],
            ["strides"],
            value=numpy_helper.from_array(np.array([8.0], np.float32)),
            name="/model.22/ConstantOfShape",
        ),
        mk("ReduceMean", ["f"], ["m"], axes=[1], keepdims=0, name="mean_c"),  # N x H x W
        mk("Reshape", ["m", "flat"], ["mf"], name="flatten"),  # N x HW
        mk("Transpose", ["mf"], ["mt"], perm=[1, 0], name="transpose"),  # HW x N
        mk("Add", ["strides", "mt"], ["anchors"], name="/model.22/Add_2"),
        mk("Mul", ["anchors", "strides"], ["boxes"], name="mul_strides"),
        mk("Shape", ["x"], ["xs"], name="shape_x"),
        mk("Gather", ["xs", "three"], ["s"], axis=0, name="gather_s"),
        mk("Unsqueeze", ["s", "zero"], ["s1"], name="unsq_s"),
        mk("Concat", ["s1", "s1"], ["mshape"], axis=0, name="concat_s"),
        mk(
            "ConstantOfShape",
            ["mshape"],
            ["ones"],
            value=numpy_helper.from_array(np.array([1.0], np.float32)),
            name="ConstantOfShape_1",
        ),
        mk("Mul", ["ones", "minus"], ["neg"], name="mask_mul"),
        mk("Add", ["neg", "row"], ["mask"], name="mask_add"),
    ]
    inits = [
        numpy_helper.from_array(
            np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w"
        ),
        numpy_helper.from_array(np.array(2, np.int64), "two"),
        numpy_helper.from_array(np.array(3, np.int64), "three"),
        _i64("zero", [0]),
        _i64("one", [1]),
        _i64("flat", [0, -1]),
        numpy_helper.from_array(np.array(-2.5, np.float32), "minus"),
        numpy_helper.from_array(np.float32(0.5) * np.ones(1, np.float32), "row"),
    ]
    graph = helper.make_graph(
        nodes,
        "anchors",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [
            helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [None, None]),
            helper.make_tensor_value_info("mask", TensorProto.FLOAT, [None, None]),
        ],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _matches_onnxruntime(model: onnx.ModelProto, artifact: Path, shapes: list[tuple[int, ...]]) -> None:
    ours, ort = Session(artifact), ort_session(model)
    rng = np.random.default_rng(3)
    for shape in shapes:
        x = rng.uniform(-1, 1, shape).astype(np.float32)
        want = ort.run(None, {"x": x})
        got = ours.run(None, {"x": x})
        for name, g, w in zip(("boxes", "mask"), got, want, strict=True):
            assert g.shape == w.shape, (shape, name)
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"{name} at {shape}")


def test_constant_of_shape_from_run_time_shape_compiles_over_ranges_and_matches(tmp_path: Path) -> None:
    model = anchors_model()
    artifact = compile_model(model, tmp_path / "a", shapes={"x": ((1, 3), 3, (8, 40), (8, 40))})
    steps = Session(artifact).plan.steps
    constants = [
        s
        for s in steps
        if "ConstantOfShape" in s.op_type or any("ConstantOfShape" in n for n in s.onnx_nodes)
    ]
    assert constants and all(s.op_type == "ConstantOfShape" for s in constants)  # not inside a fused program
    assert {s.provider for s in constants} == {"c"}
    _matches_onnxruntime(model, artifact, [(1, 3, 8, 8), (3, 3, 40, 40), (2, 3, 17, 29), (1, 3, 40, 9)])


def test_elementwise_fusion_leaves_an_op_of_no_inputs_alone() -> None:
    """Before: ConstantOfShape (no inputs once its shape is an attribute) passed as an op of arity 0
    and went into the fused program, which cannot run it; after: only the Add / Mul chain fuses."""
    b = Builder()
    x = b.input("x", (6, 1))
    ones = b.op(
        "ConstantOfShape",
        out_shape=(6, 1),
        out_dtype=np.float32,
        name="ConstantOfShape_1",
        shape=[6, 1],
        value=1.0,
        dtype="float32",
    )
    y = b.op("Mul", b.op("Add", ones, x, name="add"), x, name="mul")
    graph = b.output(y)
    assert check(graph, FuseElementwise()).modified
    assert kinds(graph) == ["ConstantOfShape", "onnx_aot.FusedElementwise"]
    assert [i["op"] for i in graph.nodes[1].attrs["program"]] == ["Add", "Mul"]


def test_depthwise_conv_of_fewer_channels_than_a_vector_builds_over_a_batch_range(tmp_path: Path) -> None:
    """PP-OCR mobile v2 cls at x=1..16: a depthwise NHWC conv whose channels (4) are fewer than an
    AVX2 vector (8) left its inside-column bounds unused, an error under -Werror."""
    mk = helper.make_node
    rng = np.random.default_rng(1)
    graph = helper.make_graph(
        [
            mk("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1], name="pointwise_in"),
            mk("Conv", ["a", "dw"], ["b"], pads=[1, 1, 1, 1], group=4, name="depthwise"),
            mk("Relu", ["b"], ["y"], name="relu"),
        ],
        "dw",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 12, 20])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4, 12, 20])],
        [
            numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w1"),
            numpy_helper.from_array(rng.standard_normal((4, 1, 3, 3)).astype(np.float32), "dw"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    artifact = compile_model(model, tmp_path / "a", shapes={"x": ((1, 16), 3, 12, 20)}, cpu="x86-64-v3")
    ours, ort = Session(artifact), ort_session(model)
    for n in (1, 7, 16):
        x = rng.uniform(-1, 1, (n, 3, 12, 20)).astype(np.float32)
        np.testing.assert_allclose(
            ours.run(None, {"x": x})[0], ort.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5
        )
