"""Convolutions and pools with run-time dims (issue 17 item 3): in a dynamic artifact, Conv (1x1
direct, packed im2col, grouped, dilated, depthwise with and without a channel multiplier),
MaxPool and AveragePool run on the C kernels with the batch and the spatial sizes read from the
binding; checked against onnxruntime at sizes that hit the last panel's tail, the row-block
tail, one panel and many, borders on both sides and the range ends.
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
from runtime.session import Session
from tests.support.models import ort_run

RTOL, ATOL = 1e-3, 1e-4
SIZES = [(1, 1, 1), (1, 1, 300), (3, 5, 7), (2, 17, 33), (1, 40, 300), (4, 24, 64)]


def _conv(name: str, x: str, y: str, m: int, c: int, k: tuple[int, int], rng: np.random.Generator,
          bias: bool = True, **attrs: object) -> tuple[onnx.NodeProto, list[onnx.TensorProto]]:
    group = int(attrs.get("group", 1))  # type: ignore[call-overload]
    w = (rng.standard_normal((m, c // group, *k)) / np.sqrt(c // group * k[0] * k[1])).astype(np.float32)
    inits = [numpy_helper.from_array(w, f"{name}_w")]
    inputs = [x, f"{name}_w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(m).astype(np.float32) * 0.1, f"{name}_b"))
        inputs.append(f"{name}_b")
    return helper.make_node("Conv", inputs, [y], name=name, kernel_shape=list(k), **attrs), inits


def _conv_model() -> onnx.ModelProto:
    """x [n, 8, h, w]: 1x1 (direct), 3x3 stride 1 (packed, a row-block tail: 12 rows), 3x3
    stride 2, a depthwise 5x5 stride (2, 1), a grouped dilated 3x3, a depthwise 3x3 with a channel
    multiplier of 2 and no bias, a 1-D-like 1x3, a depthwise 3x3 dilated along H, stride 3 along W
    with uneven pads."""
    rng = np.random.default_rng(0)
    layers = [
        _conv("c1", "x", "a", 16, 8, (1, 1), rng),
        _conv("c2", "a", "b", 12, 16, (3, 3), rng, pads=[1, 1, 1, 1]),
        _conv("c3", "b", "c", 16, 12, (3, 3), rng, pads=[1, 1, 1, 1], strides=[2, 2]),
        _conv("c4", "c", "d", 16, 16, (5, 5), rng, pads=[2, 2, 2, 2], strides=[2, 1], group=16),
        _conv("c5", "d", "e", 8, 16, (3, 3), rng, pads=[2, 2, 2, 2], dilations=[2, 2], group=2),
        _conv("c6", "e", "f", 16, 8, (3, 3), rng, bias=False, pads=[1, 1, 1, 1], group=8),
        _conv("c7", "f", "g", 8, 16, (1, 3), rng, pads=[0, 1, 0, 1]),
        _conv("c8", "g", "h", 8, 8, (3, 3), rng, pads=[2, 1, 2, 3], dilations=[2, 1], strides=[1, 3],
              group=8),
    ]
    graph = helper.make_graph(
        [node for node, _ in layers], "convs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8, "h", "w"])],
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, [None] * 4),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [None] * 4)],
        initializer=[t for _, inits in layers for t in inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _check(model: onnx.ModelProto, out: Path, kinds: set[str], sizes: list[tuple[int, int, int]],
           channels: int) -> None:
    plan = json.loads((out / "plan.json").read_text())
    steps = [s for s in plan["steps"] if s["op_type"] in kinds]
    assert steps and all(s["provider"] == "c" for s in steps), [(s["name"], s["provider"]) for s in steps]
    session = Session(out)
    for n, h, w in sizes:
        x = np.random.default_rng(n * h * w).standard_normal((n, channels, h, w)).astype(np.float32)
        got, want = session.run(None, {"x": x}), ort_run(model, {"x": x})
        for g, r in zip(got, want, strict=True):
            assert g.shape == r.shape
            np.testing.assert_allclose(g, r, rtol=RTOL, atol=ATOL, err_msg=f"at {(n, h, w)}")


@pytest.mark.parametrize("cpu", ["x86-64-v2", "x86-64-v3"])
def test_convs_run_on_c_with_run_time_batch_and_sizes(tmp_path: Path, cpu: str) -> None:
    """At -O2: the NCHW kernels (at -O3 the convs go NHWC, tests/test_dynamic_nhwc.py)."""
    model = _conv_model()
    out = compile_model(model, tmp_path / "a", dims={"n": (1, 4), "h": (1, 40), "w": (1, 300)}, cpu=cpu,
                        golden_cases=0, opt_level=2)
    _check(model, out, {"Conv", "FusedConv"}, SIZES, 8)


def test_a_static_batch_with_run_time_width(tmp_path: Path) -> None:
    """Only W is a symbol (PP-OCR rec's case): H, OH and N stay compile-time constants."""
    model = _conv_model()
    out = compile_model(model, tmp_path / "a", shapes={"x": (2, 8, 6, (1, 300))}, golden_cases=0, opt_level=2)
    _check(model, out, {"Conv", "FusedConv"}, [(2, 6, 1), (2, 6, 65), (2, 6, 300)], 8)


def _pool_model() -> onnx.ModelProto:
    """x [n, 4, h, w] through the pools of the two models (YOLOv8n's SPPF MaxPool 5x5 stride 1 pad 2,
    PP-OCR rec's AveragePool 3x2 stride (3, 2)), a MaxPool 3x3 stride 2 pad 1 with dilation 2 and
    an AveragePool 3x3 stride 2 pad 1 counting the pads; each output separately."""
    node = helper.make_node
    nodes = [
        node("MaxPool", ["x"], ["a"], kernel_shape=[5, 5], pads=[2, 2, 2, 2], strides=[1, 1]),
        node("AveragePool", ["x"], ["b"], kernel_shape=[3, 2], strides=[3, 2], count_include_pad=0),
        node("MaxPool", ["x"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2],
             dilations=[2, 2]),
        node("AveragePool", ["x"], ["d"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2],
             count_include_pad=1),
        node("AveragePool", ["x"], ["e"], kernel_shape=[2, 3], pads=[0, 1, 1, 1], strides=[1, 2]),
    ]
    graph = helper.make_graph(
        nodes, "pools", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4, "h", "w"])],
        [helper.make_tensor_value_info(v, TensorProto.FLOAT, [None] * 4) for v in "abcde"])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("cpu", ["x86-64-v2", "x86-64-v3"])
def test_pools_run_on_c_with_run_time_batch_and_sizes(tmp_path: Path, cpu: str) -> None:
    """Widths where no window lies inside the row (w 3, 4), where all but the borders do, and the
    range ends."""
    model = _pool_model()
    out = compile_model(model, tmp_path / "a", dims={"n": (1, 4), "h": (3, 40), "w": (3, 300)}, cpu=cpu,
                        golden_cases=0)
    sizes = [(1, 3, 3), (2, 4, 4), (3, 5, 7), (1, 17, 33), (4, 40, 300), (1, 3, 300)]
    _check(model, out, {"MaxPool", "AveragePool"}, sizes, 4)
