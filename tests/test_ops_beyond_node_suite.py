"""Recurrent, quantization, signal and sampling ops beyond the ONNX node suite.

The node suite covers few attribute combinations of these ops (its RNN cases never combine
``sequence_lens`` with a reverse direction, never set activations, clip or linear_before_reset).
Each model here is one ONNX node run through ``compiler.backend`` and checked against numpy
written from the ONNX spec -- per batch entry and per step for the recurrent ops, so the oracle
shares nothing with the vectorized kernels.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

import compiler.backend as backend
from runtime.errors import ModelError
from runtime.errors import UnsupportedOpError
from tests.support.models import onnx_model
from tests.support.models import run_backend

_model = partial(onnx_model, opset=22)

RNG = np.random.default_rng(7)


def _info(name: str, a: np.ndarray) -> tuple[str, int, list[int]]:
    return name, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape)


def _run(node: onnx.NodeProto, feeds: dict[str, np.ndarray], outputs: list[tuple[str, int, list[int]]],
         opset: int = 22) -> list[np.ndarray]:
    model = _model(node, [_info(k, v) for k, v in feeds.items()], outputs, opset=opset)
    return run_backend(model, *feeds.values())


def _f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


# -- recurrent ops: a per-entry, per-step oracle ------------------------------------------------
def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


_ACT: dict[str, Callable[[np.ndarray, float, float], np.ndarray]] = {
    "Tanh": lambda x, a, b: np.tanh(x),
    "Sigmoid": lambda x, a, b: _sigmoid(x),
    "Relu": lambda x, a, b: np.maximum(x, 0),
    "LeakyRelu": lambda x, a, b: np.where(x >= 0, x, a * x),
    "HardSigmoid": lambda x, a, b: np.clip(a * x + b, 0, 1),
    "Affine": lambda x, a, b: a * x + b,
}


def _step(op: str, x: np.ndarray, h: np.ndarray, c: np.ndarray, w: np.ndarray, r: np.ndarray,
          b: np.ndarray, p: np.ndarray, f: list[Callable[..., np.ndarray]],
          lbr: int, forget: int) -> tuple[np.ndarray, np.ndarray]:
    """One step of one batch entry, straight from the ONNX equations."""
    n = r.shape[1]
    wb, rb = np.split(b, 2)
    if op == "RNN":
        return f[0](w @ x + r @ h + wb + rb), c
    if op == "GRU":
        z = f[0](w[:n] @ x + r[:n] @ h + wb[:n] + rb[:n])
        rr = f[0](w[n:2 * n] @ x + r[n:2 * n] @ h + wb[n:2 * n] + rb[n:2 * n])
        if lbr:
            hh = f[1](w[2 * n:] @ x + rr * (r[2 * n:] @ h + rb[2 * n:]) + wb[2 * n:])
        else:
            hh = f[1](w[2 * n:] @ x + r[2 * n:] @ (rr * h) + rb[2 * n:] + wb[2 * n:])
        return (1 - z) * hh + z * h, c
    g = [w[k * n:(k + 1) * n] @ x + r[k * n:(k + 1) * n] @ h + wb[k * n:(k + 1) * n] + rb[k * n:(k + 1) * n]
         for k in range(4)]  # i, o, f, c
    i = f[0](g[0] + p[:n] * c)
    fg = 1 - i if forget else f[0](g[2] + p[2 * n:] * c)
    c_new = fg * c + i * f[1](g[3])
    o = f[0](g[1] + p[n:2 * n] * c_new)
    return o * f[2](c_new), c_new


def _oracle(op: str, x: np.ndarray, w: np.ndarray, r: np.ndarray, b: np.ndarray, lens: np.ndarray,
            h0: np.ndarray, c0: np.ndarray, p: np.ndarray, direction: str, acts: list[str],
            alphas: list[float], betas: list[float], clip: float, lbr: int = 0,
            forget: int = 0) -> tuple[np.ndarray, ...]:
    seq, batch, _ = x.shape
    dirs, hidden = w.shape[0], r.shape[2]
    per = len(acts) // dirs
    y = np.zeros((seq, dirs, batch, hidden))
    yh = np.zeros((dirs, batch, hidden))
    yc = np.zeros((dirs, batch, hidden))
    for d in range(dirs):
        funcs = [lambda v, k=k: _ACT[acts[k]](np.clip(v, -clip, clip), alphas[k], betas[k])
                 for k in range(d * per, (d + 1) * per)]
        backwards = direction == "reverse" or d == 1
        for e in range(batch):
            h, c = h0[d, e].astype(np.float64), c0[d, e].astype(np.float64)
            steps = range(lens[e] - 1, -1, -1) if backwards else range(lens[e])
            for t in steps:
                h, c = _step(op, x[t, e], h, c, w[d], r[d], b[d], p[d], funcs, lbr, forget)
                y[t, d, e] = h
            if lens[e]:
                yh[d, e], yc[d, e] = h, c
    return y, yh, yc


_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


@pytest.mark.parametrize("op,direction,extra", [
    ("RNN", "reverse", {"activations": ["Relu"]}),
    ("RNN", "bidirectional", {"activations": ["LeakyRelu", "Affine"], "activation_alpha": [0.2, 0.5],
                              "activation_beta": [0.25]}),
    ("GRU", "bidirectional", {"linear_before_reset": 1}),
    ("GRU", "reverse", {"activations": ["HardSigmoid", "Tanh"], "clip": 0.8}),
    ("LSTM", "bidirectional", {}),
    ("LSTM", "reverse", {"input_forget": 1, "clip": 1.5}),
    ("LSTM", "forward", {"layout": 1}),
])
def test_recurrent_ops_follow_the_spec_with_sequence_lengths_and_initial_states(
        op: str, direction: str, extra: dict[str, Any]) -> None:
    seq, batch, size, hidden = 5, 3, 4, 3
    dirs, gates = 2 if direction == "bidirectional" else 1, _GATES[op]
    layout = int(extra.get("layout", 0))
    x = _f32(seq, batch, size)
    feeds = {"X": np.swapaxes(x, 0, 1).copy() if layout else x, "W": _f32(dirs, gates * hidden, size),
             "R": _f32(dirs, gates * hidden, hidden), "B": _f32(dirs, 2 * gates * hidden),
             "lens": np.array([5, 2, 0], np.int32)}
    h0, c0, p = _f32(dirs, batch, hidden), _f32(dirs, batch, hidden), _f32(dirs, 3 * hidden)
    feeds["h0"] = np.swapaxes(h0, 0, 1).copy() if layout else h0
    if op == "LSTM":
        feeds["c0"] = np.swapaxes(c0, 0, 1).copy() if layout else c0
        feeds["P"] = p
    names = ["Y", "Y_h", "Y_c"][:3 if op == "LSTM" else 2]
    y_shape = [batch, seq, dirs, hidden] if layout else [seq, dirs, batch, hidden]
    state = [batch, dirs, hidden] if layout else [dirs, batch, hidden]
    node = helper.make_node(op, list(feeds), names, hidden_size=hidden, direction=direction, **extra)
    got = _run(node, feeds, [(n, T.FLOAT, y_shape if n == "Y" else state) for n in names])
    default = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}[op]
    acts = list(extra.get("activations", default * dirs))
    if len(acts) < len(default) * dirs:
        acts = acts * dirs
    alphas = {"LeakyRelu": 0.01, "HardSigmoid": 0.2, "Affine": 1.0}
    betas = {"HardSigmoid": 0.5, "Affine": 0.0}
    given_a, given_b = list(extra.get("activation_alpha", [])), list(extra.get("activation_beta", []))
    a_list = [given_a.pop(0) if a in alphas and given_a else alphas.get(a, 0.0) for a in acts]
    b_list = [given_b.pop(0) if a in betas and given_b else betas.get(a, 0.0) for a in acts]
    want = _oracle(op, x, feeds["W"], feeds["R"], feeds["B"], feeds["lens"], h0, c0,
                   p if op == "LSTM" else np.zeros((dirs, 3 * hidden)), direction, acts, a_list, b_list,
                   float(extra.get("clip", np.inf)), int(extra.get("linear_before_reset", 0)),
                   int(extra.get("input_forget", 0)))
    if layout:
        want = (np.transpose(want[0], (2, 0, 1, 3)), np.swapaxes(want[1], 0, 1), np.swapaxes(want[2], 0, 1))
    for g, w in zip(got, want, strict=False):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_recurrent_op_with_only_y_h_used_and_bad_activation_count() -> None:
    x, w, r = _f32(2, 1, 3), _f32(1, 4, 3), _f32(1, 4, 4)
    node = helper.make_node("RNN", ["X", "W", "R"], ["", "Y_h"], hidden_size=4)
    (yh,) = _run(node, {"X": x, "W": w, "R": r}, [("Y_h", T.FLOAT, [1, 1, 4])])
    h = np.zeros(4)
    for t in range(2):
        h = np.tanh(w[0] @ x[t, 0] + r[0] @ h)
    np.testing.assert_allclose(yh[0, 0], h, rtol=1e-5, atol=1e-6)
    bad = helper.make_node("GRU", ["X", "W", "R"], ["Y"], hidden_size=4, activations=["Tanh"])
    with pytest.raises(ModelError, match="activations"):
        _run(bad, {"X": x, "W": _f32(1, 12, 3), "R": _f32(1, 12, 4)}, [("Y", T.FLOAT, [2, 1, 1, 4])])


# -- quantization --------------------------------------------------------------------------------
def test_quantize_rounds_half_to_even_saturates_and_takes_a_negative_axis() -> None:
    x = np.array([[0.5, 1.5, 2.5, -0.5], [300.0, -300.0, 7.0, -2.5]], np.float32)
    scale = np.array([1.0, 0.5], np.float32)
    zero = np.array([0, -3], np.int8)
    node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], axis=-2)
    (y,) = _run(node, {"x": x, "s": scale, "z": zero}, [("y", T.INT8, [2, 4])])
    np.testing.assert_array_equal(y, [[0, 2, 2, 0], [127, -128, 11, -8]])


def test_quantize_opset_10_per_tensor_defaults_to_uint8_without_zero_point() -> None:
    x = np.array([-1.0, 0.2, 3.7, 1000.0], np.float32)
    node = helper.make_node("QuantizeLinear", ["x", "s"], ["y"])
    (y,) = _run(node, {"x": x, "s": np.array(0.5, np.float32)}, [("y", T.UINT8, [4])], opset=10)
    np.testing.assert_array_equal(y, [0, 0, 7, 255])


def test_blocked_dequantize_with_a_partial_last_block_and_int32_input() -> None:
    x = np.arange(10, dtype=np.uint8).reshape(2, 5)
    scale = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    zero = np.array([[1, 2], [3, 4]], np.uint8)
    node = helper.make_node("DequantizeLinear", ["x", "s", "z"], ["y"], axis=1, block_size=3)
    (y,) = _run(node, {"x": x, "s": scale, "z": zero}, [("y", T.FLOAT, [2, 5])])
    full_s, full_z = np.repeat(scale, 3, axis=1)[:, :5], np.repeat(zero, 3, axis=1)[:, :5]
    np.testing.assert_allclose(y, (x.astype(np.float32) - full_z) * full_s)
    big = np.array([2**30, -7], np.int32)
    node = helper.make_node("DequantizeLinear", ["x", "s"], ["y"])
    (y,) = _run(node, {"x": big, "s": np.array(0.5, np.float32)}, [("y", T.FLOAT, [2])])
    np.testing.assert_array_equal(y, [2**29, -3.5])


def test_a_one_element_scale_with_a_scalar_zero_point_is_per_tensor() -> None:
    # as int8 exports write a bias's dequantization (Smart Turn v3.2): scale (1,), zero point ()
    x = np.array([[-128, 0, 5], [7, 127, -3]], np.int8)
    node = helper.make_node("DequantizeLinear", ["x", "s", "z"], ["y"])
    feeds = {"x": x, "s": np.array([0.25], np.float32), "z": np.array(3, np.int8)}
    (y,) = _run(node, feeds, [("y", T.FLOAT, [2, 3])])
    np.testing.assert_array_equal(y, (x.astype(np.float32) - 3) * 0.25)
    per_axis = {"x": x, "s": np.array([0.25, 0.5], np.float32), "z": np.array(3, np.int8)}
    with pytest.raises(ModelError, match="zero point shape"):
        _run(helper.make_node("DequantizeLinear", ["x", "s", "z"], ["y"], axis=0), per_axis,
             [("y", T.FLOAT, [2, 3])])


def test_quantizing_to_a_four_bit_type_is_unsupported() -> None:
    node = helper.make_node("QuantizeLinear", ["x", "s"], ["y"], output_dtype=T.INT4)
    with pytest.raises(UnsupportedOpError):
        _run(node, {"x": _f32(4), "s": np.array(1.0, np.float32)}, [("y", T.INT4, [4])], opset=21)


def test_integer_matmul_and_conv_with_per_row_and_per_channel_zero_points() -> None:
    a = RNG.integers(0, 255, (3, 4), dtype=np.uint8)
    b = RNG.integers(-128, 127, (4, 2), dtype=np.int8)
    a_zero, b_zero = np.array([1, 200, 3], np.uint8), np.array([-5, 9], np.int8)
    node = helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])
    (y,) = _run(node, {"a": a, "b": b, "az": a_zero, "bz": b_zero}, [("y", T.INT32, [3, 2])], opset=10)
    want = (a.astype(np.int32) - a_zero[:, None].astype(np.int32)) @ (b.astype(np.int32) - b_zero)
    np.testing.assert_array_equal(y, want)

    x = RNG.integers(0, 255, (1, 2, 5, 5), dtype=np.uint8)
    w = RNG.integers(0, 255, (3, 2, 3, 3), dtype=np.uint8)
    x_zero, w_zero = np.array(128, np.uint8), np.array([10, 20, 30], np.uint8)
    node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1])
    (y,) = _run(node, {"x": x, "w": w, "xz": x_zero, "wz": w_zero}, [("y", T.INT32, [1, 3, 3, 3])],
                opset=10)
    xs = np.pad(x.astype(np.int64) - 128, ((0, 0), (0, 0), (1, 1), (1, 1)))
    ws = w.astype(np.int64) - w_zero[:, None, None, None]
    want = np.zeros((1, 3, 3, 3), np.int64)
    for i in range(3):
        for j in range(3):
            want[0, :, i, j] = np.einsum("mckl,ckl->m", ws, xs[0, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3])
    np.testing.assert_array_equal(y, want)


def test_qlinear_conv_with_bias_and_per_channel_weight_scales() -> None:
    x = RNG.integers(-128, 127, (1, 1, 4, 4), dtype=np.int8)
    w = RNG.integers(-128, 127, (2, 1, 2, 2), dtype=np.int8)
    bias = np.array([1000, -2000], np.int32)
    feeds: dict[str, np.ndarray] = {
        "x": x, "xs": np.array(0.05, np.float32), "xz": np.array(3, np.int8), "w": w,
        "ws": np.array([0.01, 0.02], np.float32), "wz": np.array([0, 0], np.int8),
        "ys": np.array(0.3, np.float32), "yz": np.array(-10, np.int8), "B": bias}
    node = helper.make_node("QLinearConv", list(feeds), ["y"])
    (y,) = _run(node, feeds, [("y", T.INT8, [1, 2, 3, 3])], opset=10)
    acc = np.zeros((2, 3, 3))
    for i in range(3):
        for j in range(3):
            acc[:, i, j] = np.einsum("mkl,kl->m", w[:, 0].astype(np.float64),
                                     x[0, 0, i:i + 2, j:j + 2].astype(np.float64) - 3)
    real = (acc + bias[:, None, None]) * (0.05 * np.array([0.01, 0.02])[:, None, None] / 0.3)
    want = np.clip(np.rint(real.astype(np.float32)) - 10, -128, 127)
    np.testing.assert_array_equal(y[0], want)


# -- signal ops -----------------------------------------------------------------------------------
def _const(name: str, value: Any, dtype: Any = np.int64) -> onnx.TensorProto:
    return helper.make_tensor(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), [],
                              [np.asarray(value, dtype).item()])


@pytest.mark.parametrize("length", [6, 12])
def test_dft_pads_or_truncates_to_dft_length_opset_17_axis_attribute(length: int) -> None:
    x = _f32(2, 8, 3, 2)
    node = helper.make_node("DFT", ["x", "n"], ["y"], axis=1, inverse=1)
    model = _model(node, [_info("x", x)], [("y", T.FLOAT, [2, length, 3, 2])], opset=17,
                   initializers=(_const("n", length),))
    (y,) = backend.prepare(model).run([x])
    want = np.fft.ifft(x[..., 0] + 1j * x[..., 1], n=length, axis=1)
    np.testing.assert_allclose(y, np.stack([want.real, want.imag], -1), rtol=1e-4, atol=1e-5)


def test_stft_of_a_complex_signal_two_sided() -> None:
    signal = _f32(2, 20, 2)
    window = np.hanning(8).astype(np.float32)
    node = helper.make_node("STFT", ["s", "step", "w"], ["y"], onesided=0)
    model = _model(node, [_info("s", signal), _info("w", window)], [("y", T.FLOAT, [2, 5, 8, 2])],
                   opset=17, initializers=(_const("step", 3),))
    (y,) = backend.prepare(model).run([signal, window])
    z = signal[..., 0] + 1j * signal[..., 1]
    frames = np.stack([z[:, 3 * f:3 * f + 8] * window for f in range(5)], axis=1)
    want = np.fft.fft(frames, axis=-1)
    np.testing.assert_allclose(y, np.stack([want.real, want.imag], -1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op,periodic,size", [("HannWindow", 0, 1), ("HammingWindow", 1, 7),
                                              ("BlackmanWindow", 0, 9)])
def test_windows_in_double_precision(op: str, periodic: int, size: int) -> None:
    node = helper.make_node(op, ["n"], ["y"], periodic=periodic, output_datatype=T.DOUBLE)
    model = _model(node, [], [("y", T.DOUBLE, [size])], opset=17, initializers=(_const("n", size, np.int32),))
    (y,) = backend.prepare(model).run([])
    n, period = np.arange(size), (size if periodic else size - 1)
    if period == 0:
        want = np.ones(size)
    elif op == "HannWindow":
        want = np.sin(np.pi * n / period) ** 2
    elif op == "HammingWindow":
        want = 25 / 46 - 21 / 46 * np.cos(2 * np.pi * n / period)
    else:
        want = 0.42 - 0.5 * np.cos(2 * np.pi * n / period) + 0.08 * np.cos(4 * np.pi * n / period)
    assert y.dtype == np.float64
    np.testing.assert_allclose(y, want, atol=1e-12)


def test_mel_weight_matrix_filters_peak_at_one_and_stay_in_range() -> None:
    consts = (_const("bins", 10, np.int32), _const("n", 64, np.int32), _const("rate", 16000, np.int32),
              _const("low", 100.0, np.float32), _const("high", 7000.0, np.float32))
    node = helper.make_node("MelWeightMatrix", ["bins", "n", "rate", "low", "high"], ["y"])
    model = _model(node, [], [("y", T.FLOAT, [33, 10])], opset=17, initializers=consts)
    (y,) = backend.prepare(model).run([])
    assert y.shape == (33, 10) and np.all((y >= 0) & (y <= 1))
    np.testing.assert_array_equal(y.max(axis=0), np.ones(10))


# -- sampling ops ----------------------------------------------------------------------------------
def test_deform_conv_with_zero_offsets_is_a_grouped_strided_dilated_conv() -> None:
    x, w, b = _f32(2, 4, 7, 6), _f32(6, 2, 2, 3), _f32(6)
    attrs: dict[str, Any] = {"strides": [2, 1], "pads": [1, 0, 0, 2], "dilations": [1, 2], "group": 2}
    out = (4, 4)
    offset = np.zeros((2, 2 * 6 * 2, *out), np.float32)
    node = helper.make_node("DeformConv", ["x", "w", "off", "b"], ["y"], offset_group=2, **attrs)
    (y,) = _run(node, {"x": x, "w": w, "off": offset, "b": b}, [("y", T.FLOAT, [2, 6, *out])])
    conv = helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)
    (want,) = _run(conv, {"x": x, "w": w, "b": b}, [("y", T.FLOAT, [2, 6, *out])])
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


def test_deform_conv_interpolates_between_pixels() -> None:
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    w = np.ones((1, 1, 1, 1), np.float32)
    offset = np.zeros((1, 2, 4, 4), np.float32)
    offset[0, 0] = 0.5  # half a row down: the mean of two rows, the last one with a zero row
    offset[0, 1] = -0.25
    node = helper.make_node("DeformConv", ["x", "w", "off"], ["y"])
    (y,) = _run(node, {"x": x, "w": w, "off": offset}, [("y", T.FLOAT, [1, 1, 4, 4])])
    padded = np.pad(x[0, 0], 1)
    want = np.zeros((4, 4))
    for i in range(4):
        for j in range(4):
            py, px = i + 0.5 + 1, j - 0.25 + 1
            y0, x0 = int(np.floor(py)), int(np.floor(px))
            fy, fx = py - y0, px - x0
            want[i, j] = ((1 - fy) * (1 - fx) * padded[y0, x0] + (1 - fy) * fx * padded[y0, x0 + 1]
                          + fy * (1 - fx) * padded[y0 + 1, x0] + fy * fx * padded[y0 + 1, x0 + 1])
    np.testing.assert_allclose(y[0, 0], want, rtol=1e-5, atol=1e-5)


def test_roi_align_adaptive_sampling_averages_bilinear_samples() -> None:
    x = _f32(2, 3, 6, 8)
    rois = np.array([[0.5, 1.0, 6.5, 5.0], [2.0, 0.0, 3.0, 0.5]], np.float32)
    batch = np.array([1, 0], np.int64)
    node = helper.make_node("RoiAlign", ["x", "rois", "b"], ["y"], output_height=2, output_width=3,
                            spatial_scale=1.0, sampling_ratio=0)
    (y,) = _run(node, {"x": x, "rois": rois, "b": batch}, [("y", T.FLOAT, [2, 3, 2, 3])], opset=16)

    def sample(img: np.ndarray, py: float, px: float) -> np.ndarray:
        if py < -1 or py > 6 or px < -1 or px > 8:
            return np.zeros(3)
        py, px = min(max(py, 0), 5), min(max(px, 0), 7)
        y0, x0 = int(py), int(px)
        y1, x1 = min(y0 + 1, 5), min(x0 + 1, 7)
        fy, fx = py - y0, px - x0
        return ((1 - fy) * (1 - fx) * img[:, y0, x0] + (1 - fy) * fx * img[:, y0, x1]
                + fy * (1 - fx) * img[:, y1, x0] + fy * fx * img[:, y1, x1])

    for k, (roi, bi) in enumerate(zip(rois, batch, strict=True)):
        x0, y0, x1, y1 = roi - 0.5
        bh, bw = (y1 - y0) / 2, (x1 - x0) / 3
        gh, gw = max(int(np.ceil(bh)), 0), max(int(np.ceil(bw)), 0)
        for i in range(2):
            for j in range(3):
                points = [sample(x[bi], y0 + i * bh + (a + 0.5) * bh / gh, x0 + j * bw + (c + 0.5) * bw / gw)
                          for a in range(gh) for c in range(gw)]
                want = np.mean(points, axis=0) if points else np.zeros(3)
                np.testing.assert_allclose(y[k, :, i, j], want, rtol=1e-4, atol=1e-5)
