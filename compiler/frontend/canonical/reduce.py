"""Canonical forms of the ops that reduce along axes: Softmax / LogSoftmax / Hardmax (before opset 13
on the input flattened to 2-D at ``axis``, which becomes Reshape + op + Reshape), the Reduce* ops
(axes from the attribute or the compile-time input, sorted and normalized; ``noop_with_empty_axes``
becomes Identity) and ArgMax / ArgMin. See docs/ops.md.
"""

from __future__ import annotations

import numpy as np

from compiler.frontend.canonical.context import CanonContext
from compiler.frontend.canonical.context import ints
from compiler.frontend.canonical.registry import register
from compiler.ir.graph import Node

__all__ = ["REDUCE_AXES_AS_INPUT"]


@register("Softmax", "LogSoftmax", "Hardmax")
def _softmax(ctx: CanonContext) -> list[Node]:
    rank = ctx.rank()
    default = -1 if ctx.opset >= 13 else 1
    axis = ctx.axis(int(ctx.attr("axis", default)), rank)
    if ctx.opset >= 13 or axis == rank - 1:
        return [ctx.node(ctx.op_type, ctx.inputs[:1], {"axis": axis})]
    # Before opset 13 the op works on the input flattened to 2-D at `axis`.
    x = ctx.inputs[0]
    out = ctx.outputs[0]
    assert x is not None and x.shape is not None
    flat = (int(np.prod(x.shape[:axis], dtype=np.int64)), int(np.prod(x.shape[axis:], dtype=np.int64)))
    g = ctx.graph
    v_in = g.make_value(ctx.name + "/flat", x.dtype, flat)
    v_out = g.make_value(ctx.name + "/flat_out", x.dtype, flat)
    return [
        ctx.node("Reshape", [x], {"shape": list(flat)}, outputs=[v_in],
                 name=g.unique_name(ctx.name + "/flatten")),
        ctx.node(ctx.op_type, [v_in], {"axis": 1}, outputs=[v_out]),
        ctx.node("Reshape", [v_out], {"shape": list(x.shape)}, outputs=[out],
                 name=g.unique_name(ctx.name + "/unflatten")),
    ]


REDUCE_AXES_AS_INPUT = {"ReduceSum": 13}  # the others moved axes to an input in opset 18


@register("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ReduceL1",
          "ReduceSumSquare", "ReduceLogSumExp", "ReduceLogSum")
def _reduce(ctx: CanonContext) -> list[Node]:
    rank = ctx.rank()
    since = REDUCE_AXES_AS_INPUT.get(ctx.op_type, 18)
    if ctx.opset >= since:
        axes_c = ctx.const_input(1, "axes") if len(ctx.inputs) > 1 else None
        axes = ints(axes_c) if axes_c is not None else []
    else:
        axes = ints(ctx.attr("axes", []))
    if not axes:
        if int(ctx.attr("noop_with_empty_axes", 0)):
            return [ctx.node("Identity", ctx.inputs[:1], {})]
        axes = list(range(rank))
    axes = sorted({ctx.axis(a, rank) for a in axes})
    return [ctx.node(ctx.op_type, ctx.inputs[:1], {"axes": axes,
                                                   "keepdims": int(ctx.attr("keepdims", 1))})]


@register("ArgMax", "ArgMin")
def _argmax(ctx: CanonContext) -> list[Node]:
    return [ctx.node(ctx.op_type, ctx.inputs[:1], {
        "axis": ctx.axis(int(ctx.attr("axis", 0)), ctx.rank()),
        "keepdims": int(ctx.attr("keepdims", 1)),
        "select_last_index": int(ctx.attr("select_last_index", 0))})]
