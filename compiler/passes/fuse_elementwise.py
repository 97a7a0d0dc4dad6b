"""Fuse chains and trees of float32 elementwise ops into one ``onnx_aot.FusedElementwise``.

Working back from each elementwise node not yet taken (a group's root), the group grows into the
producers of its inputs while the producer is elementwise too, its result is read by that one
member only (it may read it twice, as in x * x) and is not a graph output, and its result has the
root's shape (so every member computes the full output; only the group's inputs broadcast). A
group of two or more nodes becomes one node whose ``program`` (docs/ops.md) lists the members in
graph order; the root's output Value is kept. The op names come from
``runtime.kernels.elementwise`` (unary ops take one argument, binary ones exactly two).
"""

from __future__ import annotations

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
from runtime.kernels.elementwise import ELEMENTWISE_BINARY
from runtime.kernels.elementwise import ELEMENTWISE_UNARY

__all__ = ["FuseElementwise"]

_FLOAT32 = np.dtype(np.float32)


def _fusable(node: Node) -> bool:
    if node.domain != ONNX_DOMAIN or len(node.outputs) != 1 or node.outputs[0].dtype != _FLOAT32:
        return False
    # only ops the fused program runs (docs/ops.md): an op of no inputs (ConstantOfShape of a
    # run-time shape, Range, EyeLike ...) is no elementwise op, whatever its arity
    if node.op_type in ELEMENTWISE_UNARY:
        arity = 1
    elif node.op_type in ELEMENTWISE_BINARY:
        arity = 2
    else:
        return False
    if len(node.inputs) != arity:
        return False
    return all(v is not None and v.dtype == _FLOAT32 for v in node.inputs)


class FuseElementwise(Pass):
    name = "fuse_elementwise"

    def run(self, graph: Graph) -> PassResult:
        taken: set[int] = set()
        groups: list[list[Node]] = []
        # Consumers first: a node is a root only if no later elementwise node could absorb it.
        for node in reversed(graph.nodes):
            if id(node) in taken or not _fusable(node):
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
        group, stack = [root], [root]
        while stack:
            consumer = stack.pop()
            for value in consumer.inputs:
                producer = value.producer if value is not None else None
                if producer is None or id(producer) in taken or not _fusable(producer):
                    continue
                assert value is not None
                if value.shape != shape or graph.is_graph_output(value):
                    continue
                if any(use.node is not consumer for use in value.uses):
                    continue
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
        "FusedElementwise",
        inputs,
        [members[-1].outputs[0]],
        {"program": program},
        name=members[0].name,
        domain=AOT_DOMAIN,
        origin=merged_origin(members),
    )
