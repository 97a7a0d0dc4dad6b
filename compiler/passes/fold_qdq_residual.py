"""``fold_qdq``'s residual Add of two float chains (docs/ops.md, "QDQ folding"): Add(f(DQ(a)),
g(DQ(b))) (a Relu / Clip after it or not) -> QuantizeLinear, where f and g are per-channel
computations of one per-tensor DequantizeLinear each (``fold_qdq_channel``'s kinds: the
BatchNormalization a QOperator file keeps float after a ResNet block's last conv or a ShuffleNet
unit's, or none: the shortcut's DequantizeLinear itself). Each operand is, channel by channel, a
function of its 8-bit code: a (C, 256) float32 table of the reference kernels' results on the 256
dequantized codes; ``onnx_aot.QTableAdd`` adds the two rows' entries in float32 and quantizes as
QuantizeLinear does, the Relu / Clip a clamp of the codes (QuantizeLinear is monotone): bit for bit
the float graph on the reference kernels. Taken only where the sums are finite and their quotients
by the scale stay inside int32 (the C kernel's conversion), which the tables tell now.

Not exact, by the one rounding a QDQ file makes there: where the other operand is a float value that
a per-tensor QuantizeLinear also quantizes (a QOperator file's residual stream: the previous block's
Relu output feeds the next block's QuantizeLinear and, in float, its Add), it is read as those codes
dequantized -- what onnxruntime's QDQ form of the same model computes; the result strays from the
float graph by the shortcut's rounding (at most half its scale per block), within issue 32's bound
(tests/test_qdq_shuffle.py, the ResNet-50 and ShuffleNet QOperator rows of scripts/bench_int8.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from compiler.ir.graph import AOT_DOMAIN
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.passes.base import merged_origin
from compiler.passes.base import sole_consumer
from compiler.passes.fold_qdq_channel import _evaluate
from compiler.passes.fold_qdq_channel import _nodes
from compiler.passes.qdq_forms import QParams
from compiler.passes.qdq_forms import q_params
from compiler.passes.qdq_rewrite import Maker
from compiler.passes.qdq_rewrite import Rewrite
from compiler.passes.qdq_rewrite import activation_chain
from compiler.passes.qdq_rewrite import activation_input
from compiler.passes.qdq_rewrite import dq_scale_zero
from runtime.contract import Q_TABLE_ADD
from runtime.contract import op_name
from runtime.kernels.qoperator import dequantize_table

__all__ = ["table_add"]

_LIMIT = float(2**31 - 2**24)  # |sum / scale| below this: rint of it converts to int32 exactly


def _operand(graph: Graph, x: Value | None, add: Node) -> tuple[Value, np.ndarray, list[Node]] | None:
    """(codes, the (C, 256) float32 table, the float nodes it replaces) of one Add input."""
    if x is None or x.shape is None or x.is_symbolic or len(x.shape) < 3:
        return None
    channels = int(x.shape[1])
    found = activation_input(x) if sole_consumer(graph, x) is add else _quantized(x)
    if found is not None:
        codes, _, p = found
        row = dequantize_table(p.dtype, p.scale, p.zero)
        return codes, np.ascontiguousarray(np.broadcast_to(row, (channels, 256)), np.float32), []
    if sole_consumer(graph, x) is not add:
        return None
    got = _nodes(graph, x)
    if got is None:
        return None
    root, (codes, _, p), nodes = got
    order = {id(node): i for i, node in enumerate(graph.nodes)}
    region = sorted(nodes.values(), key=lambda n: order[id(n)])
    fn = _evaluate(region, root, x, channels, len(x.shape))
    table: Any = fn(dequantize_table(p.dtype, p.scale, p.zero))
    return codes, np.ascontiguousarray(table, np.float32), region


def _quantized(x: Value) -> tuple[Value, Node, QParams] | None:
    """A float value that a per-tensor QuantizeLinear also quantizes: its codes, that node, its
    parameters (the shortcut read as codes: not exact, see the module's docstring)."""
    if x.producer is None or x.producer.kind == "DequantizeLinear":
        return None
    for use in x.uses:
        p = q_params(use.node)
        if p is not None and p.per_tensor and use.node.outputs[0].shape == x.shape:
            return use.node.outputs[0], use.node, p
    return None


def table_add(graph: Graph, q: Node, qp: QParams) -> Rewrite | None:
    """Add of two per-channel float chains (a Relu / Clip after it or not), quantized by ``q``."""
    found = activation_chain(graph, q, qp) if qp.per_tensor else None
    if found is None:
        return None
    old, add, (lo, hi) = found
    first = add.input(0)
    if add.kind not in ("Add", "Sum") or len(add.inputs) != 2 or first is None:
        return None
    if add.outputs[0].shape != first.shape:
        return None
    a, b = _operand(graph, add.input(0), add), _operand(graph, add.input(1), add)
    if a is None or b is None or a[0].shape != b[0].shape or a[1].shape != b[1].shape:
        return None
    if not (a[2] or activation_input(add.input(0))) and not (b[2] or activation_input(add.input(1))):
        return None  # both operands read through another QuantizeLinear: at most one rounding
    (ca, ta, ra), (cb, tb, rb) = a, b
    bound = float(np.max(np.abs(ta))) + float(np.max(np.abs(tb)))
    if not (np.isfinite(ta).all() and np.isfinite(tb).all()) or not bound / float(qp.scale) < _LIMIT:
        return None
    replaced = [*ra, *rb, *old]

    def build(make: Maker) -> list[Node]:
        inputs = [ca, make.const(f"{add.name}_table_a", ta), cb, make.const(f"{add.name}_table_b", tb),
                  *dq_scale_zero(make, q, qp, q.outputs[0].name)]
        return [Node(op_name(Q_TABLE_ADD), inputs, list(q.outputs), {"qmin": lo, "qmax": hi}, name=add.name,
                     domain=AOT_DOMAIN, origin=merged_origin(replaced))]
    return replaced, build
