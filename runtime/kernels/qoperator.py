"""Reference kernels of the 8-bit integer ops (runtime/contract.py; docs/ops.md, "Integer ops"):
QBinary, QLookup, QAveragePool, QGlobalAveragePool and QSoftmax, which onnxruntime's ``com.microsoft``
quantized ops (compiler/frontend/canonical/qoperator.py) import to, and the tables they and the
compiler build.

Each follows onnxruntime's CPU kernel where onnxruntime defines the op, rounding float32 where it
rounds float32 (``rint``: half to even) and summing in its order, so the C kernels
(compiler/providers/c/qoperator.py) can match these bit for bit at any thread count. Scales are
float32 scalars (one element), zero points scalars of the quantized type (an omitted one is 0).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

from runtime.contract import Q_AVERAGE_POOL
from runtime.contract import Q_BINARY
from runtime.contract import Q_CHANNEL_LOOKUP
from runtime.contract import Q_GLOBAL_AVERAGE_POOL
from runtime.contract import Q_LOOKUP
from runtime.contract import Q_SOFTMAX
from runtime.contract import Q_TABLE_ADD
from runtime.kernels.common import fill_optional
from runtime.kernels.common import finish
from runtime.kernels.registry import OutputSpec
from runtime.kernels.registry import register

__all__ = ["binary_codes", "binary_ratios", "dequantize_table", "lookup_table", "softmax_exp_table",
           "softmax_factor"]

_F32 = np.float32


def _scalar(value: Any, dtype: Any = np.float32) -> Any:
    """A scale or zero point as a numpy scalar of ``dtype`` (an omitted zero point: 0)."""
    if value is None:
        return np.dtype(dtype).type(0)
    return np.asarray(value).reshape(-1)[0].astype(dtype)


def _saturate(y: Any, dtype: Any) -> Any:
    info = np.iinfo(dtype)
    return np.clip(y, info.min, info.max).astype(dtype)


def _codes(dtype: Any) -> Any:
    """The 256 values of an 8-bit type, in the order of their bytes (0x00 .. 0xff)."""
    return np.arange(256, dtype=np.uint8).view(np.dtype(dtype))


def dequantize_table(x_dtype: Any, x_scale: Any, x_zero: Any) -> Any:
    """float32 ``x_scale * (x - x_zero)`` for each byte of ``x_dtype`` (onnxruntime's dequantization:
    the integer difference, then one float32 product)."""
    diff = _codes(x_dtype).astype(np.int32) - int(_scalar(x_zero, np.int32))
    return (_scalar(x_scale) * diff.astype(_F32)).astype(_F32)


def lookup_table(fn: Callable[[Any], Any], x_dtype: Any, x_scale: Any, x_zero: Any,
                 y_scale: Any, y_zero: Any, y_dtype: Any) -> Any:
    """The QLookup table of ``fn`` between two quantizations: entry b is
    ``saturate(rint(fn(dequantized) / y_scale) + y_zero)`` for the input whose byte is b, with the
    dequantized value, ``fn``'s result (cast to float32) and the division in float32, as
    onnxruntime's ``QlinearBuildLookupTable`` computes them. ``fn`` takes and returns arrays."""
    values = np.asarray(fn(dequantize_table(x_dtype, x_scale, x_zero))).astype(_F32)
    q = np.rint(values / _scalar(y_scale)).astype(np.float64) + float(_scalar(y_zero, np.int32))
    return _saturate(np.where(np.isnan(q), 0.0, q), y_dtype)


def binary_ratios(op: str, a_scale: Any, b_scale: Any, c_scale: Any) -> tuple[float, float]:
    """QBinary's float32 rescale factors: Add's (a_scale / c_scale, b_scale / c_scale), Mul's
    (a_scale * b_scale / c_scale, 0), each rounded to float32 as onnxruntime forms them."""
    sa, sb, sc = _scalar(a_scale), _scalar(b_scale), _scalar(c_scale)
    if op == "Add":
        return float(sa / sc), float(sb / sc)
    return float((sa * sb) / sc), 0.0


def binary_codes(op: str, a: Any, b: Any, params: list[Any], dtype: Any) -> Any:
    """QBinary's codes of ``a`` and ``b`` (broadcasting), ``params`` [a_scale, a_zero, b_scale, b_zero,
    c_scale, c_zero] (zero points None or of ``dtype``)."""
    za, zb, zc = (int(_scalar(z, np.int32)) for z in params[1::2])
    ra, rb = binary_ratios(op, params[0], params[2], params[4])
    da, db = a.astype(np.int32) - za, b.astype(np.int32) - zb
    if op == "Add":  # exact: every product of an 8-bit difference and a float32 fits float64
        v = (ra * da.astype(np.float64) + rb * db.astype(np.float64)) + zc
    else:  # onnxruntime's x86 kernel: the exact product, scaled in float32, the zero point added in float32
        v = ((da * db).astype(_F32) * _F32(ra) + _F32(zc)).astype(np.float64)
    return _saturate(np.rint(v), dtype)


@register(Q_BINARY)
def qbinary_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """QBinary (op "Add" / "Mul"): A and B (broadcasting) requantized to C's scale and zero point."""
    a, a_scale, a_zero, b, b_scale, b_zero, c_scale, c_zero = fill_optional(Q_BINARY, inputs, 8)
    params = [a_scale, a_zero, b_scale, b_zero, c_scale, c_zero]
    return finish(xp, Q_BINARY, [binary_codes(str(attrs["op"]), a, b, params, outputs[0][1])], outputs)


@register(Q_LOOKUP)
def qlookup_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """QLookup: ``table[byte of x]``."""
    x, table = inputs
    return finish(xp, Q_LOOKUP, [table.reshape(-1)[x.astype(np.uint8)]], outputs)


@register(Q_CHANNEL_LOOKUP)
def qchannel_lookup_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any],
                           outputs: list[OutputSpec]) -> list[Any]:
    """QChannelLookup: ``table[c, byte of x]`` for the elements of channel c (axis 1)."""
    x, table = inputs
    channel = np.arange(x.shape[1]).reshape((1, -1) + (1,) * (x.ndim - 2))
    y = table.reshape(x.shape[1], 256)[channel, x.astype(np.uint8)]
    return finish(xp, Q_CHANNEL_LOOKUP, [y], outputs)


@register(Q_TABLE_ADD)
def qtable_add_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any],
                      outputs: list[OutputSpec]) -> list[Any]:
    """QTableAdd: the float32 sum of A's and B's channel rows (``TA[c, byte of a] + TB[c, byte of
    b]``, the float chains of a residual Add), quantized as QuantizeLinear does (the float32
    quotient rounded half to even, the zero point added, saturated), then clipped to [qmin, qmax].
    The optional forms state the tables as arithmetic (for the C kernel); the tables decide."""
    a, ta, b, tb, scale, zero = fill_optional(Q_TABLE_ADD, inputs, 8)[:6]  # the forms: the tables again
    channel = np.arange(a.shape[1]).reshape((1, -1) + (1,) * (a.ndim - 2))
    c = ta.shape[0]
    v = ta.reshape(c, 256)[channel, a.astype(np.uint8)] + tb.reshape(c, 256)[channel, b.astype(np.uint8)]
    q = np.rint(v.astype(_F32) / _scalar(scale)).astype(np.float64)
    q = q + (0.0 if zero is None else float(_scalar(zero, np.int32)))
    q = np.clip(np.where(np.isnan(q), 0.0, q), int(attrs["qmin"]), int(attrs["qmax"]))
    return finish(xp, Q_TABLE_ADD, [q.astype(outputs[0][1])], outputs)


def _pool_sum(xf: Any, kernel: list[int], strides: list[int], begins: list[int], out: tuple[int, ...]) -> Any:
    """float32 window sums of the (N, C, *spatial) ``xf``, each window's in-image cells added in
    row-major order (a cell outside the image adds nothing), and the count of those cells."""
    spatial = xf.shape[2:]
    acc = np.zeros(xf.shape[:2] + out, _F32)
    count = np.zeros(out, np.int64)
    for offsets in itertools.product(*(range(k) for k in kernel)):
        pos = [np.arange(n) * s - b + o for n, s, b, o in zip(out, strides, begins, offsets, strict=True)]
        ok = [(p >= 0) & (p < size) for p, size in zip(pos, spatial, strict=True)]
        index = np.ix_(*[np.clip(p, 0, size - 1) for p, size in zip(pos, spatial, strict=True)])
        valid = np.ones((), bool)
        for axis, mask in enumerate(ok):
            shape = [1] * len(out)
            shape[axis] = -1
            valid = valid & mask.reshape(shape)
        acc = acc + np.where(valid, xf[(slice(None), slice(None)) + index], _F32(0))
        count = count + valid
    return acc, count


@register(Q_AVERAGE_POOL)
def qaverage_pool_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any],
                         outputs: list[OutputSpec]) -> list[Any]:
    """QAveragePool (NCHW, no dilations): onnxruntime's float pool of the dequantized input, each
    sum divided by the window's in-image cells (count_include_pad: by the kernel's size) and
    quantized as ``rint(mean / y_scale + y_zero)`` in float32."""
    x, x_scale, x_zero, y_scale, y_zero = fill_optional(Q_AVERAGE_POOL, inputs, 5)
    kernel = [int(k) for k in attrs["kernel_shape"]]
    out_shape, dtype = outputs[0]
    xf = dequantize_table(x.dtype, x_scale, x_zero)[x.astype(np.uint8)]
    strides, begins = [int(s) for s in attrs["strides"]], [int(p) for p in attrs["pads"][:len(kernel)]]
    acc, count = _pool_sum(xf, kernel, strides, begins, tuple(int(d) for d in out_shape[2:]))
    if int(attrs["count_include_pad"]):
        count = np.full_like(count, int(np.prod(kernel)))
    mean = acc / count.astype(_F32)
    q = np.rint(mean / _scalar(y_scale) + _F32(_scalar(y_zero, np.int32)))
    return finish(xp, Q_AVERAGE_POOL, [_saturate(q, dtype)], outputs)


@register(Q_GLOBAL_AVERAGE_POOL)
def qglobal_average_pool_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any],
                                outputs: list[OutputSpec]) -> list[Any]:
    """QGlobalAveragePool: onnxruntime's integer mean, ``(sum(x) - size * x_zero)`` over the
    spatial axes (1 .. rank-2 with channels_last, else 2 ..), times the float32 factor
    ``x_scale / (y_scale * size)``, the product rounded to float32, then to an integer."""
    x, x_scale, x_zero, y_scale, y_zero = fill_optional(Q_GLOBAL_AVERAGE_POOL, inputs, 5)
    axes = tuple(range(1, x.ndim - 1)) if int(attrs["channels_last"]) else tuple(range(2, x.ndim))
    size = int(np.prod([x.shape[a] for a in axes]))
    acc = x.astype(np.int64).sum(axis=axes, keepdims=True) - size * int(_scalar(x_zero, np.int32))
    factor = _scalar(x_scale) / (_scalar(y_scale) * _F32(size))
    v = np.rint(acc.astype(_F32) * factor).astype(np.float64) + int(_scalar(y_zero, np.int32))
    return finish(xp, Q_GLOBAL_AVERAGE_POOL, [_saturate(v, outputs[0][1])], outputs)


def softmax_exp_table(x_scale: Any, length: int) -> Any:
    """QSoftmax's float32 table ``e[k]`` for an input ``k`` steps below its row's maximum, over rows
    of ``length``: onnxruntime's ``exp((k' - 255 + shift) * x_scale)`` at ``k' = 255 - k`` in
    float64, where ``shift = max(0, log(FLT_MAX / length) - 5) / x_scale`` keeps a row's sum finite."""
    s = float(_scalar(x_scale))
    shift = max(0.0, float(np.log(np.float64(np.finfo(_F32).max / _F32(length)))) - 5.0) / s
    i = 255.0 - np.arange(256, dtype=np.float64)
    return np.exp((i - 255.0 + shift) * s).astype(_F32)


def softmax_factor(y_scale: Any) -> Any:
    """QSoftmax's output factor: ``floor(1 / y_scale)`` in float32 (onnxruntime's)."""
    return np.floor(_F32(1) / _scalar(y_scale)).astype(_F32)


@register(Q_SOFTMAX)
def qsoftmax_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any],
                    outputs: list[OutputSpec]) -> list[Any]:
    """QSoftmax over the last axis: ``e = table[max - x]`` (``softmax_exp_table``), the row's float32
    sum in order, ``saturate(rint(e * factor / sum) + y_zero)`` (onnxruntime 1.32's results: an
    int8 result above 127 is 127)."""
    x, x_scale, y_scale, y_zero = fill_optional(Q_SOFTMAX, inputs, 4)
    dtype = np.dtype(outputs[0][1])
    e = softmax_exp_table(x_scale, int(x.shape[-1]))[x.max(axis=-1, keepdims=True).astype(np.int32) - x]
    total = np.cumsum(e, axis=-1, dtype=_F32)[..., -1:]  # (cumsum adds in order: float32 as onnxruntime)
    q = np.rint((e * softmax_factor(y_scale)) / total).astype(np.int64) + int(_scalar(y_zero, np.int32))
    return finish(xp, Q_SOFTMAX, [_saturate(q, dtype)], outputs)
