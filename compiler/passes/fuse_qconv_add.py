"""A requantizing ``onnx_aot.PackedQConv`` -> QBinary Add -> one PackedQConv with the Add in its store.

onnxruntime's QDQ quantizer writes a ResNet's residual Add between QuantizeLinear /
DequantizeLinear pairs; ``fold_qdq`` makes it a QBinary Add of the last conv's codes and the
shortcut's (the Relu after it is the Add's output range). This lowering moves such an Add into the
conv (its ``Addend`` inputs, runtime/kernels/qconv.py): the store rounds and saturates the conv's
own codes as before (through its Lut, if it has one), then computes QBinary's Add of them with the
addend (its float64 arithmetic, the same operations: ``binary_codes``), so the step gives the two
steps' bits and the conv's codes never reach memory.

Taken where the conv's output has that one use, the Add is one that an epilogue can compute
(``fuse_qgemm_add.add_operands``: constant scalar scales and zero points, every code of the conv
output's type) and the other operand has the output's shape. The QBinary's own scale and zero
point of the conv's codes travel with it (A_scale, A_zero): the Add reads the codes as it did. For
the C target, from level 2, after ``pack_qconv_weights`` and ``fuse_qconv_lookup``.
"""

from __future__ import annotations

from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.passes.base import Pass
from compiler.passes.base import PassResult
from compiler.passes.base import rewrite_each
from compiler.passes.base import sole_consumer
from compiler.passes.fuse_qgemm_add import absorb
from compiler.passes.fuse_qgemm_add import add_operands
from runtime.contract import PACKED_QCONV

__all__ = ["FuseQConvAdd"]

_ADDEND = 6  # PackedQConv's input index of Addend (then A_scale, A_zero, its own, the output's)


def _fuse(graph: Graph, conv: Node) -> bool:
    y = conv.outputs[0]
    if conv.input(4) is None or len(conv.inputs) > _ADDEND or len(conv.outputs) != 1:
        return False  # ConvInteger's int32 sums, or an Add already in
    add = sole_consumer(graph, y)
    found = add_operands(y, add)
    if add is None or found is None or found[1].shape != y.shape:
        return False
    mine, other = found
    theirs = 3 - mine
    ins = [add.input(k) for k in range(8)]
    params = list(conv.inputs) + [None] * (_ADDEND - len(conv.inputs))
    inputs = [*params, other, ins[mine + 1], ins[mine + 2], ins[theirs + 1], ins[theirs + 2], ins[6], ins[7]]
    absorb(graph, conv, add, inputs)
    return True


class FuseQConvAdd(Pass):
    name = "fuse_qconv_add"

    def run(self, graph: Graph) -> PassResult:
        return PassResult(graph, rewrite_each(graph, (PACKED_QCONV,), _fuse))
