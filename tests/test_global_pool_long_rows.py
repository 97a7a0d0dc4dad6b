"""GlobalAveragePool over a long row of pixels keeps its float sum accurate (the C kernel of the
channels-last layout, ``templates/c/channel_nhwc.c.j2``).

PP-OCRv4 rec at 8x3x48x2048 squeezes (its squeeze-excite blocks) maps of 6 x 512 pixels: a float
sum of 3072 terms in a row drifted 1.8e-4 from the float64 mean, onnxruntime 1.4e-5, and the
network carried that to one softmax value 3.4e-4 off onnxruntime's (issue 29). The kernel now adds
blocks of ``SUM_BLOCK`` pixels, then the blocks' sums. The model here is that block's form as
Paddle2ONNX writes it (1x1 Conv, HardSwish, GlobalAveragePool), compiled at -O3 (the layout pass
runs the pool channels-last) statically and over a run-time width, on pixel counts the rec model
does not have (7 x 1001, 5 x 1000, 3 x 2900) and channels past the 256-channel accumulator chunk;
the pooled means are compared with onnxruntime and with the float64 means of the activations.
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

from compiler.driver import compile_model
from compiler.providers.c.pool_nhwc import SUM_BLOCK
from runtime.session import Session
from tests.support.models import ort_run

CIN = 8


def _model(path: Path, cout: int) -> onnx.ModelProto:
    """x -> 1x1 Conv (weights giving activations of mean ~3, as after a BatchNorm) -> HardSwish ->
    GlobalAveragePool -> pooled; the HardSwish activations are a second output."""
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((cout, CIN, 1, 1)) * 0.5).astype(np.float32)
    b = (rng.uniform(1.0, 6.0, cout)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["conv"], kernel_shape=[1, 1]),
        helper.make_node("HardSwish", ["conv"], ["act"]),
        helper.make_node("GlobalAveragePool", ["act"], ["pooled"]),
    ]
    dims = ["n", CIN, "h", "w"]
    graph = helper.make_graph(
        nodes, "squeeze", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["n", cout, 1, 1]),
         helper.make_tensor_value_info("act", TensorProto.FLOAT, ["n", cout, "h", "w"])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)
    return model


def _check(artifact: Path, model: onnx.ModelProto, shape: tuple[int, int, int, int]) -> None:
    plan = json.loads((artifact / "plan.json").read_text())
    pools = [s for s in plan["steps"] if s["op_type"] == "GlobalAveragePoolNhwc"]
    assert [s["provider"] for s in pools] == ["c"], "the pool must run channels-last, in C"
    x = np.random.default_rng(shape[3]).uniform(-1.0, 1.0, shape).astype(np.float32)
    got, act = Session(artifact).run(None, {"x": x})
    want, want_act = ort_run(model, {"x": x})
    np.testing.assert_allclose(act, want_act, rtol=1e-5, atol=1e-5)
    exact = act.astype(np.float64).mean(axis=(2, 3), keepdims=True)  # of the activations it pooled
    scale = np.abs(exact).max()
    ours = np.abs(got - exact).max() / scale
    theirs = np.abs(want - want_act.astype(np.float64).mean(axis=(2, 3), keepdims=True)).max() / scale
    # one running float sum drifted 2.1e-6 .. 2.9e-6 of the largest mean here, blocks 2.8e-7 .. 4e-7,
    # onnxruntime 3.9e-7 .. 1e-6
    assert ours <= 8e-7, f"mean drifts {ours:.2g} of the largest from float64 (onnxruntime {theirs:.2g})"
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * scale)


@pytest.mark.parametrize(("shape", "cout"), [((2, CIN, 7, 1001), 40), ((1, CIN, 3, 2900), 300)])
def test_static_pool_over_thousands_of_pixels(tmp_path: Path, shape: tuple[int, int, int, int],
                                              cout: int) -> None:
    assert shape[2] * shape[3] > 10 * SUM_BLOCK
    model = _model(tmp_path / "squeeze.onnx", cout)
    artifact = compile_model(tmp_path / "squeeze.onnx", tmp_path / "a", shapes={"x": shape}, opt_level=3)
    _check(artifact, model, shape)


def test_dynamic_pool_over_a_runtime_width(tmp_path: Path) -> None:
    """Over a run-time width the block loop's pixel count is the binding's: its last block partial
    (5 x 1000 pixels), one block (1 x 40) and none filled (1 x 1)."""
    model = _model(tmp_path / "squeeze.onnx", 40)
    ranges = {"x": ((1, 2), CIN, (1, 5), (1, 1024))}
    artifact = compile_model(tmp_path / "squeeze.onnx", tmp_path / "a", shapes=ranges, opt_level=3)
    for shape in ((2, CIN, 5, 1000), (1, CIN, 1, 40), (1, CIN, 1, 1)):
        _check(artifact, model, shape)
