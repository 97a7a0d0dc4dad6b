"""IR graphs for tests: a concise builder, seeded feeds, and the before/after check a pass test runs
(STYLE.md #3: the graph verifies after the rewrite and computes the same outputs as before it)."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import numpy as np

from compiler.ir.evaluate import evaluate
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.passes import Pass
from compiler.passes.base import add_constant

__all__ = ["CONV_ATTRS", "F32", "Builder", "check", "feeds_for", "kinds", "run_graph"]

F32 = np.float32
CONV_ATTRS = {
    "kernel_shape": [3, 3],
    "strides": [1, 1],
    "pads": [1, 1, 1, 1],
    "dilations": [1, 1],
    "group": 1,
}


class Builder:
    """Builds IR graphs concisely: ``b.op("Relu", x)`` adds a node and returns its output."""

    def __init__(self, name: str = "g") -> None:
        self.graph = Graph(name)
        self.rng = np.random.default_rng(0)

    def input(self, name: str, shape: Sequence[int], dtype: Any = F32) -> Value:
        return self.graph.add_input(Value(name, dtype, tuple(shape)))

    def const(self, name: str, array: Any) -> Value:
        return add_constant(self.graph, name, np.asarray(array))

    def rand(self, name: str, *shape: int, low: float = -1.0, high: float = 1.0) -> Value:
        return self.const(name, self.rng.uniform(low, high, shape).astype(F32))

    def op(
        self,
        op_type: str,
        *inputs: Value | None,
        out_shape: Sequence[int] | None = None,
        out_dtype: Any = None,
        name: str | None = None,
        domain: str = "",
        **attrs: Any,
    ) -> Value:
        """Add a node; the output's shape defaults to the inputs' broadcast, dtype to the first's."""
        present = [v for v in inputs if v is not None]
        if out_shape is None:
            out_shape = np.broadcast_shapes(*(v.shape for v in present))
        dtype = present[0].dtype if out_dtype is None else out_dtype
        node_name = name or self.graph.unique_name(op_type.lower())
        out = Value(f"{node_name}_out", dtype, tuple(out_shape))
        self.graph.add_node(Node(op_type, inputs, [out], attrs, name=node_name, domain=domain))
        return out

    def output(self, *values: Value) -> Graph:
        for value in values:
            self.graph.add_output(value)
        self.graph.verify()
        return self.graph


def feeds_for(graph: Graph, seed: int = 1) -> dict[str, np.ndarray]:
    """Seeded uniform [-2, 2) inputs for every graph input."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in graph.inputs:
        assert value.shape is not None and value.dtype is not None
        feeds[value.name] = rng.uniform(-2.0, 2.0, value.shape).astype(value.dtype)
    return feeds


def run_graph(graph: Graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The graph's outputs by name, every node through its reference kernel."""
    return dict(zip([v.name for v in graph.outputs], evaluate(graph, feeds), strict=True))


def check(graph: Graph, rewrite: Pass | Callable[[Graph], Any], rtol: float = 1e-5) -> Any:
    """Run ``rewrite`` on ``graph`` and return what it returns; the graph must verify after it
    and compute the same outputs (same names, dtypes, values within ``rtol``) as before it."""
    feeds = feeds_for(graph)
    before = run_graph(graph, feeds)
    result = rewrite(graph)
    graph.verify()
    after = run_graph(graph, feeds)
    assert list(after) == list(before), "graph output names changed"
    for name, expected in before.items():
        assert after[name].dtype == expected.dtype
        np.testing.assert_allclose(after[name], expected, rtol=rtol, atol=rtol, err_msg=name)
    return result


def kinds(graph: Graph) -> list[str]:
    """The node kinds of ``graph`` in order (what a pass test compares)."""
    return [node.kind for node in graph.nodes]
