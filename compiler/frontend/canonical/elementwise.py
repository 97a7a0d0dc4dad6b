"""Canonical forms of the elementwise ops: the plain unary, binary and variadic ops (and MatMul and
the global pools, which need nothing resolved), Identity, Dropout (inference: Identity, its mask a
constant), and the activations whose attribute defaults are filled in (LeakyRelu, Elu,
HardSigmoid, Gelu, Clip with its bounds from attributes or constant inputs). See docs/ops.md.
"""

from __future__ import annotations

import numpy as np

from compiler.frontend.canonical.context import CanonContext
from compiler.frontend.canonical.context import first_float
from compiler.frontend.canonical.registry import register
from compiler.ir.graph import Node

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
        lo = float(ctx.attr("min", -np.inf))
        hi = float(ctx.attr("max", np.inf))
    else:
        lo_c = ctx.const_input(1, "min")
        hi_c = ctx.const_input(2, "max")
        lo = first_float(lo_c) if lo_c is not None else -np.inf
        hi = first_float(hi_c) if hi_c is not None else np.inf
    # ONNX: when min > max every value becomes max; with min := max both bounds say so.
    return [ctx.node("Clip", ctx.inputs[:1], {"min": min(lo, hi), "max": hi})]
