"""Tests of the frontend (compiler/frontend): loading, checking, shape binding, import, canonical forms.

Canonical forms are checked twice: structurally (the IR node and its attributes, docs/ops.md) and
numerically, by running the imported IR graph through the reference kernels with a tiny
interpreter and comparing with onnxruntime on the original ONNX model.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler.frontend.importer import import_model
from compiler.frontend.loader import MAX_OPSET
from compiler.frontend.loader import bind_input_shapes
from compiler.frontend.loader import load_model
from compiler.ir.evaluate import evaluate
from compiler.ir.graph import Graph
from runtime.errors import ModelError
from runtime.errors import OnnxAotError
from runtime.errors import ShapeError
from runtime.errors import UnsupportedOpError
from tests.support.models import ort_run

F32 = np.float32
I64 = np.int64
RNG_SEED = 0


# -- building and running models --------------------------------------------------------------
def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[tuple[str, Any, Sequence[Any] | None]],
    outputs: Sequence[str | tuple[str, Any] | tuple[str, Any, Sequence[Any]]],
    inits: dict[str, np.ndarray] | None = None,
    opset: int = 17,
    *,
    ir_version: int = 8,
    domains: Sequence[str] = (),
) -> onnx.ModelProto:
    """A model from nodes; inputs are (name, numpy dtype, shape); outputs are a name, (name, dtype) or
    (name, dtype, shape), and those without a shape get the one onnx's shape inference finds."""
    ins = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.dtype(d)), s)
        for n, d, s in inputs
    ]
    outs = []
    for out in outputs:
        name, dtype, shape = (out, F32, None) if isinstance(out, str) else (tuple(out) + (None,))[:3]
        outs.append(
            helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape)
        )
    initializer = [numpy_helper.from_array(np.asarray(a), n) for n, a in (inits or {}).items()]
    graph = helper.make_graph(list(nodes), "test", ins, outs, initializer=initializer)
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = ir_version
    try:  # the checker wants output shapes: fill them in the way an exporter would
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
        for out, new in zip(model.graph.output, inferred.graph.output, strict=True):
            if new.type.tensor_type.HasField("shape"):
                out.CopyFrom(new)
    except Exception:
        pass
    return model


def one_node(
    op: str,
    inputs: Sequence[tuple[str, Any, Sequence[Any]]],
    inits: dict[str, np.ndarray] | None,
    opset: int,
    n_out: int = 1,
    out_dtype: Any = F32,
    input_names: Sequence[str] | None = None,
    out_shape: Sequence[Any] | None = None,
    **attrs: Any,
) -> onnx.ModelProto:
    names = list(input_names) if input_names is not None else [n for n, _, _ in inputs] + list(inits or {})
    outs = [f"y{k}" for k in range(n_out)]
    node = helper.make_node(op, names, outs, name="node", **attrs)
    return make_model([node], inputs, [(o, out_dtype, out_shape) for o in outs], inits, opset)


def feeds_for(model: onnx.ModelProto, seed: int = RNG_SEED) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        dtype = helper.tensor_dtype_to_np_dtype(inp.type.tensor_type.elem_type)
        shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
        feeds[inp.name] = rng.uniform(-3, 3, shape).astype(dtype)
    return feeds


def check_numeric(model: onnx.ModelProto, graph: Graph | None = None, rtol: float = 1e-5) -> Graph:
    """Import ``model`` (unless given), run it both ways and compare every output."""
    graph = graph if graph is not None else import_model(model)
    feeds = feeds_for(model)
    want = ort_run(model, feeds)
    got = evaluate(graph, feeds)
    assert graph.output_names == [o.name for o in model.graph.output]
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.shape == w.shape, f"output {k}: shape {g.shape} != onnxruntime's {w.shape}"
        assert g.dtype == w.dtype, f"output {k}: dtype {g.dtype} != onnxruntime's {w.dtype}"
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol, err_msg=f"output {k}")
    return graph


def kinds(graph: Graph) -> list[str]:
    return [node.kind for node in graph.nodes]


def no_chained_traceback(exc: BaseException) -> bool:
    """True when printing ``exc`` shows no other exception (e.g. protobuf's) above it."""
    return exc.__cause__ is None and (exc.__context__ is None or exc.__suppress_context__)


def relu_model(shape: Sequence[Any] = (2, 3), opset: int = 17) -> onnx.ModelProto:
    return make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        [("x", F32, shape)],
        [("y", F32, shape)],
        opset=opset,
    )


# -- loading ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "content",
    [np.random.default_rng(1).bytes(512), b"this is a text file, not an ONNX model\n", b""],
    ids=["random-bytes", "text", "empty"],
)
def test_a_file_that_is_not_onnx_is_a_model_error_naming_it(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.onnx"
    path.write_bytes(content)
    with pytest.raises(ModelError) as info:
        import_model(path)
    assert str(path) in str(info.value)
    assert no_chained_traceback(info.value)
    assert "Traceback" not in str(info.value)


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_a_missing_path_is_a_model_error_naming_it(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "nope.onnx"
    if kind == "directory":
        path.mkdir()
    with pytest.raises(ModelError, match="no such model file") as info:
        import_model(str(path))
    assert str(path) in str(info.value)


def test_a_model_file_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "relu.onnx"
    onnx.save_model(relu_model(), path)
    graph = import_model(path)
    assert kinds(graph) == ["Relu"] and graph.inputs[0].shape == (2, 3)


def test_checker_failure_is_a_model_error(tmp_path: Path) -> None:
    model = relu_model()
    model.graph.node[0].input[0] = "undefined_value"
    with pytest.raises(ModelError, match="checker rejected"):
        import_model(model)
    path = tmp_path / "broken.onnx"
    onnx.save_model(model, path)
    with pytest.raises(ModelError, match="checker rejected") as info:
        import_model(path)
    assert str(path) in str(info.value)


def test_an_opset_newer_than_supported_is_a_model_error() -> None:
    model = relu_model()
    model.opset_import[0].version = MAX_OPSET + 5
    with pytest.raises(ModelError, match="opset"):
        load_model(model)


@pytest.mark.parametrize("opset", [1, 5, 6])
def test_an_old_opset_converts_or_fails_clearly(opset: int) -> None:
    model = relu_model(opset=opset)
    model.ir_version = 3
    try:
        graph = import_model(model)
    except ModelError as exc:
        assert f"opset {opset}" in str(exc)
        return
    assert kinds(graph) == ["Relu"] and graph.opset >= 7
    x = np.linspace(-1, 1, 6, dtype=F32).reshape(2, 3)  # (onnxruntime has no Relu-1 to compare with)
    np.testing.assert_array_equal(evaluate(graph, {"x": x})[0], np.maximum(x, 0))


def test_an_opset_6_model_converts_with_its_semantics() -> None:
    # Softmax-1 (flattening at axis 1), Add-6 (broadcast attribute), Pad-2 (attributes), IR 3 inputs
    nodes = [
        helper.make_node("Softmax", ["x"], ["s"], axis=1),
        helper.make_node("Add", ["s", "b"], ["t"], broadcast=1),
        helper.make_node("Pad", ["t"], ["y"], pads=[0, 1, 0, 0, 0, 2], value=-1.0),
    ]
    b = np.linspace(0, 1, 4, dtype=F32)
    model = make_model(
        nodes,
        [("x", F32, (2, 3, 4)), ("b", F32, (4,))],
        [("y", F32, (2, 4, 6))],
        {"b": b},
        opset=6,
        ir_version=3,
    )
    graph = import_model(model)
    assert graph.opset == 7 and [v.name for v in graph.inputs] == ["x"]
    assert kinds(graph) == ["Reshape", "Softmax", "Reshape", "Add", "Pad"]
    x = np.random.default_rng(2).standard_normal((2, 3, 4)).astype(F32)
    e = np.exp(x.reshape(2, 12) - x.max())
    want = np.pad(
        (e / e.sum(1, keepdims=True)).reshape(2, 3, 4) + b, [(0, 0), (1, 0), (0, 2)], constant_values=-1.0
    )
    np.testing.assert_allclose(evaluate(graph, {"x": x})[0], want, rtol=1e-5, atol=1e-6)


def _external_model() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    rng = np.random.default_rng(3)
    weights = {"w": rng.standard_normal((3, 4)).astype(F32), "b": rng.standard_normal(4).astype(F32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Add", ["t", "b"], ["y"])]
    return make_model(nodes, [("x", F32, (2, 3))], ["y"], weights), weights


def test_external_data_loads(tmp_path: Path) -> None:
    model, weights = _external_model()
    path = tmp_path / "m.onnx"
    onnx.save_model(
        model,
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="m.data",
        size_threshold=0,
    )
    assert (tmp_path / "m.data").is_file()
    graph = import_model(path)
    assert set(graph.constants) == set(weights)
    for name, array in weights.items():
        np.testing.assert_array_equal(graph.constants[name].const, array)
    check_numeric(_external_model()[0], graph)


def test_missing_external_data_is_a_model_error_naming_the_file(tmp_path: Path) -> None:
    model, _ = _external_model()
    path = tmp_path / "m.onnx"
    onnx.save_model(
        model,
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.data",
        size_threshold=0,
    )
    os.remove(tmp_path / "weights.data")
    with pytest.raises(ModelError, match="external data") as info:
        import_model(path)
    assert "weights.data" in str(info.value) and str(path) in str(info.value)
    assert no_chained_traceback(info.value)


def test_truncated_external_data_is_a_model_error(tmp_path: Path) -> None:
    model, _ = _external_model()
    path = tmp_path / "m.onnx"
    onnx.save_model(
        model,
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="m.data",
        size_threshold=0,
    )
    data = tmp_path / "m.data"
    data.write_bytes(data.read_bytes()[:10])
    with pytest.raises(ModelError) as info:
        import_model(path)
    assert str(path) in str(info.value) and no_chained_traceback(info.value)


# -- symbolic dims and --shape ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("shape", "dim", "label"), [(("N", 3), 0, "'N'"), ((2, "seq"), 1, "'seq'"), ((2, None), 1, "")]
)
def test_an_unbound_symbolic_dim_is_a_shape_error(shape: tuple[Any, ...], dim: int, label: str) -> None:
    with pytest.raises(ShapeError) as info:
        import_model(relu_model(shape))
    message = str(info.value)
    assert "'x'" in message and f"dim {dim}" in message and label in message and "--shape" in message


def test_a_binding_makes_every_shape_static() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Flatten", ["r"], ["y"], axis=1)]
    model = make_model(nodes, [("x", F32, ("batch", 3, "h"))], ["y"])
    graph = import_model(model, {"x": (2, 3, 4)})
    assert graph.inputs[0].shape == (2, 3, 4)
    assert all(v.shape is not None and v.dtype is not None for v in graph.values())
    assert graph.outputs[0].shape == (2, 12)
    assert graph.nodes[1].attrs == {"shape": [2, 12]}


def test_the_binding_does_not_change_the_callers_model() -> None:
    model = relu_model(("N", 3))
    bind_input_shapes(model, {"x": (5, 3)})
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"


@pytest.mark.parametrize(
    ("shapes", "match"),
    [
        ({"x": (2, 4)}, "dim 1 is fixed at 3"),
        ({"x": (2, 3, 1)}, "rank 2"),
        ({"z": (2, 3)}, "'?z'?"),
        ({"x": (2, 3), "w": (3,)}, "w"),
        ({"x": (-1, 3)}, "negative"),
    ],
)
def test_a_bad_binding_is_a_shape_error(shapes: dict[str, tuple[int, ...]], match: str) -> None:
    model = make_model(
        [helper.make_node("Add", ["x", "w"], ["y"])], [("x", F32, ("N", 3))], ["y"], {"w": np.ones(3, F32)}
    )
    with pytest.raises(ShapeError, match=match):
        import_model(model, shapes)


# -- initializers, constants and import-time folding -------------------------------------------
def test_an_initializer_listed_as_input_is_a_constant() -> None:
    w = np.arange(6, dtype=F32).reshape(2, 3)
    model = make_model(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        [("x", F32, (2, 3)), ("w", F32, (2, 3))],
        ["y"],
        {"w": w},
        opset=8,
        ir_version=3,
    )
    graph = check_numeric(model)
    assert [v.name for v in graph.inputs] == ["x"]
    assert list(graph.constants) == ["w"] and graph.nodes[0].inputs[1] is graph.constants["w"]
    np.testing.assert_array_equal(graph.constants["w"].const, w)


def test_constant_nodes_become_constants() -> None:
    nodes = [
        helper.make_node(
            "Constant", [], ["c"], name="const", value=numpy_helper.from_array(np.full((2, 3), 2.0, F32))
        ),
        helper.make_node("Constant", [], ["s"], value_float=0.5),
        helper.make_node("Mul", ["x", "c"], ["t"]),
        helper.make_node("Mul", ["t", "s"], ["y"]),
    ]
    graph = check_numeric(make_model(nodes, [("x", F32, (2, 3))], ["y"]))
    assert kinds(graph) == ["Mul", "Mul"] and set(graph.constants) == {"c", "s"}
    assert graph.eliminated["const"] == "constant"


@pytest.mark.parametrize("batch", [2, "N"])
def test_shape_gather_unsqueeze_concat_reshape_folds_at_import(batch: int | str) -> None:
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "zero"], ["n"], name="gather", axis=0),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"], name="unsqueeze"),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], name="concat", axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape"),
    ]
    inits = {"zero": np.array(0, I64), "axes0": np.array([0], I64), "minus1": np.array([-1], I64)}
    # onnx's own shape inference cannot see through this chain: the output is declared symbolic
    model = make_model(nodes, [("x", F32, (batch, 3, 4))], [("y", F32, ("a", "b"))], inits, opset=13)
    graph = import_model(model, {"x": (2, 3, 4)} if batch == "N" else None)
    check_numeric(bind_input_shapes(model, {"x": (2, 3, 4)}), graph)
    assert kinds(graph) == ["Reshape"] and graph.outputs[0].shape == (2, 12)
    assert graph.nodes[0].attrs == {"shape": [2, 12]} and graph.nodes[0].inputs == (graph.inputs[0],)
    assert {k: graph.eliminated[k] for k in ("shape", "gather", "unsqueeze", "concat")} == dict.fromkeys(
        ("shape", "gather", "unsqueeze", "concat"), "folded at import"
    )
    assert not graph.constants  # the folded shape values were pruned


@pytest.mark.parametrize("opset", [11, 13])
def test_shapes_found_only_after_folding_follow_the_models_opset(opset: int) -> None:
    # onnx's inference loses the shape at the Reshape; the importer infers the rest node by node,
    # and must read Squeeze / Unsqueeze / ReduceSum with their attribute (opset 11) or input axes
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Slice", ["shape", "zero", "one"], ["n0"]),
        helper.make_node("Mul", ["n0", "one"], ["n1"]),
        helper.make_node("Concat", ["n1", "tail"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["r"]),
    ]
    if opset < 13:
        nodes += [
            helper.make_node("Squeeze", ["r"], ["s"], axes=[2]),
            helper.make_node("Unsqueeze", ["s"], ["u"], axes=[0]),
            helper.make_node("ReduceSum", ["u"], ["y"], axes=[2], keepdims=0),
        ]
    else:
        nodes += [
            helper.make_node("Squeeze", ["r", "two"], ["s"]),
            helper.make_node("Unsqueeze", ["s", "zero"], ["u"]),
            helper.make_node("ReduceSum", ["u", "two"], ["y"], keepdims=0),
        ]
    inits = {
        "zero": np.array([0], I64),
        "one": np.array([1], I64),
        "two": np.array([2], I64),
        "tail": np.array([-1, 1, 1], I64),
    }
    model = make_model(nodes, [("x", F32, (2, 3, 4))], [("y", F32, ("a", "b", "c"))], inits, opset=opset)
    graph = check_numeric(model)
    assert [v.shape for n in graph.nodes for v in n.outputs] == [
        (2, 12, 1, 1),
        (2, 12, 1),
        (1, 2, 12, 1),
        (1, 2, 1),
    ]


def test_size_folds_at_import() -> None:
    nodes = [
        helper.make_node("Size", ["x"], ["n"], name="size"),
        helper.make_node("Reshape", ["n", "one"], ["n1"]),
        helper.make_node("Cast", ["n1"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["x", "f"], ["y"]),
    ]
    graph = check_numeric(make_model(nodes, [("x", F32, (2, 3))], ["y"], {"one": np.array([1], I64)}))
    # tiny float results fold at import too (canonical forms may need them: a Pad value)
    assert kinds(graph) == ["Mul"] and graph.eliminated["size"] == "folded at import"
    np.testing.assert_array_equal(graph.nodes[0].inputs[1].const, np.array([6], np.float32))


def test_a_folded_scalar_keeps_rank_0() -> None:
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i"], ["n"], axis=0),
        helper.make_node("Cast", ["n"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["f", "c"], ["y"]),
    ]
    model = make_model(
        nodes,
        [("x", F32, (2, 5))],
        [("y", F32), ("n", I64)],
        {"i": np.array(1, I64), "c": np.array(0.5, F32)},
    )
    graph = check_numeric(model)
    assert graph.outputs[1].is_const and graph.outputs[1].shape == () and graph.outputs[0].shape == ()


def test_a_folded_value_that_is_a_graph_output_stays_an_output() -> None:
    model = make_model([helper.make_node("Shape", ["x"], ["y"])], [("x", F32, (2, 5))], [("y", I64)])
    graph = check_numeric(model)
    assert len(graph) == 0 and graph.outputs[0].is_const


def test_onnx_node_names_are_kept() -> None:
    # nodes named like values (here: like the graph input and their own outputs) keep their names;
    # only a second node of the same name is renamed
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="x"),
        helper.make_node("Neg", ["a"], ["b"], name="b"),
        helper.make_node("Abs", ["b"], ["y"], name="b"),
        helper.make_node("Exp", ["y"], ["z"]),
    ]
    graph = import_model(make_model(nodes, [("x", F32, (2, 3))], ["z"]))  # (onnxruntime refuses it)
    names = [n.name for n in graph.nodes]
    assert names[:2] == ["x", "b"] and names[2] not in names[:2] + ["Exp_3"] and names[3] == "Exp_3"
    graph.verify()
    model = make_model(
        [
            helper.make_node("Relu", ["x"], ["y"], name="y"),
            helper.make_node("Reshape", ["y", "s"], ["z"], name="x"),
        ],
        [("x", F32, (2, 3)), ("s", I64, (1,))],
        [("z", F32, ("a",))],
    )
    with pytest.raises(ModelError, match="node 'x' \\(Reshape\\)"):
        import_model(model)


# -- shape-determining inputs that are not constant -------------------------------------------
@pytest.mark.parametrize(
    ("op", "inputs", "inits", "opset", "attrs"),
    [
        ("Reshape", [("x", F32, (2, 6)), ("s", I64, (2,))], {}, 13, {}),
        ("Slice", [("x", F32, (2, 6)), ("st", I64, (1,))], {"en": np.array([4], I64)}, 13, {}),
        ("Pad", [("x", F32, (2, 6)), ("p", I64, (4,))], {}, 13, {}),
        ("Tile", [("x", F32, (2, 6)), ("r", I64, (2,))], {}, 13, {}),
        ("ReduceMean", [("x", F32, (2, 6)), ("axes", I64, (1,))], {}, 18, {}),
    ],
)
def test_a_non_constant_shape_input_is_an_error_naming_the_node(
    op: str,
    inputs: list[tuple[str, Any, tuple[int, ...]]],
    inits: dict[str, np.ndarray],
    opset: int,
    attrs: dict[str, Any],
) -> None:
    model = one_node(op, inputs, inits, opset, out_shape=["d0", "d1"], **attrs)
    with pytest.raises(ModelError) as info:
        import_model(model)
    assert "'node'" in str(info.value) and op in str(info.value)


# -- unsupported ops ----------------------------------------------------------------------------
def test_every_unsupported_node_is_listed_in_one_error() -> None:
    nodes = [
        helper.make_node("Frobnicate", ["x"], ["a"], name="custom", domain="com.example"),
        helper.make_node("Relu", ["a"], ["b"], name="fine"),
        helper.make_node("Blur", ["b"], ["y"], name="hard", domain="com.example"),
    ]
    model = make_model(nodes, [("x", F32, (2, 3))], [("y", F32, (2, 3))], domains=["com.example"])
    with pytest.raises(UnsupportedOpError) as info:
        import_model(model)
    message = str(info.value)
    assert "custom" in message and "com.example.Frobnicate" in message
    assert "hard" in message and "com.example.Blur" in message and "fine" not in message
    assert info.value.nodes == [("custom", "com.example.Frobnicate"), ("hard", "com.example.Blur")]


# -- canonical forms: structure ----------------------------------------------------------------
CONV_W = np.random.default_rng(5).standard_normal((4, 2, 3, 3)).astype(F32)
CONV_B = np.random.default_rng(6).standard_normal(4).astype(F32)


def test_conv_defaults_are_filled_in() -> None:
    model = one_node("Conv", [("x", F32, (1, 2, 6, 5))], {"w": CONV_W, "b": CONV_B}, 11)
    graph = check_numeric(model, rtol=1e-4)
    node = graph.nodes[0]
    assert node.attrs == {
        "kernel_shape": [3, 3],
        "strides": [1, 1],
        "pads": [0, 0, 0, 0],
        "dilations": [1, 1],
        "group": 1,
    }
    assert graph.outputs[0].shape == (1, 4, 4, 3)


# onnxruntime refuses SAME_* with dilations > 1, so dilated cases are VALID only
@pytest.mark.parametrize(
    ("auto_pad", "size", "kernel", "stride", "dilation"),
    [
        (pad, *case)
        for pad in ("SAME_UPPER", "SAME_LOWER", "VALID")
        for case in ((7, 3, 2, 1), (8, 4, 3, 1), (6, 2, 1, 1), (5, 1, 2, 1))
    ]
    + [("VALID", 9, 3, 2, 2), ("VALID", 8, 3, 1, 3)],
)
def test_conv_auto_pad_becomes_explicit_pads(
    auto_pad: str, size: int, kernel: int, stride: int, dilation: int
) -> None:
    w = np.random.default_rng(size).standard_normal((3, 2, kernel, kernel)).astype(F32)
    model = one_node(
        "Conv",
        [("x", F32, (1, 2, size, size + 1))],
        {"w": w},
        11,
        auto_pad=auto_pad,
        strides=[stride, stride],
        dilations=[dilation, dilation],
    )
    graph = check_numeric(model, rtol=1e-4)
    attrs = graph.nodes[0].attrs
    assert "auto_pad" not in attrs and len(attrs["pads"]) == 4
    if auto_pad == "VALID":
        assert attrs["pads"] == [0, 0, 0, 0]
    else:
        begins, ends = attrs["pads"][:2], attrs["pads"][2:]
        bigger = ends if auto_pad == "SAME_UPPER" else begins
        assert all(b - s in (0, 1) for b, s in zip(bigger, begins if bigger is ends else ends, strict=True))
        assert graph.outputs[0].shape[2:] == (-(-size // stride), -(-(size + 1) // stride))


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID", "NOTSET"])
def test_pool_auto_pad_becomes_explicit_pads(op: str, auto_pad: str) -> None:
    model = one_node(
        op, [("x", F32, (1, 2, 7, 6))], None, 11, auto_pad=auto_pad, kernel_shape=[3, 2], strides=[2, 2]
    )
    graph = check_numeric(model)
    attrs = graph.nodes[0].attrs
    assert "auto_pad" not in attrs and len(attrs["pads"]) == 4 and attrs["ceil_mode"] == 0
    assert ("count_include_pad" in attrs) == (op == "AveragePool")


@pytest.mark.parametrize("indices_used", [False, True])
def test_maxpool_keeps_one_output(indices_used: bool) -> None:
    outputs: list[Any] = [("y", F32, (1, 2, 3, 3))] + ([("idx", I64, (1, 2, 3, 3))] if indices_used else [])
    node = helper.make_node("MaxPool", ["x"], ["y", "idx"], name="pool", kernel_shape=[2, 2], strides=[2, 2])
    model = make_model([node], [("x", F32, (1, 2, 6, 6))], outputs, opset=12)
    graph = check_numeric(model)  # the Indices output, when used, is computed and checked too
    assert [len(n.outputs) for n in graph.nodes] == [2 if indices_used else 1]


@pytest.mark.parametrize(
    ("opset", "inits", "attrs", "bounds"),
    [
        (10, {}, {"min": -0.5, "max": 1.5}, (-0.5, 1.5)),
        (7, {}, {"max": 1.0}, (-np.inf, 1.0)),
        (10, {}, {}, (-np.inf, np.inf)),
        (13, {"lo": np.array(-0.5, F32), "hi": np.array(1.5, F32)}, {}, (-0.5, 1.5)),
        (13, {"lo": np.array(0.25, F32)}, {}, (0.25, np.inf)),
        (13, {}, {}, (-np.inf, np.inf)),
    ],
)
def test_clip_bounds_from_attributes_or_inputs(
    opset: int, inits: dict[str, np.ndarray], attrs: dict[str, float], bounds: tuple[float, float]
) -> None:
    model = one_node("Clip", [("x", F32, (3, 4))], inits, opset, **attrs)
    graph = check_numeric(model)
    assert graph.nodes[0].attrs == {"min": bounds[0], "max": bounds[1]}
    assert len(graph.nodes[0].inputs) == 1 and not graph.constants


def test_clip_with_only_a_max_input() -> None:
    model = one_node(
        "Clip", [("x", F32, (3, 4))], {"hi": np.array(0.5, F32)}, 13, input_names=["x", "", "hi"]
    )
    graph = check_numeric(model)
    assert graph.nodes[0].attrs == {"min": -np.inf, "max": 0.5}


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize(
    ("opset", "axis", "expect"),
    [
        (11, 1, ["Reshape", "X", "Reshape"]),
        (11, 0, ["Reshape", "X", "Reshape"]),
        (11, None, None),
        (11, -1, ["X"]),
        (11, 2, ["X"]),
        (13, 1, ["X"]),
        (13, None, ["X"]),
    ],
)
def test_softmax_axis_semantics(op: str, opset: int, axis: int | None, expect: list[str] | None) -> None:
    attrs = {} if axis is None else {"axis": axis}
    model = one_node(op, [("x", F32, (2, 3, 4))], None, opset, **attrs)
    graph = check_numeric(model)
    if expect is None:  # opset 11 default axis is 1: flatten into (2, 12)
        expect = ["Reshape", "X", "Reshape"]
    assert kinds(graph) == [op if k == "X" else k for k in expect]
    soft = next(n for n in graph.nodes if n.op_type == op)
    if len(graph) == 3:
        flat = graph.nodes[0].attrs["shape"]
        assert soft.attrs == {"axis": 1} and len(flat) == 2 and graph.nodes[2].attrs == {"shape": [2, 3, 4]}
        assert flat == ([2, 12] if axis in (1, None) else [1, 24])
        assert soft.name == "node" and all(n.origin == ["node"] for n in graph.nodes)
    else:
        assert soft.attrs == {"axis": 2 if axis in (None, -1, 2) else axis}


@pytest.mark.parametrize(
    ("op", "opset", "shape", "axes", "out"),
    [
        ("Squeeze", 11, (1, 3, 1, 2), [0, -2], (3, 2)),
        ("Squeeze", 13, (1, 3, 1, 2), [0, -2], (3, 2)),
        ("Squeeze", 13, (1, 3, 1, 2), None, (3, 2)),
        ("Unsqueeze", 11, (3, 2), [0, -1], (1, 3, 2, 1)),
        ("Unsqueeze", 13, (3, 2), [0, 3], (1, 3, 2, 1)),
        ("Flatten", 13, (2, 3, 4), None, (2, 12)),
    ],
)
def test_squeeze_unsqueeze_flatten_become_reshape(
    op: str, opset: int, shape: tuple[int, ...], axes: list[int] | None, out: tuple[int, ...]
) -> None:
    inits: dict[str, np.ndarray] = {}
    attrs: dict[str, Any] = {}
    if axes is not None and opset >= 13:
        inits["axes"] = np.array(axes, I64)
    elif axes is not None:
        attrs["axes"] = axes
    graph = check_numeric(one_node(op, [("x", F32, shape)], inits, opset, **attrs))
    assert kinds(graph) == ["Reshape"] and graph.nodes[0].attrs == {"shape": list(out)}
    assert graph.nodes[0].inputs == (graph.inputs[0],) and not graph.constants


@pytest.mark.parametrize(
    ("opset", "inits", "attrs", "n_out", "sizes"),
    [
        (11, {}, {"axis": 1, "split": [1, 4, 2]}, 3, [1, 4, 2]),
        (11, {}, {"axis": -1}, 2, [3, 3]),
        (13, {"split": np.array([2, 5], I64)}, {"axis": 1}, 2, [2, 5]),
        (13, {}, {"axis": 0}, 2, [1, 1]),
        (18, {}, {"axis": 1, "num_outputs": 3}, 3, [3, 3, 1]),
        (18, {"split": np.array([6, 1], I64)}, {"axis": 1}, 2, [6, 1]),
    ],
)
def test_split_sizes_from_attributes_inputs_or_num_outputs(
    opset: int, inits: dict[str, np.ndarray], attrs: dict[str, Any], n_out: int, sizes: list[int]
) -> None:
    width = 6 if attrs.get("axis") == -1 else 7
    model = one_node("Split", [("x", F32, (2, width))], inits, opset, n_out=n_out, **attrs)
    graph = check_numeric(model)
    axis = 1 if attrs["axis"] in (1, -1) else 0
    assert kinds(graph) == ["Split"] and graph.nodes[0].attrs == {"axis": axis, "split": sizes}


@pytest.mark.parametrize(
    ("op", "opset", "axes", "keepdims", "noop", "expect_axes"),
    [
        ("ReduceMean", 13, [1, -1], 1, None, [1, 2]),
        ("ReduceMean", 13, None, 0, None, [0, 1, 2]),
        ("ReduceMean", 18, [-2], 0, None, [1]),
        ("ReduceMean", 18, None, 1, None, [0, 1, 2]),
        ("ReduceMean", 18, None, 1, 1, None),
        ("ReduceSum", 13, [0, 2], 1, None, [0, 2]),
        ("ReduceSum", 11, [0], 0, None, [0]),
        ("ReduceMax", 18, [2], 1, None, [2]),
    ],
)
def test_reduce_axes_from_attributes_or_inputs(
    op: str,
    opset: int,
    axes: list[int] | None,
    keepdims: int,
    noop: int | None,
    expect_axes: list[int] | None,
) -> None:
    axes_as_input = opset >= (13 if op == "ReduceSum" else 18)
    inits = {"axes": np.array(axes, I64)} if axes is not None and axes_as_input else {}
    attrs: dict[str, Any] = {"keepdims": keepdims}
    if axes is not None and not axes_as_input:
        attrs["axes"] = axes
    if noop is not None:
        attrs["noop_with_empty_axes"] = noop
    graph = check_numeric(one_node(op, [("x", F32, (2, 3, 4))], inits, opset, **attrs))
    if expect_axes is None:
        assert kinds(graph) == ["Identity"]
    else:
        assert kinds(graph) == [op]
        assert graph.nodes[0].attrs == {"axes": expect_axes, "keepdims": keepdims}


@pytest.mark.parametrize(
    ("opset", "starts", "ends", "axes", "steps"),
    [
        (9, [1, 0], [3, -1], [0, 1], None),
        (9, [-2], [100], None, None),
        (13, [1, -4], [-1, 1000], [0, 1], None),
        (13, [-1], [-100], [1], [-1]),
        (13, [4, 0], [0, 5], [1, 0], [-2, 2]),
        (13, [-100], [-200], [1], [-1]),
        (13, [100], [-100], [-1], [-3]),
        (13, [-1, 2], [-1000, 0], [-1, -2], [-1, -1]),
    ],
)
def test_slice_from_attributes_or_inputs(
    opset: int, starts: list[int], ends: list[int], axes: list[int] | None, steps: list[int] | None
) -> None:
    if opset < 10:
        attrs: dict[str, Any] = {"starts": starts, "ends": ends}
        if axes is not None:
            attrs["axes"] = axes
        model = one_node("Slice", [("x", F32, (4, 6))], {}, opset, **attrs)
    else:
        inits = {"starts": np.array(starts, I64), "ends": np.array(ends, I64)}
        if axes is not None:
            inits["axes"] = np.array(axes, I64)
        if steps is not None:
            inits["steps"] = np.array(steps, I64)
        model = one_node("Slice", [("x", F32, (4, 6))], inits, opset)
    graph = check_numeric(model)
    node = graph.nodes[0]
    assert kinds(graph) == ["Slice"] and node.inputs == (graph.inputs[0],)
    assert set(node.attrs) == {"starts", "ends", "axes", "steps"}
    assert all(0 <= a < 2 for a in node.attrs["axes"])


@pytest.mark.parametrize(
    ("opset", "pads", "mode", "value", "axes"),
    [
        (7, [1, 0, 2, 3], "constant", 1.5, None),
        (7, [0, 2, 1, 0], "edge", None, None),
        (11, [1, 2, 0, 1], "reflect", None, None),
        (13, [1, 0, 0, 2], "constant", -2.0, None),
        (13, [0, 1, 0, 1], "constant", None, None),
        (18, [1, 2], "constant", 3.0, [-1]),
        (13, [-1, 1, 0, -2], "constant", None, None),
    ],
)
def test_pad_from_attributes_or_inputs(
    opset: int, pads: list[int], mode: str, value: float | None, axes: list[int] | None
) -> None:
    if opset < 11:
        attrs: dict[str, Any] = {"pads": pads, "mode": mode}
        if value is not None:
            attrs["value"] = value
        model = one_node("Pad", [("x", F32, (3, 4))], {}, opset, **attrs)
        full, val = pads, value or 0.0
    else:
        inits = {"pads": np.array(pads, I64)}
        names = ["x", "pads"]
        if value is not None or axes is not None:
            names.append("cv" if value is not None else "")
            if value is not None:
                inits["cv"] = np.array(value, F32)
        if axes is not None:
            inits["axes"] = np.array(axes, I64)
            names.append("axes")
        model = one_node("Pad", [("x", F32, (3, 4))], inits, opset, input_names=names, mode=mode)
        full = [0, pads[0], 0, pads[1]] if axes is not None else pads
        val = value or 0.0
    graph = check_numeric(model)
    assert kinds(graph) == ["Pad"] and graph.nodes[0].attrs == {"pads": full, "mode": mode, "value": val}
    assert graph.nodes[0].inputs == (graph.inputs[0],)


@pytest.mark.parametrize(("opset", "mask_dtype"), [(7, F32), (10, np.bool_), (13, np.bool_)])
@pytest.mark.parametrize("with_mask", [False, True])
def test_dropout_becomes_identity(opset: int, mask_dtype: Any, with_mask: bool) -> None:
    outs = ["y", "mask"] if with_mask else ["y"]
    node = helper.make_node("Dropout", ["x"], outs, name="drop")
    outputs = [("y", F32, (2, 3))] + ([("mask", mask_dtype, (2, 3))] if with_mask else [])
    model = make_model([node], [("x", F32, (2, 3))], outputs, opset=opset)
    graph = import_model(model)
    if with_mask and opset < 12:
        # onnxruntime's Dropout-7/10 returns an all-zero mask in inference; ONNX (and its reference
        # evaluator) say every element is kept, so the mask is all ones / true
        from onnx.reference import ReferenceEvaluator

        x = feeds_for(model)
        for got, want in zip(evaluate(graph, x), ReferenceEvaluator(model).run(None, x), strict=True):
            np.testing.assert_array_equal(got, want.astype(got.dtype))  # (it says bool for Dropout-7)
        assert evaluate(graph, x)[1].all() and evaluate(graph, x)[1].dtype == mask_dtype
    else:
        check_numeric(model, graph)
    assert kinds(graph)[0] == "Identity"
    if with_mask:
        assert kinds(graph) == ["Identity", "ConstantOfShape"]
        mask = graph.nodes[1]
        assert mask.attrs["dtype"] == np.dtype(mask_dtype).name and mask.outputs[0].dtype == mask_dtype
    else:
        assert len(graph) == 1


@pytest.mark.parametrize("opset", [7, 9, 13])
def test_unused_dropout_mask_is_dropped(opset: int) -> None:
    # (onnx infers no shape for the mask of Dropout-7; unused, it needs none)
    nodes = [helper.make_node("Dropout", ["x"], ["t", "mask"]), helper.make_node("Relu", ["t"], ["y"])]
    graph = check_numeric(make_model(nodes, [("x", F32, (2, 3))], ["y"], opset=opset))
    assert kinds(graph) == ["Identity", "Relu"]
    graph.verify()


@pytest.mark.parametrize(
    ("op", "inputs", "inits", "opset", "attrs", "expect"),
    [
        (
            "Gemm",
            [("a", F32, (3, 2))],
            {"b": np.ones((4, 2), F32)},
            13,
            {"transB": 1},
            {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 1},
        ),
        ("Transpose", [("x", F32, (2, 3, 4))], {}, 13, {}, {"perm": [2, 1, 0]}),
        ("Concat", [("a", F32, (2, 3)), ("b", F32, (2, 1))], {}, 13, {"axis": -1}, {"axis": 1}),
        ("Gather", [("x", F32, (3, 4))], {"i": np.array([[0, -1]], I64)}, 13, {"axis": -1}, {"axis": 1}),
        ("LeakyRelu", [("x", F32, (3, 4))], {}, 13, {}, {"alpha": 0.01}),
        ("HardSigmoid", [("x", F32, (3, 4))], {}, 13, {}, {"alpha": 0.2, "beta": 0.5}),
        ("Cast", [("x", F32, (3, 4))], {}, 13, {"to": TensorProto.INT32}, {"to": "int32"}),
        (
            "LayerNormalization",
            [("x", F32, (2, 3, 4))],
            {"s": np.ones(4, F32)},
            17,
            {},
            {"axis": 2, "epsilon": 1e-5},
        ),
        ("Shape", [("x", F32, (2, 3, 4))], {}, 15, {"start": -2}, {"start": 1, "end": 3}),
    ],
)
def test_other_canonical_forms(
    op: str,
    inputs: list[tuple[str, Any, tuple[int, ...]]],
    inits: dict[str, np.ndarray],
    opset: int,
    attrs: dict[str, Any],
    expect: dict[str, Any],
) -> None:
    out_dtype = {"Cast": np.int32, "Shape": I64}.get(op, F32)
    model = one_node(op, inputs, inits, opset, out_dtype=out_dtype, **attrs)
    graph = import_model(model)
    if op == "Shape":  # folds at import
        assert len(graph) == 0
    else:
        assert graph.nodes[0].attrs == expect
    if op != "Cast":  # float -> int rounding of random values is not worth comparing
        check_numeric(model, graph)


def test_imported_graph_verifies_and_errors_are_project_errors() -> None:
    model = relu_model()
    model.graph.node[0].op_type = "Relu"
    graph = import_model(model)
    graph.verify()
    with pytest.raises(OnnxAotError):
        import_model(b"not a model path or proto".decode())  # a path that does not exist


def test_every_canonical_family_module_is_listed() -> None:
    # The registry is filled by importing the families named in FAMILIES (a list, not a scan):
    # a new module left out of it would silently register nothing.
    import compiler.frontend.canonical as canonical
    from compiler.frontend.canonical import registry

    machinery = {"__init__", "context", "registry"}
    modules = {p.stem for p in Path(canonical.__file__).parent.glob("*.py")} - machinery
    assert {m.__name__.rpartition(".")[2] for m in canonical.FAMILIES} == modules
    owners = {fn.__module__ for fn in registry._REGISTRY.values()}
    assert owners == {m.__name__ for m in canonical.FAMILIES}, "a family registers nothing"
