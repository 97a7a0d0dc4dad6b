"""Where each value lives, and the arena buffers (with lifetimes over steps) that result.

A value lives in one of three places: the caller's arrays ("ext": graph inputs and outputs),
weights.bin ("weights": constants) or an arena ("arena": everything else). Values that share
memory share a *root*: a view (Reshape, Identity) aliases its input; an elementwise step may write
over an input of the same shape that dies at that step (in place). Each arena root becomes one
:class:`Buffer` whose lifetime runs from its producer's step to the last step that reads any value
sharing it; kernel scratch is a buffer live for one step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from compiler.ir.graph import Graph, Value
from compiler.memory.packing import Buffer

__all__ = ["VIEW_KINDS", "INPLACE_KINDS", "Storage", "assign_storage"]

VIEW_KINDS = frozenset({"Reshape", "Identity"})
INPLACE_KINDS = frozenset(
    "Relu Sigmoid Tanh Exp Log Neg Abs Sqrt Reciprocal Erf Floor Ceil Softplus Clip LeakyRelu Elu "
    "HardSigmoid Gelu Add Sub Mul Div Pow Max Min Sum Mean onnx_aot.FusedElementwise".split()
)


@dataclass
class Storage:
    """The result of storage assignment for one schedule."""

    root: dict[str, str]  # value name -> name of the value whose memory it uses
    kind: dict[str, str]  # root name -> "ext" | "weights" | "arena"
    space: dict[str, str]  # root name -> memory space (arena roots only)
    buffers: dict[str, list[Buffer]] = field(default_factory=dict)  # memory space -> buffers
    tensors: dict[str, list[str]] = field(default_factory=dict)  # buffer id -> values in it
    inplace: list[tuple[str, str]] = field(default_factory=list)  # (output, input) pairs
    views: list[tuple[str, str]] = field(default_factory=list)


def assign_storage(
    graph: Graph,
    steps: list,
    step_space: list[str],
    scratch: list[int],
    *,
    inplace: bool = True,
) -> Storage:
    """Resolve aliasing and build the buffers of each memory space.

    ``steps`` are the scheduled nodes, ``step_space[t]`` the memory space of step t's provider and
    ``scratch[t]`` the scratch bytes step t needs.
    """
    parent: dict[str, str] = {}

    def find(name: str) -> str:
        while parent.get(name, name) != name:
            name = parent[name]
        return name

    kind: dict[str, str] = {}
    for value in graph.inputs:
        kind[value.name] = "ext"
    for value in graph.outputs:
        kind[value.name] = "ext"
    for value in graph.constants.values():
        kind.setdefault(value.name, "weights")
    step_of: dict[str, int] = {}
    for t, node in enumerate(steps):
        for value in node.outputs:
            step_of[value.name] = t
            kind.setdefault(value.name, "arena")

    storage = Storage(root={}, kind={}, space={})
    for t, node in enumerate(steps):
        src = node.input(0)
        out = node.outputs[0] if node.outputs else None
        if node.kind in VIEW_KINDS and src is not None and out is not None and kind[out.name] == "arena":
            if kind[find(src.name)] != "arena" or step_space[step_of[find(src.name)]] == step_space[t]:
                parent[out.name] = find(src.name)
                storage.views.append((out.name, src.name))

    last_use: dict[str, int] = {}
    first_def: dict[str, int] = {}
    for t, node in enumerate(steps):
        for value in node.outputs:
            r = find(value.name)
            first_def.setdefault(r, t)
            last_use[r] = max(last_use.get(r, t), t)
        for value in node.inputs:
            if value is not None:
                r = find(value.name)
                last_use[r] = max(last_use.get(r, t), t)

    if inplace:
        for t, node in enumerate(steps):
            if node.kind not in INPLACE_KINDS or len(node.outputs) != 1:
                continue
            out = node.outputs[0]
            if kind[out.name] != "arena" or find(out.name) != out.name:
                continue
            for value in node.inputs:
                if value is None or not _same_layout(value, out):
                    continue
                r = find(value.name)
                if kind[r] != "arena" or last_use[r] != t or step_space[first_def[r]] != step_space[t]:
                    continue
                others = [v for v in node.inputs if v is not None and v is not value]
                if any(find(v.name) == r for v in others):
                    continue  # another operand reads the same memory through a view
                parent[out.name] = r
                last_use[r] = max(last_use[r], last_use.get(out.name, t))
                storage.inplace.append((out.name, value.name))
                break

    for value in graph.values():
        storage.root[value.name] = find(value.name)
    for name, k in kind.items():
        if find(name) == name:
            storage.kind[name] = k

    for t, node in enumerate(steps):
        for value in node.outputs:
            r = find(value.name)
            if kind[r] != "arena":
                continue
            storage.tensors.setdefault(r, []).append(value.name)
            if r == value.name:
                space = step_space[t]
                storage.space[r] = space
                storage.buffers.setdefault(space, []).append(
                    Buffer(r, value.nbytes, first_def[r], last_use[r]))
        if scratch[t] > 0:
            bid = f"scratch/{t}"
            storage.buffers.setdefault(step_space[t], []).append(Buffer(bid, scratch[t], t, t))
            storage.tensors[bid] = []
    return storage


def _same_layout(a: Value, b: Value) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype
