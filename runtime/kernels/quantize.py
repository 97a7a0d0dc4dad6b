"""Reference kernels of the quantization ops (canonical forms in
compiler/frontend/canonical/quantize.py).

Integer products are computed in float64, which is exact for every product of 8/16-bit values and
every sum of up to 2**21 of them, and lets matmul use BLAS. Rounding is half to even (``rint``)
and results saturate to the target type's range.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from runtime.kernels.common import fill_optional
from runtime.kernels.common import finish
from runtime.kernels.conv import conv
from runtime.kernels.registry import OutputSpec
from runtime.kernels.registry import register

__all__: list[str] = []


def _expand(xp: Any, param: Any, shape: tuple[int, ...], axis: int, block_size: int) -> Any:
    """A scale or zero point broadcastable to an input of ``shape`` (per tensor, axis or block)."""
    if block_size:
        full = xp.repeat(param, block_size, axis=axis)
        return xp.take(full, xp.arange(shape[axis]), axis=axis)
    if param.size == 1:
        return param.reshape(())
    dims = [1] * len(shape)
    dims[axis] = int(param.size)
    return param.reshape(dims)


def _saturate(xp: Any, y: Any, dtype: Any) -> Any:
    """Float values already rounded, clipped to ``dtype``'s range and converted (NaN becomes 0)."""
    info = np.iinfo(dtype)
    return xp.clip(xp.where(xp.isnan(y), 0, y), info.min, info.max).astype(dtype)


@register("QuantizeLinear")
def quantize_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any],
                    outputs: list[OutputSpec]) -> list[Any]:
    """QuantizeLinear: x, y_scale, y_zero_point? -> y = saturate(rint(x / y_scale) + y_zero_point)."""
    x, scale, zero = fill_optional("QuantizeLinear", inputs, 3)
    axis, block = int(attrs["axis"]), int(attrs["block_size"])
    precision = np.dtype(attrs["precision"])
    y = xp.rint(x.astype(precision) / _expand(xp, scale, x.shape, axis, block).astype(precision))
    y = y.astype(np.float64)
    if zero is not None:
        y = y + _expand(xp, zero, x.shape, axis, block).astype(np.float64)
    return finish(xp, "QuantizeLinear", [_saturate(xp, y, np.dtype(attrs["to"]))], outputs)


@register("DequantizeLinear")
def dequantize_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any],
                      outputs: list[OutputSpec]) -> list[Any]:
    """DequantizeLinear: x, x_scale, x_zero_point? -> y = (x - x_zero_point) * x_scale."""
    x, scale, zero = fill_optional("DequantizeLinear", inputs, 3)
    axis, block = int(attrs["axis"]), int(attrs["block_size"])
    compute = np.result_type(np.dtype(attrs["to"]), np.float32)
    shifted = x.astype(np.int64)
    if zero is not None:
        shifted = shifted - _expand(xp, zero, x.shape, axis, block).astype(np.int64)
    y = shifted.astype(compute) * _expand(xp, scale, x.shape, axis, block).astype(compute)
    return finish(xp, "DequantizeLinear", [y], outputs)


@register("DynamicQuantizeLinear")
def dynamic_quantize_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any],
                            outputs: list[OutputSpec]) -> list[Any]:
    """DynamicQuantizeLinear: x -> y (uint8), y_scale, y_zero_point over the range [min(x, 0), max(x, 0)].

    An all-zero input gets scale 1/255 (the ONNX reference's choice; the spec would divide by 0).
    """
    x = inputs[0].astype(np.float32)
    high = xp.maximum(xp.max(x), 0) if x.size else xp.zeros((), np.float32)
    low = xp.minimum(xp.min(x), 0) if x.size else xp.zeros((), np.float32)
    span = xp.where(high == low, np.float32(1), high - low).astype(np.float32)
    scale = (span / np.float32(255)).astype(np.float32)
    zero = xp.rint(xp.clip(-low / scale, 0, 255))
    y = _saturate(xp, xp.rint(x / scale) + zero, np.uint8)
    return finish(xp, "DynamicQuantizeLinear", [y, scale, zero.astype(np.uint8)], outputs)


def _rows(param: Any) -> Any:
    """A 1-D per-row parameter as a column; scalars and N-D parameters broadcast as they are."""
    if param.size == 1:
        return param.reshape(())
    return param.reshape(-1, 1) if param.ndim == 1 else param


def _cols(param: Any) -> Any:
    """A 1-D per-column parameter as a row; scalars and N-D parameters broadcast as they are."""
    if param.size == 1:
        return param.reshape(())
    return param.reshape(1, -1) if param.ndim == 1 else param


def _centered(x: Any, zero: Any | None, shape_zero: Any) -> Any:
    """``x - zero`` in float64 (exact), ``shape_zero`` placing a per-row / per-column zero point."""
    out = x.astype(np.float64)
    return out - shape_zero(zero).astype(np.float64) if zero is not None else out


def _requantize(xp: Any, acc: Any, factor: Any, zero: Any, dtype: Any) -> Any:
    """Integer accumulators ``acc`` scaled by ``factor``, rounded, shifted by ``zero`` and saturated."""
    return _saturate(xp, xp.rint(acc * factor.astype(np.float64)) + zero.astype(np.float64), dtype)


@register("MatMulInteger")
def matmul_integer_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any],
                          outputs: list[OutputSpec]) -> list[Any]:
    """MatMulInteger: A, B, a_zero_point?, b_zero_point? -> (A - a_zp) @ (B - b_zp) in int32."""
    a, b, a_zero, b_zero = fill_optional("MatMulInteger", inputs, 4)
    acc = xp.matmul(_centered(a, a_zero, _rows), _centered(b, b_zero, _cols))
    return finish(xp, "MatMulInteger", [acc.astype(np.int64).astype(np.int32)], outputs)


@register("QLinearMatMul")
def qlinear_matmul_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any],
                          outputs: list[OutputSpec]) -> list[Any]:
    """QLinearMatMul: a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp -> quantized a @ b.

    The rescale factor a_scale * b_scale / y_scale is formed in the scales' own type.
    """
    a, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero = inputs
    acc = xp.matmul(_centered(a, a_zero, _rows), _centered(b, b_zero, _cols))
    factor = _rows(a_scale) * _cols(b_scale) / _cols(y_scale)
    return finish(xp, "QLinearMatMul", [_requantize(xp, acc, factor, _cols(y_zero), y_zero.dtype)], outputs)


def _per_channel(param: Any, rank: int) -> Any:
    """A scalar or per-output-channel (M,) parameter shaped to broadcast over (N, M, *spatial)."""
    if param.size == 1:
        return param.reshape(())
    return param.reshape((1, -1) + (1,) * (rank - 2))


def _filter_param(param: Any, rank: int) -> Any:
    """A scalar or per-output-channel (M,) parameter shaped to broadcast over weights (M, C, *kernel)."""
    if param.size == 1:
        return param.reshape(())
    return param.reshape((-1,) + (1,) * (rank - 1))


@register("ConvInteger")
def conv_integer_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any],
                        outputs: list[OutputSpec]) -> list[Any]:
    """ConvInteger: x, w, x_zero_point?, w_zero_point? -> Conv(x - x_zp, w - w_zp) in int32."""
    x, w, x_zero, w_zero = fill_optional("ConvInteger", inputs, 4)
    xs = _centered(x, x_zero, lambda z: z.reshape(()))
    ws = _centered(w, w_zero, lambda z: _filter_param(z, w.ndim))
    acc = conv(xp, xs, ws, None, attrs)
    return finish(xp, "ConvInteger", [acc.astype(np.int64).astype(np.int32)], outputs)


@register("QLinearConv")
def qlinear_conv_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any],
                        outputs: list[OutputSpec]) -> list[Any]:
    """QLinearConv: x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, B? -> quantized Conv + B."""
    x, x_scale, x_zero, w, w_scale, w_zero, y_scale, y_zero, bias = fill_optional("QLinearConv", inputs, 9)
    xs = _centered(x, x_zero, lambda z: z.reshape(()))
    ws = _centered(w, w_zero, lambda z: _filter_param(z, w.ndim))
    acc = conv(xp, xs, ws, bias.astype(np.float64) if bias is not None else None, attrs)
    factor = x_scale.reshape(()) * _per_channel(w_scale, x.ndim) / y_scale.reshape(())
    y = _requantize(xp, acc, factor, y_zero.reshape(()), y_zero.dtype)
    return finish(xp, "QLinearConv", [y], outputs)
