"""Import-time folding: every node whose inputs are known at compile time is evaluated there.

The rule (docs/ops.md, "Folding"): a node of the default ONNX domain is evaluated with the
reference kernels (``runtime.kernels``, on its canonical form) when

- everything its canonical form reads is *known*: a constant, or, for ``Shape``, a tensor of
  known shape (Shape reads only the shape);
- it is not random (``NONDETERMINISTIC`` ops and any op with a ``seed`` attribute);
- its results total at most ``FOLD_MAX_BYTES``: a folded result is stored in weights.bin, so a large
  Expand / Tile / ConstantOfShape stays a node that computes it at run time (the level-1 pass
  ``fold_constants`` folds larger results, an optimization the level controls).

There is no list of foldable ops: the reference kernels are the list. The node's outputs become
constants, so the nodes after it see known inputs in turn.

**Why one sweep is the fixed point.** The importer visits the nodes in topological order. For an
output whose shape onnx's whole-model inference left unknown, it infers that node alone from what
is known of its inputs (their constants given as initializers). Inference and evaluation carry
facts only forward along edges, so when a node is visited every fact about its inputs that any
number of "fold, re-infer, repeat until nothing changes" rounds could establish is established:
the one ordered sweep is that fixed point.

**What is known, and why not.** :class:`Knowledge` records, for each value the sweep could not
make a constant, the node that computes it, that node's inputs that are not known, and why it
stayed a node when they all were. Error messages walk these records back to the graph inputs a
value depends on (:meth:`Knowledge.explain`). Dynamic shapes (dims that are symbols) extend this
without replacing it: a shape becomes partly known, a ``Shape`` result a vector of integers and
symbols; ``known_array`` and the records gain that partial kind and a symbolic step joins
``evaluate``, while the constant rule above stays as it is.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from compiler.ir.evaluate import run_node
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.passes.base import NONDETERMINISTIC

__all__ = ["FOLD_MAX_BYTES", "Knowledge", "Producer", "evaluate", "is_random", "known_array"]

# Results of one node larger than this stay a node at import. Far above any shape computation
# (a rank-8 int64 shape is 64 bytes) and small next to real weights.
FOLD_MAX_BYTES = 64 << 10


class NotFolded(Exception):
    """Why a node stays a node (internal to this module)."""


def is_random(op_type: str, attr_names: Sequence[str]) -> bool:
    """A random op: its result is not a function of its inputs, so it is never evaluated early."""
    return op_type in NONDETERMINISTIC or "seed" in attr_names


def known_array(node: Node, index: int) -> np.ndarray | None:
    """What a kernel reads of input ``index`` of ``node`` when it is known at compile time: the
    constant, or for ``Shape`` a zero-stride stand-in of the right shape (no memory whatever its
    size); None when it is not known."""
    value = node.inputs[index]
    if value is None:
        return None
    if value.const is not None:
        return value.const
    if node.kind == "Shape" and value.shape is not None and value.dtype is not None:
        return np.broadcast_to(np.zeros((), value.dtype), value.shape)
    return None


def evaluate(nodes: Sequence[Node]) -> dict[int, np.ndarray]:
    """Run ``nodes`` (one ONNX node's canonical form, in order) with the reference kernels.

    Returns every result by ``id`` of its Value; raises NotFolded naming the reason when an input
    is not known or a kernel refuses.
    """
    results: dict[int, np.ndarray] = {}
    for node in nodes:
        args: list[Any] = []
        for k, value in enumerate(node.inputs):
            if value is not None and id(value) in results:
                args.append(results[id(value)])
                continue
            array = known_array(node, k)
            if array is None and value is not None:
                raise NotFolded(f"input {value.name!r} is not known")
            args.append(array)
        try:
            outs = run_node(node, args)
            for value, array in zip(node.outputs, outs, strict=True):
                # (ascontiguousarray makes 0-d arrays 1-d: reshape after it)
                result = np.ascontiguousarray(np.asarray(array, dtype=value.dtype))
                results[id(value)] = result.reshape(value.shape)
        except Exception as exc:  # the kernel refuses these inputs: the node stays, the reason is kept
            raise NotFolded(f"evaluating it failed ({type(exc).__name__}: {exc})") from None
    return results


@dataclass(frozen=True)
class Producer:
    """The ONNX node that computes a value the sweep could not make a constant."""

    node: str
    op_type: str
    unknown: tuple[str, ...]  # its inputs that are not known at compile time
    why: str  # why it stays a node although its inputs are known ("" while some are not)

    def describe(self) -> str:
        return f"node {self.node!r} ({self.op_type})"


class Knowledge:
    """What the import knows of each value at compile time, and why an unknown one is unknown."""

    def __init__(self, graph_inputs: Iterable[str]) -> None:
        self._graph_inputs = frozenset(graph_inputs)
        self._producers: dict[str, Producer] = {}

    def fold(self, proto: onnx.NodeProto, name: str, nodes: Sequence[Node],
             outputs: Sequence[Value]) -> dict[str, np.ndarray] | None:
        """The ONNX node's results by output name when it folds; else None (and it is recorded)."""
        unknown = _unknown_inputs(nodes)
        made = {id(v) for node in nodes for v in node.outputs}
        produced = [v for v in outputs if id(v) in made]  # canonical forms drop unused outputs
        try:
            if unknown:
                raise NotFolded("")
            _check_foldable(proto, nodes, produced)
            results = evaluate(nodes)
            return {v.name: results[id(v)] for v in produced}
        except NotFolded as exc:
            self.stays(Producer(name, proto.op_type, tuple(unknown), str(exc)), [v.name for v in outputs])
            return None

    def stays(self, producer: Producer, outputs: Sequence[str]) -> None:
        """Record that ``producer`` stays a node computing ``outputs`` (also for nodes imported
        otherwise, such as control flow); a value keeps the first record (an inlined If branch's
        node, not the If)."""
        for output in outputs:
            self._producers.setdefault(output, producer)

    def sources(self, name: str) -> tuple[list[str], list[Producer], list[str]]:
        """Why value ``name`` is not known: the graph inputs it depends on, the nodes on the way
        whose inputs are all known but which stay nodes, and values nothing recorded computes."""
        inputs: list[str] = []
        unrecorded: list[str] = []
        stuck: dict[str, Producer] = {}
        seen: set[str] = set()
        stack = [name]
        while stack:
            current = stack.pop()
            if current in seen:
                continue
            seen.add(current)
            producer = self._producers.get(current)
            if producer is None:
                (inputs if current in self._graph_inputs else unrecorded).append(current)
            elif producer.unknown:
                stack.extend(producer.unknown)
            else:
                stuck.setdefault(producer.node, producer)
        return sorted(inputs), list(stuck.values()), sorted(unrecorded)

    def explain(self, name: str) -> str:
        """Why value ``name`` is not known at compile time and what to do, in one sentence."""
        inputs, stuck, unrecorded = self.sources(name)
        parts = [_bind_advice(inputs)] if inputs else []
        parts += [f"{p.describe()} stays a node: {p.why}" for p in stuck]
        parts += [f"{n!r} comes from a node the folding does not evaluate" for n in unrecorded]
        return "; ".join(parts) if parts else "it is not known at compile time"


def _bind_advice(inputs: list[str]) -> str:
    listed = ", ".join(repr(n) for n in inputs)
    binds = " ".join(f"--bind {n}=VALUES" for n in inputs)
    if len(inputs) == 1:
        return (f"it comes from graph input {listed}; if its value is fixed for your use, make it a "
                f"constant with {binds} (see 'onnx-aot compile --help'); a shape that follows the "
                f"input data cannot be compiled ahead of time")
    return (f"it comes from graph inputs {listed}; if their values are fixed for your use, make them "
            f"constants with {binds} (see 'onnx-aot compile --help'); a shape that follows the input "
            f"data cannot be compiled ahead of time")


def _unknown_inputs(nodes: Sequence[Node]) -> list[str]:
    """The inputs from outside the canonical nodes that are not known, without repeats."""
    made = {id(v) for node in nodes for v in node.outputs}
    names: dict[str, None] = {}
    for node in nodes:
        for k, value in enumerate(node.inputs):
            if value is not None and id(value) not in made and known_array(node, k) is None:
                names.setdefault(value.name, None)
    return list(names)


def _check_foldable(proto: onnx.NodeProto, nodes: Sequence[Node], outputs: Sequence[Value]) -> None:
    if proto.domain not in ("", "ai.onnx"):
        raise NotFolded(f"an op of domain {proto.domain!r}")
    # (the canonical form decides: Dropout is an Identity in inference, its seed unused)
    if any(is_random(node.op_type, list(node.attrs)) for node in nodes):
        raise NotFolded("a random op is never evaluated at compile time")
    if any(v.shape is None or v.dtype is None for v in outputs):
        raise NotFolded("its output shapes are not known")
    nbytes = sum(v.nbytes for v in outputs)
    if nbytes > FOLD_MAX_BYTES:
        raise NotFolded(f"its results ({nbytes:,} bytes) are over the {FOLD_MAX_BYTES:,}-byte cap on "
                        f"what is folded at import")
