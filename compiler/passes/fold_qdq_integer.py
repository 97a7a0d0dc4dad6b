"""``fold_qdq``'s rewrites into the 8-bit integer ops of runtime/contract.py (docs/ops.md, "Integer
ops": QBinary, QLookup, QAveragePool, QGlobalAveragePool, QSoftmax), for the float ops a QDQ file
runs between DequantizeLinear and QuantizeLinear ``q`` (docs/ops.md, "QDQ folding"):

- ``lookup``: any elementwise float computation of ONE per-tensor DequantizeLinear's output (a
  Sigmoid, a LeakyRelu, GELU's Div / Erf / Add, a Mul by a scalar, a requantizing DQ -> Q, ...),
  every other operand a one-element constant: its 256 results, computed now by the reference
  kernels on the 256 dequantized codes and quantized as ``q`` does, are a QLookup table. Bit for bit
  what the reference kernels compute for the float graph;
- ``binary``: Add / Mul (a two-input Sum) of two per-tensor DequantizeLinear outputs, or of one and a
  constant folded from a per-tensor DequantizeLinear (a bias vector) -> QBinary (a Relu / Clip before
  ``q`` as a Clip of the codes); onnxruntime's arithmetic (rescale factors in float32), which agrees
  with the float graph but where a float sum lands within its rounding error of a tie;
- ``pool``: AveragePool / GlobalAveragePool -> QAveragePool / QGlobalAveragePool; ``softmax``:
  Softmax over the last axis -> QSoftmax (onnxruntime's integer algorithms: within the issue's
  stray rule, not bit for bit);
- ``concat``: a Concat whose inputs' quantizations differ from ``q``'s: each such input through a
  requantizing QLookup, then the Concat of codes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from compiler.ir.graph import AOT_DOMAIN
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.passes.base import merged_origin
from compiler.passes.qdq_forms import QParams
from compiler.passes.qdq_forms import weight_codes
from compiler.passes.qdq_rewrite import Maker
from compiler.passes.qdq_rewrite import Operand
from compiler.passes.qdq_rewrite import Rewrite
from compiler.passes.qdq_rewrite import activation_chain
from compiler.passes.qdq_rewrite import activation_input
from compiler.passes.qdq_rewrite import activation_operand
from compiler.passes.qdq_rewrite import dequantized_region
from compiler.passes.qdq_rewrite import dq_scale_zero
from compiler.passes.qdq_rewrite import operand_inputs
from compiler.passes.qdq_rewrite import with_clamp
from runtime.contract import Q_AVERAGE_POOL
from runtime.contract import Q_BINARY
from runtime.contract import Q_GLOBAL_AVERAGE_POOL
from runtime.contract import Q_LOOKUP
from runtime.contract import Q_SOFTMAX
from runtime.contract import op_name
from runtime.kernels.elementwise import ELEMENTWISE_OPS
from runtime.kernels.elementwise import ELEMENTWISE_REFERENCE_ONLY
from runtime.kernels.elementwise import apply_elementwise
from runtime.kernels.qoperator import lookup_table

__all__ = ["binary", "concat", "lookup", "pool", "softmax"]

_ELEMENTWISE = (ELEMENTWISE_OPS | ELEMENTWISE_REFERENCE_ONLY) - {"Where"}
_POOL_ATTRS = ("kernel_shape", "strides", "pads", "dilations", "ceil_mode", "count_include_pad")


def _aot(op: str) -> str:
    return op.split(".", 1)[1]


def _scalar_operands(node: Node) -> bool:
    """An elementwise node whose every operand is present, a one-element constant where constant."""
    return node.kind in _ELEMENTWISE and all(
        operand is not None and (operand.const is None or operand.const.size == 1) for operand in node.inputs)


def _region(graph: Graph, y: Value) -> tuple[Value, Node, QParams, list[Node]] | None:
    """The elementwise nodes computing ``y`` from one per-tensor DequantizeLinear's output (the
    root), every other operand a one-element constant, nothing else using their results; in
    graph order. None when ``y`` is no such computation."""
    region = dequantized_region(graph, y, _scalar_operands)
    if region is None:
        return None
    _, found, nodes = region
    order = {id(node): i for i, node in enumerate(graph.nodes)}
    return found[0], found[1], found[2], sorted(nodes.values(), key=lambda n: order[id(n)])


def _evaluate(region: list[Node], root: Value, y: Value) -> Any:
    """The region as a function of the root's values (the reference kernels' arithmetic)."""
    def fn(x: Any) -> Any:
        env = {id(root): np.asarray(x, np.float32)}
        for node in region:
            args = [env[id(v)] if id(v) in env else v.const.reshape(())  # type: ignore[union-attr]
                    for v in node.inputs]
            out = node.outputs[0]
            result = apply_elementwise(np, node.kind, args, dict(node.attrs))
            env[id(out)] = np.asarray(result).astype(out.dtype)
        return env[id(y)]
    return fn


def _table(make: Maker, base: str, fn: Any, p: QParams, qp: QParams) -> Value:
    table = lookup_table(fn, p.dtype, p.scale, p.zero, qp.scale, qp.zero, qp.dtype)
    return make.const(f"{base}_table", np.ascontiguousarray(table, qp.dtype).reshape(256))


def lookup(graph: Graph, q: Node, qp: QParams) -> Rewrite | None:
    """An elementwise computation of one DequantizeLinear's output, quantized by ``q``: a QLookup."""
    y = q.inputs[0]
    assert y is not None
    dq = y.producer
    if dq is not None and dq.kind == "DequantizeLinear":  # a requantization: the identity's table
        found = activation_input(y)
        region: list[Node] = []
        if found is None or not qp.per_tensor or found[2].dtype != qp.dtype:
            return None
    else:
        got = _region(graph, y) if qp.per_tensor else None
        if got is None:
            return None
        found, region = got[:3], got[3]
    codes, _, p = found
    fn = _evaluate(region, found[1].outputs[0], y)
    origin = merged_origin([*region, q])

    def build(make: Maker) -> list[Node]:
        return [Node(op_name(Q_LOOKUP), [codes, _table(make, q.name, fn, p, qp)], list(q.outputs), {},
                     name=region[-1].name if region else q.name, domain=AOT_DOMAIN, origin=origin)]
    return [*region, q], build


def _operand(graph: Graph, value: Value | None) -> Operand | None:
    """A QBinary operand: a per-tensor DequantizeLinear's codes, or a per-tensor quantized constant."""
    found = activation_operand(value)
    if found is not None:
        return found
    if value is None or value.const is None:
        return None
    w = weight_codes(graph, value, 0) if value.const.ndim else None
    return None if w is None or not w[1].per_tensor else (w[0], w[1], None)


def binary(graph: Graph, q: Node, qp: QParams) -> Rewrite | None:
    """Add / Mul of two quantized operands (a Relu / Clip between it and ``q`` or not): a QBinary."""
    found = activation_chain(graph, q, qp) if qp.per_tensor else None
    if found is None:
        return None
    old, op, clamp = found
    if op.kind not in ("Add", "Mul", "Sum") or len(op.inputs) != 2:
        return None
    a, b = _operand(graph, op.input(0)), _operand(graph, op.input(1))
    if a is None or b is None or a[1].dtype != qp.dtype or b[1].dtype != qp.dtype:
        return None
    kind = "Mul" if op.kind == "Mul" else "Add"

    def make_op(make: Maker, y: Value, origin: list[str]) -> Node:
        inputs = [*operand_inputs(make, f"{op.name}_a", a), *operand_inputs(make, f"{op.name}_b", b),
                  *dq_scale_zero(make, q, qp, y.name)]
        return Node(_aot(Q_BINARY), inputs, [y], {"op": kind}, name=op.name, domain=AOT_DOMAIN, origin=origin)
    return old, with_clamp(op, q, clamp, make_op, merged_origin(old))


def pool(op: Node, q: Node, qp: QParams) -> Rewrite | None:
    """AveragePool / GlobalAveragePool of a per-tensor DequantizeLinear's output: the integer pool."""
    found = activation_input(op.input(0))
    if found is None or not qp.per_tensor or len(op.outputs) != 1 or found[2].dtype != qp.dtype:
        return None
    codes, dq, p = found
    if op.kind == "AveragePool":
        kind, attrs = Q_AVERAGE_POOL, {k: op.attrs[k] for k in _POOL_ATTRS if k in op.attrs}
    else:
        kind, attrs = Q_GLOBAL_AVERAGE_POOL, {"channels_last": 0}

    def build(make: Maker) -> list[Node]:
        inputs = [codes, *dq_scale_zero(make, dq, p, codes.name), *dq_scale_zero(make, q, qp, q.name)]
        return [Node(_aot(kind), inputs, list(q.outputs), attrs, name=op.name, domain=AOT_DOMAIN,
                     origin=merged_origin([op, q]))]
    return [op, q], build


def softmax(op: Node, q: Node, qp: QParams) -> Rewrite | None:
    """Softmax over the last axis of a per-tensor DequantizeLinear's output: a QSoftmax."""
    found = activation_input(op.input(0))
    x = op.input(0)
    if found is None or not qp.per_tensor or x is None or x.shape is None or found[2].dtype != qp.dtype:
        return None
    if int(op.attrs["axis"]) != len(x.shape) - 1:
        return None
    codes, dq, p = found

    def build(make: Maker) -> list[Node]:
        inputs = [codes, dq.inputs[1], *dq_scale_zero(make, q, qp, q.name)]
        return [Node(_aot(Q_SOFTMAX), inputs, list(q.outputs), {}, name=op.name, domain=AOT_DOMAIN,
                     origin=merged_origin([op, q]))]  # type: ignore[list-item]
    return [op, q], build


def concat(op: Node, q: Node, qp: QParams) -> Rewrite | None:
    """A Concat of per-tensor DequantizeLinear outputs of other quantizations than ``q``'s: each
    such input requantized by a QLookup, then the Concat of the codes."""
    parts = [activation_input(v) for v in op.inputs]
    if not qp.per_tensor or any(p is None or p[2].dtype != qp.dtype for p in parts):
        return None
    origin = merged_origin([op, q])

    def build(make: Maker) -> list[Node]:
        nodes, inputs = [], []
        for k, part in enumerate(parts):
            assert part is not None
            codes, _, p = part
            if p.same(qp):
                inputs.append(codes)
                continue
            moved = make.value(f"{op.name}_in{k}", np.dtype(qp.dtype), codes.shape)
            table = _table(make, f"{op.name}_in{k}", lambda v: v, p, qp)
            nodes.append(Node(_aot(Q_LOOKUP), [codes, table], [moved], {}, name=f"{op.name}_requantize{k}",
                              domain=AOT_DOMAIN, origin=origin))
            inputs.append(moved)
        return [*nodes, Node("Concat", inputs, list(q.outputs), op.attrs, name=op.name, origin=origin)]
    return [op, q], build
