"""Where each value lives, and the arena buffers (with lifetimes over steps) that result.

A value lives in one of three places: the caller's arrays ("ext": graph inputs and outputs),
weights.bin ("weights": constants) or an arena ("arena": everything else). Values that share
memory share a *root*: a view (Reshape, Identity) aliases its input; an elementwise step may write
over an input of the same shape that dies at that step (in place); a Concat input may be produced
straight into its slice of the Concat output (a root plus a byte offset). Each arena root becomes one
:class:`Buffer` whose lifetime runs from its producer's step to the last step that reads any value
sharing it; kernel scratch is a buffer live for one step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from dataclasses import field

from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.memory.packing import Buffer
from runtime.contract import FUSED_ELEMENTWISE
from runtime.contract import TRANSFER

__all__ = ["VIEW_KINDS", "INPLACE_KINDS", "TRANSFER", "Storage", "assign_storage"]

VIEW_KINDS = frozenset({"Reshape", "Identity"})
INPLACE_KINDS = frozenset(
    "Relu Sigmoid Tanh Exp Log Neg Abs Sqrt Reciprocal Erf Floor Ceil Softplus Clip LeakyRelu Elu "
    "HardSigmoid Gelu Add Sub Mul Div Pow Max Min Sum Mean".split()
) | {FUSED_ELEMENTWISE}


@dataclass
class Storage:
    """The result of storage assignment for one schedule."""

    root: dict[str, str]  # value name -> name of the value whose memory it uses
    kind: dict[str, str]  # root name -> "ext" | "weights" | "arena"
    space: dict[str, str]  # root name -> memory space (arena roots only)
    offset: dict[str, int] = field(default_factory=dict)  # value name -> byte offset in its root
    buffers: dict[str, list[Buffer]] = field(default_factory=dict)  # memory space -> buffers
    tensors: dict[str, list[str]] = field(default_factory=dict)  # buffer id -> values in it
    inplace: list[tuple[str, str]] = field(default_factory=list)  # (output, input) pairs
    views: list[tuple[str, str]] = field(default_factory=list)
    concats: list[tuple[str, str, int]] = field(default_factory=list)  # (input, concat output, offset)


@dataclass
class _Places:
    """Where each value of one schedule lives, and the aliases decided so far (a union-find whose
    links carry byte offsets: ``parent[v] = (value v lives in, offset of v there)``)."""

    kind: dict[str, str]  # value name -> "ext" | "weights" | "arena" (before aliasing)
    space: dict[str, str]  # produced value -> memory space
    parent: dict[str, tuple[str, int]] = field(default_factory=dict)

    def find(self, name: str) -> tuple[str, int]:
        offset = 0
        while name in self.parent:
            name, delta = self.parent[name]
            offset += delta
        return name, offset

    def root(self, name: str) -> str:
        return self.find(name)[0]

    def is_arena(self, name: str) -> bool:
        return self.kind[name] == "arena"


def assign_storage(
    graph: Graph,
    steps: list,
    step_space: list[str],
    scratch: list[int],
    *,
    inplace: bool = True,
    concat_inplace: bool = True,
    overwrites: list[int | None] | None = None,
) -> Storage:
    """Resolve aliasing and build the buffers of each memory space.

    ``steps`` are the scheduled nodes, ``step_space[t]`` the memory space of step t's provider and
    ``scratch[t]`` the scratch bytes step t needs. Aliases are decided in this order: views, then
    Concat in place (an input produced straight into its slice of the Concat output, when the
    dims before the axis are all 1 so every input is one contiguous run of the output), then
    elementwise in place (which needs the lifetimes the first two produce). ``overwrites[t]``, where
    given and not None, is the one input step t's kernel may write its output over although its
    kind is not elementwise (a conv's residual: each output element read before it is stored).
    """
    places = _places(graph, steps, step_space)
    storage = Storage(root={}, kind={}, space={})
    _alias_views(steps, places, storage)
    if concat_inplace:
        for node in steps:
            if node.kind == "Concat":
                _concat_in_place(node, places, storage)
    first_def, last_use = _lifetimes(steps, places)
    if inplace:
        _alias_in_place(steps, places, first_def, last_use, storage, overwrites or [None] * len(steps))
    for value in graph.values():
        storage.root[value.name], storage.offset[value.name] = places.find(value.name)
    for name, k in places.kind.items():
        if name not in places.parent:
            storage.kind[name] = k
    _add_buffers(steps, step_space, scratch, places, (first_def, last_use), storage)
    return storage


def _places(graph: Graph, steps: list, step_space: list[str]) -> _Places:
    kind: dict[str, str] = {}
    for value in graph.inputs:
        kind[value.name] = "ext"
    for value in graph.outputs:
        kind[value.name] = "ext"
    for value in graph.constants.values():
        kind.setdefault(value.name, "weights")
    space: dict[str, str] = {}
    for t, node in enumerate(steps):
        for value in node.outputs:
            kind.setdefault(value.name, "arena")
            space[value.name] = str(node.attrs["to"]) if node.kind == TRANSFER else step_space[t]
    return _Places(kind, space)


def _alias_views(steps: list, places: _Places, storage: Storage) -> None:
    """A view's output lives in its input (unless that is in another memory space's arena)."""
    for node in steps:
        src = node.input(0)
        out = node.outputs[0] if node.outputs else None
        if node.kind in VIEW_KINDS and src is not None and out is not None and places.is_arena(out.name):
            r = places.root(src.name)
            if not places.is_arena(r) or places.space[r] == places.space[out.name]:
                places.parent[out.name] = (src.name, 0)
                storage.views.append((out.name, src.name))


def _lifetimes(steps: list, places: _Places) -> tuple[dict[str, int], dict[str, int]]:
    """(first step that writes, last step that touches) each root."""
    last_use: dict[str, int] = {}
    first_def: dict[str, int] = {}
    for t, node in enumerate(steps):
        for value in node.outputs:
            r = places.root(value.name)
            first_def[r] = min(first_def.get(r, t), t)
            last_use[r] = max(last_use.get(r, t), t)
        for value in node.inputs:
            if value is not None:
                r = places.root(value.name)
                last_use[r] = max(last_use.get(r, t), t)
    return first_def, last_use


def _alias_in_place(steps: list, places: _Places, first_def: dict[str, int], last_use: dict[str, int],
                    storage: Storage, overwrites: list[int | None]) -> None:
    """An elementwise step (or a step whose kernel says which input it may overwrite) writes over
    an input of its output's layout that dies at that step."""
    for t, node in enumerate(steps):
        index = overwrites[t]
        if (node.kind not in INPLACE_KINDS and index is None) or len(node.outputs) != 1:
            continue
        out = node.outputs[0]
        if not places.is_arena(out.name) or places.root(out.name) != out.name:
            continue
        for value in node.inputs if index is None else [node.input(index)]:
            if value is None or not _same_layout(value, out):
                continue
            r = places.root(value.name)
            if not places.is_arena(r) or last_use[r] != t or places.space[r] != places.space[out.name]:
                continue
            # (a non-elementwise kernel's other inputs: the same value there too)
            others = [v for i, v in enumerate(node.inputs)
                      if v is not None and (v is not value if index is None else i != index)]
            if any(places.root(v.name) == r for v in others):
                continue  # another operand reads the same memory (through a view)
            places.parent[out.name] = (value.name, 0)
            last_use[r] = max(last_use[r], last_use.get(out.name, t))
            first_def[r] = min(first_def[r], first_def.get(out.name, t))
            storage.inplace.append((out.name, value.name))
            break


def _add_buffers(steps: list, step_space: list[str], scratch: list[int], places: _Places,
                 lifetimes: tuple[dict[str, int], dict[str, int]], storage: Storage) -> None:
    """One buffer per arena root (in step order of its producer) and one per step's scratch."""
    first_def, last_use = lifetimes
    for t, node in enumerate(steps):
        for value in node.outputs:
            r = places.root(value.name)
            if not places.is_arena(r):
                continue
            storage.tensors.setdefault(r, []).append(value.name)
            if r == value.name:
                space = places.space[r]
                storage.space[r] = space
                storage.buffers.setdefault(space, []).append(
                    Buffer(r, value.nbytes, first_def[r], last_use[r]))
        if not isinstance(scratch[t], int) or scratch[t] > 0:  # a dynamic step's may be an Expr
            bid = f"scratch/{t}"
            storage.buffers.setdefault(step_space[t], []).append(Buffer(bid, scratch[t], t, t))
            storage.tensors[bid] = []


def _concat_in_place(node: Node, places: _Places, storage: Storage) -> None:
    """Let the inputs of Concat ``node`` live in their slices of its output, where allowed."""
    out = node.outputs[0]
    axis = int(node.attrs["axis"])
    assert out.shape is not None
    if not places.is_arena(out.name) or out.name in places.parent or math.prod(out.shape[:axis]) != 1:
        return  # (a symbolic product is an Expr, never equal to 1)
    seen: set[str] = set()
    offset = 0
    for value in node.inputs:
        assert value is not None
        nbytes = value.nbytes
        r = value.name
        if (r not in places.parent and places.is_arena(r) and r not in seen and value.dtype == out.dtype
                and places.space[r] == places.space[out.name]):
            places.parent[r] = (out.name, offset)
            storage.concats.append((r, out.name, offset))
        seen.add(value.name)
        offset += nbytes


def _same_layout(a: Value, b: Value) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype
