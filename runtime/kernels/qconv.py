"""``onnx_aot.PackedQConv``: QLinearConv / ConvInteger with constant weights packed ahead of time
(``compiler/passes/pack_qconv_weights.py`` makes it; the C kernels in ``templates/c/qconv*.c.j2``
run it), its packing and its reference kernel.

Inputs: X (uint8 / int8, NCHW), Wp (the packed weights), Corr (int32, one per output channel),
Wz? (int32 per output channel) and Scale? (float32 per output channel; absent: ConvInteger's int32
output). Two methods (attribute ``method``):

- "gemm": the integer dot products of unsigned X' and signed W' (what VNNI's ``vpdpbusd`` takes):
  X' = X + 128 for an int8 X (its zero point likewise), W' = W - 128 for a uint8 W. Wp is
  (G, M/G, K4) int8, K = (C/G, KH, KW) in that order padded to K4 (a multiple of 4) with each
  channel's own zero point Wz', so the padded products cancel. With xz' the shifted x zero point
  and the spatial padding read as xz' (a centred zero),
  ``acc = sum(X' W') - Wz'[m] * sum(X') + Corr[m]``, ``Corr = B - xz' * sum(W') + K * xz' * Wz'``
  (Wz absent: all zero) -- equal to ``sum((X - xz)(W - wz)) + B``;
- "depthwise": one input channel per group; Wp (M, KH * KW) int16 holds W - wz (centred), X is
  centred as it is read (padding: zero), ``acc = sum((X - xz) Wp) + Corr`` (Corr: the bias).

The accumulator is an int32 (sums wrap as int32 sums do). With Scale the output is
``clip(rint(acc * Scale[m]) + y_zero, qmin, qmax)`` in float64 (round half to even, exact for
every int32 acc and float32 factor), Scale being ``x_scale * w_scale / y_scale`` in float32, as
the ONNX reference forms it; ``qmin`` / ``qmax`` are the output type's range narrowed by a fused
activation. Lut? then maps each code through its channel's row of a table, and Addend? (codes of
the output's shape and type, with A_scale? A_zero? Addend_scale? Addend_zero? Out_scale? Out_zero?)
adds it to those codes as QBinary's Add does: the QDQ residual Add after a conv in one step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from runtime.contract import PACKED_QCONV
from runtime.kernels.common import fill_optional
from runtime.kernels.common import finish
from runtime.kernels.conv import conv
from runtime.kernels.qoperator import binary_codes
from runtime.kernels.registry import OutputSpec
from runtime.kernels.registry import register

__all__ = ["QConvPack", "pack_qconv", "x_shift"]


def x_shift(dtype: Any) -> int:
    """What the "gemm" method adds to X (and its zero point) to make it unsigned."""
    return 128 if np.dtype(dtype) == np.int8 else 0


class QConvPack:
    """The constant inputs of a PackedQConv: Wp, Corr and Wz (None when every Wz' is 0)."""

    def __init__(self, wp: np.ndarray, corr: np.ndarray, wz: np.ndarray | None) -> None:
        self.wp, self.corr, self.wz = wp, corr, wz


def _per_channel(value: np.ndarray | None, m: int) -> np.ndarray:
    """A scalar or (M,) parameter (absent: 0) as an int64 vector of M."""
    if value is None:
        return np.zeros(m, np.int64)
    return np.broadcast_to(np.asarray(value, np.int64).reshape(-1), (m,)).copy()


def _wrap32(values: np.ndarray) -> np.ndarray:
    return values.astype(np.int64).astype(np.uint32).view(np.int32)


def pack_qconv(method: str, w: np.ndarray, w_zero: np.ndarray | None, x_zero: int, x_dtype: Any,
               bias: np.ndarray | None, group: int) -> QConvPack:
    """Wp, Corr, Wz of a conv with weights ``w`` (M, C/G, *kernel) (see the module docstring)."""
    m = int(w.shape[0])
    wz = _per_channel(w_zero, m)
    b = _per_channel(bias, m)
    if method == "depthwise":
        centred = w.reshape(m, -1).astype(np.int64) - wz[:, None]
        return QConvPack(centred.astype(np.int16), _wrap32(b), None)
    w_shift = 128 if w.dtype == np.uint8 else 0
    ws = w.reshape(m, -1).astype(np.int64) - w_shift
    wzs = wz - w_shift
    xz = int(x_zero) + x_shift(x_dtype)
    k = ws.shape[1]
    k4 = -(-k // 4) * 4
    padded = np.repeat(wzs[:, None], k4, axis=1)
    padded[:, :k] = ws
    corr = b - xz * ws.sum(axis=1) + k * xz * wzs
    wp = padded.astype(np.int8).reshape(group, m // group, k4)
    return QConvPack(wp, _wrap32(corr), wzs.astype(np.int32) if np.any(wzs) else None)


def _no_pads(attrs: dict[str, Any]) -> dict[str, Any]:
    return {**attrs, "pads": [0] * len(attrs["pads"])}


def _gemm_acc(xp: Any, x: Any, wp: Any, wz: Any, attrs: dict[str, Any]) -> Any:
    """sum(X' W') - Wz' sum(X') over each window (float64, exact), X' padded with xz'."""
    group, kernel = int(attrs["group"]), [int(k) for k in attrs["kernel_shape"]]
    shift = x_shift(x.dtype)
    xs = x.astype(np.float64) + shift
    rank = len(kernel)
    pads = [int(p) for p in attrs["pads"]]
    widths = [(0, 0), (0, 0)] + [(pads[d], pads[rank + d]) for d in range(rank)]
    xs = xp.pad(xs, widths, constant_values=float(int(attrs["x_zero"]) + shift))
    cg = int(x.shape[1]) // group
    m = int(wp.shape[0]) * int(wp.shape[1])
    k = cg * int(np.prod(kernel))
    w = wp.reshape(m, -1)[:, :k].astype(np.float64).reshape((m, cg, *kernel))
    acc = conv(xp, xs, w, None, _no_pads(attrs))
    if wz is not None:
        ones = xp.ones((group, cg, *kernel), np.float64)
        sums = conv(xp, xs, ones, None, _no_pads(attrs))
        sums = xp.repeat(sums, m // group, axis=1)
        acc = acc - wz.astype(np.float64).reshape((1, -1) + (1,) * rank) * sums
    return acc


def _depthwise_acc(xp: Any, x: Any, wp: Any, attrs: dict[str, Any]) -> Any:
    kernel = [int(k) for k in attrs["kernel_shape"]]
    xs = x.astype(np.float64) - float(int(attrs["x_zero"]))
    w = wp.astype(np.float64).reshape((int(wp.shape[0]), 1, *kernel))
    return conv(xp, xs, w, None, attrs)


@register(PACKED_QCONV)
def packed_qconv_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any],
                        outputs: list[OutputSpec]) -> list[Any]:
    """PackedQConv: X, Wp, Corr, Wz?, Scale?, Lut?, Addend?, A_scale? .. Out_zero? -> the requantized
    (or int32) convolution; with Lut (M rows of 256 then padding) each requantized code q of channel
    m becomes Lut[m, byte of q]; with Addend (the output's shape) those codes then go through
    QBinary's Add with it (``binary_codes``, its scales and zero points the six inputs after it)."""
    x, wp, corr, wz, scale, lut, addend, *add = fill_optional(PACKED_QCONV, inputs, 13)
    rank = x.ndim
    if attrs["method"] == "depthwise":
        acc = _depthwise_acc(xp, x, wp, attrs)
    else:
        acc = _gemm_acc(xp, x, wp, wz, attrs)
    acc = acc + corr.astype(np.float64).reshape((1, -1) + (1,) * (rank - 2))
    acc32 = acc.astype(np.int64).astype(np.uint32).view(np.int32)
    if scale is None:
        return finish(xp, PACKED_QCONV, [acc32], outputs)
    factor = scale.astype(np.float64).reshape((1, -1) + (1,) * (rank - 2))
    y = xp.rint(acc32.astype(np.float64) * factor) + float(int(attrs["y_zero"]))
    y = xp.clip(y, float(int(attrs["qmin"])), float(int(attrs["qmax"])))
    if lut is not None:
        m = int(corr.size)
        channel = np.arange(m).reshape((1, -1) + (1,) * (rank - 2))
        y = lut.reshape(-1)[: m * 256].reshape(m, 256)[channel, y.astype(np.int64).astype(np.uint8)]
    codes = y.astype(outputs[0][1])
    if addend is not None:  # the residual Add after the conv (compiler/passes/fuse_qconv_add.py)
        codes = binary_codes("Add", codes, np.asarray(addend).reshape(codes.shape), add, outputs[0][1])
    return finish(xp, PACKED_QCONV, [codes], outputs)
