"""Output types of onnxruntime's ``com.microsoft`` quantized ops, which onnx's shape inference does
not know: the importer asks ``qoperator_types`` where a quantized file carries none
(compiler/frontend/canonical/qoperator.py gives their canonical forms).

Shapes follow onnxruntime's kernels: the binary ops and QLinearWhere broadcast numpy-style, the
unary ops and QLinearSoftmax keep their input's shape, QLinearConcat joins along ``axis``, the pools
follow the ONNX pool rule (``channels_last``: the spatial axes are 1 .. rank-2). Static shapes only;
an op whose inputs have symbolic dims gets no type here (the importer then names the output).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx

from compiler.frontend.canonical.context import onnx_attrs
from compiler.ir.graph import Value
from runtime.kernels.window import pool_out_size
from runtime.kernels.window import same_pads

__all__ = ["MS_DOMAIN", "qoperator_types"]

MS_DOMAIN = "com.microsoft"
Type = tuple[np.dtype, tuple[int, ...]]
Types = dict[str, Type]
_Rule = Callable[[list[Any], dict[str, Any]], Type]


def _broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(d) for d in np.broadcast_shapes(*shapes))


def _first(types: list[Any], attrs: dict[str, Any]) -> Type:
    return types[0]


def _binary(types: list[Any], attrs: dict[str, Any]) -> Type:
    return types[0][0], _broadcast(types[0][1], types[3][1])


def _where(types: list[Any], attrs: dict[str, Any]) -> Type:
    return types[1][0], _broadcast(types[0][1], types[1][1], types[4][1])


def _concat(types: list[Any], attrs: dict[str, Any]) -> Type:
    parts = [t[1] for t in types[2::3]]
    axis = int(attrs["axis"]) % len(parts[0])
    shape = list(parts[0])
    shape[axis] = sum(p[axis] for p in parts)
    return types[2][0], tuple(shape)


def _spatial_axes(rank: int, attrs: dict[str, Any]) -> list[int]:
    return list(range(1, rank - 1)) if int(attrs.get("channels_last", 0)) else list(range(2, rank))


def _global_pool(types: list[Any], attrs: dict[str, Any]) -> Type:
    dtype, shape = types[0]
    axes = _spatial_axes(len(shape), attrs)
    return dtype, tuple(1 if k in axes else d for k, d in enumerate(shape))


def _pool(types: list[Any], attrs: dict[str, Any]) -> Type:
    dtype, shape = types[0]
    axes = _spatial_axes(len(shape), attrs)
    kernel = [int(k) for k in attrs["kernel_shape"]]
    strides = [int(s) for s in attrs.get("strides", [1] * len(kernel))]
    pads = [int(p) for p in attrs.get("pads", [0] * 2 * len(kernel))]
    auto_pad = str(attrs.get("auto_pad", "NOTSET"))
    out = list(shape)
    for j, axis in enumerate(axes):
        begin, end = pads[j], pads[j + len(kernel)]
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            begin, end = same_pads(shape[axis], kernel[j], strides[j], 1, auto_pad == "SAME_UPPER")
        elif auto_pad == "VALID":
            begin = end = 0
        ceil_mode = int(attrs.get("ceil_mode", 0))
        out[axis] = pool_out_size(shape[axis], kernel[j], strides[j], 1, begin, end, ceil_mode)
    return dtype, tuple(out)


_RULES: dict[str, _Rule] = {
    "QLinearAdd": _binary, "QLinearMul": _binary, "QLinearLeakyRelu": _first, "QLinearSigmoid": _first,
    "QLinearSoftmax": _first, "QLinearWhere": _where, "QLinearConcat": _concat,
    "QLinearGlobalAveragePool": _global_pool, "QLinearAveragePool": _pool,
}


def qoperator_types(proto: onnx.NodeProto, inputs: list[Value | None]) -> Types:
    """The (dtype, shape) of ``proto``'s output for a ``com.microsoft`` quantized op with static
    input shapes; {} for any other node (and where the inputs do not fit the rule)."""
    rule = _RULES.get(proto.op_type) if proto.domain == MS_DOMAIN else None
    if rule is None or not proto.output or any(v is not None and (v.is_symbolic or v.shape is None)
                                               for v in inputs):
        return {}
    types = [(v.dtype, tuple(int(d) for d in v.shape)) if v is not None and v.shape is not None else None
             for v in inputs]
    try:
        dtype, shape = rule(types, onnx_attrs(proto))
    except (IndexError, KeyError, TypeError, ValueError):
        return {}  # (the canonical form names what is wrong)
    return {proto.output[0]: (np.dtype(dtype), shape)}
