"""Output shapes over symbolic dims by the op's own size rule: the ops whose output has their
inputs' (broadcast) shape, and Slice.

Most nodes of a network are elementwise ops, activations and normalizations: their output shape is
their first input's shape, or the numpy broadcast of all their inputs' shapes. onnx's whole-model
inference loses the symbols after the first Conv, so the import would probe each of them
(``probing.py``); the rule is exact and needs no fit. Where the broadcast is not decided by the
expressions alone (two different expressions on one axis, equal only at some sizes), the probes
take the node as before.

A Slice's extent along an axis is ``max(0, ceil((end - start) / step))`` of its start and end
clamped as ONNX says (``canonical/movement.py`` clamps them the same way): with ends computed from
the shape (``x[..., 1:W-1:5]``, a negative end truncated by an integer Div) the output is a
``min`` / ``max`` of expressions no fit family holds, and a stride of any size is exact.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence

import onnx

from compiler.frontend.canonical.elementwise import BINARY_PLAIN
from compiler.frontend.canonical.elementwise import UNARY_PLAIN
from compiler.frontend.canonical.elementwise import VARIADIC
from compiler.frontend.shape_arith import tight_bounds
from compiler.ir.graph import Value
from runtime.symbolic import Dim
from runtime.symbolic import Expr
from runtime.symbolic import ceildiv
from runtime.symbolic import max_
from runtime.symbolic import min_
from runtime.symbolic import simplify

__all__ = ["same_shape", "slice_shape"]

# output 0 has the numpy broadcast of every input's shape
BROADCAST = frozenset({*BINARY_PLAIN, *VARIADIC, "Mod", "BitShift"} - {"PRelu"})
# output 0 has input 0's shape (the other inputs are per-channel or scalar parameters)
FIRST = frozenset({*UNARY_PLAIN, "Clip", "LeakyRelu", "Elu", "HardSigmoid", "Gelu", "Selu", "Celu",
                   "ThresholdedRelu", "Shrink", "Swish", "IsInf", "PRelu", "Cast", "CastLike", "Identity",
                   "Softmax", "LogSoftmax", "Hardmax", "BatchNormalization", "InstanceNormalization",
                   "LayerNormalization", "LRN", "QuantizeLinear", "DequantizeLinear"})


def same_shape(proto: onnx.NodeProto, inputs: Sequence[Value | None]) -> tuple[Dim, ...] | None:
    """The shape of ``proto``'s one output when its op gives its inputs' (broadcast) shape and the
    expressions decide it; None otherwise."""
    if proto.domain not in ("", "ai.onnx") or len([n for n in proto.output if n]) != 1 or not proto.output[0]:
        return None
    if proto.op_type in FIRST:
        first = inputs[0] if inputs else None
        return None if first is None or first.shape is None else tuple(first.shape)
    if proto.op_type not in BROADCAST:
        return None
    shapes = [tuple(v.shape) for v in inputs if v is not None and v.shape is not None]
    if len(shapes) != len([v for v in inputs if v is not None]) or not shapes:
        return None
    rank = max(len(s) for s in shapes)
    out: list[Dim] = []
    for k in range(rank):
        dims = {s[k - rank + len(s)] for s in shapes if k - rank + len(s) >= 0}
        dims.discard(1)
        if len(dims) > 1:
            return None  # (static sizes that differ, or expressions equal only at some sizes)
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def slice_shape(proto: onnx.NodeProto, inputs: Sequence[Value | None], opset: int,
                ranges: Mapping[str, tuple[int, int]]) -> tuple[Dim, ...] | None:
    """The output shape of Slice ``proto`` (opset 10 on: starts / ends / axes / steps inputs) whose
    bounds are constants, ints or expressions; None where they are not, or an index's sign is not
    one over the ranges (the canonical form says why)."""
    if proto.domain not in ("", "ai.onnx") or proto.op_type != "Slice" or opset < 10 or len(inputs) < 3:
        return None
    x = inputs[0]
    consts = [v.const if v is not None and v.const is not None else None for v in inputs[1:5]]
    if x is None or x.shape is None or consts[0] is None or consts[1] is None:
        return None
    if any(v is not None and c is None for v, c in zip(inputs[1:5], consts, strict=False)):
        return None
    starts, ends = list(consts[0].reshape(-1)), list(consts[1].reshape(-1))
    rank = len(x.shape)
    axes = [int(a) % rank for a in consts[2].reshape(-1)] if len(consts) > 2 and consts[2] is not None \
        else list(range(len(starts)))
    steps = [int(s) for s in consts[3].reshape(-1)] if len(consts) > 3 and consts[3] is not None \
        else [1] * len(starts)
    shape: list[Dim] = list(x.shape)
    for axis, start, end, step in zip(axes, starts, ends, steps, strict=True):
        extent = _extent(shape[axis], _index(start, ranges), _index(end, ranges), step, ranges)
        if extent is None:
            return None
        shape[axis] = simplify(extent, ranges)
    return tuple(shape)


def _index(value: object, ranges: Mapping[str, tuple[int, int]]) -> Dim | None:
    if isinstance(value, Expr):
        lo, hi = tight_bounds(value, ranges)
        return value if lo >= 0 or hi < 0 else None
    return int(value)  # type: ignore[call-overload]


def _extent(dim: Dim, start: Dim | None, end: Dim | None, step: int,
            ranges: Mapping[str, tuple[int, int]]) -> Dim | None:
    if start is None or end is None or step == 0:
        return None
    start = start + dim if tight_bounds(start, ranges)[1] < 0 else start  # (from the end)
    end = end + dim if tight_bounds(end, ranges)[1] < 0 else end
    if step > 0:
        lo, hi = min_(max_(start, 0), dim), min_(max_(end, 0), dim)
        return max_(0, ceildiv(hi - lo, step))
    first, last = min_(max_(start, 0), dim - 1), min_(max_(end, -1), dim - 1)
    return max_(0, ceildiv(first - last, -step))
