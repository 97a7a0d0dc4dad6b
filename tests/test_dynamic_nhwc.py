"""Convolution regions in NHWC and Winograd with run-time dims (issue 18): in a dynamic artifact at
-O3 the layout and Winograd lowerings run as in a static one, and ConvNhwc (GEMM path in its
"direct", "check" and "copy" tap modes, depthwise, grouped, partial panels, residual),
WinogradConvNhwc (4x4 and 2x2 tiles), MaxPoolNhwc / AveragePoolNhwc, GlobalAveragePoolNhwc and
LRNNhwc run on the C kernels with the batch and the spatial sizes read from the binding. Checked
against onnxruntime at sizes that hit the last pixel tile, tiles overhanging the output's edges,
windows with no tap inside the input, one tile and thousands (every thread path), and the range
ends; compiled for x86-64-v2 and x86-64-v3.
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
from compiler.frontend.importer import import_model
from compiler.passes.manager import optimize
from runtime.session import Session
from tests.support.models import ort_run
from tests.support.zoo import dummy_input
from tests.support.zoo import random_weight_model
from tests.support.zoo import strip_softmax

RTOL, ATOL = 1e-3, 1e-4
NHWC_KINDS = {"ConvNhwc", "WinogradConvNhwc", "MaxPoolNhwc", "AveragePoolNhwc", "GlobalAveragePoolNhwc",
              "LRNNhwc"}
SIZES = [(1, 1, 1), (1, 1, 300), (1, 2, 2), (3, 5, 7), (2, 17, 33), (1, 40, 300), (4, 24, 64), (1, 9, 13)]


class _Builder:
    """A model under construction: nodes and seeded initializers."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def const(self, name: str, a: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(a.astype(np.float32), name))
        return name

    def conv(self, x: str, y: str, m: int, c: int, k: int, bias: bool = True, **attrs: object) -> str:
        group = int(attrs.get("group", 1))  # type: ignore[call-overload]
        kh, kw = (k, k) if isinstance(k, int) else k
        w = self.rng.standard_normal((m, c // group, kh, kw)) / np.sqrt(c // group * kh * kw)
        inputs = [x, self.const(f"{y}_w", w)]
        if bias:
            inputs.append(self.const(f"{y}_b", self.rng.standard_normal(m) * 0.1))
        self.nodes.append(helper.make_node("Conv", inputs, [y], name=y, kernel_shape=[kh, kw], **attrs))
        return y

    def op(self, kind: str, inputs: list[str], y: str, **attrs: object) -> str:
        self.nodes.append(helper.make_node(kind, inputs, [y], name=y, **attrs))
        return y

    def model(self, x: list, outputs: list[str]) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, "nhwc", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x)],
            [helper.make_tensor_value_info(v, TensorProto.FLOAT, [None] * 4) for v in outputs],
            initializer=self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _nhwc_model() -> onnx.ModelProto:
    """x [n, 3, h, w]: a 3-channel 3x3 stem ("copy" taps), 1x1 (flat), two Winograd 3x3 at full
    size, the second with a residual (epilogue), a 3x3 stride 2 with 32 channels ("check" taps),
    a Winograd 3x3 at a quarter of the size with 20 output channels (a partial panel), depthwise 3x3
    stride 1 and 5x5 stride 2, a grouped 3x3, 24 output channels (a partial panel), BatchNorm and
    ReLU, MaxPool 5x5 pad 2 (YOLOv8n's SPPF), AveragePool 3x3 pad 1 not counting the pads and
    counting them, LRN, Concat of channels, GlobalAveragePool, a dilated MaxPool 3x3 stride 2;
    outputs at several depths."""
    b = _Builder()
    b.conv("x", "s", 16, 3, 3, pads=[1, 1, 1, 1])
    b.op("Relu", ["s"], "sr")
    b.conv("sr", "p", 32, 16, 1)
    b.conv("p", "wa", 32, 32, 3, pads=[1, 1, 1, 1])
    b.op("Relu", ["wa"], "war")
    b.conv("war", "wb", 32, 32, 3, pads=[1, 1, 1, 1])
    b.op("Add", ["wb", "p"], "res")
    b.conv("res", "d1", 32, 32, 3, pads=[1, 1, 1, 1], group=32)
    b.conv("d1", "c2", 32, 32, 3, pads=[1, 1, 1, 1], strides=[2, 2])
    scale, shift = b.rng.uniform(0.5, 1.5, 32), b.rng.standard_normal(32) * 0.1
    mean, var = b.rng.standard_normal(32) * 0.1, b.rng.uniform(0.5, 1.5, 32)
    b.op("BatchNormalization", ["c2", b.const("bn_s", scale), b.const("bn_t", shift), b.const("bn_m", mean),
                                b.const("bn_v", var)], "bn")
    b.op("Relu", ["bn"], "bnr")
    b.conv("bnr", "d2", 32, 32, 5, pads=[2, 2, 2, 2], strides=[2, 2], group=32)
    b.conv("d2", "wg", 20, 32, 3, pads=[1, 1, 1, 1])
    b.conv("wg", "gr", 24, 20, 3, pads=[1, 1, 1, 1], group=2)
    b.op("MaxPool", ["gr"], "mp", kernel_shape=[5, 5], pads=[2, 2, 2, 2], strides=[1, 1])
    b.op("AveragePool", ["gr"], "ap", kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1],
         count_include_pad=0)
    b.op("AveragePool", ["gr"], "apc", kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1],
         count_include_pad=1)
    b.op("LRN", ["gr"], "lrn", size=3, alpha=1e-3, beta=0.75, bias=1.0)
    b.op("Concat", ["mp", "ap", "apc", "lrn"], "cat", axis=1)
    b.conv("cat", "head", 20, 96, 1)
    b.op("GlobalAveragePool", ["head"], "gap")
    b.op("MaxPool", ["gr"], "mpd", kernel_shape=[3, 3], pads=[2, 2, 2, 2], strides=[2, 2], dilations=[2, 2])
    b.op("Relu", ["mpd"], "mpr")
    b.conv("mpr", "tail", 16, 24, 1)
    return b.model(["n", 3, "h", "w"], ["res", "head", "gap", "tail"])


def _plan(out: Path) -> list[dict]:
    steps: list[dict] = json.loads((out / "plan.json").read_text())["steps"]
    return steps


def _check(model: onnx.ModelProto, out: Path, sizes: list[tuple[int, int, int]], threads: int | None = None
           ) -> None:  # fmt: skip
    session = Session(out, threads=threads)
    for n, h, w in sizes:
        x = np.random.default_rng(n * h * w).standard_normal((n, 3, h, w)).astype(np.float32)
        got, want = session.run(None, {"x": x}), ort_run(model, {"x": x})
        for g, r in zip(got, want, strict=True):
            assert g.shape == r.shape
            np.testing.assert_allclose(g, r, rtol=RTOL, atol=ATOL, err_msg=f"at {(n, h, w)}")


@pytest.fixture(scope="module", params=["x86-64-v2", "x86-64-v3"])
def nhwc(request: pytest.FixtureRequest,
         tmp_path_factory: pytest.TempPathFactory) -> tuple[onnx.ModelProto, Path]:  # fmt: skip
    model = _nhwc_model()
    out = compile_model(model, tmp_path_factory.mktemp("nhwc") / "a", dims={"n": (1, 4), "h": (1, 40),
                        "w": (1, 300)}, cpu=request.param, golden_cases=0)  # fmt: skip
    return model, out


def test_every_step_runs_on_c_in_nhwc(nhwc: tuple[onnx.ModelProto, Path]) -> None:
    steps = _plan(nhwc[1])
    assert all(s["provider"] == "c" for s in steps), [(s["name"], s["provider"]) for s in steps]
    kinds = {s["op_type"] for s in steps}
    assert NHWC_KINDS <= kinds, kinds
    assert not kinds & {"Conv", "FusedConv", "WinogradConv", "MaxPool", "AveragePool", "LRN"}, kinds


@pytest.mark.parametrize("threads", [1, 2])
def test_nhwc_matches_onnxruntime_at_every_size(nhwc: tuple[onnx.ModelProto, Path], threads: int) -> None:
    _check(*nhwc, SIZES, threads)


def test_a_static_batch_and_height_with_run_time_width(tmp_path: Path) -> None:
    """Only W is a symbol (PP-OCR rec's case): N, H and OH stay compile-time constants; from
    W = 16 the full-size Winograd convs have 4x4 tiles (5 x 4 of them at the low end)."""
    model = _nhwc_model()
    out = compile_model(model, tmp_path / "a", shapes={"x": (2, 3, 20, (16, 300))}, golden_cases=0)
    assert {s["provider"] for s in _plan(out)} == {"c"}
    assert NHWC_KINDS <= {s["op_type"] for s in _plan(out)}
    _check(model, out, [(2, 20, 16), (2, 20, 17), (2, 20, 65), (2, 20, 300)])


def test_winograd_tiles_fit_the_smallest_output_in_range() -> None:
    """Weights are transformed once: each conv's tile is the one a static compile picks at the
    range's low end (here 2x2 at 1x1 outputs, 4x4 from 16 tiles of 4x4 at the low end)."""
    for lo, tile in ((1, 2), (16, 4)):
        graph = import_model(_nhwc_model(), None, None, {"n": (1, 4), "h": (lo, 40), "w": (lo, 300)})
        graph = optimize(graph, 3, target="cpu")
        convs = [node for node in graph if node.kind == "onnx_aot.WinogradConvNhwc"]
        assert len(convs) == 3, [node.kind for node in graph]
        first = convs[0].input(1)
        assert first is not None and first.shape is not None and first.shape[0] == (tile + 2) ** 2


def test_a_light_zoo_model_with_a_run_time_batch(tmp_path: Path) -> None:
    """SqueezeNet (fire modules: 1x1 squeeze, 1x1 and Winograd 3x3 expand, channel Concat,
    MaxPool, GlobalAveragePool) with only the batch a symbol: every step on C, NHWC kept."""
    model = strip_softmax(random_weight_model("squeezenet"))  # (an opset-9 Softmax takes no symbolic dims)
    (name, x1), = dummy_input(model).items()
    for value in (*model.graph.input[:1], *model.graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = "n"
    out = compile_model(model, tmp_path / "a", dims={"n": (1, 4)}, golden_cases=0, cpu="x86-64-v3")
    steps = _plan(out)
    assert {s["provider"] for s in steps} == {"c"}
    assert {"ConvNhwc", "WinogradConvNhwc", "MaxPoolNhwc"} <= {s["op_type"] for s in steps}
    session = Session(out)
    for x in (x1, np.concatenate([x1, -x1, 0.5 * x1])):
        np.testing.assert_allclose(session.run(None, {name: x})[0], ort_run(model, {name: x})[0],
                                   rtol=RTOL, atol=ATOL)


def _shuffle_model() -> onnx.ModelProto:
    """x [n, 8, h, w]: a 1x1 conv, ShuffleNet's channel shuffle with its Reshape targets computed
    from the tensor's Shape (n, 4, 4, h, w) and back (n, 16, h, w), a 3x3 conv."""
    b = _Builder()
    b.conv("x", "a", 16, 8, 1)
    b.op("Shape", ["a"], "sh")
    for k, name in ((0, "n0"), (2, "h0"), (3, "w0")):
        b.inits.append(numpy_helper.from_array(np.array([k], np.int64), f"i{k}"))
        b.op("Gather", ["sh", f"i{k}"], name, axis=0)
    for name, v in (("four", 4), ("sixteen", 16)):
        b.inits.append(numpy_helper.from_array(np.array([v], np.int64), name))
    b.op("Concat", ["n0", "four", "four", "h0", "w0"], "s5", axis=0)
    b.op("Reshape", ["a", "s5"], "r5")
    b.op("Transpose", ["r5"], "t5", perm=[0, 2, 1, 3, 4])
    b.op("Concat", ["n0", "sixteen", "h0", "w0"], "s4", axis=0)
    b.op("Reshape", ["t5", "s4"], "r4")
    b.conv("r4", "y", 8, 16, 3, pads=[1, 1, 1, 1])
    return b.model(["n", 8, "h", "w"], ["y"])


def test_a_channel_shuffle_with_run_time_dims_stays_nhwc(tmp_path: Path) -> None:
    """The shuffle's NHWC form (n, h, w, 4, 4) with its last axes swapped: Reshapes whose shape
    attributes are expressions, no Transpose back to NCHW between the convs."""
    model = _shuffle_model()
    out = compile_model(model, tmp_path / "a", dims={"n": (1, 4), "h": (1, 40), "w": (1, 64)}, golden_cases=0,
                        cpu="x86-64-v3")
    steps = _plan(out)
    assert {s["provider"] for s in steps} == {"c"}
    assert [s["op_type"] for s in steps] == ["Transpose", "ConvNhwc", "Reshape", "Transpose", "Reshape",
                                             "ConvNhwc", "Transpose"]
    session = Session(out)
    for n, h, w in ((1, 1, 1), (3, 7, 9), (4, 40, 64)):
        x = np.random.default_rng(h).standard_normal((n, 8, h, w)).astype(np.float32)
        np.testing.assert_allclose(session.run(None, {"x": x})[0], ort_run(model, {"x": x})[0], rtol=RTOL,
                                   atol=ATOL)


@pytest.mark.parametrize("cpu", ["x86-64-v2", "x86-64-v3"])
def test_layout_transposes_with_run_time_dims_are_blocked(tmp_path: Path, cpu: str) -> None:
    """The region edges' Transposes (N, C, H*W) <-> (N, H*W, C) with run-time N, H, W run the
    blocked transpose when H*W holds a step (else the loop nest): exact at sizes below a step, at
    one step, and with partial steps and pieces at both ends."""
    node = helper.make_node
    graph = helper.make_graph(
        [node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]), node("Relu", ["t"], ["r"]),
         node("Transpose", ["r"], ["y"], perm=[0, 3, 1, 2])], "edges",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 24, "h", "w"])],
        [helper.make_tensor_value_info(v, TensorProto.FLOAT, [None] * 4) for v in ("t", "y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    out = compile_model(model, tmp_path / "a", dims={"n": (1, 3), "h": (1, 64), "w": (1, 300)}, cpu=cpu,
                        golden_cases=0)
    assert (out / "kernels" / "cpu" / "model.c").read_text().count("too short for a step") == 2
    session = Session(out)
    for n, h, w in ((1, 1, 1), (2, 1, 7), (1, 2, 8), (3, 4, 4), (1, 5, 31), (2, 17, 33), (3, 64, 300)):
        x = np.random.default_rng(w).standard_normal((n, 24, h, w)).astype(np.float32)
        t, y = session.run(None, {"x": x})
        np.testing.assert_array_equal(t, x.transpose(0, 2, 3, 1))
        np.testing.assert_array_equal(y, np.maximum(x, 0))


@pytest.mark.parametrize("cpu", ["x86-64-v2", "x86-64-v3"])
def test_nchw_winograd_at_o2_with_run_time_dims(tmp_path: Path, cpu: str) -> None:
    """At -O2 (no NHWC) the Winograd convs run the NCHW WinogradConv kernel with run-time tile
    counts and product columns: 2x2 tiles over the full range, 4x4 with a static height of 20 and
    widths from 16."""
    model = _nhwc_model()
    out = compile_model(model, tmp_path / "a", dims={"n": (1, 4), "h": (1, 40), "w": (1, 300)}, cpu=cpu,
                        golden_cases=0, opt_level=2)
    steps = _plan(out)
    assert {s["provider"] for s in steps} == {"c"}
    kinds = {s["op_type"] for s in steps}
    assert "WinogradConv" in kinds and not kinds & NHWC_KINDS, kinds
    _check(model, out, SIZES, threads=2)
    out = compile_model(model, tmp_path / "b", shapes={"x": (2, 3, 20, (16, 300))}, cpu=cpu, golden_cases=0,
                        opt_level=2)
    assert {s["provider"] for s in _plan(out)} == {"c"}
    _check(model, out, [(2, 20, 16), (2, 20, 17), (2, 20, 65), (2, 20, 300)], threads=1)
