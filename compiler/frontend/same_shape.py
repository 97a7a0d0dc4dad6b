"""Output shapes of the ops whose output has their inputs' (broadcast) shape, over symbolic dims.

Most nodes of a network are elementwise ops, activations and normalizations: their output shape is
their first input's shape, or the numpy broadcast of all their inputs' shapes. onnx's whole-model
inference loses the symbols after the first Conv, so the import would probe each of them
(``probing.py``); the rule is exact and needs no fit. Where the broadcast is not decided by the
expressions alone (two different expressions on one axis, equal only at some sizes), the probes
take the node as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx

from compiler.frontend.canonical.elementwise import BINARY_PLAIN
from compiler.frontend.canonical.elementwise import UNARY_PLAIN
from compiler.frontend.canonical.elementwise import VARIADIC
from compiler.ir.graph import Value
from runtime.symbolic import Dim

__all__ = ["same_shape"]

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
