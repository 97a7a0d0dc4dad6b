"""Give every graph output its own producing step (the back half's first step, compiler/back_half.py).

An output that is a constant, a graph input, or the same value as an earlier output gets an
``onnx_aot.Copy`` step, so each output has exactly one writer into the caller's array. The pass
runs on the model's graph and on every If branch and Loop / Scan body before they are planned;
run again on its own result it changes nothing.
"""

from __future__ import annotations

from compiler.ir.graph import AOT_DOMAIN
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.passes.base import Pass
from compiler.passes.base import PassResult
from runtime.contract import COPY
from runtime.contract import op_name

__all__ = ["MaterializeOutputs", "materialize_outputs"]


class MaterializeOutputs(Pass):
    name = "materialize_outputs"

    def run(self, graph: Graph) -> PassResult:
        seen: set[int] = set()
        copies = 0
        for k, value in enumerate(list(graph.outputs)):
            needs_copy = (
                value.const is not None
                or value.producer is None
                or graph.is_graph_input(value)
                or id(value) in seen
            )
            seen.add(id(value))
            if not needs_copy:
                continue
            public = graph.output_names[k] if k < len(graph.output_names) else value.name
            out = graph.make_value(public + "/copy", value.dtype, value.shape)
            graph.add_node(Node(op_name(COPY), [value], [out], {}, domain=AOT_DOMAIN,
                                name=graph.unique_name(f"copy_output_{k}"), origin=[]))
            graph.set_output(k, out)
            copies += 1
        graph.sort()
        return PassResult(graph, copies > 0)


def materialize_outputs(graph: Graph) -> None:
    """Run :class:`MaterializeOutputs` over ``graph`` (changed in place)."""
    MaterializeOutputs().run(graph)
