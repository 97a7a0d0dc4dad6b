"""The memory planner's greedy strategies: an order to place buffers in, and a fit for each one.

A strategy places the buffers one at a time in its order; each goes where its fit says among the
already placed buffers whose lifetimes meet its own (best fit: the smallest gap that holds it;
first fit: the lowest). The orders carry the ideas of the classic planners (TFLite's size order,
Glow's max-pressure order, TVM's conflict-count order) plus conflict-weight, lifetime and area
orders of our own. Everything works on :class:`Problem`, the instance as parallel integer lists
with its conflicts computed in numpy; ``compiler.memory.packing`` builds it and
``compiler.memory.search`` improves on the best greedy result. Work is counted in list entries
visited (``Problem.cost``), so budgets do not depend on the speed of the machine.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from functools import cached_property

import numpy as np

from compiler.memory.placement_c import c_loop_available
from compiler.memory.placement_c import place_in_c
from runtime.contract import round_up

__all__ = [
    "Fit", "MORE_STRATEGIES", "Order", "Problem", "STRATEGIES", "best_fit", "first_fit", "order_by_pressure",
    "place_fresh", "place_fresh_python",
]


# The C loop either scans every placed buffer (n^2 / 2 simple steps, ~3 ns each, no conflict
# lists to build) or visits conflict lists (~60 ns per conflicting pair, building the lists in
# numpy included). It scans up to SCAN_LIMIT buffers, and beyond that while n^2 stays within
# SCAN_RATIO x the conflict count (measured crossover: ~40).
SCAN_LIMIT = 2048
SCAN_RATIO = 32


class Problem:
    """The buffers as parallel lists indexed by input position, plus who conflicts with whom."""

    def __init__(
        self, nbytes: Sequence[int], first: Sequence[int], last: Sequence[int], alignment: int
    ) -> None:
        self.n = len(nbytes)
        self.nbytes = list(nbytes)
        self.size = [round_up(b, alignment) for b in nbytes]
        self.first = list(first)
        self.last = list(last)
        # Zero-byte buffers take no space: they conflict with nothing and keep offset 0.
        self.nonempty = [i for i in range(self.n) if self.size[i]]

    @cached_property
    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """Every conflicting pair (a[k], b[k]) of non-empty buffers, once, with ``a`` starting first.

        Sorted by first step, buffer k meets exactly the buffers after it that start no later
        than it ends: one contiguous run each, found with one binary search for all of them.
        """
        index = np.asarray(self.nonempty, dtype=np.int64)
        firsts = np.asarray(self.first, dtype=np.int64)[index]
        by_first = np.argsort(firsts, kind="stable")
        index, firsts = index[by_first], firsts[by_first]
        lasts = np.asarray(self.last, dtype=np.int64)[index]
        begin = np.arange(1, len(index) + 1)
        count = np.searchsorted(firsts, lasts, side="right") - begin
        total = int(count.sum())
        lo = np.repeat(np.arange(len(index)), count)
        hi = np.arange(total) - np.repeat(np.cumsum(count) - count - begin, count)
        return index[lo], index[hi]

    @cached_property
    def degree(self) -> list[int]:
        """How many non-empty buffers each non-empty buffer conflicts with (0 for empty ones).

        Counted without listing the pairs: j meets i unless j starts after i ends or ends before
        i starts, and those two sets are disjoint.
        """
        degree = np.zeros(self.n, dtype=np.int64)
        if self.nonempty:
            index = np.asarray(self.nonempty, dtype=np.int64)
            _, first, last = self.arrays
            firsts, lasts = np.sort(first[index]), np.sort(last[index])
            starts_by_end = np.searchsorted(firsts, last[index], side="right")
            ended_before = np.searchsorted(lasts, first[index], side="left")
            degree[index] = starts_by_end - ended_before - 1
        return degree.tolist()

    @cached_property
    def cost(self) -> list[int]:
        """The work of placing each buffer: the conflict entries it visits, plus a constant."""
        return [d + 4 for d in self.degree]

    @cached_property
    def full_cost(self) -> int:
        """The work of one whole placement (sorting the spans each buffer meets counts double)."""
        return sum(self.degree) + 8 * len(self.nonempty)

    def strategy_cost(self, order_fn: Callable[[Problem], list[int]]) -> int:
        """The work of running one strategy: its order, then a whole placement."""
        per_buffer = 40 if order_fn is order_by_pressure else 4
        return self.full_cost + per_buffer * len(self.nonempty)

    @cached_property
    def conflicts(self) -> list[list[int]]:
        """For each buffer, the other non-empty buffers whose lifetimes intersect its own."""
        a, b = self.pairs
        return _group(np.concatenate([a, b]), np.concatenate([b, a]), self.n)

    def earlier(self, order: Sequence[int]) -> list[list[int]]:
        """For each buffer in ``order``, the conflicting buffers that come before it."""
        a, b = self.pairs
        rank = np.zeros(self.n, dtype=np.int64)
        rank[np.asarray(order, dtype=np.int64)] = np.arange(len(order))
        a_first = rank[a] < rank[b]
        return _group(np.where(a_first, b, a), np.where(a_first, a, b), self.n)

    def earlier_csr(self, order: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """``earlier`` as int64 arrays: buffer i's list is ``indices[indptr[i]:indptr[i + 1]]``."""
        a, b = self.pairs
        rank = np.zeros(self.n, dtype=np.int64)
        rank[np.asarray(order, dtype=np.int64)] = np.arange(len(order))
        a_first = rank[a] < rank[b]
        src = np.where(a_first, b, a)
        keys = src.astype(np.int16) if self.n <= 1 << 15 else src  # numpy radix-sorts 16-bit keys
        dst = np.where(a_first, a, b)
        indices = np.ascontiguousarray(dst[np.argsort(keys, kind="stable")], dtype=np.int64)
        indptr = np.zeros(self.n + 1, dtype=np.int64)
        np.cumsum(np.bincount(src, minlength=self.n), out=indptr[1:])
        return indptr, indices

    @cached_property
    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(size, first, last) as int64 arrays."""
        return (np.asarray(self.size, dtype=np.int64), np.asarray(self.first, dtype=np.int64),
                np.asarray(self.last, dtype=np.int64))

    @cached_property
    def lower_bound(self) -> int:
        """The largest sum of (aligned) live sizes at any step."""
        if not self.nonempty:
            return 0
        index = np.asarray(self.nonempty, dtype=np.int64)
        sizes = np.asarray(self.size, dtype=np.int64)[index]
        starts = np.asarray(self.first, dtype=np.int64)[index]
        stops = np.asarray(self.last, dtype=np.int64)[index] + 1
        steps, where = np.unique(np.concatenate([starts, stops]), return_inverse=True)
        delta = np.zeros(len(steps), dtype=np.int64)
        np.add.at(delta, where, np.concatenate([sizes, -sizes]))
        return int(np.cumsum(delta).max())


def _group(src: np.ndarray, dst: np.ndarray, n: int) -> list[list[int]]:
    """``out[i]`` lists ``dst[k]`` for every k with ``src[k] == i``, in k order."""
    if not n:
        return []
    keys = src.astype(np.int16) if n <= 1 << 15 else src  # numpy radix-sorts 16-bit keys
    targets = dst[np.argsort(keys, kind="stable")].tolist()
    ends = np.cumsum(np.bincount(src, minlength=n)).tolist()
    return [targets[start:end] for start, end in zip([0, *ends[:-1]], ends, strict=True)]


# ---- fits: where to put one buffer, given the (offset, end) spans of placed conflicting ones ----

Fit = Callable[[list[tuple[int, int]], int], int]


def best_fit(spans: list[tuple[int, int]], nbytes: int) -> int:
    """The smallest gap that holds ``nbytes`` (lowest on ties), else just past the highest end."""
    spans.sort()
    best_offset, best_gap = -1, 1 << 62
    top = 0
    for offset, end in spans:
        gap = offset - top
        if nbytes <= gap < best_gap:
            best_offset, best_gap = top, gap
            if gap == nbytes:
                break
        if end > top:
            top = end
    return best_offset if best_offset >= 0 else top


def first_fit(spans: list[tuple[int, int]], nbytes: int) -> int:
    """The lowest address where ``nbytes`` fits."""
    spans.sort()
    top = 0
    for offset, end in spans:
        if offset - top >= nbytes:
            return top
        if end > top:
            top = end
    return top


def place_fresh(p: Problem, order: Sequence[int], fit: Fit, limit: int = -1) -> tuple[list[int], int]:
    """Place the buffers in ``order`` with ``fit``: (offsets, arena), arena -1 once past ``limit``.

    For the two fits defined here the loop runs in C where it can be built
    (``compiler.memory.placement_c``); this Python loop is its specification and its fallback.
    """
    if (fit is best_fit or fit is first_fit) and c_loop_available():
        ordered = np.asarray(order, dtype=np.int64)
        n = len(p.nonempty)
        if n <= SCAN_LIMIT or n * n <= SCAN_RATIO * sum(p.degree):
            placed = place_in_c(ordered, p.arrays[0], fit is best_fit, limit,
                                  first=p.arrays[1], last=p.arrays[2])
        else:
            indptr, indices = p.earlier_csr(order)
            placed = place_in_c(ordered, p.arrays[0], fit is best_fit, limit,
                                  indptr=indptr, indices=indices)
        if placed is not None:
            return placed
    return place_fresh_python(p, order, fit, limit)


def place_fresh_python(p: Problem, order: Sequence[int], fit: Fit, limit: int = -1) -> tuple[list[int], int]:
    """``place_fresh`` in Python: the specification of the C loop."""
    size = p.size
    earlier = p.earlier(order)
    spans = [(0, 0)] * p.n
    top = 0
    for i in order:
        below = earlier[i]
        offset = fit(list(map(spans.__getitem__, below)), size[i]) if below else 0
        end = offset + size[i]
        if 0 <= limit < end:
            return [], -1
        spans[i] = (offset, end)
        if end > top:
            top = end
    return [offset for offset, _ in spans], top


# ---- orders: which buffer to place next (ties always fall back to the input index) ----

Order = Callable[[Problem], list[int]]


def order_by_size(p: Problem) -> list[int]:
    """TFLite's order: buffers live over the whole schedule first, then larger, then earlier."""
    if not p.nonempty:
        return []
    index = np.asarray(p.nonempty, dtype=np.int64)
    sizes, firsts, lasts = (a[index] for a in p.arrays)
    nbytes = np.asarray(p.nbytes, dtype=np.int64)[index]
    partial = (firsts != firsts.min()) | (lasts != lasts.max())  # not live over the whole run
    return index[np.lexsort((index, firsts, -nbytes, -sizes, partial))].tolist()


def order_by_conflicts(p: Problem) -> list[int]:
    """The most bytes in conflict first: the buffers that constrain the most placements."""
    size = p.size
    a, b = p.pairs
    sizes = np.asarray(size, dtype=np.int64)
    weight = np.zeros(p.n, dtype=np.int64)
    np.add.at(weight, a, sizes[b])
    np.add.at(weight, b, sizes[a])
    w = weight.tolist()
    return sorted(p.nonempty, key=lambda i: (-w[i], -size[i], i))


def order_by_conflict_count(p: Problem) -> list[int]:
    """TVM USMP's greedy_by_conflicts: the most conflicting buffers first, then larger."""
    size, degree = p.size, p.degree
    return sorted(p.nonempty, key=lambda i: (-degree[i], -size[i], i))


def order_by_area(p: Problem) -> list[int]:
    """Largest size x lifetime first: the rectangles hardest to fit in later."""
    size, first, last = p.size, p.first, p.last
    return sorted(p.nonempty, key=lambda i: (-size[i] * (last[i] - first[i] + 1), -size[i], i))


def order_by_lifetime(p: Problem) -> list[int]:
    """Longest-lived first: the buffers that meet the most steps."""
    size, first, last = p.size, p.first, p.last
    return sorted(p.nonempty, key=lambda i: (first[i] - last[i], -size[i], i))


def order_by_pressure(p: Problem) -> list[int]:
    """Glow's order: at the step with most unplaced live bytes, its largest unplaced buffer.

    The remaining live bytes only change at buffer starts, and the earliest step of greatest
    pressure is always some buffer's first step, so only those steps ("points") are tracked in a
    numpy array. Each point keeps the buffers covering it in pick order (largest, then
    longest-lived, then input index) with a cursor past the placed ones.
    """
    size, first, last = p.size, p.first, p.last
    if not p.nonempty:
        return []
    points = sorted({first[i] for i in p.nonempty})
    pick_order = sorted(p.nonempty, key=lambda i: (-size[i], first[i] - last[i], i))
    starts = np.searchsorted(points, [first[i] for i in pick_order], side="left")
    stops = np.searchsorted(points, [last[i] for i in pick_order], side="right")
    live = np.zeros(len(points) + 1, dtype=np.int64)
    np.add.at(live, starts, [size[i] for i in pick_order])
    np.add.at(live, stops, [-size[i] for i in pick_order])
    live = np.cumsum(live[:-1])
    # the buffers covering each point, in pick order
    span = {i: (int(a), int(b)) for i, a, b in zip(pick_order, starts.tolist(), stops.tolist(), strict=True)}
    candidates: list[list[int]] = [[] for _ in points]
    for i in pick_order:
        a, b = span[i]
        for k in range(a, b):
            candidates[k].append(i)
    cursor = [0] * len(points)
    done = [False] * p.n
    order: list[int] = []
    for _ in p.nonempty:
        k = int(live.argmax())
        column, j = candidates[k], cursor[k]
        while done[column[j]]:
            j += 1
        cursor[k] = j + 1
        i = column[j]
        done[i] = True
        order.append(i)
        a, b = span[i]
        live[a:b] -= size[i]
    return order


# The default heuristic, tried in this order; on equal arenas the earlier one wins.
STRATEGIES: dict[str, tuple[Order, Fit]] = {
    "size_best_fit": (order_by_size, best_fit),
    "max_pressure_first_fit": (order_by_pressure, first_fit),
    "conflicts_best_fit": (order_by_conflicts, best_fit),
    "lifetime_best_fit": (order_by_lifetime, best_fit),
}

# More candidates for the search, when the default heuristic stays above the lower bound: TFLite
# Micro's first fit, TVM's conflict-count order (with gap filling: TVM's own placement, just past
# every placed conflicting buffer, was never the smaller on the instances we measured), and an
# order of our own.
MORE_STRATEGIES: dict[str, tuple[Order, Fit]] = {
    "size_first_fit": (order_by_size, first_fit),
    "conflict_count_best_fit": (order_by_conflict_count, best_fit),
    "area_best_fit": (order_by_area, best_fit),
}
