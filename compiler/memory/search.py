"""The memory planner's search: try to beat the greedy best-of within a work budget.

Stages, each stopping at the lower bound: more greedy candidates (the classic planners' other
orders and fits), an exact branch and bound (``compiler.memory.exact``) on instances with few
buffers, and a local search over placement orders. Everything is deterministic: random choices
come from a generator seeded by the instance, and the budget is counted in work units (list
entries visited), never in wall-clock time.

The local search keeps a placement order and its first-fit placement. Each move picks a buffer
that reaches the top of the arena and either moves it earlier in the order or swaps one of the
buffers beneath it with a neighbour of a neighbour (the moves of TVM's hill climb); only the
buffers whose place can change are placed again. A move is kept when the arena does not grow and
no more buffers reach its top. A run that stalls restarts from another greedy order. When most
buffers are small "sand", a coarse pass first searches the order of the large ones alone.
"""

from __future__ import annotations

import heapq
import itertools
import random
import zlib
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass

from compiler.memory.exact import BranchAndBound
from compiler.memory.exact import Budget
from compiler.memory.greedy import Fit
from compiler.memory.greedy import Problem
from compiler.memory.greedy import first_fit
from compiler.memory.greedy import order_by_pressure
from compiler.memory.greedy import place_fresh

__all__ = ["Solution", "improve"]

_FAR = 1 << 62

# The branch and bound runs first, on half the budget, on instances with at most this many
# non-empty buffers; above that the local search gets all of it.
EXACT_MAX_BUFFERS = 64
# The greedy candidates run while they take at most this share of the budget (the first always).
CANDIDATE_SHARE = 0.25
# The local search starts from Glow's max-pressure order: measured over random instances it is
# the best start even where another order's greedy plan is smaller.
LOCAL_SEARCH_START = "max_pressure_first_fit"
# The coarse pass searches the order of the large buffers alone, on this share of what is left of
# the budget; the small ones, together at most SAND_FRACTION of all bytes, are filled in after.
COARSE_SHARE = 0.6
SAND_FRACTION = 0.03
# A local search run restarts after this many moves per buffer that lower neither the arena nor
# the number of buffers at its top.
RESTART_PATIENCE = 10


@dataclass
class Solution:
    """A placement and how it was made."""

    strategy: str
    offsets: list[int]  # indexed like the problem's buffers
    arena: int
    order: list[int]  # the non-empty buffers in placement order
    fit: Fit


def improve(
    p: Problem,
    incumbent: Solution,
    work: int,
    candidates: Sequence[tuple[str, Callable[[Problem], list[int]], Fit]] = (),
) -> Solution:
    """The best plan found within ``work`` units; never worse than ``incumbent``.

    ``candidates`` are more greedy strategies (name, order, fit) to try before searching.
    """
    budget = Budget(work)
    bound = p.lower_bound
    best = incumbent
    orders = {incumbent.strategy: incumbent.order}
    for name, order_fn, fit in candidates:
        if best.arena == bound:
            return best
        cost = p.strategy_cost(order_fn)
        if len(orders) > 1 and work - budget.left + cost > work * CANDIDATE_SHARE:
            continue
        orders[name] = order = order_fn(p)
        offsets, arena = place_fresh(p, order, fit)
        budget.spend(cost)
        if arena < best.arena:
            best = Solution(name, offsets, arena, order, fit)
    if best.arena == bound or budget.left <= 0:
        return best
    if len(p.nonempty) <= EXACT_MAX_BUFFERS:
        found = BranchAndBound(p, budget, budget.left // 2).run(bound)
        if found is not None:
            order = sorted(p.nonempty, key=lambda i: (found[i], i))
            return Solution("exact_search", found, bound, order, first_fit)
    rng = random.Random(zlib.crc32(repr((p.size, p.first, p.last)).encode()))
    if LOCAL_SEARCH_START not in orders:
        orders[LOCAL_SEARCH_START] = order_by_pressure(p)
        budget.spend(p.strategy_cost(order_by_pressure) - p.full_cost)
    start = orders[LOCAL_SEARCH_START]
    coarse = _coarse_search(p, start, budget, rng)
    if coarse is not None:
        if coarse.arena < best.arena:
            best = coarse
        start = coarse.order
    # Restart when a run stalls: from the other greedy orders in turn, then from the best plan.
    restarts = [start] + [order for name, order in orders.items() if name != LOCAL_SEARCH_START]
    patience = RESTART_PATIENCE * len(p.nonempty)
    for run in itertools.count():
        if budget.left <= 0 or best.arena == bound:
            break
        order = restarts[run] if run < len(restarts) else best.order
        found_ls = _local_search(p, order, best.arena, budget, rng, patience)
        if found_ls is not None:
            best = found_ls
    return best


# ---- local search ----


def _coarse_search(p: Problem, start: list[int], budget: Budget, rng: random.Random) -> Solution | None:
    """Search the order of the large buffers alone, then fill the small ones in around them.

    Many small buffers ("sand") make every placement slow and barely move the arena: they fit
    in the gaps. Worth it only when they are at least a third of the buffers; None otherwise.
    """
    size = p.size
    allowance = sum(size) * SAND_FRACTION
    cut = 0
    for i in sorted(p.nonempty, key=lambda i: size[i]):
        allowance -= size[i]
        if allowance < 0:
            cut = size[i]
            break
    big = [i for i in start if size[i] >= cut]
    sand = [i for i in start if size[i] < cut]
    if len(sand) < len(big) // 2 or len(big) < 2:
        return None
    sub = Problem([size[i] for i in big], [p.first[i] for i in big], [p.last[i] for i in big], 1)
    share = int(budget.left * COARSE_SHARE)
    sub_budget = Budget(share)
    found = _local_search(sub, list(range(len(big))), _FAR, sub_budget, rng)
    budget.spend(share - sub_budget.left)
    sub_order = found.order if found is not None else list(range(len(big)))
    order = [big[k] for k in sub_order] + sorted(sand, key=lambda i: (-size[i], i))
    offsets, arena = place_fresh(p, order, first_fit)
    budget.spend(p.full_cost)
    return Solution("local_search", offsets, arena, order, first_fit)


class _OrderState:
    """A placement order and its first-fit placement, kept up to date under swaps and moves.

    ``earlier[i]`` lists the buffers conflicting with ``i`` that come before it in the order: the
    only ones its fit looks at. An update places again only the buffers that may land elsewhere:
    those whose ``earlier`` changed (marked ``dirty`` by a swap or move), and those with an
    earlier buffer that left or entered the bytes below their end (first fit looks for the lowest
    gap, so changes above a buffer cannot move it). They are visited in order position through a
    heap, never scanning the rest.
    """

    def __init__(self, p: Problem, order: Sequence[int], budget: Budget) -> None:
        self.p, self.budget = p, budget
        self.order = list(order)
        self.pos = pos = [0] * p.n
        for k, i in enumerate(self.order):
            pos[i] = k
        self.earlier = p.earlier(self.order)
        self.spans = [(0, 0)] * p.n  # (offset, end) of each buffer; (0, 0) for empty ones
        self.ends = [0] * p.n
        self.dirty = [False] * p.n
        self.pending: list[int] = []  # the dirty buffers
        self.log: list[tuple[int, tuple[int, int]]] = []
        budget.spend(sum(p.cost[i] for i in self.order))
        for i in self.order:
            self.mark(i)
        self.arena = self.update(-1)

    def mark(self, i: int) -> None:
        if not self.dirty[i]:
            self.dirty[i] = True
            self.pending.append(i)

    def update(self, limit: int) -> int:
        """Re-place what may have changed; the new arena, or -1 once a buffer ends past ``limit``.

        The replaced spans are logged so that ``undo`` can put them back.
        """
        size, conflicts = self.p.size, self.p.conflicts
        pos, earlier, spans, ends, dirty = self.pos, self.earlier, self.spans, self.ends, self.dirty
        heap = [pos[i] for i in self.pending]
        heapq.heapify(heap)
        log: list[tuple[int, tuple[int, int]]] = []
        self.log = log
        work = len(heap)
        result = 0
        order = self.order
        while heap:
            k = heapq.heappop(heap)
            i = order[k]
            if not dirty[i]:
                continue  # pushed twice
            dirty[i] = False
            below = earlier[i]
            work += len(below) + 4
            offset = first_fit(list(map(spans.__getitem__, below)), size[i]) if below else 0
            old = spans[i]
            if offset == old[0] and old[1]:
                continue
            end = offset + size[i]
            if 0 <= limit < end:
                result = -1
                break
            log.append((i, old))
            spans[i] = (offset, end)
            ends[i] = end
            low = min(offset, old[0]) if old[1] else offset
            for j in conflicts[i]:
                if pos[j] > k and not dirty[j] and low < ends[j]:
                    dirty[j] = True
                    heapq.heappush(heap, pos[j])
            work += len(conflicts[i])
        for k in heap:
            dirty[order[k]] = False
        self.pending = []
        self.budget.spend(work)
        return result if result < 0 else max(ends)

    def forget(self) -> None:
        """Drop the marks: the order was put back as it was placed."""
        for i in self.pending:
            self.dirty[i] = False
        self.pending = []

    def undo(self) -> None:
        spans, ends = self.spans, self.ends
        for i, old in reversed(self.log):
            spans[i] = old
            ends[i] = old[1]
        self.log = []

    def swap(self, a: int, b: int) -> None:
        """Swap the buffers at positions ``a`` < ``b``."""
        order, pos, earlier, mark = self.order, self.pos, self.earlier, self.mark
        conflicts = self.p.conflicts
        u, v = order[a], order[b]
        for x in conflicts[u]:
            if a < pos[x] < b:
                earlier[x].remove(u)
                earlier[u].append(x)
                mark(x)
        for x in conflicts[v]:
            px = pos[x]
            if a < px < b:
                earlier[v].remove(x)
                earlier[x].append(v)
                mark(x)
            elif px == a:  # u and v conflict: v now comes first
                earlier[v].remove(u)
                earlier[u].append(v)
        order[a], order[b] = v, u
        pos[u], pos[v] = b, a
        mark(u)
        mark(v)
        self.budget.spend(len(conflicts[u]) + len(conflicts[v]))

    def move(self, a: int, b: int) -> None:
        """Move the buffer at position ``a`` to position ``b``, shifting those between."""
        order, pos, earlier, mark = self.order, self.pos, self.earlier, self.mark
        conflicts = self.p.conflicts
        t = order[a]
        lo, hi = (b, a) if b < a else (a + 1, b + 1)
        for x in conflicts[t]:
            if lo <= pos[x] < hi:
                if b < a:
                    earlier[t].remove(x)
                    earlier[x].append(t)
                else:
                    earlier[x].remove(t)
                    earlier[t].append(x)
                mark(x)
        del order[a]
        order.insert(b, t)
        for k in range(min(a, b), max(a, b) + 1):
            pos[order[k]] = k
        mark(t)
        self.budget.spend(len(conflicts[t]) + abs(a - b))


def _perturb(state: _OrderState, conflicts: list[list[int]], t: int, beneath: list[int],
             rng: random.Random) -> tuple[int, tuple[int, int]] | None:
    """One random change of the order that may lower ``t``, a buffer at the top (``beneath``: those
    it conflicts with placed before it): ``t`` moved to an earlier place, or two buffers swapped --
    one of ``beneath`` and a neighbour of a neighbour of ``t`` placed before that neighbour, or a
    second one of ``beneath``. Returns (the first place changed, the swapped places or (-1, -1)
    for a move); None where it changed nothing."""
    pos = state.pos
    pt = pos[t]
    if rng.random() < 0.3:
        q = rng.randrange(pt)
        state.move(pt, q)
        return q, (-1, -1)
    u = beneath[rng.randrange(len(beneath))]
    v = u
    if rng.random() < 0.75:  # a neighbour of a neighbour that comes before it
        for _ in range(4):
            c1 = conflicts[t][rng.randrange(len(conflicts[t]))]
            c2 = conflicts[c1][rng.randrange(len(conflicts[c1]))]
            if pos[c2] < pos[c1] and c2 != u:
                v = c2
                break
    if v == u:
        v = beneath[rng.randrange(len(beneath))]
        if v == u:
            return None
    a, b = sorted((pos[u], pos[v]))
    state.swap(a, b)
    return a, (a, b)


def _local_search(p: Problem, order: list[int], target: int, budget: Budget, rng: random.Random,
                  patience: int = 1 << 62) -> Solution | None:
    """Improve ``order`` until the budget runs out; the best plan found below ``target``, if any.

    Gives up after ``patience`` moves in a row that lower neither the arena nor its top count.
    """
    conflicts, bound = p.conflicts, p.lower_bound
    state = _OrderState(p, order, budget)
    spans, ends, pos, nonempty = state.spans, state.ends, state.pos, p.nonempty
    arena = state.arena
    n_top = ends.count(arena)  # how many buffers reach the top: fewer is closer to a lower arena
    best_arena = target
    best: Solution | None = None
    if arena < best_arena:
        best_arena = arena
        best = Solution("local_search", [s[0] for s in spans], arena, list(state.order), first_fit)
    stale = 0
    while budget.left > 0 and best_arena > bound and stale < patience:
        stale += 1
        tops = [i for i in nonempty if ends[i] == arena]
        t = tops[rng.randrange(len(tops))]
        pt = pos[t]
        beneath = [j for j in conflicts[t] if pos[j] < pt]
        budget.spend(len(nonempty) // 4 + len(conflicts[t]))
        moved = _perturb(state, conflicts, t, beneath, rng) if beneath else None
        if moved is None:
            continue
        start_at, swapped = moved
        new_arena = state.update(arena)
        new_top = ends.count(new_arena) if new_arena >= 0 else 0
        if new_arena >= 0 and (new_arena < arena or new_top <= n_top):
            if new_arena < arena or new_top < n_top:
                stale = 0
            arena, n_top = new_arena, new_top
            if arena < best_arena:
                best_arena = arena
                best = Solution("local_search", [s[0] for s in spans], arena, list(state.order), first_fit)
        else:
            state.undo()
            if swapped[0] < 0:
                state.move(start_at, pt)
            else:
                state.swap(*swapped)
            state.forget()
    return best
