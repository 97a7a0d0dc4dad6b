"""``--quantize int8``'s accuracy: the artifact measured on the calibration feeds against the fp32 model.

With ``--max-error`` the candidates are the nodes the QDQ plan computes on quantized operands
(Conv, MatMul, Gemm, Add, Mul, Concat, pools, Softmax: ``compiler/quantize/qdq_plan.py``);
restoring one re-plans without it (its inputs and output stay quantized where a neighbouring int8
step needs them), over the same calibrated ranges; with every one restored nothing is quantized.

The calibration feeds ran through the fp32 model on the reference kernels when the ranges were
observed (``compiler/quantize/observe.py``), so their fp32 outputs are at hand: the built artifact
(still in its temporary folder) runs each feed once, and the error per output (max |int8 - fp32| /
max |fp32| per feed, the largest over the feeds) goes into the manifest's accuracy record. The
first STORED_FEEDS feeds and their fp32 outputs stay in the artifact (``accuracy.bin``, optional:
``strip`` removes it) for ``verify`` to rerun against the bound.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from compiler.accuracy.record import BoundMissed
from compiler.accuracy.record import StepCounts
from compiler.accuracy.record import accuracy_hook
from compiler.accuracy.record import missed_bound
from compiler.accuracy.record import store_feeds
from compiler.accuracy.search import Choice
from compiler.accuracy.search import choose_restored
from compiler.accuracy.search import more_restored
from compiler.ir.evaluate import Interpreter
from compiler.ir.graph import Graph
from compiler.memory_policy import MemoryPolicy
from compiler.quantize import Quantized
from runtime.errors import InternalError
from runtime.selftest import VerifyReport
from runtime.selftest import relative_error

__all__ = ["Int8Steps", "calibration_errors", "compile_int8", "int8_hook"]

Hook = Callable[[Path, VerifyReport | None], None]
Front = Callable[[onnx.ModelProto], tuple[Graph, MemoryPolicy]]
SEARCH_FEEDS = 8  # the search measures on the first feeds; the built artifact on every one
SENSITIVITY_FEEDS = 2  # and ranks the steps on fewer (one measurement per step)
STORED_FEEDS = 2  # calibration feeds (and fp32 outputs) the artifact keeps for verify


class Int8Steps:
    """The nodes ``quantized`` computes on int8 operands, by name; ``measure`` runs the
    QDQ model of a choice (imported, its QuantizeLinear / DequantizeLinear on the reference kernels)
    on the first SEARCH_FEEDS calibration feeds (a sensitivity on SENSITIVITY_FEEDS) against the
    fp32 outputs."""

    def __init__(self, quantized: Quantized, import_args: Mapping[str, Any]) -> None:
        self.quantized = quantized
        self.import_args = dict(import_args)
        self.index = {quantized.step_name(k): k for k in quantized.steps}

    def measure(self, restored: frozenset[str], feeds: int = SEARCH_FEEDS) -> float:
        from compiler.frontend.importer import import_model

        variant = self.quantized.variant(frozenset(self.index[n] for n in restored))
        graph = import_model(variant.model, **self.import_args)
        worst = 0.0
        pairs = list(zip(self.quantized.feeds, self.quantized.reference, strict=True))[:feeds]
        for feed, refs in pairs:
            for got, ref in zip(Interpreter(graph).run(feed), refs, strict=True):
                if np.asarray(ref).dtype.kind == "f":
                    worst = max(worst, relative_error(np.asarray(got), np.asarray(ref)))
        return worst

    def sensitivity(self, name: str) -> float:
        return self.measure(frozenset(self.index) - {name}, SENSITIVITY_FEEDS)


def compile_int8(quantized: Quantized, import_args: Mapping[str, Any], front: Front,
                 back: Callable[[Graph, MemoryPolicy, Hook], Path], bound: float,
                 say: Callable[[str], None]) -> Path:
    """A ``--quantize int8 --max-error`` compile: quantized steps back to fp32 until the artifact's
    error on the calibration feeds is under ``bound``."""
    from compiler.accuracy import ATTEMPTS
    from compiler.accuracy import MARGIN

    steps = Int8Steps(quantized, import_args)
    choice: Choice | None = None
    missed = 0.0
    for attempt in range(ATTEMPTS):
        if choice is None:
            choice = choose_restored(list(steps.index), steps.measure, steps.sensitivity, bound * MARGIN, say)
        else:
            choice = more_restored(choice, missed, steps.sensitivity, say)
        if attempt == ATTEMPTS - 1:
            choice = dataclasses.replace(choice, restored=len(choice.order))
        variant = quantized.variant(frozenset(steps.index[n] for n in choice.restored_names))
        say(f"--max-error {bound:g}: building with {len(steps.index) - choice.restored} of "
            f"{len(steps.index)} quantized step(s) in int8"
            + (f" (reference error {choice.error:.3g})" if attempt == 0 else ""))
        graph, policy = front(variant.model)
        hook = int8_hook(variant, bound, say, choice.restored_names, len(steps.index))
        try:
            return back(graph, policy, hook)
        except BoundMissed as exc:
            counts = StepCounts("int8", len(steps.index), choice.restored_names)
            if choice.restored >= len(choice.order):
                raise missed_bound(bound, exc.error, counts, "calibration") from None
            missed = exc.error
            say(f"--max-error {bound:g}: the built artifact's error is {exc.error:.3g}: more steps back")
    raise InternalError("--max-error: the last attempt restores every step, so it returns or raises")


def calibration_errors(folder: Path, quantized: Quantized) -> dict[str, float]:
    """Per output, the artifact at ``folder``'s largest relative error over the calibration feeds."""
    from runtime.session import Session

    session = Session(folder)
    errors = {spec.name: 0.0 for spec in session.outputs}
    for feed, refs in zip(quantized.feeds, quantized.reference, strict=True):
        for spec, got, ref in zip(session.outputs, session.run(None, feed), refs, strict=True):
            ref = np.asarray(ref)
            if ref.dtype.kind == "f":
                errors[spec.name] = max(errors[spec.name], relative_error(np.asarray(got), ref))
    return errors


def int8_hook(quantized: Quantized, bound: float | None, say: Callable[[str], None],
              restored: tuple[str, ...] = (), total: int | None = None) -> Hook:
    """The accuracy hook of an int8 compile (``restored``: the steps ``--max-error`` kept fp32, of
    ``total`` candidates)."""
    counts = StepCounts("int8", len(quantized.steps) if total is None else total, restored)

    def measure(folder: Path, _report: VerifyReport | None) -> tuple[dict[str, float], int]:
        return calibration_errors(folder, quantized), len(quantized.feeds)

    def store(folder: Path) -> list[dict[str, Any]]:
        names = [o.name for o in quantized.prepared.graph.output]
        kept = list(zip(quantized.feeds, quantized.reference, strict=True))[:STORED_FEEDS]
        pairs = [(feed, [(n, np.asarray(r)) for n, r in zip(names, refs, strict=True)
                         if np.asarray(r).dtype.kind == "f"]) for feed, refs in kept]
        return store_feeds(folder, pairs)

    return accuracy_hook(measure, bound, counts, "calibration", say, store)
