"""Canonical forms of the elementwise ops: the plain unary, binary and variadic ops (and MatMul and
the global pools, which need nothing resolved), Identity, Dropout (inference: Identity, its mask a
constant), and the activations whose attribute defaults are filled in (LeakyRelu, Elu,
HardSigmoid, Gelu, Clip with its bounds from attributes or constant inputs; a bound computed at run
time becomes a comparison and a Where). See docs/ops.md.
"""

from __future__ import annotations

import numpy as np

from compiler.frontend.canonical.context import CanonContext
from compiler.frontend.canonical.context import first_float
from compiler.frontend.canonical.registry import register
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from runtime.symbolic import Expr

__all__ = ["BINARY_PLAIN", "UNARY_PLAIN", "VARIADIC"]

UNARY_PLAIN = (
    "Relu Sigmoid Tanh Exp Log Neg Abs Sqrt Reciprocal Erf Floor Ceil Softplus Sign Sin Cos Not "
    "Softsign Round IsNaN Tan Asin Acos Atan Sinh Cosh Asinh Acosh Atanh Mish HardSwish BitwiseNot"
).split()
BINARY_PLAIN = ("Add Sub Mul Div Pow Equal Less Greater LessOrEqual GreaterOrEqual And Or Xor Where PRelu "
                "BitwiseAnd BitwiseOr BitwiseXor").split()
VARIADIC = "Sum Max Min Mean".split()


@register(*UNARY_PLAIN, *BINARY_PLAIN, *VARIADIC, "MatMul", "GlobalAveragePool", "GlobalMaxPool")
def _plain(ctx: CanonContext) -> list[Node]:
    return [ctx.node(ctx.op_type, ctx.inputs, {})]


@register("Identity")
def _identity(ctx: CanonContext) -> list[Node]:
    return [ctx.node("Identity", ctx.inputs[:1], {})]


@register("Dropout")
def _dropout(ctx: CanonContext) -> list[Node]:
    # Inference: output = input; the optional mask is all true.
    nodes = [ctx.node("Identity", ctx.inputs[:1], {}, outputs=ctx.outputs[:1])]
    if len(ctx.outputs) > 1 and ctx.outputs[1].name in ctx.used:
        mask = ctx.outputs[1]
        assert mask.shape is not None
        assert mask.dtype is not None  # bool since opset 10, the input's type before
        nodes.append(ctx.node("ConstantOfShape", [], {"shape": list(mask.shape), "value": 1,
                                                      "dtype": mask.dtype.name},
                              outputs=[mask], name=ctx.graph.unique_name(ctx.name + "/mask")))
    return nodes


@register("LeakyRelu")
def _leaky(ctx: CanonContext) -> list[Node]:
    return [ctx.node("LeakyRelu", ctx.inputs, {"alpha": float(ctx.attr("alpha", 0.01))})]


@register("Elu")
def _elu(ctx: CanonContext) -> list[Node]:
    return [ctx.node("Elu", ctx.inputs, {"alpha": float(ctx.attr("alpha", 1.0))})]


@register("HardSigmoid")
def _hsig(ctx: CanonContext) -> list[Node]:
    return [ctx.node("HardSigmoid", ctx.inputs, {"alpha": float(ctx.attr("alpha", 0.2)),
                                                 "beta": float(ctx.attr("beta", 0.5))})]


@register("Gelu")
def _gelu(ctx: CanonContext) -> list[Node]:
    return [ctx.node("Gelu", ctx.inputs, {"approximate": str(ctx.attr("approximate", "none"))})]


@register("Clip")
def _clip(ctx: CanonContext) -> list[Node]:
    if ctx.opset < 11:
        lo, hi = float(ctx.attr("min", -np.inf)), float(ctx.attr("max", np.inf))
        return [ctx.node("Clip", ctx.inputs[:1], {"min": min(lo, hi), "max": hi})]
    bounds = [ctx.inputs[i] if i < len(ctx.inputs) else None for i in (1, 2)]
    if all(b is None or b.const is not None for b in bounds):
        lo_c, hi_c = (ctx.const_input(i, what) for i, what in ((1, "min"), (2, "max")))
        lo = first_float(lo_c) if lo_c is not None else -np.inf
        hi = first_float(hi_c) if hi_c is not None else np.inf
        # ONNX: when min > max every value becomes max; with min := max both bounds say so.
        return [ctx.node("Clip", ctx.inputs[:1], {"min": min(lo, hi), "max": hi})]
    return _clip_runtime(ctx, bounds[0], bounds[1])


def _clip_runtime(ctx: CanonContext, lo: Value | None, hi: Value | None) -> list[Node]:
    """Clip with a bound computed at run time (``ReduceMax(x) - 80``): the lower bound, then the
    upper one, each ``Where(x < lo, lo, x)`` (``x > hi`` for the upper), which fuse into elementwise
    chains. That is onnxruntime's Clip lane for lane: a NaN input stays NaN, a NaN bound is no bound
    (a comparison with NaN is false; a constant bound has the same rule), and min > max gives max.
    (ONNX's reference evaluator, np.clip, makes everything NaN under a NaN bound.)"""
    x, out = ctx.inputs[0], ctx.outputs[0]
    assert x is not None and x.shape is not None
    steps: list[tuple[int, Value | None, float]] = []  # (k, the run-time bound or None, a constant)
    for k, (bound, unbounded) in enumerate(((lo, -np.inf), (hi, np.inf))):
        if bound is not None and bound.const is not None:  # the other bound is the run-time one
            value = first_float(ctx.const_input(1 + k, _WHAT[k]))
            if value != unbounded:
                steps.append((k, None, value))
        elif bound is not None:
            steps.append((k, bound, 0.0))
    nodes: list[Node] = []
    current = x
    for n, (k, bound, value) in enumerate(steps):
        into = out if n == len(steps) - 1 else None
        if bound is None:
            attrs = {"min": value, "max": np.inf} if k == 0 else {"min": -np.inf, "max": value}
            current = _clip_step(ctx, nodes, "Clip", [current], attrs, into, _WHAT[k])
            continue
        bound = _scalar_bound(ctx, nodes, bound, len(x.shape), k)
        test = Value(ctx.graph.unique_name(f"{ctx.name}/{_WHAT[k]}_test"), np.dtype(np.bool_), out.shape)
        nodes.append(ctx.node(("Less", "Greater")[k], [current, bound], {}, outputs=[test], name=test.name))
        current = _clip_step(ctx, nodes, "Where", [test, bound, current], {}, into, _WHAT[k])
    return nodes


_WHAT = ("min", "max")


def _clip_step(ctx: CanonContext, nodes: list[Node], op: str, inputs: list[Value | None],
               attrs: dict[str, float], out: Value | None, what: str) -> Value:
    """Append one node of the run-time Clip; its result is ``out`` (the Clip's output) or a new
    value shaped like it."""
    result = out
    if result is None:
        template = ctx.outputs[0]
        result = Value(ctx.graph.unique_name(f"{ctx.name}/{what}"), template.dtype, template.shape)
    name = ctx.name if out is not None else result.name
    nodes.append(ctx.node(op, inputs, attrs, outputs=[result], name=name))
    return result


def _scalar_bound(ctx: CanonContext, nodes: list[Node], bound: Value, rank: int, k: int) -> Value:
    """A run-time bound as a value that broadcasts to ``x`` without changing its shape (ONNX: a
    scalar; a one-element tensor of a higher rank is reshaped)."""
    assert bound.shape is not None
    if any(isinstance(d, Expr) for d in bound.shape) or int(np.prod(bound.shape)) != 1:
        raise ctx.error(f"input {1 + k} ({_WHAT[k]}, {bound.name!r}) must be a scalar "
                        f"(one element); it has shape {list(bound.shape)}")
    if len(bound.shape) <= rank:
        return bound
    flat = Value(ctx.graph.unique_name(f"{ctx.name}/{_WHAT[k]}_scalar"), bound.dtype, (1,) * rank)
    nodes.append(ctx.node("Reshape", [bound], {"shape": [1] * rank}, outputs=[flat], name=flat.name))
    return flat
