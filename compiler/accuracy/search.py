"""``--max-error``'s search: which reduced-precision steps go back to fp32, most sensitive first.

The search sees the steps as names and the error as a function: ``measure(restored)`` is the
largest relative error of the outputs (max |reduced - fp32| / max |fp32|, per output and feed) with
the steps in ``restored`` back in fp32 and every other candidate reduced. It measures the error
with every candidate reduced first; within the bound, nothing goes back (one measurement). Else it
takes each candidate's sensitivity (``sensitivity(name)``: the error with that step alone reduced),
sorts the steps most sensitive first (ties by name), and bisects over that order for the fewest
leading steps whose restoration brings the error below the bound: about log2(N) measurements
instead of one per step. The error is close to monotone in that order, not exactly; the bisection
keeps an invariant (``lo`` restored measured at or over the bound, ``hi`` under it), so what it
returns was measured under the bound, and the compile checks the built artifact again.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Choice", "choose_restored", "more_restored", "rank"]

Measure = Callable[[frozenset[str]], float]


@dataclass(frozen=True)
class Choice:
    """The candidates most sensitive first, how many of them go back to fp32 (``restored``), and the
    error measured with those back (``error``) and with none back (``all_reduced``)."""

    order: tuple[str, ...]
    restored: int
    error: float
    all_reduced: float
    measurements: int
    ranked: bool = True  # False: within the bound with all reduced, ``order`` as the graph gives it

    @property
    def restored_names(self) -> tuple[str, ...]:
        return self.order[:self.restored]


def choose_restored(candidates: Sequence[str], measure: Measure, sensitivity: Callable[[str], float],
                    bound: float, say: Callable[[str], None]) -> Choice:
    """The fewest candidates, most sensitive first, to put back in fp32 for an error under ``bound``
    (all of them when nothing less does; the caller reports a bound even that misses)."""
    names = tuple(candidates)
    first = measure(frozenset())
    say(f"--max-error: {len(names)} reduced-precision step(s), error {first:.3g} with all reduced (the "
        f"search aims under {bound:.3g})")
    if first < bound or not names:
        return Choice(names, 0, first, first, 1, ranked=not names)
    order = rank(names, sensitivity, say)
    # every step back is the fp32 reference itself: error 0, not measured
    lo, hi, errors = 0, len(order), {0: first, len(order): 0.0}
    count = 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        errors[mid] = measure(frozenset(order[:mid]))
        count += 1
        say(f"--max-error: {mid} of {len(order)} step(s) back to fp32: error {errors[mid]:.3g}")
        lo, hi = (lo, mid) if errors[mid] < bound else (mid, hi)
    return Choice(order, hi, errors[hi], first, count + len(names))


def rank(names: Sequence[str], sensitivity: Callable[[str], float],
         say: Callable[[str], None]) -> tuple[str, ...]:
    """``names`` most sensitive first (ties by name)."""
    say("--max-error: measuring each step's sensitivity (the error with it alone reduced)")
    scores = {}
    for k, name in enumerate(names):
        scores[name] = sensitivity(name)
        if (k + 1) % 10 == 0 or k + 1 == len(names):
            say(f"--max-error: sensitivity of {k + 1} of {len(names)} steps measured")
    return tuple(sorted(names, key=lambda n: (-scores[n], n)))


def more_restored(choice: Choice, error: float, sensitivity: Callable[[str], float],
                  say: Callable[[str], None]) -> Choice:
    """The next try after the built artifact measured ``error`` (at or over the bound) with
    ``choice``: half the steps still reduced go back too (at least one), most sensitive first
    (ranked now if the first try did not need to)."""
    order = choice.order if choice.ranked else rank(choice.order, sensitivity, say)
    left = len(order) - choice.restored
    step = max(1, -(-left // 2))
    return Choice(order, min(len(order), choice.restored + step), error, choice.all_reduced,
                  choice.measurements + (0 if choice.ranked else len(order)), True)
