"""Symbolic results from static code: run it at several bindings of the symbols, fit an expression.

The import needs, for values whose dims are symbols, what static code already computes for static
ones: onnx's per-node shape inference (an output shape) and the reference kernels (a folded shape
computation, e.g. ``Shape -> Gather -> Concat`` giving a Reshape's target). Instead of a second,
hand-written symbolic rule per op, the import *probes*: it runs that static code at several
bindings of the symbols (:class:`Probes`) and fits each integer result (a dim, an element of a shape
tensor) as an expression of the *atoms* the node reads -- its inputs' symbolic dims and symbolic
constant elements, and the bare symbols those depend on -- from a small family (:func:`fit`), in
this order:

- a constant; an input's dim passed through unchanged;
- ``(p*a + q) // r`` of one bare symbol, then of one atom ``a`` (scaling, every Conv / pool /
  Resize size rule: ``(a + pads - dilation*(k-1) - 1) // stride + 1`` is of this form);
- an integer linear combination of atoms (a Concat along a symbolic axis, a Pad);
- ``c * a1 * a2 * ...`` (a Flatten, a Reshape's ``-1``);
- ``min(f, c)`` / ``max(f, c)`` of the one-atom form (a Slice end clamped to a dim).

A fit is accepted only when it reproduces every probe (more probes than the family has
parameters), and the probes cover each symbol's range ends and residues modulo small strides, so
a floor rule is pinned down. What fits none is an error naming the node and the output dim.

Why probing rather than evaluating the static code on symbolic objects: onnx's shape inference is
C++ (it takes numbers or opaque names, and gives up on Conv, Pool, Resize, Slice, Concat, Flatten
over a name), and the reference kernels are numpy code that sizes arrays from their shapes; both
stay the one definition of each op's sizes, for static and dynamic dims alike.

Some models take only some sizes in a range (a detector whose feature maps are concatenated after
an upsample needs multiples of 32). Probes are therefore in two sets: *varied* bindings (the
range ends and seeded random sizes) and *aligned* ones (multiples of 32 where the range allows). A
node is fitted on the varied probes where enough of them succeed, else on the aligned ones.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable
from collections.abc import Sequence
from fractions import Fraction
from typing import TypeVar

import numpy as np

from runtime.symbolic import Dim
from runtime.symbolic import Expr
from runtime.symbolic import evaluate
from runtime.symbolic import floordiv
from runtime.symbolic import free_symbols
from runtime.symbolic import max_
from runtime.symbolic import min_
from runtime.symbolic import sym

__all__ = ["Probes", "fit", "atoms_of", "may_be_equal"]

R = TypeVar("R")
Binding = dict[str, int]

VARIED = 14  # random bindings besides those at and next to the range ends
ALIGNED = 12
ALIGN = 32
MIN_SUCCESSES = 6
MIN_POINTS = 4  # the fewest probes a fit is made from
DENOMINATORS = (1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64)  # tried first, in this order
MAX_DENOMINATOR = 128


class Probes:
    """The bindings of a model's symbols at which the import runs static code (seeded: the same
    model gives the same probes, so imports are deterministic)."""

    def __init__(self, ranges: dict[str, tuple[int, int]]) -> None:
        self.ranges = dict(sorted(ranges.items()))
        rng = random.Random(17)
        names = list(self.ranges)
        # the range ends and sizes next to them (a clamp, min(W, 16), shows near an end)
        ends = [{n: min(max(self.ranges[n][0] + k, self.ranges[n][0]), self.ranges[n][1]) for n in names}
                for k in (0, 1, 2, 3)]
        ends += [{n: max(min(self.ranges[n][1] - k, self.ranges[n][1]), self.ranges[n][0]) for n in names}
                 for k in (0, 1)]
        self.varied: list[Binding] = ends + [{n: rng.randint(*self.ranges[n]) for n in names}
                                             for _ in range(VARIED)]
        self.aligned: list[Binding] = [{n: _aligned(rng, *self.ranges[n]) for n in names}
                                       for _ in range(ALIGNED)]

    @property
    def count(self) -> int:
        return len(self.varied) + len(self.aligned)

    def run(self, fn: Callable[[Binding], R | None]) -> list[tuple[Binding, R]]:
        """``fn`` at the varied bindings, or at the aligned ones when too few of those succeed (an
        exception or None is a binding the code refuses)."""
        found = _successes(fn, self.varied)
        if len(found) >= MIN_SUCCESSES:
            return found
        aligned = _successes(fn, self.aligned)
        return aligned if len(aligned) >= len(found) else found


def may_be_equal(a: Dim, b: Dim, ranges: dict[str, tuple[int, int]]) -> bool:
    """``a == b`` at some probe binding of ``ranges`` (always, where both are the same expression;
    for ints, when they are equal): a model whose dims must agree takes the sizes where they do."""
    if a == b or not (isinstance(a, Expr) or isinstance(b, Expr)):
        return a == b
    probes = Probes(ranges)
    return any(evaluate(a, binding) == evaluate(b, binding) for binding in probes.varied + probes.aligned)


def _aligned(rng: random.Random, lo: int, hi: int) -> int:
    first, last = -(-lo // ALIGN), hi // ALIGN
    if last - first >= 2:
        return rng.randint(first, last) * ALIGN
    return rng.randint(lo, hi)


def _successes(fn: Callable[[Binding], R | None], bindings: list[Binding]) -> list[tuple[Binding, R]]:
    found = []
    for binding in bindings:
        try:
            result = fn(binding)
        except Exception:  # the static code refuses this binding (the model does not take it)
            continue
        if result is not None:
            found.append((binding, result))
    return found


def atoms_of(*groups: Sequence[object]) -> list[Expr]:
    """The distinct symbolic dims among ``groups`` (shapes, flattened symbolic constants), in
    order of first appearance."""
    seen: dict[Expr, None] = {}
    for group in groups:
        for item in group:
            if isinstance(item, Expr):
                seen.setdefault(item, None)
    return list(seen)


def fit(ys: Sequence[int], atoms: Sequence[Expr], bindings: Sequence[Binding]) -> Dim | None:
    """An expression of ``atoms`` equal to ``ys[i]`` at ``bindings[i]`` for every i, from the family
    in the module docstring; None when none fits."""
    ys = [int(y) for y in ys]
    if len(ys) < MIN_POINTS:  # (a node the model takes at hardly any probe: no fit is trusted)
        return None
    if len(set(ys)) == 1:
        return ys[0]
    values = [[evaluate(a, b) for a in atoms] for b in bindings]
    for k, atom in enumerate(atoms):  # an input dim passed through (a Concat's other dims)
        if all(v[k] == y for v, y in zip(values, ys, strict=True)):
            return atom
    # then the bare symbols: over a small range many forms agree (s and s + (s+4)//5 - 1 for s in
    # 1..4), and the simplest one is the one later rules compare equal
    symbols = sorted({name for atom in atoms for name in free_symbols(atom)})
    atoms = atoms_of([sym(name) for name in symbols], atoms)
    values = [[evaluate(a, b) for a in atoms] for b in bindings]
    for k, atom in enumerate(atoms):
        line = _fit_line([v[k] for v in values], ys)
        if line is not None:
            p, q, r = line
            return floordiv(p * atom + q, r)
    for candidate in (_fit_linear, _fit_product, _fit_clamped):
        found = candidate(ys, atoms, values)
        if found is not None and all(evaluate(found, b) == y for b, y in zip(bindings, ys, strict=True)):
            return found
    return None


def _fit_line(xs: Sequence[int], ys: Sequence[int]) -> tuple[int, int, int] | None:
    """``(p, q, r)`` with ``ys[i] == (p*xs[i] + q) // r`` for all i (smallest r, then smallest q)."""
    pairs = dict(zip(xs, ys, strict=True))
    if len(pairs) < 2 or len(pairs) != len(set(zip(xs, ys, strict=True))):
        return None  # one x, or one x with two ys
    (x1, y1), (x2, y2) = min(pairs.items()), max(pairs.items())
    slope = Fraction(y2 - y1, x2 - x1)
    # (then any stride up to 128 and the slope's own denominator: a Slice of step 40, a scale of
    # 37/100; a fit the probes leave ambiguous is settled by fit_check.py)
    extra = [r for r in range(9, MAX_DENOMINATOR + 1) if r not in DENOMINATORS]
    limited = {slope.limit_denominator(m).denominator for m in (256, 1024)}
    extra += sorted(limited - set(extra) - set(DENOMINATORS))
    for r in (*DENOMINATORS, *extra):
        for p in sorted({math.floor(slope * r), math.ceil(slope * r)}):
            if p == 0:
                continue
            lo = max(r * y - p * x for x, y in pairs.items())
            hi = min(r * y - p * x + r - 1 for x, y in pairs.items())
            if lo <= hi:
                return p, lo, r
    return None


def _fit_linear(ys: Sequence[int], atoms: Sequence[Expr], values: Sequence[Sequence[int]]) -> Dim | None:
    """An integer combination ``c0 + sum(c_k * atom_k)``."""
    if len(atoms) < 2 or len(ys) < len(atoms) + 2:
        return None
    matrix = np.array([[*v, 1] for v in values], dtype=np.float64)
    coefs, *_ = np.linalg.lstsq(matrix, np.array(ys, dtype=np.float64), rcond=None)
    ints = [int(round(c)) for c in coefs]
    result: Dim = ints[-1]
    for c, atom in zip(ints, atoms, strict=False):
        result = result + c * atom
    return result


def _fit_product(ys: Sequence[int], atoms: Sequence[Expr], values: Sequence[Sequence[int]]) -> Dim | None:
    """``c * a1 * a2 * ...`` (up to three atoms, repeats allowed: ``W*W``; ``c`` a fraction, the
    product divisible by its denominator at every probe)."""
    for size in (2, 3, 1):
        for subset in itertools.combinations_with_replacement(range(len(atoms)), size):
            products = [int(np.prod([v[k] for k in subset], dtype=object)) for v in values]
            if any(p == 0 for p in products):
                continue
            ratios = {Fraction(y, p) for y, p in zip(ys, products, strict=True)}
            if len(ratios) != 1:
                continue
            (c,) = ratios
            product: Dim = 1
            for k in subset:
                product = product * atoms[k]
            return floordiv(c.numerator * product, c.denominator)
    return None


def _fit_clamped(ys: Sequence[int], atoms: Sequence[Expr], values: Sequence[Sequence[int]]) -> Dim | None:
    """``min(f, c)`` or ``max(f, c)`` with ``f`` of the one-atom form."""
    for bound, clamp in ((max(ys), min_), (min(ys), max_)):
        inside = [i for i, y in enumerate(ys) if y != bound]
        for k, atom in enumerate(atoms):
            line = _fit_line([values[i][k] for i in inside], [ys[i] for i in inside])
            if line is not None:
                p, q, r = line
                return clamp(floordiv(p * atom + q, r), bound)
    return None
