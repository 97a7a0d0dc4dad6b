"""Canonical forms of onnxruntime's ``com.microsoft`` quantized ops (what its quantizer writes with
``quant_format=QOperator``, beside ONNX's QLinearConv / QLinearMatMul), as the 8-bit integer ops of
runtime/contract.py (docs/ops.md, "Integer ops"), with onnxruntime's semantics:

- QLinearAdd / QLinearMul -> QBinary (op "Add" / "Mul");
- QLinearLeakyRelu / QLinearSigmoid -> QLookup, the 256-entry table computed here by
  ``lookup_table`` (onnxruntime builds the same table; its sigmoid is MLAS's approximation, ours
  the float64 logistic rounded to float32, so a table entry may differ by one step);
- QLinearConcat / QLinearWhere -> a QLookup requantizing each input whose scale or zero point
  differs from the output's, then Concat / Where;
- QLinearAveragePool -> QAveragePool (channels_last: between Transposes), or QGlobalAveragePool
  where the window is the whole image without pads (onnxruntime's own choice);
- QLinearGlobalAveragePool -> QGlobalAveragePool;
- QLinearSoftmax -> QSoftmax over the last axis, between Reshapes (``opset`` < 13: the axes from
  ``axis`` on as one) or Transposes (another axis).

Scales and zero points must be one element each (onnxruntime's rule); those a table is built from
must be constants. Output types come from compiler/frontend/qoperator_shapes.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from compiler.frontend.canonical.context import CanonContext
from compiler.frontend.canonical.context import shape_of
from compiler.frontend.canonical.conv import check_output
from compiler.frontend.canonical.conv import resolve_pads
from compiler.frontend.canonical.conv import window_attrs
from compiler.frontend.canonical.registry import register
from compiler.frontend.qoperator_shapes import MS_DOMAIN
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from runtime.contract import AOT_DOMAIN
from runtime.errors import UnsupportedOpError
from runtime.kernels.qoperator import lookup_table
from runtime.kernels.window import pool_out_size

__all__: list[str] = []

_EIGHT_BIT = frozenset({np.dtype(np.int8), np.dtype(np.uint8)})
_F32 = np.float32


def _ms(*ops: str) -> tuple[str, ...]:
    return tuple(f"{MS_DOMAIN}.{op}" for op in ops)


def _inputs(ctx: CanonContext, count: int) -> list[Value | None]:
    return (list(ctx.inputs) + [None] * count)[:count]


def _check(ctx: CanonContext, data: list[int], params: list[int]) -> None:
    """Inputs ``data`` 8-bit integers of one type, inputs ``params`` (scales, zero points) one element."""
    values = _inputs(ctx, max(data + params) + 1)
    dtypes = {v.dtype for k in data if (v := values[k]) is not None}
    if not dtypes <= _EIGHT_BIT or len(dtypes) != 1:
        names = ", ".join(sorted(str(d) for d in dtypes))
        raise UnsupportedOpError(f"{ctx.describe()}: quantized inputs of type {names} (int8 or uint8, "
                                 f"one of them, are supported)")
    for k in params:
        value = values[k]
        if value is not None and int(np.prod(shape_of(value))) != 1:
            raise ctx.error(f"input {k} ({value.name!r}) must be a scalar or a 1-element tensor "
                            f"(per-tensor quantization), got shape {list(shape_of(value))}")


def _const(ctx: CanonContext, i: int, what: str) -> np.ndarray | None:
    value = ctx.inputs[i] if i < len(ctx.inputs) else None
    return None if value is None else ctx.const_input(i, what)


def _aot(ctx: CanonContext, op: str, inputs: list[Value | None], attrs: dict[str, Any],
         out: Value | None = None) -> Node:
    name = ctx.name if out is None else ctx.graph.unique_name(f"{ctx.name}/{op}")
    outputs = [out] if out is not None else None
    return ctx.node(op, inputs, attrs, outputs=outputs, domain=AOT_DOMAIN, name=name)


def _lookup(ctx: CanonContext, x: Value, table: np.ndarray, out: Value | None = None) -> Node:
    """A QLookup of ``x`` through ``table`` into ``out`` (default: the node's output)."""
    const = ctx.graph.add_constant(f"{ctx.name}/table", table)
    return _aot(ctx, "QLookup", [x, const], {}, out)


@register(*_ms("QLinearAdd", "QLinearMul"))
def _binary(ctx: CanonContext) -> list[Node]:
    _check(ctx, [0, 3], [1, 2, 4, 5, 6, 7])
    return [_aot(ctx, "QBinary", _inputs(ctx, 8), {"op": ctx.op_type.removeprefix("QLinear")})]


def _unary(ctx: CanonContext, fn: Callable[[Any], Any]) -> list[Node]:
    _check(ctx, [0], [1, 2, 3, 4])
    x = ctx.inputs[0]
    assert x is not None and x.dtype is not None
    xs, xz, ys, yz = (_const(ctx, i, what) for i, what in enumerate(("X_scale", "X_zero_point", "Y_scale",
                                                                      "Y_zero_point"), start=1))
    table = lookup_table(fn, x.dtype, xs, xz, ys, yz, ctx.outputs[0].dtype)
    return [_lookup(ctx, x, table)]


@register(*_ms("QLinearLeakyRelu"))
def _leaky_relu(ctx: CanonContext) -> list[Node]:
    alpha = _F32(ctx.attr("alpha", 0.01))
    return _unary(ctx, lambda v: np.where(v >= 0, v, alpha * v))


@register(*_ms("QLinearSigmoid"))
def _sigmoid(ctx: CanonContext) -> list[Node]:
    return _unary(ctx, lambda v: 1.0 / (1.0 + np.exp(-v.astype(np.float64))))


def _requantized(ctx: CanonContext, nodes: list[Node], k: int, scale: int, out: tuple[np.ndarray, np.ndarray],
                 what: str) -> Value:
    """Input ``k`` at the output's quantization (``out``: its scale and zero point): itself where
    its scale (input ``scale``) and zero point (``scale + 1``) are the output's, else a QLookup."""
    x = ctx.inputs[k]
    assert x is not None and x.dtype is not None
    params = (_const(ctx, scale, f"{what} scale"), _const(ctx, scale + 1, f"{what} zero point"))
    if all(p is not None and np.array_equal(p.reshape(-1), o.reshape(-1))
           for p, o in zip(params, out, strict=True)):
        return x
    dtype = ctx.outputs[0].dtype
    table = lookup_table(lambda v: v, x.dtype, params[0], params[1], out[0], out[1], dtype)
    value = ctx.graph.make_value(f"{ctx.name}/{what}", dtype, x.shape)
    nodes.append(_lookup(ctx, x, table, value))
    return value


def _out_params(ctx: CanonContext, scale: int) -> tuple[np.ndarray, np.ndarray]:
    found = (_const(ctx, scale, "output scale"), _const(ctx, scale + 1, "output zero point"))
    if found[1] is None:
        raise ctx.error(f"input {scale + 1} (the output's zero point) is required")
    return found[0], found[1]  # type: ignore[return-value]


@register(*_ms("QLinearConcat"))
def _concat(ctx: CanonContext) -> list[Node]:
    count = len(ctx.inputs) - 2
    if count < 3 or count % 3:
        raise ctx.error(f"{len(ctx.inputs)} inputs: expected Y_scale, Y_zero_point and (X, X_scale, "
                        f"X_zero_point) per input")
    data = list(range(2, len(ctx.inputs), 3))
    _check(ctx, data, [k for k in range(len(ctx.inputs)) if k not in data])
    out = _out_params(ctx, 0)
    nodes: list[Node] = []
    parts = [_requantized(ctx, nodes, k, k + 1, out, f"input{k // 3}") for k in data]
    axis = ctx.axis(int(ctx.attr("axis", 0)), len(shape_of(ctx.inputs[2])))
    return [*nodes, ctx.node("Concat", list(parts), {"axis": axis})]


@register(*_ms("QLinearWhere"))
def _where(ctx: CanonContext) -> list[Node]:
    if len(ctx.inputs) != 9 or any(v is None for v in ctx.inputs):
        raise ctx.error("expected 9 inputs: condition, X, X_scale, X_zero_point, Y, Y_scale, Y_zero_point, "
                        "Z_scale, Z_zero_point")
    _check(ctx, [1, 4], [2, 3, 5, 6, 7, 8])
    out = _out_params(ctx, 7)
    nodes: list[Node] = []
    x, y = (_requantized(ctx, nodes, k, k + 1, out, what) for k, what in ((1, "x"), (4, "y")))
    return [*nodes, ctx.node("Where", [ctx.inputs[0], x, y], {})]


@register(*_ms("QLinearGlobalAveragePool"))
def _global_pool(ctx: CanonContext) -> list[Node]:
    _check(ctx, [0], [1, 2, 3, 4])
    if len(shape_of(ctx.inputs[0])) < 3:
        raise ctx.error(f"input needs rank >= 3, got shape {list(shape_of(ctx.inputs[0]))}")
    channels_last = int(ctx.attr("channels_last", 0))
    return [_aot(ctx, "QGlobalAveragePool", _inputs(ctx, 5), {"channels_last": channels_last})]


def _transposed(ctx: CanonContext, x: Value, perm: list[int], what: str,
                out: Value | None = None) -> tuple[Node, Value]:
    """A Transpose of ``x`` by ``perm`` into ``out`` (default: a new value)."""
    shape = tuple(shape_of(x)[p] for p in perm)
    value = out if out is not None else ctx.graph.make_value(f"{ctx.name}/{what}", x.dtype, shape)
    name = ctx.graph.unique_name(f"{ctx.name}/{what}")
    node = ctx.node("Transpose", [x], {"perm": perm}, outputs=[value], name=name)
    return node, value


@register(*_ms("QLinearAveragePool"))
def _average_pool(ctx: CanonContext) -> list[Node]:
    _check(ctx, [0], [1, 2, 3, 4])
    x_shape = shape_of(ctx.inputs[0])
    if len(x_shape) < 3:
        raise ctx.error(f"input needs rank >= 3, got shape {list(x_shape)}")
    channels_last = int(ctx.attr("channels_last", 0))
    spatial = tuple(x_shape[1:-1] if channels_last else x_shape[2:])
    kernel, strides, dilations = window_attrs(ctx, len(spatial))
    if any(d != 1 for d in dilations):
        raise UnsupportedOpError(f"{ctx.describe()}: dilations {dilations} (onnxruntime's kernel has none)")
    pads = resolve_pads(ctx, spatial, kernel, strides, dilations)
    if list(spatial) == kernel and not any(pads):
        return [_aot(ctx, "QGlobalAveragePool", _inputs(ctx, 5), {"channels_last": channels_last})]
    ceil_mode = int(ctx.attr("ceil_mode", 0))
    n = len(spatial)
    want = [pool_out_size(s, k, st, 1, b, e, ceil_mode)
            for s, k, st, b, e in zip(spatial, kernel, strides, pads[:n], pads[n:], strict=True)]
    attrs = {"kernel_shape": kernel, "strides": strides, "pads": pads, "dilations": dilations,
             "ceil_mode": ceil_mode, "count_include_pad": int(ctx.attr("count_include_pad", 0))}
    if not channels_last:
        check_output(ctx, want)
        return [_aot(ctx, "QAveragePool", _inputs(ctx, 5), attrs)]
    rank = len(x_shape)
    to_first = [0, rank - 1, *range(1, rank - 1)]
    into, x = _transposed(ctx, ctx.inputs[0], to_first, "nchw")  # type: ignore[arg-type]
    y = ctx.graph.make_value(f"{ctx.name}/nchw_out", x.dtype, (*shape_of(x)[:2], *want))
    back, _ = _transposed(ctx, y, [0, *range(2, rank), 1], "nhwc", ctx.outputs[0])
    return [into, _aot(ctx, "QAveragePool", [x, *_inputs(ctx, 5)[1:]], attrs, y), back]


@register(*_ms("QLinearSoftmax"))
def _softmax(ctx: CanonContext) -> list[Node]:
    _check(ctx, [0], [1, 2, 3, 4])
    if "opset" not in ctx.attrs:
        raise ctx.error("attribute 'opset' is required (the Softmax opset the op follows)")
    opset = int(ctx.attrs["opset"])
    x = ctx.inputs[0]
    assert x is not None
    shape = shape_of(x)
    axis = ctx.axis(int(ctx.attr("axis", 1 if opset < 13 else -1)), len(shape))
    params = [ctx.inputs[1], *_inputs(ctx, 5)[3:]]
    last = len(shape) - 1
    if opset < 13 and axis != last:  # the axes from `axis` on as one row
        rows = (int(np.prod(shape[:axis])), int(np.prod(shape[axis:])))
        flat = ctx.graph.make_value(f"{ctx.name}/rows", x.dtype, rows)
        soft = ctx.graph.make_value(f"{ctx.name}/softmax", x.dtype, rows)
        into = ctx.node("Reshape", [x], {"shape": list(rows)}, outputs=[flat], name=flat.name)
        back = ctx.node("Reshape", [soft], {"shape": list(shape)}, name=ctx.graph.unique_name(ctx.name))
        return [into, _aot(ctx, "QSoftmax", [flat, *params], {}, soft), back]
    if axis == last:
        return [_aot(ctx, "QSoftmax", [x, *params], {})]
    perm = list(range(len(shape)))
    perm[axis], perm[last] = last, axis
    into, moved = _transposed(ctx, x, perm, "last")
    soft = ctx.graph.make_value(f"{ctx.name}/softmax", x.dtype, shape_of(moved))
    back, _ = _transposed(ctx, soft, perm, "back", ctx.outputs[0])
    return [into, _aot(ctx, "QSoftmax", [moved, *params], {}, soft), back]
