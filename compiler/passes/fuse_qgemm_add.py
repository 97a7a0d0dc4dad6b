"""A requantizing ``onnx_aot.QGemm`` -> QBinary Add -> one QGemm with the Add in its epilogue.

onnxruntime's QDQ quantizer writes a Linear (MatMul + bias Add) as two quantized ops: the MatMul's
output quantized, dequantized, the bias (quantized by itself) added, the sum quantized again.
``fold_qdq`` makes that QLinearMatMul (``use_qgemm``: a QGemm with the "quantized" output) and a
QBinary Add of its codes and the bias codes; a residual Add after the projection is another
QBinary of the QGemm's codes and an activation of its shape. This lowering moves such an Add into
the QGemm (its ``addend`` inputs, runtime/kernels/qgemm.py): the epilogue rounds and saturates the
QGemm's own codes as before, then computes QBinary's Add of them with the addend (its float64
arithmetic, the same operations), so the step gives the two steps' bits and the intermediate codes
never reach memory.

Taken where the QGemm's output has that one use, the QBinary's scales and zero points are
constant scalars, every code has the QGemm output's type, and the other operand is a constant of
N values along the last axis (a bias) or a value of the output's shape (a residual). A QGemm that
with an addend takes a second such Add (``addend2``: the residual after the bias); the next stays
a QBinary. A QLookup (or a QChannelLookup of
equal rows) that is then the only use goes into the epilogue too (``lut``: each code by its byte,
as the lookup's kernel): the GELU after a QDQ up-projection. For the C target, from level 2, after
``use_qgemm``.
"""

from __future__ import annotations

import numpy as np

from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.passes.base import Pass
from compiler.passes.base import PassResult
from compiler.passes.base import add_constant
from compiler.passes.base import merged_origin
from compiler.passes.base import replace_nodes
from compiler.passes.base import rewrite_each
from compiler.passes.base import sole_consumer
from compiler.passes.compose_qbinary import lookup_table
from compiler.passes.use_qgemm import sized
from runtime.contract import Q_BINARY
from runtime.contract import QGEMM

__all__ = ["FuseQGemmAdd", "absorb", "add_operands"]

_ADDEND = 10  # QGemm's input index of the addend (then its scale, zero, the output's scale, zero)
_LUT = 15  # of the lookup table
_ADDEND2 = 16  # of the second addend (then its scale, zero, the output's scale, zero)
_INPUTS = 21


def _scalar(value: Value | None, dtype: np.dtype | None = None) -> bool:
    """A constant of one element (of ``dtype`` when given)."""
    return (value is not None and value.const is not None and value.const.size == 1
            and (dtype is None or value.const.dtype == dtype))


def _same_const(a: Value | None, b: Value | None) -> bool:
    """Two scalar constants of the same bits (an absent zero point is 0)."""
    va = np.zeros(()) if a is None else a.const
    vb = np.zeros(()) if b is None else b.const
    if va is None or vb is None or va.size != 1 or vb.size != 1:
        return False
    same_type = a is None or b is None or va.dtype == vb.dtype
    return same_type and float(va.reshape(-1)[0]) == float(vb.reshape(-1)[0])


def add_operands(y: Value, add: Node | None) -> tuple[int, Value] | None:
    """(the QBinary's input index of y: 0 or 3, the other operand) where ``add`` is a QBinary Add of
    y (once) and another value of y's type, its one result of y's type and shape, its scales
    constant float32 scalars and its zero points absent or constant scalars of y's type: an Add an
    integer step's requantizing epilogue can compute (here and compiler/passes/fuse_qconv_add.py)."""
    if add is None or add.kind != Q_BINARY or y.dtype is None:
        return None
    ins = list(add.inputs) + [None] * (8 - len(add.inputs))
    if add.attrs.get("op") != "Add" or len(add.outputs) != 1 or (ins[0] is y) == (ins[3] is y):
        return None
    mine = 0 if ins[0] is y else 3
    other = ins[3 - mine]
    dtype, out = y.dtype, add.outputs[0]
    if other is None or other.dtype != dtype or out.dtype != dtype or out.shape != y.shape:
        return None
    if not all(_scalar(ins[k], np.dtype(np.float32)) for k in (1, 4, 6)):
        return None
    if not all(ins[k] is None or _scalar(ins[k], dtype) for k in (2, 5, 7)):
        return None
    return mine, other


def _addend(gemm: Node, add: Node, codes: tuple[Value | None, Value | None]) -> tuple[int, Value] | None:
    """(the QBinary's input index of the QGemm's codes: 0 or 3, the other operand) when ``add``
    can go into ``gemm``'s epilogue; ``codes``: the scale and zero point of the QGemm's codes,
    which the QBinary must read them with."""
    y = gemm.outputs[0]
    found = add_operands(y, add)
    if found is None:
        return None
    mine, other = found
    if not (_same_const(add.input(mine + 1), codes[0]) and _same_const(add.input(mine + 2), codes[1])):
        return None
    n = int(gemm.attrs["n"])
    row = other.const is not None and sized(other, n)
    return (mine, other) if row or (other.shape == y.shape and other is not y) else None


def _zero(graph: Graph, value: Value | None, name: str, dtype: np.dtype) -> Value:
    return value if value is not None else add_constant(graph, name, np.zeros((), dtype))


def _fuse_add(graph: Graph, gemm: Node, slot: int) -> Node | None:
    """The QGemm with the QBinary Add after it in its epilogue (its inputs from ``slot``: the
    addend's, or the second addend's after a first and no lut), or None."""
    ins_now = list(gemm.inputs) + [None] * (_INPUTS - len(gemm.inputs))
    second = slot == _ADDEND2
    if len(gemm.inputs) > slot or (second and (ins_now[_ADDEND] is None or ins_now[_LUT] is not None)):
        return None
    y = gemm.outputs[0]
    add = sole_consumer(graph, y)
    if add is None or y.dtype is None:
        return None
    codes = (ins_now[7], ins_now[8]) if slot == _ADDEND else (ins_now[13], ins_now[14])
    found = _addend(gemm, add, codes)
    if found is None:
        return None
    mine, other = found
    ins = list(add.inputs) + [None] * (8 - len(add.inputs))
    base = add.name or gemm.name
    if other.const is not None:
        other = add_constant(graph, f"{base}_addend", np.ascontiguousarray(other.const).reshape(-1))
    theirs = 3 - mine
    params = list(gemm.inputs) + [None] * (slot - len(gemm.inputs))
    params[8] = _zero(graph, params[8], f"{base}_y_zero", y.dtype)
    inputs = [*params, other, ins[theirs + 1], _zero(graph, ins[theirs + 2], f"{base}_addend_zero", y.dtype),
              ins[6], _zero(graph, ins[7], f"{base}_out_zero", y.dtype)]
    return absorb(graph, gemm, add, inputs)


def _fuse_lookup(graph: Graph, gemm: Node) -> bool:
    """The lookup that is the QGemm's output's only use into its epilogue (``lut``)."""
    y = gemm.outputs[0]
    lookup = sole_consumer(graph, y)
    table = lookup_table(lookup)
    inputs = list(gemm.inputs) + [None] * (_INPUTS - len(gemm.inputs))
    if lookup is None or table is None or inputs[_LUT] is not None or lookup.outputs[0].dtype != y.dtype:
        return False
    padded = np.concatenate([table, np.zeros(4, table.dtype)])
    inputs[_LUT] = add_constant(graph, f"{lookup.name}_lut", padded)
    absorb(graph, gemm, lookup, inputs)
    return True


def absorb(graph: Graph, node: Node, after: Node, inputs: list[Value | None]) -> Node:
    """``node`` with ``inputs`` (trailing Nones dropped) and ``after``'s outputs in place of both:
    ``after`` (``node``'s output's one use) computed in ``node``'s epilogue."""
    while inputs[-1] is None:
        inputs.pop()
    new = Node(node.op_type, inputs, list(after.outputs), dict(node.attrs), name=node.name,
               domain=node.domain, origin=merged_origin([node, after]))
    return replace_nodes(graph, [node, after], new)


def _fuse(graph: Graph, gemm: Node) -> bool:
    if str(gemm.attrs["output"]) != "quantized":
        return False
    added = _fuse_add(graph, gemm, _ADDEND)
    second = _fuse_add(graph, added, _ADDEND2) if added is not None else None
    return _fuse_lookup(graph, second or added or gemm) or added is not None


class FuseQGemmAdd(Pass):
    name = "fuse_qgemm_add"

    def run(self, graph: Graph) -> PassResult:
        modified = rewrite_each(graph, (QGEMM,), _fuse)
        if modified:
            graph.prune_constants()
        return PassResult(graph, modified)
