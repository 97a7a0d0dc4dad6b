"""A channels-last conv's output written over its residual (ConvNhwcKernel.overwritable_input,
compiler/memory/lifetimes.py): where the residual is an intermediate that dies at the conv, the
output takes its memory, and the results still match onnxruntime, bit-identical at 1 and 2 threads,
for every CPU level this host runs (text-free: the plan's buffers say whether the alias was made).

The model is a bottleneck block as exporters write it (Conv, Relu, Conv, Add of a projection
branch, Relu), at shapes the zoo does not have: 40 output channels (two full panels and a partial
one of 8), batch 2, 13 x 11 pixels (tiles of balanced odd sizes).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler import compile_model
from runtime import Session
from tests.cpu_targets import host_runs
from tests.cpu_targets import level_params

N, C, H, W, M = 2, 24, 13, 11, 40
Expected = tuple[np.ndarray, np.ndarray]  # the input and onnxruntime's output


def _block() -> onnx.ModelProto:
    rng = np.random.default_rng(31)

    def weight(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
        fan_in = int(np.prod(shape[1:]))
        values = rng.standard_normal(shape) / np.sqrt(fan_in)
        return numpy_helper.from_array(values.astype(np.float32), name)

    inits = [weight("w1", (M, C, 3, 3)), weight("w2", (M, M, 1, 1)), weight("wp", (M, C, 1, 1)),
             numpy_helper.from_array(rng.standard_normal(M).astype(np.float32), "b2")]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["t1"], name="conv1", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["t1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["x", "wp"], ["proj"], name="proj", kernel_shape=[1, 1]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["t2"], name="conv2", kernel_shape=[1, 1]),
        helper.make_node("Add", ["t2", "proj"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["y"], name="relu2"),
    ]
    graph = helper.make_graph(nodes, "residual_block",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [N, C, H, W])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [N, M, H, W])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _aliased_residuals(art: Path) -> list[str]:
    """The ConvNhwc steps whose output shares a buffer with their residual input."""
    plan = json.loads((art / "plan.json").read_text())
    buffer_of = {v: b["id"] for b in plan["buffers"] for v in b["values"]}
    return [s["name"] for s in plan["steps"]
            if s["op_type"] == "ConvNhwc" and len(s["inputs"]) > 3 and s["inputs"][3]
            and buffer_of.get(s["inputs"][3]) is not None
            and buffer_of.get(s["inputs"][3]) == buffer_of.get(s["outputs"][0])]


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return _block()


@pytest.fixture(scope="module")
def expected(model: onnx.ModelProto) -> Expected:
    ort = pytest.importorskip("onnxruntime")
    x = np.random.default_rng(5).standard_normal((N, C, H, W)).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return x, session.run(None, {"x": x})[0]


@pytest.mark.parametrize("level", level_params())
def test_output_over_the_residual_matches_onnxruntime(model: onnx.ModelProto, expected: Expected,
                                                     tmp_path: Path, level: str) -> None:
    art = compile_model(model, tmp_path / "art", cpu=level, golden_cases=0)
    plan = json.loads((art / "plan.json").read_text())
    assert [s["provider"] for s in plan["steps"]] == ["c"] * len(plan["steps"])
    assert len(_aliased_residuals(art)) == 1  # the fused conv2 + add + relu2 over proj's output
    if not host_runs(level):
        pytest.skip(f"this host does not run {level} code")
    x, want = expected
    got = {t: Session(art, threads=t).run(None, {"x": x})[0] for t in (1, 2)}
    np.testing.assert_array_equal(got[1], got[2])
    np.testing.assert_allclose(got[2], want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def test_no_alias_where_the_residual_lives_on(tmp_path: Path, expected: Expected) -> None:
    # proj read again after the fused conv (y = relu2 + proj): its memory must survive the conv
    model = _block()
    model.graph.output[0].name = "y0"
    model.graph.node.append(helper.make_node("Add", ["y0", "proj"], ["y"], name="again"))
    model.graph.node[-2].output[0] = "y0"
    model.graph.output[0].name = "y"
    art = compile_model(model, tmp_path / "art", cpu="x86-64-v3", golden_cases=0)
    assert _aliased_residuals(art) == []
    if host_runs("x86-64-v3"):
        x, _ = expected
        ort = pytest.importorskip("onnxruntime")
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        want = session.run(None, {"x": x})[0]
        got = Session(art, threads=2).run(None, {"x": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
