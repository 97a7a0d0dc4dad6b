"""The canonicalizer registry: ``register`` per ONNX op type, ``canonicalize`` dispatches a node to
its canonicalizer (ops without one keep their ONNX attributes), and ``COMPILE_TIME_INPUTS``, the
node inputs whose values the compiler must know."""

from __future__ import annotations

from collections.abc import Callable

from compiler.frontend.canonical.context import CanonContext
from compiler.ir.graph import Node

__all__ = ["COMPILE_TIME_INPUTS", "Canonicalizer", "canonical_op_types", "canonicalize", "register"]

Canonicalizer = Callable[[CanonContext], list[Node]]
_REGISTRY: dict[str, Canonicalizer] = {}

# Node inputs whose *values* are needed at compile time (shapes, axes, pads, sizes, k, ...), by
# input index, for every opset that has them. A canonicalizer reads them with const_input; the
# backend and ``compile --bind`` use this table to find graph inputs to specialize on.
_REDUCE_OPS = ("ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceL1 ReduceL2 ReduceLogSum "
               "ReduceLogSumExp ReduceSumSquare").split()
COMPILE_TIME_INPUTS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "ConstantOfShape": (0,), "Range": (0, 1, 2),
    "Slice": (1, 2, 3, 4), "Squeeze": (1,), "Unsqueeze": (1,), "Split": (1,), "Pad": (1, 2, 3),
    "Resize": (1, 2, 3), "Upsample": (1,), "TopK": (1,), "OneHot": (1,),
    "CenterCropPad": (1,), "Trilu": (1,), "CumSum": (1,), "CumProd": (1,), "Col2Im": (1, 2), "DFT": (1, 2),
    "STFT": (1, 3), "HannWindow": (0,), "HammingWindow": (0,), "BlackmanWindow": (0,),
    "MelWeightMatrix": (0, 1, 2, 3, 4), "AffineGrid": (1,), "EyeLike": (),
    "MaxUnpool": (2,), "Loop": (0, 1),  # a trip count and a first condition decide the unrolling
    **{op: (1,) for op in _REDUCE_OPS},
}


def register(*op_types: str) -> Callable[[Canonicalizer], Canonicalizer]:
    def deco(fn: Canonicalizer) -> Canonicalizer:
        for op in op_types:
            _REGISTRY[op] = fn
        return fn

    return deco


def canonical_op_types() -> frozenset[str]:
    """ONNX op types with a canonicalizer, those of other domains as their kinds
    (``"com.microsoft.QLinearAdd"``; they may become other kinds, see docs/ops.md)."""
    return frozenset(_REGISTRY)


def canonicalize(ctx: CanonContext) -> list[Node]:
    """The canonical nodes of ``ctx``'s node: its canonicalizer's, registered by op type for the
    default domain and as ``"<domain>.<op type>"`` (its kind) for another (``com.microsoft``)."""
    domain = "" if ctx.proto.domain in ("", "ai.onnx") else ctx.proto.domain
    fn = _REGISTRY.get(f"{domain}.{ctx.op_type}" if domain else ctx.op_type)
    if fn is None:
        return [ctx.node(ctx.op_type, ctx.inputs, ctx.attrs, domain=domain)]
    return fn(ctx)
