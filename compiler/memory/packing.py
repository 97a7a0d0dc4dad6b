"""Static memory planning: pack buffers with known lifetimes into one arena.

The planner is a pure function: buffers (size and inclusive lifetime over a fixed schedule) in,
byte offsets out, such that buffers alive at the same step never share bytes. It runs several
greedy orderings (TFLite's size order with best fit, Glow's max-pressure order with lowest-address
fit, TVM's conflict order, longest lifetime first) and keeps the smallest arena, stopping early
once a plan meets the lower bound (the largest sum of live sizes at any step). ``verify_plan``
checks any plan independently of how it was made.
"""

from __future__ import annotations

import operator
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

__all__ = ["Buffer", "MemoryPlan", "lower_bound", "plan_offsets", "verify_plan"]


@dataclass(frozen=True)
class Buffer:
    """One tensor to place: ``nbytes`` live from ``first_step`` to ``last_step`` inclusive."""

    id: Hashable
    nbytes: int
    first_step: int
    last_step: int

    def __post_init__(self) -> None:
        for name in ("nbytes", "first_step", "last_step"):
            value = getattr(self, name)
            try:
                # numpy integers become plain ints so equal buffers compare and hash equal
                object.__setattr__(self, name, operator.index(value))
            except TypeError:
                raise TypeError(f"buffer {self.id!r}: {name} must be an integer, got {value!r}") from None
        if self.nbytes < 0:
            raise ValueError(f"buffer {self.id!r}: nbytes {self.nbytes} is negative")
        if self.last_step < self.first_step:
            raise ValueError(
                f"buffer {self.id!r}: last_step {self.last_step} is before first_step {self.first_step}"
            )


@dataclass(frozen=True)
class MemoryPlan:
    """Where each buffer lives in the arena, with the numbers to judge the plan by."""

    offsets: dict[Hashable, int]  # buffer id -> byte offset, in input order
    arena_nbytes: int
    lower_bound_nbytes: int  # no plan can use less than this
    naive_nbytes: int  # every buffer in its own place
    strategy: str  # the heuristic that produced ``offsets``


def plan_offsets(buffers: Iterable[Buffer], alignment: int = 64) -> MemoryPlan:
    """Give every buffer an aligned offset; buffers with intersecting lifetimes never overlap."""
    return _plan_with(buffers, alignment, tuple(_STRATEGIES))


def lower_bound(buffers: Iterable[Buffer], alignment: int) -> int:
    """The largest sum of aligned live sizes at any one step: no arena can be smaller."""
    bufs = _check_buffers(buffers, alignment)
    return _Problem(bufs, alignment).lower_bound()


def verify_plan(buffers: Iterable[Buffer], plan: MemoryPlan, alignment: int) -> None:
    """Raise ValueError naming the culprit if ``plan`` is not a valid placement of ``buffers``."""
    bufs = _check_buffers(buffers, alignment)
    offsets = plan.offsets
    arena = plan.arena_nbytes
    if arena < 0 or arena % alignment:
        raise ValueError(f"arena size {arena} is not a non-negative multiple of alignment {alignment}")
    known = {b.id for b in bufs}
    for buffer_id in offsets:
        if buffer_id not in known:
            raise ValueError(f"plan has an offset for unknown buffer {buffer_id!r}")
    for b in bufs:
        if b.id not in offsets:
            raise ValueError(f"buffer {b.id!r} ({_describe(b)}) has no offset in the plan")
        offset = offsets[b.id]
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"buffer {b.id!r}: offset {offset!r} is not a non-negative integer")
        if offset % alignment:
            raise ValueError(f"buffer {b.id!r}: offset {offset} is not a multiple of alignment {alignment}")
        if offset + b.nbytes > arena:
            raise ValueError(f"buffer {b.id!r} ({_describe(b, offset)}) ends past the arena of {arena} bytes")
    # Sweep over time: every pair with intersecting lifetimes is compared exactly once.
    by_start = sorted((b for b in bufs if b.nbytes), key=lambda b: b.first_step)
    active: list[Buffer] = []
    for b in by_start:
        active = [a for a in active if a.last_step >= b.first_step]
        ob = offsets[b.id]
        for a in active:
            oa = offsets[a.id]
            if oa < ob + b.nbytes and ob < oa + a.nbytes:
                raise ValueError(
                    f"buffers {a.id!r} ({_describe(a, oa)}) and {b.id!r} ({_describe(b, ob)}) "
                    f"overlap in memory while both live at steps "
                    f"[{b.first_step}, {min(a.last_step, b.last_step)}]"
                )
        active.append(b)


def _describe(b: Buffer, offset: int | None = None) -> str:
    where = "" if offset is None else f"bytes [{offset}, {offset + b.nbytes}), "
    return f"{where}steps [{b.first_step}, {b.last_step}]"


def _check_buffers(buffers: Iterable[Buffer], alignment: int) -> tuple[Buffer, ...]:
    if not isinstance(alignment, int) or alignment <= 0:
        raise ValueError(f"alignment must be a positive integer, got {alignment!r}")
    bufs = tuple(buffers)
    seen: set[Hashable] = set()
    for b in bufs:
        if not isinstance(b, Buffer):
            raise TypeError(f"expected a Buffer, got {b!r}")
        if b.id in seen:
            raise ValueError(f"duplicate buffer id {b.id!r}")
        seen.add(b.id)
    return bufs


class _Problem:
    """The buffers as parallel lists indexed by input position, plus who conflicts with whom."""

    def __init__(self, bufs: Sequence[Buffer], alignment: int) -> None:
        self.n = len(bufs)
        self.size = [-(-b.nbytes // alignment) * alignment for b in bufs]  # rounded up
        self.first = [b.first_step for b in bufs]
        self.last = [b.last_step for b in bufs]
        # Zero-byte buffers take no space: they conflict with nothing and keep offset 0.
        self.nonempty = [i for i in range(self.n) if self.size[i]]

    @cached_property
    def conflicts(self) -> list[list[int]]:
        """For each buffer, the other non-empty buffers whose lifetimes intersect its own."""
        first, last = self.first, self.last
        conflicts: list[list[int]] = [[] for _ in range(self.n)]
        active: list[int] = []
        for i in sorted(self.nonempty, key=lambda i: first[i]):
            active = [j for j in active if last[j] >= first[i]]
            if active:
                conflicts[i].extend(active)
                for j in active:
                    conflicts[j].append(i)
            active.append(i)
        return conflicts

    def lower_bound(self) -> int:
        events = []
        for i in self.nonempty:
            events.append((self.first[i], self.size[i]))
            events.append((self.last[i] + 1, -self.size[i]))
        events.sort()  # at equal steps the frees (negative) come first
        live = peak = 0
        for _, delta in events:
            live += delta
            if live > peak:
                peak = live
        return peak


# ---- orders: which buffer to place next (ties always fall back to the input index) ----


def _order_by_size(p: _Problem) -> list[int]:
    size = p.size
    return sorted(p.nonempty, key=lambda i: (-size[i], i))


def _order_by_conflicts(p: _Problem) -> list[int]:
    size, conflicts = p.size, p.conflicts
    weight = {i: sum(map(size.__getitem__, conflicts[i])) for i in p.nonempty}
    return sorted(p.nonempty, key=lambda i: (-weight[i], -size[i], i))


def _order_by_lifetime(p: _Problem) -> list[int]:
    size, first, last = p.size, p.first, p.last
    return sorted(p.nonempty, key=lambda i: (first[i] - last[i], -size[i], i))


def _order_by_pressure(p: _Problem) -> list[int]:
    """Glow's order: at the step with most unplaced live bytes, its largest unplaced buffer.

    The remaining live bytes only change at buffer starts, and the earliest step of greatest
    pressure is always some buffer's first step, so only those steps ("points") are tracked, in
    a max segment tree with range add. Each point keeps the buffers covering it in pick order
    (largest, then longest-lived, then input index) with a cursor past the placed ones.
    """
    size, first, last = p.size, p.first, p.last
    points = sorted({first[i] for i in p.nonempty})
    if not points:
        return []
    width = 1 << (len(points) - 1).bit_length()
    # leaves past the last point hold -1 so the descent below never picks them
    tree = [0] * (width + len(points)) + [-1] * (width - len(points))
    pending = [0] * width  # add applied to a whole subtree, already counted in tree[v]
    candidates: list[list[int]] = [[] for _ in points]
    covered: dict[int, tuple[int, int]] = {}
    for i in sorted(p.nonempty, key=lambda i: (-size[i], first[i] - last[i], i)):
        lo, hi = bisect_left(points, first[i]), bisect_right(points, last[i])
        covered[i] = (lo, hi)
        for k in range(lo, hi):
            candidates[k].append(i)
        tree[width + lo] += size[i]  # difference array, summed below
        if hi < len(points):
            tree[width + hi] -= size[i]
    for k in range(1, len(points)):
        tree[width + k] += tree[width + k - 1]
    for v in range(width - 1, 0, -1):
        tree[v] = max(tree[2 * v], tree[2 * v + 1])
    cursor = [0] * len(points)
    done = [False] * p.n
    order: list[int] = []
    for _ in p.nonempty:
        v = 1
        while v < width:  # descend to the earliest point of greatest pressure
            v <<= 1
            if tree[v] < tree[v + 1]:
                v += 1
        k = v - width
        column, j = candidates[k], cursor[k]
        while done[column[j]]:
            j += 1
        cursor[k] = j + 1
        i = column[j]
        done[i] = True
        order.append(i)
        # subtract its size from the points it covers, then repair the two boundary paths
        lo, hi = covered[i]
        delta = -size[i]
        left, right = lo + width, hi + width
        while left < right:
            if left & 1:
                tree[left] += delta
                if left < width:
                    pending[left] += delta
                left += 1
            if right & 1:
                right -= 1
                tree[right] += delta
                if right < width:
                    pending[right] += delta
            left >>= 1
            right >>= 1
        for v in (lo + width, hi - 1 + width):
            v >>= 1
            while v:
                tree[v] = max(tree[2 * v], tree[2 * v + 1]) + pending[v]
                v >>= 1
    return order


# ---- fits: where to put one buffer, given the (offset, end) spans of placed conflicting ones ----


def _best_fit(spans: list[tuple[int, int]], nbytes: int) -> int:
    """The smallest gap that holds ``nbytes`` (lowest on ties), else just past the highest end."""
    best_offset, best_gap = -1, -1
    top = 0
    for offset, end in spans:
        gap = offset - top
        if gap >= nbytes and (best_gap < 0 or gap < best_gap):
            best_offset, best_gap = top, gap
        if end > top:
            top = end
    return best_offset if best_offset >= 0 else top


def _first_fit(spans: list[tuple[int, int]], nbytes: int) -> int:
    """The lowest address where ``nbytes`` fits."""
    top = 0
    for offset, end in spans:
        if offset - top >= nbytes:
            return top
        if end > top:
            top = end
    return top


_Order = Callable[[_Problem], list[int]]
_Fit = Callable[[list[tuple[int, int]], int], int]

# Tried in this order; on equal arenas the earlier one wins.
_STRATEGIES: dict[str, tuple[_Order, _Fit]] = {
    "size_best_fit": (_order_by_size, _best_fit),
    "max_pressure_first_fit": (_order_by_pressure, _first_fit),
    "conflicts_best_fit": (_order_by_conflicts, _best_fit),
    "lifetime_best_fit": (_order_by_lifetime, _best_fit),
}


def _place(p: _Problem, order: list[int], fit: _Fit) -> tuple[list[int], int]:
    size, conflicts = p.size, p.conflicts
    offsets = [0] * p.n
    spans: list[tuple[int, int] | None] = [None] * p.n
    arena = 0
    for i in order:
        around = [s for j in conflicts[i] if (s := spans[j])]
        if around:
            around.sort()
            offset = fit(around, size[i])
        else:
            offset = 0
        end = offset + size[i]
        spans[i] = (offset, end)
        offsets[i] = offset
        if end > arena:
            arena = end
    return offsets, arena


def _plan_with(buffers: Iterable[Buffer], alignment: int, strategies: Sequence[str]) -> MemoryPlan:
    """Run the named strategies in order and keep the first smallest arena (tests call this)."""
    bufs = _check_buffers(buffers, alignment)
    problem = _Problem(bufs, alignment)
    bound = problem.lower_bound()
    best: tuple[int, str, list[int]] | None = None
    for name in strategies:
        order_fn, fit = _STRATEGIES[name]
        offsets, arena = _place(problem, order_fn(problem), fit)
        if best is None or arena < best[0]:
            best = (arena, name, offsets)
        if arena == bound:
            break  # nothing beats the lower bound, and later strategies lose ties
    if best is None:
        raise ValueError("no strategy given")
    arena, name, offsets = best
    return MemoryPlan(
        offsets={b.id: offsets[i] for i, b in enumerate(bufs)},
        arena_nbytes=arena,
        lower_bound_nbytes=bound,
        naive_nbytes=sum(problem.size),
        strategy=name,
    )
