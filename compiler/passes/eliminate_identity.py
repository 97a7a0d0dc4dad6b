"""Remove Identity nodes (Dropout arrives as Identity from the frontend).

Uses of the Identity's output are pointed at its input. When the output is a graph output its
Value (its name) must survive: if the input is an intermediate produced by a single-output node,
that producer is rebuilt to write the graph output directly; if the input is a graph input, a
constant, another graph output or an output of a multi-output node, the Identity becomes an
``onnx_aot.Copy`` (docs/ops.md): a real copy the graph needs, never a view of its input.
"""

from __future__ import annotations

from compiler.ir.graph import AOT_DOMAIN
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.passes.base import Pass
from compiler.passes.base import PassResult
from compiler.passes.base import bypass
from compiler.passes.base import note_eliminated
from compiler.passes.base import replace_nodes
from runtime.contract import COPY
from runtime.contract import op_name

__all__ = ["EliminateIdentity"]


class EliminateIdentity(Pass):
    name = "eliminate_identity"

    def run(self, graph: Graph) -> PassResult:
        removed: list[Node] = []
        copies = 0
        for node in graph:
            if node.kind != "Identity" or len(node.outputs) != 1:
                continue
            src, out = node.input(0), node.outputs[0]
            if src is None:
                continue
            if not graph.is_graph_output(out):
                bypass(graph, node, [src])
                removed.append(node)
            elif self._hand_output_to_producer(graph, node, src, out):
                removed.append(node)
            else:
                copy = Node(op_name(COPY), [src], [out], {}, name=node.name, domain=AOT_DOMAIN,
                            origin=node.origin)
                replace_nodes(graph, [node], copy)
                copies += 1
        note_eliminated(graph, removed, self.name)
        return PassResult(graph, bool(removed) or copies > 0)

    @staticmethod
    def _hand_output_to_producer(graph: Graph, identity: Node, src: Value, out: Value) -> bool:
        """Make ``src``'s producer write the graph output ``out`` itself; False when it cannot."""
        producer = src.producer
        if producer is None or len(producer.outputs) != 1 or graph.is_graph_output(src):
            return False
        # Everything that read src (the Identity included) now reads out; the rebuilt producer
        # takes src's place in the order, before all of those readers.
        graph.replace_all_uses(src, out)
        rebuilt = Node(
            producer.op_type,
            producer.inputs,
            [out],
            producer.attrs,
            name=producer.name,
            domain=producer.domain,
            origin=producer.origin,
        )
        replace_nodes(graph, [producer, identity], rebuilt, at=producer)
        return True
