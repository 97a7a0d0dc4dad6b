"""The pieces of a QDQ rewrite that ``fold_qdq``'s rewrites share (compiler/passes/fold_qdq.py).

A rewrite is the list of nodes it replaces and a builder of the new nodes, run twice: once with a
``Maker`` of free values, to ask the provider whether it claims every new node, then with the
graph's. Here too: the Relu / Clip between an op and its QuantizeLinear, moved into the quantized
domain (``activation_chain``, ``with_clamp``), the codes behind a DequantizeLinear input, and a
quantized operand's codes, scale and zero point as the new node's inputs (``operand_inputs``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from compiler.ir.graph import AOT_DOMAIN
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.passes.base import add_constant
from compiler.passes.base import sole_consumer
from compiler.passes.qdq_forms import QParams
from compiler.passes.qdq_forms import dq_params
from compiler.passes.qdq_forms import q_params
from compiler.passes.qdq_forms import quantize_bound
from runtime.contract import Q_LOOKUP

__all__ = ["Build", "MakeOp", "Maker", "Rewrite", "activation_chain", "activation_input", "bounds",
           "dequantized_region", "dq_scale_zero", "producer", "with_clamp"]


class Maker:
    """Makes a candidate rewrite's values: free ones (``graph`` None) to ask the provider about,
    or the graph's own once the rewrite is taken."""

    def __init__(self, graph: Graph | None) -> None:
        self.graph = graph

    def const(self, base: str, array: np.ndarray) -> Value:
        return add_constant(self.graph, base, array) if self.graph is not None else Value(base, const=array)

    def value(self, base: str, dtype: np.dtype, shape: tuple[int, ...] | None) -> Value:
        if self.graph is None:
            return Value(base, dtype, shape)
        return self.graph.make_value(base, dtype, shape)


# A rewrite: the nodes it replaces (the last one last in graph order) and a builder of the new
# nodes, in order; the last new node produces the last old node's outputs.
Build = Callable[[Maker], list[Node]]
Rewrite = tuple[list[Node], Build]


def producer(value: Value | None) -> Node | None:
    return value.producer if value is not None else None


def bounds(node: Node) -> tuple[float, float]:
    """The real interval a Relu / Clip clamps to."""
    if node.kind == "Relu":
        return 0.0, math.inf
    return float(node.attrs["min"]), float(node.attrs["max"])


def activation_chain(graph: Graph, q: Node, qp: QParams) -> tuple[list[Node], Node, tuple[int, int]] | None:
    """The chain from the linear op to ``q`` (with a Relu / Clip between them or not), the linear
    op, and the clamp in the quantized domain ((min, max) of the codes where there is none)."""
    info = np.iinfo(qp.dtype)
    chain = [q]
    node = q.input(0).producer  # type: ignore[union-attr]
    interval = (-math.inf, math.inf)
    if node is not None and node.kind in ("Relu", "Clip") and len(node.inputs) == 1:
        interval = bounds(node)
        chain.insert(0, node)
        x = node.inputs[0]
        node = x.producer if x is not None and sole_consumer(graph, x) is node else None
    if node is None or len(node.outputs) != 1:
        return None
    lo, hi = quantize_bound(interval[0], qp), quantize_bound(interval[1], qp)
    return [node, *chain], node, (max(lo, int(info.min)), min(hi, int(info.max)))


def dequantized_region(graph: Graph, y: Value, accepts: Callable[[Node], bool]
                       ) -> tuple[Value, tuple[Value, Node, QParams], dict[int, Node]] | None:
    """The float32 nodes of ``y``'s shape that compute ``y`` from exactly one DequantizeLinear's
    output of that shape (the root, an activation's), each one ``accepts``, their results used by
    nothing outside them (nor graph outputs, but ``y``): (root, ``activation_input(root)``, the
    nodes by id), or None."""
    nodes: dict[int, Node] = {}
    roots: dict[int, Value] = {}
    stack = [y]
    while stack:
        value = stack.pop()
        node = value.producer
        if node is None or id(node) in nodes:
            continue
        if node.kind == "DequantizeLinear":
            roots[id(value)] = value
            continue
        out = node.outputs[0]
        if len(node.outputs) != 1 or out.dtype != np.float32 or out.shape != y.shape or not accepts(node):
            return None
        nodes[id(node)] = node
        stack.extend(v for v in node.inputs if v is not None and v.const is None)
    if len(roots) != 1 or not nodes:
        return None
    for node in nodes.values():
        out = node.outputs[0]
        if graph.is_graph_output(out) or (out is not y and any(id(u.node) not in nodes for u in out.uses)):
            return None
    (root,) = roots.values()
    found = activation_input(root)
    if found is None or root.shape != y.shape:
        return None
    return root, found, nodes


def activation_input(value: Value | None) -> tuple[Value, Node, QParams] | None:
    """A value made by a per-tensor DequantizeLinear: its codes, the node, the parameters."""
    dq = value.producer if value is not None else None
    p = dq_params(dq)
    if dq is None or p is None or not p.per_tensor:
        return None
    return dq.inputs[0], dq, p  # type: ignore[return-value]


def dq_scale_zero(make: Maker, dq: Node, p: QParams, base: str) -> list[Value]:
    """The DequantizeLinear's own scale and zero point (a zero point made where it has none)."""
    scale, zero = dq.inputs[1], dq.input(2)
    return [scale, zero if zero is not None else make.const(f"{base}_zero_point", p.zero)]  # type: ignore[list-item]


# A quantized operand: its codes (a DequantizeLinear's input, or a quantized constant's codes),
# their parameters, and the DequantizeLinear (None for a constant).
Operand = tuple[Value | np.ndarray, QParams, Node | None]


def activation_operand(value: Value | None) -> Operand | None:
    """``activation_input`` of ``value`` as an operand."""
    found = activation_input(value)
    return None if found is None else (found[0], found[2], found[1])


def operand_inputs(make: Maker, base: str, operand: Operand) -> list[Value]:
    """An operand's codes, scale and zero point as a node's inputs: the DequantizeLinear's own, or
    constants ``{base}_codes`` / ``_scale`` / ``_zero_point``."""
    codes, p, dq = operand
    if dq is not None:
        assert isinstance(codes, Value)
        return [codes, *dq_scale_zero(make, dq, p, codes.name)]
    assert isinstance(codes, np.ndarray)
    return [make.const(f"{base}_codes", codes), make.const(f"{base}_scale", p.scale),
            make.const(f"{base}_zero_point", p.zero)]


MakeOp = Callable[[Maker, Value, list[str]], Node]


def with_clamp(op: Node, q: Node, clamp: tuple[int, int], make_op: MakeOp, origin: list[str]) -> Build:
    """The builder of ``make_op``'s node writing ``q``'s output, or, where ``clamp`` clamps some
    code, writing a fresh value that a QLookup clamping the codes (a table of them, clipped) then
    writes ``q``'s output from."""
    qp = q_params(q)
    assert qp is not None
    info = np.iinfo(qp.dtype)
    clip = clamp != (int(info.min), int(info.max))
    out = q.outputs[0]
    codes = np.arange(256, dtype=np.uint8).view(qp.dtype)  # the codes in the order of their bytes
    table = np.clip(codes, clamp[0], clamp[1]).astype(qp.dtype)

    def build(make: Maker) -> list[Node]:
        y = make.value(f"{op.name}_q", out.dtype, out.shape) if clip else out  # type: ignore[arg-type]
        nodes = [make_op(make, y, origin)]
        if clip:
            lookup = [y, make.const(f"{op.name}_clamp_table", table)]
            nodes.append(Node(Q_LOOKUP.split(".", 1)[1], lookup, [out], {}, name=f"{op.name}_clamp",
                              domain=AOT_DOMAIN, origin=origin))
        return nodes
    return build
