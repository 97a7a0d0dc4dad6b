"""Fuse chains and trees of float32 elementwise ops into one ``onnx_aot.FusedElementwise``.

Working back from each elementwise node not yet taken (a group's root), the group grows into the
producers of its inputs while the producer is elementwise too, its result is read by members of the
group only (one may read it twice, as in x * x; two may, as in ``Where(y > hi, hi, y)``) and is not
a graph output, and its result has the root's shape (so every member computes the full output; only
the group's inputs broadcast). A group of two or more nodes becomes one node whose ``program``
(docs/ops.md) lists the members in graph order; the root's output Value is kept. The op names come
from ``runtime.kernels.elementwise`` (unary ops take one argument, binary ones exactly two). A Where
joins with the comparison that computes its condition (a Clip by bounds known only at run time
imports as ``Where(x < lo, lo, x)``), so every input and the result stay float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from compiler.ir.graph import AOT_DOMAIN
from compiler.ir.graph import ONNX_DOMAIN
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.passes.base import Pass
from compiler.passes.base import PassResult
from compiler.passes.base import merged_origin
from compiler.passes.base import replace_nodes
from runtime.contract import FUSED_ELEMENTWISE
from runtime.contract import op_name
from runtime.kernels.elementwise import ELEMENTWISE_BINARY
from runtime.kernels.elementwise import ELEMENTWISE_UNARY

__all__ = ["FuseElementwise"]

_FLOAT32 = np.dtype(np.float32)
_COMPARE = frozenset({"Less", "Greater", "Equal"})  # (those the shared C / CUDA emitter has)


def _fusable(graph: Graph, node: Node) -> bool:
    """A float32 elementwise node a group may take: unary, binary, or a Where whose condition is a
    comparison only it reads (``_condition``), computed in the group too."""
    if node.domain != ONNX_DOMAIN or len(node.outputs) != 1 or node.outputs[0].dtype != _FLOAT32:
        return False
    if node.op_type == "Where":
        return len(node.inputs) == 3 and _floats(node.inputs[1:]) and _condition(graph, node) is not None
    # only ops the fused program runs (docs/ops.md): an op of no inputs (ConstantOfShape of a
    # run-time shape, Range, EyeLike ...) is no elementwise op, whatever its arity
    if node.op_type in ELEMENTWISE_UNARY:
        arity = 1
    elif node.op_type in ELEMENTWISE_BINARY:
        arity = 2
    else:
        return False
    return len(node.inputs) == arity and _floats(node.inputs)


def _floats(values: Sequence[Value | None]) -> bool:
    return all(v is not None and v.dtype == _FLOAT32 for v in values)


def _condition(graph: Graph, where: Node) -> Node | None:
    """The comparison of two float32 values that computes ``where``'s condition, read by nothing
    else, no graph output, and of its shape (the fused program computes it as an int, never
    stored); else None."""
    cond = where.inputs[0]
    producer = cond.producer if cond is not None else None
    if producer is None or producer.domain != ONNX_DOMAIN or producer.op_type not in _COMPARE:
        return None
    assert cond is not None
    if len(producer.inputs) != 2 or not _floats(producer.inputs) or cond.shape != where.outputs[0].shape:
        return None
    if graph.is_graph_output(cond):
        return None
    return producer if all(use.node is where for use in cond.uses) else None


class FuseElementwise(Pass):
    name = "fuse_elementwise"

    def run(self, graph: Graph) -> PassResult:
        taken: set[int] = set()
        groups: list[list[Node]] = []
        # Consumers first: a node is a root only if no later elementwise node could absorb it.
        for node in reversed(graph.nodes):
            if id(node) in taken or not _fusable(graph, node):
                continue
            group = self._grow(graph, node, taken)
            if len(group) >= 2:
                groups.append(group)
        order = {id(node): i for i, node in enumerate(graph.nodes)}
        for group in reversed(groups):  # in graph order of their roots
            members = sorted(group, key=lambda n: order[id(n)])
            replace_nodes(graph, members, _fused_node(members))
        return PassResult(graph, bool(groups))

    @staticmethod
    def _grow(graph: Graph, root: Node, taken: set[int]) -> list[Node]:
        shape = root.outputs[0].shape
        taken.add(id(root))
        members = {id(root)}
        group, stack = [root], [root]
        while stack:
            consumer = stack.pop()
            for value in consumer.inputs:
                producer = value.producer if value is not None else None
                if producer is None or id(producer) in taken:
                    continue
                if consumer.op_type == "Where" and value is consumer.inputs[0]:
                    taken.add(id(producer))  # its comparison (_fusable checked it)
                    members.add(id(producer))
                    group.append(producer)
                    stack.append(producer)
                    continue
                if not _fusable(graph, producer):
                    continue
                assert value is not None
                if value.shape != shape or graph.is_graph_output(value):
                    continue
                if any(id(use.node) not in members for use in value.uses):
                    continue  # (read outside the group, or by a member not reached yet)
                members.add(id(producer))
                taken.add(id(producer))
                group.append(producer)
                stack.append(producer)
        return group


def _fused_node(members: list[Node]) -> Node:
    """One FusedElementwise computing ``members`` (in graph order; the last one is the root)."""
    results: dict[int, str] = {}  # id(value) -> "t<k>"
    refs: dict[int, str] = {}  # id(value) -> "i<k>"
    inputs: list[Value] = []
    program: list[dict[str, Any]] = []
    for k, node in enumerate(members):
        args = []
        for value in node.inputs:
            assert value is not None
            ref = results.get(id(value)) or refs.get(id(value))
            if ref is None:
                ref = refs[id(value)] = f"i{len(inputs)}"
                inputs.append(value)
            args.append(ref)
        program.append({"op": node.op_type, "args": args, "attrs": dict(node.attrs)})
        results[id(node.outputs[0])] = f"t{k}"
    return Node(
        op_name(FUSED_ELEMENTWISE),
        inputs,
        [members[-1].outputs[0]],
        {"program": program},
        name=members[0].name,
        domain=AOT_DOMAIN,
        origin=merged_origin(members),
    )
