"""A fitted expression is checked where a wrong one would show, before the import trusts it.

A fit (``probing.py``) reproduces the probe sizes; between them several expressions may agree:
``(W + 31) // 32`` and ``(W + 30) // 32`` differ only where ``W % 32 == 1``, and a fit picks the
smallest offset that the probes allow. So every fit is checked against the code it was fitted from
(onnx's shape inference of the node, or the reference kernels of a shape computation) at more
sizes, one symbol at a time from a binding the node takes (:func:`check_bindings`):

- every size of a symbol whose range has at most ``EXHAUSTIVE`` sizes, and, where a dim's fit is
  a new expression (not a constant nor an input's dim passed through), of a range up to
  ``EXHAUSTIVE_NEW``;
- otherwise the sizes where a floor, ceil or mod boundary falls: the range ends and the sizes next
  to them, the first and the last size in range at residues ``0``, ``1`` and ``d - 1`` modulo every
  divisor ``d`` the fit family tries and every divisor in the fit, and the sizes where each floor
  of the fit steps and the size before it (an offset too small shows one size before the step,
  one too large at it);
- and, with several symbols, seeded joint bindings of those sizes.

A size the node refuses (onnx's inference fails: a detector that takes multiples of 32 only) is
no evidence either way. Where the fit misses a checked size it is fitted again from the probes
and every checked size, and that fit is checked at its own boundary sizes; one that still misses,
or none, is a ``ShapeError`` naming the node, the dim and a size where the fit is wrong.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Sequence

from compiler.frontend.probing import DENOMINATORS
from compiler.frontend.probing import fit
from runtime.errors import ShapeError
from runtime.symbolic import Dim
from runtime.symbolic import Expr
from runtime.symbolic import evaluate
from runtime.symbolic import free_symbols

__all__ = ["EXHAUSTIVE", "EXHAUSTIVE_NEW", "check_bindings", "verify_fits"]

Binding = dict[str, int]
EXHAUSTIVE = 64  # a range of at most this many sizes is checked at every size
EXHAUSTIVE_NEW = 4096  # ... and up to this many for a dim whose fit is a new expression
JOINT = 12  # joint bindings of several symbols' check sizes
_SCAN = 1 << 16  # the most sizes of one symbol scanned for the fit's own steps
# truth(bindings) -> per binding the integers the fit is of (None: refused there)
Truth = Callable[[list[Binding]], list[list[int] | None]]


def _divisors(dims: Iterable[Dim]) -> set[int]:
    found: set[int] = set()

    def walk(x: object) -> None:
        if not isinstance(x, Expr):
            return
        for mono, _ in x._terms:
            for atom, _ in mono:
                if atom[0] == "fd":
                    found.add(atom[2])
                    walk(atom[1])
                elif atom[0] in ("min", "max"):
                    for arg in atom[1]:
                        walk(arg)
    for dim in dims:
        walk(dim)
    return found


def _floors(x: object) -> list[tuple[Dim, int]]:
    """The ``(numerator, divisor)`` of every floor in ``x``."""
    found: list[tuple[Dim, int]] = []
    if isinstance(x, Expr):
        for mono, _ in x._terms:
            for atom, _ in mono:
                if atom[0] == "fd":
                    found.append((atom[1], atom[2]))
                    found += _floors(atom[1])
                elif atom[0] in ("min", "max"):
                    for arg in atom[1]:
                        found += _floors(arg)
    return found


def _first_last(values: range) -> list[int]:
    return [values[0], values[-1]] if len(values) else []


def _sizes(name: str, lo: int, hi: int, base: Binding, dims: Sequence[Dim], limit: int) -> list[int]:
    """The sizes of symbol ``name`` (range ``lo..hi``) at which ``dims`` are checked."""
    if hi - lo + 1 <= limit:
        return list(range(lo, hi + 1))
    sizes = {lo, lo + 1, hi - 1, hi}
    for d in sorted(set(DENOMINATORS[1:]) | _divisors(dims)):
        for r in {0, 1, d - 1}:
            first = lo + (r - lo) % d
            sizes.update(_first_last(range(first, hi + 1, d)))
    for numerator, d in (f for dim in dims for f in _floors(dim)):
        if name not in free_symbols(numerator):
            continue
        steps: list[int] = []
        for v in range(lo, min(hi, lo + _SCAN) + 1):
            if evaluate(numerator, {**base, name: v}) % d in (0, d - 1):
                steps.append(v)
        sizes.update(steps[:2] + steps[-2:] + steps[len(steps) // 2:len(steps) // 2 + 1])
    return sorted(sizes)


def check_bindings(ranges: dict[str, tuple[int, int]], symbols: Iterable[str], base: Binding,
                   dims: Sequence[Dim], new: bool) -> list[Binding]:
    """The bindings at which fits ``dims`` of a node reading ``symbols`` are checked: each symbol's
    check sizes with the others at ``base`` (a binding the node takes), and joint ones (``new``:
    some fit is a new expression, so ranges up to ``EXHAUSTIVE_NEW`` are checked at every size)."""
    names = sorted(set(symbols) & set(ranges))
    per = {n: _sizes(n, *ranges[n], base, dims, EXHAUSTIVE_NEW if new else EXHAUSTIVE) for n in names}
    out: dict[tuple[tuple[str, int], ...], Binding] = {}
    for name in names:
        for v in per[name]:
            binding = {**base, name: v}
            out.setdefault(tuple(sorted(binding.items())), binding)
    if len(names) > 1:
        rng = random.Random(29)
        for _ in range(JOINT):
            binding = {**base, **{n: rng.choice(per[n]) for n in names}}
            out.setdefault(tuple(sorted(binding.items())), binding)
    return list(out.values())


def _is_new(dim: Dim | None, atoms: Sequence[Expr]) -> bool:
    return isinstance(dim, Expr) and dim not in atoms


def verify_fits(where: str, labels: Sequence[str], fitted: list[Dim], found: list[tuple[Binding, list[int]]],
                atoms: Sequence[Expr], truth: Truth, ranges: dict[str, tuple[int, int]]) -> list[Dim]:
    """``fitted`` (one per label, fitted from ``found``: probe bindings and the integers there)
    checked at :func:`check_bindings` against ``truth``; refitted from every checked size where it
    misses one, and that fit checked in turn. Returns the fits; a ShapeError where one is wrong."""
    symbols = {n for atom in atoms for n in free_symbols(atom)}
    if not symbols or not found:
        return fitted
    seen = {tuple(sorted(b.items())) for b, _ in found}
    points = list(found)
    for _round in range(2):
        new = any(_is_new(d, atoms) for d in fitted)
        bindings = [b for b in check_bindings(ranges, symbols, found[0][0], fitted, new)
                    if tuple(sorted(b.items())) not in seen]
        seen.update(tuple(sorted(b.items())) for b in bindings)
        checked = [(b, ys) for b, ys in zip(bindings, truth(bindings), strict=True) if ys is not None]
        points += checked
        wrong = _misses(labels, fitted, checked)
        if wrong is None:
            return fitted
        k, binding, ys = wrong
        if _round or len(ys) != len(fitted):
            raise _refusal(where, labels[k] if k < len(labels) else "its shape", fitted, k, binding, ys)
        refits = [fit([p[1][j] for p in points], atoms, [p[0] for p in points]) for j in range(len(fitted))]
        if any(r is None for r in refits):
            raise _refusal(where, labels[k], fitted, k, binding, ys)
        fitted = refits  # type: ignore[assignment]
    return fitted


def _misses(labels: Sequence[str], fitted: Sequence[Dim], checked: Sequence[tuple[Binding, list[int]]]
            ) -> tuple[int, Binding, list[int]] | None:
    for binding, ys in checked:
        if len(ys) != len(fitted):
            return len(labels), binding, ys
        for k, (dim, y) in enumerate(zip(fitted, ys, strict=True)):
            if evaluate(dim, binding) != y:
                return k, binding, ys
    return None


def _refusal(where: str, label: str, fitted: Sequence[Dim], k: int, binding: Binding,
             ys: list[int]) -> ShapeError:
    at = ", ".join(f"{n}={v}" for n, v in sorted(binding.items()))
    if k >= len(fitted) or len(ys) != len(fitted):
        got = f"a result of another shape at {at}"
    else:
        got = f"{ys[k]} at {at}, where the fit {fitted[k]} gives {evaluate(fitted[k], binding)}"
    return ShapeError(f"{where}: {label} fits no expression of the symbols that holds at every checked size: "
                      f"the import's fit from the probe sizes is wrong there (the node gives {got}); "
                      f"narrow the --shape / --dim ranges or use a static shape (docs/dynamic-shapes.md)")
