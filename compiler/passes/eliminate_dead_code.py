"""Remove nodes whose outputs nothing uses (and that produce no graph output), then unused constants."""

from __future__ import annotations

from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.passes.base import Pass
from compiler.passes.base import PassResult
from compiler.passes.base import note_eliminated

__all__ = ["EliminateDeadCode"]


class EliminateDeadCode(Pass):
    name = "eliminate_dead_code"

    def run(self, graph: Graph) -> PassResult:
        removed: list[Node] = []
        # Consumers before producers, so a whole dead branch goes in one sweep.
        for node in reversed(graph.nodes):
            if any(value.uses or graph.is_graph_output(value) for value in node.outputs):
                continue
            graph.remove_node(node)
            removed.append(node)
        note_eliminated(graph, removed, self.name)
        constants = len(graph.constants)
        graph.prune_constants()
        return PassResult(graph, bool(removed) or len(graph.constants) != constants)
