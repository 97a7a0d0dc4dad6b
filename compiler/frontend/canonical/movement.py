"""Canonical forms of the shape and data-movement ops: Reshape (and Flatten, Squeeze, Unsqueeze, which
become it), Expand, Concat, Transpose, Gather, Cast, ConstantOfShape, Shape, Slice, Split, Pad,
Tile. Targets that ONNX gives as inputs (shapes, starts/ends, pads, repeats) become attributes
from their compile-time constants, axes are normalized and slice bounds clamped. See docs/ops.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from compiler.frontend.canonical.context import CanonContext
from compiler.frontend.canonical.context import first_float
from compiler.frontend.canonical.context import ints
from compiler.frontend.canonical.context import np_dtype_of
from compiler.frontend.canonical.registry import register
from compiler.frontend.probing import may_be_equal
from compiler.frontend.shape_arith import tight_bounds
from compiler.ir.graph import AOT_DOMAIN
from compiler.ir.graph import Node
from runtime.contract import SLICE_AT
from runtime.contract import op_name
from runtime.symbolic import Dim
from runtime.symbolic import is_symbolic
from runtime.symbolic import max_
from runtime.symbolic import min_

__all__: list[str] = []


@register("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def _reshape(ctx: CanonContext) -> list[Node]:
    out, x = ctx.outputs[0], ctx.inputs[0]
    assert out.shape is not None and x is not None and x.shape is not None
    if x.size != out.size and not may_be_equal(x.size, out.size, ctx.graph.symbols):
        # (a shape the model declares for another input size, say)
        raise ctx.error(f"cannot reshape {tuple(x.shape)} ({x.size:,} elements) into {tuple(out.shape)} "
                        f"({out.size:,} elements); check the --shape sizes")
    if x.size != out.size:  # equal at some sizes in the ranges: those are the ones the model takes
        ctx.graph.assumptions.append((ctx.name, x.size, out.size))
    return [ctx.node("Reshape", ctx.inputs[:1], {"shape": list(out.shape)})]


@register("Expand")
def _expand(ctx: CanonContext) -> list[Node]:
    out = ctx.outputs[0]
    assert out.shape is not None
    return [ctx.node("Expand", ctx.inputs[:1], {"shape": list(out.shape)})]


@register("Concat")
def _concat(ctx: CanonContext) -> list[Node]:
    if "axis" not in ctx.attrs:
        raise ctx.error("axis is required")
    return [ctx.node("Concat", ctx.inputs, {"axis": ctx.axis(int(ctx.attrs["axis"]), ctx.rank())})]


@register("Transpose")
def _transpose(ctx: CanonContext) -> list[Node]:
    rank = ctx.rank()
    perm = ints(ctx.attr("perm", list(range(rank))[::-1]))
    if sorted(perm) != list(range(rank)):
        raise ctx.error(f"perm {perm} is not a permutation of {rank} axes")
    return [ctx.node("Transpose", ctx.inputs[:1], {"perm": perm})]


@register("Gather")
def _gather(ctx: CanonContext) -> list[Node]:
    return [ctx.node("Gather", ctx.inputs[:2], {"axis": ctx.axis(int(ctx.attr("axis", 0)), ctx.rank())})]


@register("Cast")
def _cast(ctx: CanonContext) -> list[Node]:
    dtype = np_dtype_of(int(ctx.attrs["to"]), ctx.describe())
    return [ctx.node("Cast", ctx.inputs[:1], {"to": dtype.name})]


@register("ConstantOfShape")
def _constant_of_shape(ctx: CanonContext) -> list[Node]:
    out = ctx.outputs[0]
    assert out.shape is not None and out.dtype is not None
    value = ctx.attr("value", np.zeros(1, np.float32))
    scalar = np.asarray(value).reshape(-1)
    item = scalar[0].item() if scalar.size else 0
    return [ctx.node("ConstantOfShape", [], {"shape": list(out.shape), "value": item,
                                             "dtype": out.dtype.name})]


@register("Shape")
def _shape(ctx: CanonContext) -> list[Node]:
    rank = ctx.rank()
    start = int(ctx.attr("start", 0))
    end = int(ctx.attr("end", rank))
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return [ctx.node("Shape", ctx.inputs[:1], {"start": start, "end": max(end, start)})]


@register("Slice")
def _slice(ctx: CanonContext) -> list[Node]:
    rank = ctx.rank()
    x = ctx.inputs[0]
    assert x is not None and x.shape is not None
    if ctx.opset < 10:
        starts = ints(ctx.attrs["starts"])
        ends = ints(ctx.attrs["ends"])
        axes = ints(ctx.attr("axes", range(len(starts))))
        steps = [1] * len(starts)
    elif any(v is not None and v.const is None for v in ctx.inputs[1:]):
        # starts / ends known only at run time (a loop body's x[i:i+1]; its shape was taken at its
        # first iterations): the reference kernel slices as ONNX says and checks the shape
        return [ctx.node(op_name(SLICE_AT), list(ctx.inputs), {}, domain=AOT_DOMAIN)]
    else:
        starts = _bounds_ints(ctx, ctx.const_input(1, "starts"))
        ends = _bounds_ints(ctx, ctx.const_input(2, "ends"))
        axes_c = ctx.const_input(3, "axes")
        steps_c = ctx.const_input(4, "steps")
        axes = ints(axes_c) if axes_c is not None else list(range(len(starts)))
        steps = ints(steps_c) if steps_c is not None else [1] * len(starts)
    axes = [ctx.axis(a, rank) for a in axes]
    n_starts: list[Dim] = []
    n_ends: list[Dim] = []
    for a, s, e, st in zip(axes, starts, ends, steps, strict=True):
        if st == 0:
            raise ctx.error("slice step 0")
        dim = x.shape[a]
        s = s + dim if _negative(ctx, s) else s
        e = e + dim if _negative(ctx, e) else e
        if st > 0:  # (min_ / max_: a dynamic dim is an expression, runtime/symbolic.py)
            start, end = min_(max_(s, 0), dim), min_(max_(e, 0), dim)
        else:  # the start clamps to a real index; end -1 means "through index 0"
            start, end = min_(max_(s, 0), dim - 1), min_(max_(e, -1), dim - 1)
        n_starts.append(start)
        n_ends.append(end)
    return [ctx.node("Slice", ctx.inputs[:1], {"starts": n_starts, "ends": n_ends, "axes": axes,
                                               "steps": steps})]


def _bounds_ints(ctx: CanonContext, values: Any) -> list[Any]:
    """Slice starts / ends, Pad pads: ints, or expressions of the symbols (``x[:, :seq]`` of a constant in a
    model with dynamic dims, runtime/symbolic.py) kept as they are."""
    return [v if is_symbolic(v) else int(v) for v in np.asarray(values).reshape(-1)]


def _negative(ctx: CanonContext, index: Any) -> bool:
    """A Slice index counts from the end; an expression must be of one sign over the ranges."""
    if not is_symbolic(index):
        return bool(index < 0)
    lo, hi = tight_bounds(index, ctx.graph.symbols)
    if lo < 0 <= hi:
        raise ctx.error(f"slice index {index} is negative for some sizes in the ranges and not for others")
    return hi < 0


@register("Split")
def _split(ctx: CanonContext) -> list[Node]:
    axis = ctx.axis(int(ctx.attr("axis", 0)), ctx.rank())
    sizes = []
    for out in ctx.outputs:
        assert out.shape is not None
        sizes.append(int(out.shape[axis]))
    return [ctx.node("Split", ctx.inputs[:1], {"axis": axis, "split": sizes})]


@register("Pad")
def _pad(ctx: CanonContext) -> list[Node]:
    rank = ctx.rank()
    mode = str(ctx.attr("mode", "constant"))
    if ctx.opset < 11:
        pads = ints(ctx.attr("pads", ctx.attr("paddings", [0] * 2 * rank)))
        value = float(ctx.attr("value", 0.0))
    else:
        pads = _bounds_ints(ctx, ctx.const_input(1, "pads"))  # expressions: pads computed from shapes
        value_c = ctx.const_input(2, "constant_value")
        value = first_float(value_c) if value_c is not None else 0.0
        axes_c = ctx.const_input(3, "axes") if len(ctx.inputs) > 3 else None
        if axes_c is not None:
            axes = [ctx.axis(int(a), rank) for a in axes_c]
            full = [0] * (2 * rank)
            for k, a in enumerate(axes):
                full[a] = pads[k]
                full[a + rank] = pads[k + len(axes)]
            pads = full
    if len(pads) != 2 * rank:
        raise ctx.error(f"pads has {len(pads)} values, expected {2 * rank}")
    return [ctx.node("Pad", ctx.inputs[:1], {"pads": pads, "mode": mode, "value": value})]


@register("Tile")
def _tile(ctx: CanonContext) -> list[Node]:
    return [ctx.node("Tile", ctx.inputs[:1], {"repeats": ints(ctx.const_input(1, "repeats"))})]  # type: ignore[arg-type]
