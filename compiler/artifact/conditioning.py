"""Golden tolerances that cover the reference's own sensitivity, where the built artifact needs it.

The compile's check (``compiler/artifact/check.py``) holds every output of the built artifact to
the tolerance of its dtype (``golden.tolerance_for``: 2e-3 for float32). Some outputs are
ill-conditioned at the golden inputs: a loop that sums to 1e5 before a ``sin``, a long chain of
rounding steps. There any kernel that orders its float operations differently from the numpy
reference -- a vector FMA, a blocked sum -- moves the output by more than 2e-3, and the reference
moves as much when its own inputs move by one unit in the last place. Such a disagreement is no
kernel bug, and refusing the artifact for it would refuse correct code.

``widen_for_conditioning`` measures that: for each output the check found off its tolerance it
reruns the reference on the case's inputs with every float input nudged one ulp away from zero
(and, in a quantized graph, the input of every QuantizeLinear moved by 1e-5 of itself: there
rounding flips between kernels are integer steps that compound), and takes the relative
distance between the two reference outputs (the output's *conditioning*).
When the artifact's error is within ``FACTOR`` times that distance for every such output, the
golden files are returned with those tolerances raised to ``FACTOR`` times the conditioning (each
recorded as ``"conditioning"`` beside it, so ``verify`` holds the artifact to the same bound on the
deploy machine); otherwise None, and the check's error stands. It runs only after a check failed,
so a compile pays nothing for it when the artifact agrees.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np

from compiler.artifact.golden import GOLDEN_BIN
from compiler.artifact.golden import GOLDEN_JSON
from compiler.ir.evaluate import Interpreter
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from runtime.errors import OnnxAotError
from runtime.selftest import generate_input
from runtime.selftest import relative_error

__all__ = ["FACTOR", "widen_for_conditioning"]

FACTOR = 4.0  # an error up to this many times the reference's own 1-ulp movement is rounding
JITTER = 1e-5  # relative move of a quantizing node's input (float sums of ~100 terms differ so)
QUANTIZING = frozenset({"QuantizeLinear", "DynamicQuantizeLinear"})
Mismatch = tuple[int, str, float]  # (case, output name, relative error) as ArtifactCheckError has them


def _feeds(case: Mapping[str, Any]) -> dict[str, np.ndarray]:
    return {r["name"]: generate_input(r["generator"], np.dtype(r["dtype"]), tuple(r["shape"]), int(r["seed"]))
            for r in case["inputs"]}


def _nudged(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """``feeds`` with every float array moved one ulp away from zero (None: no float input)."""
    out = dict(feeds)
    moved = False
    for name, array in feeds.items():
        if array.dtype.kind == "f" and array.size:
            away = np.copysign(np.inf, array).astype(array.dtype)
            out[name] = np.nextafter(array, away).astype(array.dtype)
            moved = True
    return out if moved else None


class _AsImported(Interpreter):
    """The reference run of a graph whose control steps were compiled since the golden cases were
    made: each node runs with the attributes it had then (``attrs_of``: id(node) -> attributes;
    a compiled step's programs are gone from its own). With ``jitter``, the float input of every
    quantizing node moves by ``JITTER`` of itself, up or down at random (seeded): the size of the
    differences between two correct float kernels that sum in different orders, which flip the
    values lying that near a rounding boundary to the next integer step."""

    def __init__(self, graph: Graph, attrs_of: Mapping[int, dict[str, Any]], binding: Any,
                 jitter: bool = False) -> None:
        super().__init__(graph, binding=binding)
        self.attrs_of = attrs_of
        self.rng = np.random.default_rng(0) if jitter else None

    def run_node(self, node: Node, args: list[Any]) -> list[Any]:
        if self.rng is not None and node.kind in QUANTIZING and args and args[0] is not None:
            x = np.asarray(args[0])
            if x.dtype.kind == "f":
                signs = self.rng.choice(np.array([-JITTER, JITTER], x.dtype), x.shape)
                args = [x + x * signs, *args[1:]]
        now = node.attrs
        node.attrs = self.attrs_of.get(id(node), now)
        try:
            return super().run_node(node, args)
        finally:
            node.attrs = now


def _conditioning(graph: Graph, attrs_of: Mapping[int, dict[str, Any]],
                  case: Mapping[str, Any]) -> list[float] | None:
    """Per output of ``case``: the reference's relative movement under the 1-ulp nudge."""
    feeds = _feeds(case)
    nudged = _nudged(feeds)
    if nudged is None:
        return None
    binding = case.get("binding")
    jitter = any(node.kind in QUANTIZING for node in graph.nodes)
    try:
        base = _AsImported(graph, attrs_of, binding).run(feeds)
        moved = _AsImported(graph, attrs_of, binding, jitter).run(nudged)
    except (OnnxAotError, ArithmeticError, ValueError, TypeError, IndexError, KeyError, MemoryError):
        return None
    return [relative_error(np.asarray(m), np.asarray(b)) for m, b in zip(moved, base, strict=True)]


def _round_up(value: float) -> float:
    """``value`` rounded up to three significant digits (a stable, readable tolerance)."""
    if value <= 0 or not math.isfinite(value):
        return value
    scale = 10.0 ** (math.floor(math.log10(value)) - 2)
    return math.ceil(value / scale) * scale


def widen_for_conditioning(graph: Graph, attrs_of: Mapping[int, dict[str, Any]], files: Mapping[str, bytes],
                           mismatches: Sequence[Mismatch]) -> dict[str, bytes] | None:
    """The golden ``files`` with the tolerances of ``mismatches`` widened to their outputs'
    conditioning, or None when some mismatch is more than rounding (see the module docstring).
    ``attrs_of``: each node's attributes when the golden cases were made (id(node) -> dict)."""
    if not mismatches:
        return None
    index = json.loads(files[GOLDEN_JSON].decode("utf-8"))
    spreads: dict[int, list[float] | None] = {}
    for case_no, output, error in mismatches:
        case = index["cases"][case_no]
        if case_no not in spreads:
            spreads[case_no] = _conditioning(graph, attrs_of, case)
        spread = spreads[case_no]
        names = [r["name"] for r in case["outputs"]]
        if spread is None or output not in names:
            return None
        k = names.index(output)
        if not math.isfinite(error) or not math.isfinite(spread[k]) or error > FACTOR * spread[k]:
            return None
        record = case["outputs"][k]
        record["tolerance"] = max(float(record["tolerance"]), _round_up(FACTOR * spread[k]))
        record["conditioning"] = spread[k]
    text = json.dumps(index, indent=1, ensure_ascii=False) + "\n"
    return {GOLDEN_JSON: text.encode("utf-8"), GOLDEN_BIN: files[GOLDEN_BIN]}
