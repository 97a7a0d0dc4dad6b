"""Canonical forms of the quantization ops: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
QLinearMatMul, QLinearConv, ConvInteger and MatMulInteger (see docs/ops.md).

onnx-aot quantizes to the integer types numpy has (int8, uint8, int16, uint16); 2- and 4-bit and
float8 / float4 types are rejected as unsupported. (De)QuantizeLinear resolve their granularity
from the scale's shape and keep ``axis`` (normalized), ``block_size`` (0 = not blocked), the
element type ``to`` and the ``precision`` of the division (QuantizeLinear only). The convolutions
get Conv's resolved attributes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from compiler.frontend.canonical.context import CanonContext
from compiler.frontend.canonical.context import np_dtype_of
from compiler.frontend.canonical.context import shape_of
from compiler.frontend.canonical.conv import resolve_pads
from compiler.frontend.canonical.conv import spatial_dims
from compiler.frontend.canonical.conv import window_attrs
from compiler.frontend.canonical.registry import register
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from runtime.errors import UnsupportedOpError

__all__: list[str] = []

# Element types onnx-aot quantizes to / dequantizes from.
_QUANT_TYPES = frozenset(np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16))


def _dtype(value: Value | None) -> np.dtype:
    assert value is not None and value.dtype is not None
    return value.dtype


def _one_element(shape: tuple[int, ...]) -> bool:
    """A scalar or a 1-element vector: what a per-tensor scale or zero point may be."""
    return len(shape) <= 1 and int(np.prod(shape, dtype=np.int64)) == 1


def _granularity(ctx: CanonContext, x: Value | None, scale: Value | None,
                 zero: Value | None) -> dict[str, int]:
    """``axis`` and ``block_size`` of a (de)quantization, checked against the scale's shape."""
    x_shape, s_shape = shape_of(x), shape_of(scale)
    block = int(ctx.attr("block_size", 0))
    if block < 0:
        raise ctx.error(f"block_size must be positive, got {block}")
    if block == 0 and _one_element(s_shape) and (zero is None or _one_element(shape_of(zero))):
        return {"axis": 0, "block_size": 0}  # per tensor: a scalar or a 1-element scale and zero point
    if zero is not None and shape_of(zero) != s_shape:
        raise ctx.error(f"zero point shape {shape_of(zero)} differs from the scale's {s_shape}")
    axis = ctx.axis(int(ctx.attr("axis", 1)), len(x_shape))
    if block == 0:
        if len(s_shape) != 1 or s_shape[0] != x_shape[axis]:
            raise ctx.error(f"a per-axis scale must have shape ({x_shape[axis]},) for axis {axis}, "
                            f"got {s_shape}")
    else:
        want = tuple(-(-d // block) if k == axis else d for k, d in enumerate(x_shape))
        if s_shape != want:
            raise ctx.error(f"a blocked scale for input {x_shape}, axis {axis}, block_size {block} "
                            f"must have shape {want}, got {s_shape}")
    return {"axis": axis, "block_size": block}


def _quant_type(ctx: CanonContext, dtype: np.dtype) -> str:
    if dtype not in _QUANT_TYPES:
        raise UnsupportedOpError(f"{ctx.describe()}: quantized type {dtype.name} is not supported "
                                 f"(int8, uint8, int16, uint16 are)")
    return dtype.name


@register("QuantizeLinear")
def _quantize(ctx: CanonContext) -> list[Node]:
    x, scale, zero = (list(ctx.inputs) + [None] * 3)[:3]
    if zero is not None:
        to = _dtype(zero)
    elif "output_dtype" in ctx.attrs and int(ctx.attrs["output_dtype"]):
        to = np_dtype_of(int(ctx.attrs["output_dtype"]), ctx.describe())
    else:
        to = np.dtype(np.uint8)
    precision = (np_dtype_of(int(ctx.attrs["precision"]), ctx.describe())
                 if int(ctx.attr("precision", 0)) else _dtype(scale))
    attrs = {**_granularity(ctx, x, scale, zero), "to": _quant_type(ctx, to), "precision": precision.name}
    return [ctx.node("QuantizeLinear", [x, scale, zero], attrs)]


@register("DequantizeLinear")
def _dequantize(ctx: CanonContext) -> list[Node]:
    x, scale, zero = (list(ctx.inputs) + [None] * 3)[:3]
    if _dtype(x) != np.int32:
        _quant_type(ctx, _dtype(x))
    elif zero is not None and (zero.const is None or np.any(zero.const)):
        raise ctx.error("an int32 input takes no zero point (or an all-zero constant one)")
    to = (np_dtype_of(int(ctx.attrs["output_dtype"]), ctx.describe())
          if int(ctx.attr("output_dtype", 0)) else _dtype(scale))
    attrs = {**_granularity(ctx, x, scale, zero), "to": to.name}
    return [ctx.node("DequantizeLinear", [x, scale, zero], attrs)]


@register("DynamicQuantizeLinear")
def _dynamic_quantize(ctx: CanonContext) -> list[Node]:
    return [ctx.node("DynamicQuantizeLinear", ctx.inputs[:1], {})]


@register("QLinearMatMul", "MatMulInteger")
def _quant_matmul(ctx: CanonContext) -> list[Node]:
    for value in ctx.inputs:
        if value is not None and value.dtype is not None and value.dtype.kind in "iu":
            _quant_type(ctx, value.dtype)
    return [ctx.node(ctx.op_type, ctx.inputs, {})]


def _conv_attrs(ctx: CanonContext, w: Value | None) -> dict[str, Any]:
    """Conv's canonical attributes (kernel_shape, strides, pads, dilations, group) for weights ``w``."""
    spatial = spatial_dims(ctx)
    n = len(spatial)
    kernel, strides, dilations = window_attrs(ctx, n, shape_of(w)[2:])
    return {"kernel_shape": kernel, "strides": strides,
            "pads": resolve_pads(ctx, spatial, kernel, strides, dilations),
            "dilations": dilations, "group": int(ctx.attr("group", 1))}


@register("QLinearConv", "ConvInteger")
def _quant_conv(ctx: CanonContext) -> list[Node]:
    w = ctx.inputs[3 if ctx.op_type == "QLinearConv" else 1]
    for value in ctx.inputs:
        dtype = value.dtype if value is not None else None
        if dtype is not None and dtype.kind in "iu" and dtype != np.int32:  # (the bias is int32)
            _quant_type(ctx, dtype)
    return [ctx.node(ctx.op_type, ctx.inputs, _conv_attrs(ctx, w))]
