"""Canonical forms of the math ops: activations with attributes, Mod, BitShift, IsInf, CastLike,
BitCast, the scans (CumSum, CumProd), Trilu, Gemm, Det, Einsum and the normalizations (Lp, MeanVariance).

Attribute defaults are filled in, axes normalized and the compile-time inputs (a scan's axis,
Trilu's k) moved into attributes; see docs/ops.md.
"""

from __future__ import annotations

import numpy as np

from compiler.frontend.canonical.context import CanonContext
from compiler.frontend.canonical.context import np_dtype_of
from compiler.frontend.canonical.registry import register
from compiler.ir.graph import Node

__all__: list[str] = []

# Selu's defaults, as the ONNX spec writes them (float32 values).
_SELU_ALPHA = 1.67326319217681884765625
_SELU_GAMMA = 1.05070102214813232421875


def _float_attrs(ctx: CanonContext, defaults: dict[str, float]) -> dict[str, float]:
    return {key: float(ctx.attr(key, default)) for key, default in defaults.items()}


@register("Shrink")
def _shrink(ctx: CanonContext) -> list[Node]:
    return [ctx.node("Shrink", ctx.inputs[:1], _float_attrs(ctx, {"bias": 0.0, "lambd": 0.5}))]


@register("ThresholdedRelu", "Celu", "Swish")
def _alpha_one(ctx: CanonContext) -> list[Node]:
    return [ctx.node(ctx.op_type, ctx.inputs[:1], _float_attrs(ctx, {"alpha": 1.0}))]


@register("Selu")
def _selu(ctx: CanonContext) -> list[Node]:
    attrs = _float_attrs(ctx, {"alpha": _SELU_ALPHA, "gamma": _SELU_GAMMA})
    return [ctx.node("Selu", ctx.inputs[:1], attrs)]


@register("Mod")
def _mod(ctx: CanonContext) -> list[Node]:
    fmod = int(ctx.attr("fmod", 0))
    if fmod not in (0, 1):
        raise ctx.error(f"fmod must be 0 or 1, got {fmod}")
    return [ctx.node("Mod", ctx.inputs[:2], {"fmod": fmod})]


@register("BitShift")
def _bitshift(ctx: CanonContext) -> list[Node]:
    direction = str(ctx.attr("direction", ""))
    if direction not in ("LEFT", "RIGHT"):
        raise ctx.error(f"direction must be 'LEFT' or 'RIGHT', got {direction!r}")
    return [ctx.node("BitShift", ctx.inputs[:2], {"direction": direction})]


@register("IsInf")
def _isinf(ctx: CanonContext) -> list[Node]:
    return [ctx.node("IsInf", ctx.inputs[:1], {
        "detect_negative": int(ctx.attr("detect_negative", 1)),
        "detect_positive": int(ctx.attr("detect_positive", 1))})]


@register("CastLike")
def _cast_like(ctx: CanonContext) -> list[Node]:
    # Only the `like` input's element type matters: the node becomes a Cast.
    like = ctx.inputs[1]
    assert like is not None and like.dtype is not None
    return [ctx.node("Cast", ctx.inputs[:1], {"to": like.dtype.name})]


@register("BitCast")
def _bitcast(ctx: CanonContext) -> list[Node]:
    x = ctx.inputs[0]
    assert x is not None and x.dtype is not None
    if "to" not in ctx.attrs:
        raise ctx.error("to is required")
    to = np_dtype_of(int(ctx.attrs["to"]), ctx.describe())
    if to.itemsize != x.dtype.itemsize:
        raise ctx.error(f"cannot reinterpret {x.dtype.name} ({8 * x.dtype.itemsize} bits) as "
                        f"{to.name} ({8 * to.itemsize} bits)")
    return [ctx.node("BitCast", ctx.inputs[:1], {"to": to.name})]


@register("CumSum", "CumProd")
def _scan(ctx: CanonContext) -> list[Node]:
    axis_c = ctx.const_input(1, "axis")
    if axis_c is None or np.asarray(axis_c).size != 1:
        raise ctx.error("axis must be a single integer")
    axis = ctx.axis(int(np.asarray(axis_c).reshape(-1)[0]), ctx.rank())
    return [ctx.node(ctx.op_type, ctx.inputs[:1], {"axis": axis,
                                                   "exclusive": int(ctx.attr("exclusive", 0)),
                                                   "reverse": int(ctx.attr("reverse", 0))})]


@register("Trilu")
def _trilu(ctx: CanonContext) -> list[Node]:
    if ctx.rank() < 2:
        raise ctx.error(f"input needs rank >= 2, got rank {ctx.rank()}")
    k_c = ctx.const_input(1, "k")
    if k_c is not None and np.asarray(k_c).size != 1:
        raise ctx.error("k must be a single integer")
    k = int(np.asarray(k_c).reshape(-1)[0]) if k_c is not None else 0
    return [ctx.node("Trilu", ctx.inputs[:1], {"upper": int(ctx.attr("upper", 1)), "k": k})]


@register("Det")
def _det(ctx: CanonContext) -> list[Node]:
    x = ctx.inputs[0]
    assert x is not None and x.shape is not None
    if len(x.shape) < 2 or x.shape[-1] != x.shape[-2]:
        raise ctx.error(f"input must be square matrices [*, M, M], got shape {x.shape}")
    return [ctx.node("Det", ctx.inputs[:1], {})]


@register("Einsum")
def _einsum(ctx: CanonContext) -> list[Node]:
    if "equation" not in ctx.attrs:
        raise ctx.error("equation is required")
    equation = "".join(str(ctx.attrs["equation"]).split())
    if not equation:
        raise ctx.error("equation is empty")
    return [ctx.node("Einsum", ctx.inputs, {"equation": equation})]


@register("LpNormalization")
def _lp_normalization(ctx: CanonContext) -> list[Node]:
    p = int(ctx.attr("p", 2))
    if p not in (1, 2):
        raise ctx.error(f"p must be 1 or 2, got {p}")
    axis = ctx.axis(int(ctx.attr("axis", -1)), ctx.rank())
    return [ctx.node("LpNormalization", ctx.inputs[:1], {"axis": axis, "p": p})]


@register("MeanVarianceNormalization")
def _mvn(ctx: CanonContext) -> list[Node]:
    rank = ctx.rank()
    axes = sorted({ctx.axis(int(a), rank) for a in ctx.attr("axes", [0, 2, 3])})
    return [ctx.node("MeanVarianceNormalization", ctx.inputs[:1], {"axes": axes})]


@register("Gemm")
def _gemm(ctx: CanonContext) -> list[Node]:
    return [ctx.node("Gemm", ctx.inputs[:3], {"alpha": float(ctx.attr("alpha", 1.0)),
                                              "beta": float(ctx.attr("beta", 1.0)),
                                              "transA": int(ctx.attr("transA", 0)),
                                              "transB": int(ctx.attr("transB", 0))})]
