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
value depends on (:meth:`Knowledge.explain`). Dynamic shapes (dims that are symbols, ``--shape
x=1x3x48x32..2048``) extend this without replacing it: a ``Shape`` of a tensor with symbolic dims
is known too, and a node that reads such a shape or a *symbolic constant* folds into a symbolic
constant -- an object array of ints and expressions (``runtime/symbolic.py``), e.g. a Reshape's
target ``[1, 120, H*W]`` -- by :func:`fold_symbolic`: the same reference kernels run at several
bindings of the symbols and each integer element is fitted as an expression (``probing.py``).
The constant rule above stays as it is: a result whose shape depends on the symbols is no
constant and stays a node.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from compiler.frontend.fit_check import check_bindings
from compiler.frontend.fit_check import verify_fits
from compiler.frontend.probing import Probes
from compiler.frontend.probing import atoms_of
from compiler.frontend.probing import fit
from compiler.frontend.shape_arith import fold_exact
from compiler.ir.evaluate import concrete_shape
from compiler.ir.evaluate import run_node
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.ir.graph import is_symbolic_shape
from compiler.passes.base import NONDETERMINISTIC
from runtime.errors import ShapeError
from runtime.symbolic import evaluate as sym_evaluate
from runtime.symbolic import free_symbols

Binding = Mapping[str, int]

__all__ = ["FOLD_MAX_BYTES", "Knowledge", "Producer", "evaluate", "fold_symbolic", "is_known", "is_random",
           "known_array"]

# Results of one node larger than this stay a node at import. Far above any shape computation
# (a rank-8 int64 shape is 64 bytes) and small next to real weights.
FOLD_MAX_BYTES = 64 << 10


class NotFolded(Exception):
    """Why a node stays a node (internal to this module)."""


def is_random(op_type: str, attr_names: Sequence[str]) -> bool:
    """A random op: its result is not a function of its inputs, so it is never evaluated early."""
    return op_type in NONDETERMINISTIC or "seed" in attr_names


def known_array(node: Node, index: int, binding: Binding | None = None) -> np.ndarray | None:
    """What a kernel reads of input ``index`` of ``node`` when it is known at compile time: the
    constant, or for ``Shape`` a zero-stride stand-in of the right shape (no memory whatever its
    size); None when it is not known. A symbolic constant or a symbolic shape is taken at
    ``binding`` (the symbols' values); without one, a symbolic constant is its object array and a
    symbolic shape's stand-in is None."""
    value = node.inputs[index]
    if value is None:
        return None
    if value.const is not None:
        if value.const.dtype != object or binding is None:
            return value.const
        flat = [sym_evaluate(d, binding) for d in value.const.reshape(-1)]
        return np.array(flat, dtype=value.dtype).reshape(value.const.shape)
    if node.kind == "Shape" and value.shape is not None and value.dtype is not None:
        if is_symbolic_shape(value.shape) and binding is None:
            return None
        return np.broadcast_to(np.zeros((), value.dtype), concrete_shape(value.shape, binding))
    return None


def is_known(node: Node, index: int) -> bool:
    """Input ``index`` of ``node`` is known at compile time (a constant, symbolic or not; for
    ``Shape``, an input whose shape is known, symbolic or not)."""
    value = node.inputs[index]
    if value is None or value.const is not None:
        return value is not None
    return node.kind == "Shape" and value.shape is not None and value.dtype is not None


def evaluate(nodes: Sequence[Node], binding: Binding | None = None) -> dict[int, np.ndarray]:
    """Run ``nodes`` (one ONNX node's canonical form, in order) with the reference kernels, symbolic
    dims and constants taken at ``binding``.

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
            array = known_array(node, k, binding)
            if array is None and value is not None:
                raise NotFolded(f"input {value.name!r} is not known")
            args.append(array)
        try:
            outs = run_node(node, args, binding=binding)
            for value, array in zip(node.outputs, outs, strict=True):
                # (ascontiguousarray makes 0-d arrays 1-d: reshape after it)
                result = np.ascontiguousarray(np.asarray(array, dtype=value.dtype))
                results[id(value)] = result.reshape(concrete_shape(value.shape or (), binding))
        except Exception as exc:  # the kernel refuses these inputs: the node stays, the reason is kept
            raise NotFolded(f"evaluating it failed ({type(exc).__name__}: {exc})") from None
    return results


def fold_symbolic(nodes: Sequence[Node], outputs: Sequence[Value], probes: Probes,
                  where: str = "a shape computation") -> dict[str, np.ndarray]:
    """The results of ``nodes`` (inputs known, some symbolic) as expressions of the symbols: each
    integer element (or whole-number float element) fitted from evaluations at the probe bindings
    (``probing.py``). A result that is the same at every probe is a plain constant; one whose
    shape, or fractional or boolean value, depends on the symbols is not folded."""
    groups: list[Sequence[object]] = []
    for node in nodes:
        for value in node.inputs:
            if value is not None and value.const is not None and value.const.dtype == object:
                groups.append(list(value.const.reshape(-1)))
            elif node.kind == "Shape" and value is not None and value.shape is not None:
                groups.append(value.shape)
    atoms = atoms_of(*groups)
    found = probes.run(lambda b: [evaluate(nodes, b)[id(v)] for v in outputs])
    if not found:
        raise NotFolded("evaluating it failed at every probe binding of the symbols")
    bindings = [b for b, _ in found]
    folded: dict[str, np.ndarray] = {}
    for j, value in enumerate(outputs):
        arrays = [results[j] for _, results in found]
        if len({a.shape for a in arrays}) != 1:
            raise NotFolded("the shape of its result depends on the symbols")
        if all(np.array_equal(a, arrays[0]) for a in arrays):
            differs = _differs_at(nodes, value, arrays[0], atoms, probes, bindings[0])
            if differs is None:
                folded[value.name] = arrays[0]
                continue
            if arrays[0].dtype.kind not in "iu":  # (an integer one is fitted and checked below)
                at = ", ".join(f"{n}={v}" for n, v in sorted(differs.items()))
                raise NotFolded(f"its result is the same at every probe size of the symbols but another "
                                f"at {at}: it depends on them and is not a whole number")
        if not (arrays[0].dtype.kind in "iu" or (arrays[0].dtype.kind == "f" and all(
                np.array_equal(a, np.floor(a)) and np.all(np.abs(a) < 2**24) for a in arrays))):
            # (a shape cast to float and scaled by whole numbers stays whole: Range(0.0, W) folds)
            raise NotFolded("its result depends on the symbols and is not a whole number")
        table = np.stack([a.reshape(-1) for a in arrays])
        elements = []
        for e in range(table.shape[1]):
            dim = fit(table[:, e].tolist(), atoms, bindings)
            if dim is None:
                raise NotFolded(f"element {e} of its result fits no expression of the symbols")
            elements.append(dim)

        def truth(at: list[dict[str, int]], j: int = j) -> list[list[int] | None]:
            return [_evaluated(nodes, outputs[j], b) for b in at]

        labels = [f"element {e} of {value.name!r}" for e in range(len(elements))]
        found_j = [(b, [int(x) for x in table[i]]) for i, b in enumerate(bindings)]
        try:
            elements = verify_fits(where, labels, elements, found_j, atoms, truth, probes.ranges)
        except ShapeError as exc:  # (it stays a node: what needs its value at compile time says why)
            raise NotFolded(str(exc)) from None
        array = np.empty(len(elements), dtype=object)
        array[:] = elements
        folded[value.name] = array.reshape(arrays[0].shape)
    return folded


def _evaluated(nodes: Sequence[Node], value: Value, binding: Binding) -> list[int] | None:
    """``value``'s elements computed by the reference kernels at ``binding`` (None where they refuse
    it, or where an element is not a whole number)."""
    try:
        array = evaluate(nodes, binding)[id(value)].reshape(-1)
    except NotFolded:
        return None
    if array.dtype.kind == "f" and not np.array_equal(array, np.floor(array)):
        return None
    return [int(x) for x in array]


def _differs_at(nodes: Sequence[Node], value: Value, array: np.ndarray, atoms: Sequence[Any],
                probes: Probes, base: Binding) -> dict[str, int] | None:
    """A check size (``fit_check.py``) where a result equal at every probe is not ``array`` (a
    value that differs at one size only, ``W == 37``, is no constant); None where there is none."""
    symbols = {n for atom in atoms for n in free_symbols(atom)}
    for binding in check_bindings(probes.ranges, symbols, dict(base), [], new=False):
        try:
            result = evaluate(nodes, binding)[id(value)]
        except NotFolded:
            continue  # (a size the computation refuses)
        if not np.array_equal(result, array):
            return binding
    return None


def _agrees(nodes: Sequence[Node], outputs: Sequence[Value], exact: Mapping[str, np.ndarray],
            probes: Probes) -> bool:
    """The exact symbolic results ``exact`` equal the reference kernels' at the probes near the
    range ends (where those run; at none of them: False, and the node is probed as before)."""
    checked = 0
    for binding in probes.varied[:6]:
        try:
            results = evaluate(nodes, binding)
        except NotFolded:
            continue
        for value in outputs:
            want = np.array([sym_evaluate(d, binding) for d in exact[value.name].reshape(-1)])
            if not np.array_equal(want, np.asarray(results[id(value)]).reshape(-1)):
                return False
        checked += 1
    return checked > 0


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

    def __init__(self, graph_inputs: Iterable[str], ranges: dict[str, tuple[int, int]] | None = None) -> None:
        self._graph_inputs = frozenset(graph_inputs)
        self._producers: dict[str, Producer] = {}
        self.symbols = dict(ranges or {})  # the symbols of dynamic dims and their ranges
        self.probes = Probes(self.symbols) if ranges else None  # bindings of the symbols, if any
        # id(a run-time value) -> (the value, sample values of it): a loop step's iteration number
        # at its first iterations, and what the import computes from it (shapes only, importer.py)
        self.samples: dict[int, tuple[Value, list[np.ndarray]]] = {}
        self.input_shapes: dict[str, tuple[Any, ...]] = {}  # graph inputs' shapes (messages name them)

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
            if self.probes is not None and _reads_symbols(nodes):
                exact = fold_exact(nodes, produced, self.symbols)
                if exact is not None and _agrees(nodes, produced, exact, self.probes):
                    return exact
                return fold_symbolic(nodes, produced, self.probes, f"node {name!r} ({proto.op_type})")
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
            if value is not None and id(value) not in made and not is_known(node, k):
                names.setdefault(value.name, None)
    return list(names)


def _reads_symbols(nodes: Sequence[Node]) -> bool:
    """Some node reads a symbolic constant, or a symbolic shape through ``Shape``."""
    return any(value is not None and (value.is_symbolic if value.const is not None
                                      else node.kind == "Shape" and is_symbolic_shape(value.shape))
               for node in nodes for value in node.inputs)


def _check_foldable(proto: onnx.NodeProto, nodes: Sequence[Node], outputs: Sequence[Value]) -> None:
    if proto.domain not in ("", "ai.onnx"):
        raise NotFolded(f"an op of domain {proto.domain!r}")
    # (the canonical form decides: Dropout is an Identity in inference, its seed unused)
    if any(is_random(node.op_type, list(node.attrs)) for node in nodes):
        raise NotFolded("a random op is never evaluated at compile time")
    if any(v.shape is None or v.dtype is None for v in outputs):
        raise NotFolded("its output shapes are not known")
    if any(is_symbolic_shape(v.shape) for v in outputs):
        raise NotFolded("its output shapes depend on the symbols (a constant has one shape)")
    nbytes = sum(v.nbytes for v in outputs)
    if nbytes > FOLD_MAX_BYTES:
        raise NotFolded(f"its results ({nbytes:,} bytes) are over the {FOLD_MAX_BYTES:,}-byte cap on "
                        f"what is folded at import")
