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

from dataclasses import dataclass

import numpy as np

from compiler.ir.graph import AOT_DOMAIN
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.passes.base import merged_origin
from compiler.passes.base import sole_consumer
from compiler.passes.fold_qdq_channel import channel_region
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


@dataclass(frozen=True)
class _Operand:
    codes: Value
    table: np.ndarray  # (C, 256) float32
    region: list[Node]  # the float nodes it replaces
    form: np.ndarray | None = None  # (C, 5) float32: the table as BatchNormalization arithmetic


def _bn_form(region: list[Node], root: Value, p: QParams, table: np.ndarray) -> np.ndarray | None:
    """Where the region is one inference BatchNormalization of the root: per channel [x_scale,
    x_zero, mean, factor, bias] such that every entry of ``table`` is, in float32 operations,
    ((code - x_zero) * x_scale - mean) * factor + bias (the reference kernel's order; checked
    here entry by entry), which the C kernel computes instead of reading the table; else None."""
    if len(region) != 1 or region[0].kind != "BatchNormalization" or region[0].inputs[0] is not root:
        return None
    bn = region[0]
    consts = [v.const if v is not None else None for v in bn.inputs[1:5]]
    if any(c is None for c in consts) or not p.per_tensor:
        return None
    scale, bias, mean, var = (np.asarray(c, np.float32).reshape(-1) for c in consts)  # type: ignore[arg-type]
    factor = (scale / np.sqrt(var + np.float32(bn.attrs.get("epsilon", 1e-5)))).astype(np.float32)
    dq = dequantize_table(p.dtype, p.scale, p.zero)[None, :]
    with np.errstate(all="ignore"):
        formed = ((dq - mean[:, None]) * factor[:, None] + bias[:, None]).astype(np.float32)
    if formed.shape != table.shape or not np.array_equal(formed, table):
        return None
    channels = table.shape[0]
    head = np.broadcast_to(np.array([float(p.scale), float(p.zero)], np.float32), (channels, 2))
    return np.ascontiguousarray(np.column_stack([head, mean, factor, bias]), np.float32)


def _operand(graph: Graph, x: Value | None, add: Node) -> _Operand | None:
    """One Add input as codes and their (C, 256) float32 table."""
    if x is None or x.shape is None or x.is_symbolic or len(x.shape) < 3:
        return None
    channels = int(x.shape[1])
    found = activation_input(x) if sole_consumer(graph, x) is add else _quantized(x)
    if found is not None:
        codes, _, p = found
        row = dequantize_table(p.dtype, p.scale, p.zero)
        return _Operand(codes, np.ascontiguousarray(np.broadcast_to(row, (channels, 256)), np.float32), [])
    if sole_consumer(graph, x) is not add:
        return None
    got = channel_region(graph, x)
    if got is None:
        return None
    root, codes, p, region, fn = got
    table = np.ascontiguousarray(fn(dequantize_table(p.dtype, p.scale, p.zero)), np.float32)
    return _Operand(codes, table, region, _bn_form(region, root, p, table))


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
    if a is None or b is None or a.codes.shape != b.codes.shape or a.table.shape != b.table.shape:
        return None
    if not (a.region or activation_input(add.input(0))) and not (b.region or activation_input(add.input(1))):
        return None  # both operands read through another QuantizeLinear: at most one rounding
    ca, ta, cb, tb = a.codes, a.table, b.codes, b.table
    bound = float(np.max(np.abs(ta))) + float(np.max(np.abs(tb)))
    if not (np.isfinite(ta).all() and np.isfinite(tb).all()) or not bound / float(qp.scale) < _LIMIT:
        return None
    replaced = [*a.region, *b.region, *old]

    def build(make: Maker) -> list[Node]:
        tables = [make.const(f"{add.name}_table_a", ta), make.const(f"{add.name}_table_b", tb)]
        inputs: list[Value | None] = [ca, tables[0], cb, tables[1]]
        inputs += dq_scale_zero(make, q, qp, q.outputs[0].name)
        if a.form is not None or b.form is not None:
            inputs += [None if o.form is None else make.const(f"{add.name}_form_{k}", o.form)
                       for k, o in (("a", a), ("b", b))]
        return [Node(op_name(Q_TABLE_ADD), inputs, list(q.outputs), {"qmin": lo, "qmax": hi}, name=add.name,
                     domain=AOT_DOMAIN, origin=merged_origin(replaced))]
    return replaced, build
