"""The pass contract and the small graph-rewriting helpers the passes share.

A pass is a small class with a ``name`` and ``run(graph) -> PassResult(graph, modified)``
(STYLE.md #2). The helpers here change graphs only through the IR's own methods: in particular
:func:`replace_nodes` swaps a group of nodes for one new node while keeping the Value objects
(and so the names) of the outputs the group hands on, which keeps graph output names stable.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable
from collections.abc import Collection
from collections.abc import Iterable
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from typing import ClassVar

import numpy as np

from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value

__all__ = [
    "add_constant",
    "bypass",
    "NONDETERMINISTIC",
    "NO_ACTIVATION",
    "Pass",
    "PassResult",
    "merged_origin",
    "note_eliminated",
    "replace_nodes",
    "rewrite_each",
    "sole_consumer",
]

# Activation attributes of a FusedConv / FusedGemm without an activation (docs/ops.md).
NO_ACTIVATION: dict[str, Any] = {
    "activation": "",
    "act_min": -math.inf,
    "act_max": math.inf,
    "act_alpha": 0.0,
}

# Ops whose result is not a function of their inputs: never folded, never merged.
NONDETERMINISTIC = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}
)


@dataclass(frozen=True)
class PassResult:
    """What a pass hands back: the (possibly same) graph and whether it changed anything."""

    graph: Graph
    modified: bool


class Pass(abc.ABC):
    """One graph transformation. Subclasses set ``name`` (their file's name) and define ``run``."""

    name: ClassVar[str]

    @abc.abstractmethod
    def run(self, graph: Graph) -> PassResult:
        """Transform ``graph`` in place through its API; report whether anything changed."""

    def __call__(self, graph: Graph) -> PassResult:
        return self.run(graph)

    def __repr__(self) -> str:
        return f"<pass {self.name}>"


def add_constant(graph: Graph, base: str, array: np.ndarray) -> Value:
    """``graph.add_constant``, keeping a 0-d array 0-d.

    ``np.ascontiguousarray`` (which the IR applies) turns a 0-d array into shape (1,); a folded
    scalar (Gather of one dim of a Shape) must keep its rank, so the fresh constant (nothing
    uses it yet) gets its 0-d array back.
    """
    value = graph.add_constant(base, array)
    if value.shape != array.shape:
        assert value.const is not None and value.const.size == array.size
        value.const = value.const.reshape(array.shape)
        value.shape = tuple(array.shape)
    return value


def sole_consumer(graph: Graph, value: Value) -> Node | None:
    """The node that uses ``value`` exactly once, when nothing else (not even the graph) does."""
    if len(value.uses) != 1 or graph.is_graph_output(value):
        return None
    return value.uses[0].node


def merged_origin(nodes: Iterable[Node]) -> list[str]:
    """The union of the nodes' ``origin`` lists, in order, without repeats."""
    seen: dict[str, None] = {}
    for node in nodes:
        for name in node.origin:
            seen.setdefault(name, None)
    return list(seen)


def note_eliminated(graph: Graph, removed: Sequence[Node], pass_name: str) -> None:
    """Record in ``graph.eliminated`` the ONNX nodes of ``removed`` that no node stands for now.

    One ONNX node may become several IR nodes (Dropout -> Identity + ConstantOfShape), so a name
    counts as eliminated only once no remaining node lists it in its ``origin``.
    """
    if not removed:
        return
    alive = {name for node in graph for name in node.origin}
    for node in removed:
        for name in node.origin:
            if name and name not in alive and name not in graph.eliminated:
                graph.eliminated[name] = pass_name


def bypass(graph: Graph, node: Node, values: Sequence[Value]) -> None:
    """Remove ``node``; whatever used its outputs uses ``values`` instead (one per output, in order)."""
    for old, new in zip(node.outputs, values, strict=True):
        graph.replace_all_uses(old, new)
    graph.remove_node(node)


def replace_nodes(graph: Graph, old: Sequence[Node], new: Node, *, at: Node | None = None) -> Node:
    """Replace the nodes ``old`` by the one node ``new``, placed where ``at`` was.

    ``at`` defaults to the last of ``old`` in graph order. ``new``'s outputs may be outputs of
    ``old`` (the same Value objects: their names, uses and graph-output slots are kept) or fresh
    values; every other output of ``old`` must be used only inside ``old``. The caller picks ``at``
    so that ``new``'s inputs are defined before it and its outputs' users come after it.
    """
    order = {id(node): i for i, node in enumerate(graph.nodes)}
    olds = sorted(old, key=lambda node: order[id(node)])
    anchor = at if at is not None else olds[-1]
    old_ids = {id(node) for node in olds}
    later = graph.nodes[order[id(anchor)] + 1 :]
    following = next((node for node in later if id(node) not in old_ids), None)
    # Park the kept outputs' uses (and graph-output slots) on stand-ins while the old producers
    # go, so the same Value objects can be handed to the new node.
    parked: list[tuple[Value, Value]] = []
    for value in new.outputs:
        if value.producer is not None:
            stand_in = Value(f"{value.name}__parked", value.dtype, value.shape)
            graph.replace_all_uses(value, stand_in)
            parked.append((stand_in, value))
    for node in reversed(olds):
        graph.remove_node(node)
    graph.add_node(new, before=following)
    for stand_in, value in parked:
        graph.replace_all_uses(stand_in, value)
    return new


def rewrite_each(graph: Graph, kinds: Collection[str], rewrite: Callable[[Graph, Node], bool]) -> bool:
    """Apply the local rewrite ``rewrite`` once at every node of ``kinds`` in ``graph`` (the node
    list as it was before the first rewrite; a node an earlier rewrite removed is passed over).
    True when any rewrite changed the graph."""
    modified = False
    for node in list(graph):
        if node.graph is graph and node.kind in kinds:
            modified = rewrite(graph, node) or modified
    return modified


def rewrite_chains(graph: Graph, step: Callable[[Graph, Node], Node | None],
                   start: Callable[[Node], bool] = lambda node: True) -> bool:
    """Apply the local rewrite ``step`` at every node where ``start`` holds, then again at the node
    it returns, for as long as it returns one (Conv, then BatchNorm, then Relu into it, ...).
    True when any step rewrote something."""
    modified = False
    for node in graph:
        current: Node | None = node
        while current is not None and current.graph is graph and start(current):
            current = step(graph, current)
            modified = modified or current is not None
    return modified
