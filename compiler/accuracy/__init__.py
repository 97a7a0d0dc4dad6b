"""Accuracy control for reduced precision: ``--max-error E`` with ``--precision bf16`` or ``--quantize int8``.

``E`` bounds the artifact's error against the fp32 model: per output, max |artifact - fp32| over
max |fp32|, the largest over the feeds it is measured on -- the golden feeds for bf16 (the inputs
the golden self-test stores, so ``verify`` re-checks the bound on any machine), the calibration
feeds for int8 (the artifact keeps two of them for ``verify``). The compile measures the error of
the steps it would reduce with the reference kernels first and puts steps back in fp32, most
sensitive first, until that error is under ``MARGIN`` x E (``search.py``; bf16: ``bf16.py``, int8:
``int8.py``); it then builds the artifact and measures the artifact itself (``record.py``): under
E, the manifest records the error per output, the bound and which steps run reduced; at or over
it (the artifact computes a little differently from the reference kernels), half the steps still
reduced go back too and it builds again, then all of them.

A bound that even the all-fp32 artifact misses (below fp32's own rounding against the reference,
~1e-7) is an ``AccuracyBoundError`` naming the bound and the error reached: the compile writes
nothing rather than an artifact whose record contradicts what was asked. Without ``--max-error``
a reduced-precision compile still measures, prints and records its error (bound null).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from collections.abc import Sequence
from pathlib import Path

from compiler.accuracy.bf16 import Bf16Steps
from compiler.accuracy.bf16 import bf16_constants
from compiler.accuracy.record import BoundMissed
from compiler.accuracy.record import StepCounts
from compiler.accuracy.record import accuracy_hook
from compiler.accuracy.record import golden_errors
from compiler.accuracy.record import missed_bound
from compiler.accuracy.search import Choice
from compiler.accuracy.search import choose_restored
from compiler.accuracy.search import more_restored
from compiler.ir.graph import Graph
from compiler.memory_policy import MemoryPolicy
from runtime.errors import CompileError
from runtime.errors import InternalError
from runtime.selftest import VerifyReport

__all__ = ["ATTEMPTS", "MARGIN", "Hook", "check_max_error", "compile_bf16", "missed_bound"]

Front = Callable[[], tuple[Graph, MemoryPolicy]]
Hook = Callable[[Path, VerifyReport | None], None]
Back = Callable[[Graph, MemoryPolicy, Hook], Path]
Say = Callable[[str], None]
ATTEMPTS = 3  # builds at most: the search's choice, half the rest back, all back
# The search aims under MARGIN x E on its feeds, the built artifact must be under E: a margin for
# feeds the choice never saw (on the light zoo, held-out feeds measured up to 1.38x the error of
# the two golden feeds the steps were chosen on: docs/performance.md, scripts/check_max_error.py)
MARGIN = 0.8


def check_max_error(max_error: float | None, precision: str, quantize: str | None, golden_cases: int,
                    run_check: bool, opt_shapes: Sequence[object] | None) -> None:
    """``CompileError`` for a ``--max-error`` the compile cannot honour, before any work."""
    if max_error is None:
        return
    if not (isinstance(max_error, (int, float)) and math.isfinite(max_error) and max_error > 0):
        raise CompileError(f"--max-error must be a positive number (relative to max |output|), "
                           f"got {max_error!r}")
    if precision == "fp32" and quantize is None:
        raise CompileError("--max-error bounds the error of reduced precision: it needs --precision bf16 "
                           "(or auto) or --quantize int8; an fp32 compile has no steps to put back in fp32")
    if quantize is None and (golden_cases <= 0 or not run_check):
        raise CompileError("--max-error with --precision bf16 measures the error on the golden cases: "
                           "it needs --golden-cases 1 or more (and the artifact's run checked)")
    if opt_shapes:
        raise CompileError("--max-error does not combine with --opt-shape yet")


def _choose(steps: Bf16Steps, choice: Choice | None, missed: float | None, bound: float, say: Say) -> Choice:
    """The search's choice first; after a built artifact missed the bound, half the rest back too."""
    if choice is None:
        return choose_restored(list(steps.steps), steps.measure, steps.sensitivity, bound * MARGIN, say)
    assert missed is not None
    return more_restored(choice, missed, steps.sensitivity, say)


def compile_bf16(front: Front, back: Back, bound: float | None, cases: int, say: Say) -> Path:
    """A ``--precision bf16`` compile: ``front()`` gives the optimized graph, ``back`` builds it with
    the accuracy hook; with a ``bound``, steps go back to fp32 until the artifact's error is under it."""
    if bound is None:
        graph, policy = front()
        counts = StepCounts("bf16", len(bf16_constants(graph)), ())
        return back(graph, policy, accuracy_hook(golden_errors, None, counts, "golden", say))
    choice: Choice | None = None
    missed: float | None = None
    for attempt in range(ATTEMPTS):
        graph, policy = front()
        steps = Bf16Steps(graph, cases, policy.golden_bindings())
        choice = _choose(steps, choice, missed, bound, say)
        if attempt == ATTEMPTS - 1:  # the last build: every step back
            choice = dataclasses.replace(choice, restored=len(choice.order))
        restored = tuple(r for n in choice.restored_names for r in steps.readers(n))
        counts = StepCounts("bf16", sum(len(steps.readers(n)) for n in steps.steps), restored)
        steps.restore(choice.restored_names)
        del steps  # (its fp32 runs keep every value of the graph)
        say(f"--max-error {bound:g}: building with {counts.reduced} of {counts.total} step(s) in bf16"
            + (f" (reference error {choice.error:.3g})" if attempt == 0 else ""))
        try:
            return back(graph, policy, accuracy_hook(golden_errors, bound, counts, "golden", say))
        except BoundMissed as exc:
            missed = exc.error
            if choice.restored >= len(choice.order):
                raise missed_bound(bound, exc.error, counts, "golden") from None
            say(f"--max-error {bound:g}: the built artifact's error is {exc.error:.3g}: more steps back "
                "to fp32")
    raise InternalError("--max-error: the last attempt restores every step, so it returns or raises")
