"""Static memory planning: pack buffers with known lifetimes into one arena.

The planner is a pure, deterministic function: buffers (size and inclusive lifetime over a fixed
schedule) in, byte offsets out, such that buffers alive at the same step never share bytes. The
default heuristic runs greedy strategies (``compiler.memory.greedy``: TFLite's size order with best
fit, Glow's max-pressure order with first fit, conflict and lifetime orders) and keeps the
smallest arena, stopping at the lower bound (the largest sum of live sizes at any step). When that
is above the bound, a search (``compiler.memory.search``: the classic planners' other orders, an
exact branch and bound for few buffers, a local search over placement orders) tries to do better
within ``budget_ms`` and never returns a larger arena. ``verify_plan`` checks any plan
independently of how it was made.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Hashable
from collections.abc import Iterable
from collections.abc import Sequence
from dataclasses import dataclass

from compiler.memory.greedy import MORE_STRATEGIES
from compiler.memory.greedy import STRATEGIES
from compiler.memory.greedy import Problem
from compiler.memory.greedy import place_fresh
from compiler.memory.search import Solution
from compiler.memory.search import improve
from runtime.errors import InternalError
from runtime.symbolic import Expr

__all__ = ["DEFAULT_BUDGET_MS", "Buffer", "MemoryPlan", "lower_bound", "plan_offsets", "verify_plan"]

# The search budget when the caller names none. It is only spent when the default heuristic is
# above the lower bound and stops at the bound (the light zoo needs at most a few ms); 500 ms is
# where, on random instances of up to 300 buffers, the search stops losing to TVM's 500-attempt
# hill climb (200 ms still loses on a few dense ones; see scripts/bench_planner.py).
DEFAULT_BUDGET_MS = 500.0
# A budget is converted to work units (list entries visited), WORK_PER_MS of them per millisecond
# as measured on the 2-core development machine: never wall-clock time, so the plan does not
# depend on the speed or load of the machine that makes it.
WORK_PER_MS = 8000
# The default heuristic runs its strategies in turn while within this much work (the first always
# runs): about 8 ms of Python. The strategies it skips are tried by the search.
GREEDY_WORK = 50_000
@dataclass(frozen=True)
class Buffer:
    """One tensor to place: ``nbytes`` live from ``first_step`` to ``last_step`` inclusive
    (``nbytes`` an ``Expr`` of the symbols in a dynamic graph: such buffers are placed per binding
    by the runtime, ``compiler/dynamic.py``, never by ``plan_offsets``)."""

    id: Hashable
    nbytes: int
    first_step: int
    last_step: int

    def __post_init__(self) -> None:
        for name in ("nbytes", "first_step", "last_step"):
            value = getattr(self, name)
            if name == "nbytes" and isinstance(value, Expr):
                continue
            try:
                # numpy integers become plain ints so equal buffers compare and hash equal
                object.__setattr__(self, name, operator.index(value))
            except TypeError:
                raise TypeError(f"buffer {self.id!r}: {name} must be an integer, got {value!r}") from None
        if isinstance(self.nbytes, int) and self.nbytes < 0:
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


def plan_offsets(
    buffers: Iterable[Buffer], alignment: int = 64, *, budget_ms: float | None = None
) -> MemoryPlan:
    """Give every buffer an aligned offset; buffers with intersecting lifetimes never overlap.

    The greedy best-of runs first; if its arena is above the lower bound, the search gets
    ``budget_ms`` (``DEFAULT_BUDGET_MS`` when None; 0 turns it off) to find a smaller one.
    """
    if budget_ms is None:
        budget_ms = DEFAULT_BUDGET_MS
    number = isinstance(budget_ms, (int, float)) and not isinstance(budget_ms, bool)
    if not number or not math.isfinite(budget_ms) or budget_ms < 0:
        raise ValueError(f"budget_ms must be a finite number >= 0, got {budget_ms!r}")
    bufs = _check_buffers(buffers, alignment)
    problem = _problem(bufs, alignment)
    best, tried = _greedy(problem, tuple(STRATEGIES), GREEDY_WORK)
    if best.arena > problem.lower_bound and budget_ms > 0:
        more = [(name, *STRATEGIES[name]) for name in STRATEGIES if name not in tried]
        more += [(name, *strategy) for name, strategy in MORE_STRATEGIES.items()]
        best = improve(problem, best, int(budget_ms * WORK_PER_MS), more)
    return _plan(bufs, problem, best)


def lower_bound(buffers: Iterable[Buffer], alignment: int) -> int:
    """The largest sum of aligned live sizes at any one step: no arena can be smaller."""
    bufs = _check_buffers(buffers, alignment)
    return _problem(bufs, alignment).lower_bound


def verify_plan(buffers: Iterable[Buffer], plan: MemoryPlan, alignment: int) -> None:
    """Raise InternalError naming the culprit if ``plan`` is not a valid placement of ``buffers``
    (ValueError, as ``plan_offsets``, for buffers that are malformed themselves)."""
    bufs = _check_buffers(buffers, alignment)
    offsets = plan.offsets
    arena = plan.arena_nbytes
    if arena < 0 or arena % alignment:
        raise InternalError(f"arena size {arena} is not a non-negative multiple of alignment {alignment}")
    known = {b.id for b in bufs}
    for buffer_id in offsets:
        if buffer_id not in known:
            raise InternalError(f"plan has an offset for unknown buffer {buffer_id!r}")
    for b in bufs:
        if b.id not in offsets:
            raise InternalError(f"buffer {b.id!r} ({_describe(b)}) has no offset in the plan")
        offset = offsets[b.id]
        if not isinstance(offset, int) or offset < 0:
            raise InternalError(f"buffer {b.id!r}: offset {offset!r} is not a non-negative integer")
        if offset % alignment:
            raise InternalError(f"buffer {b.id!r}: offset {offset} is not a multiple of alignment "
                                f"{alignment}")
        if offset + b.nbytes > arena:
            raise InternalError(f"buffer {b.id!r} ({_describe(b, offset)}) ends past the arena of "
                                f"{arena} bytes")
    # Sweep over time: every pair with intersecting lifetimes is compared exactly once.
    by_start = sorted((b for b in bufs if b.nbytes), key=lambda b: b.first_step)
    active: list[Buffer] = []
    for b in by_start:
        active = [a for a in active if a.last_step >= b.first_step]
        ob = offsets[b.id]
        for a in active:
            oa = offsets[a.id]
            if oa < ob + b.nbytes and ob < oa + a.nbytes:
                raise InternalError(
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


def _problem(bufs: Sequence[Buffer], alignment: int) -> Problem:
    nbytes = [b.nbytes for b in bufs]
    return Problem(nbytes, [b.first_step for b in bufs], [b.last_step for b in bufs], alignment)


def _greedy(problem: Problem, strategies: Sequence[str], work: int) -> tuple[Solution, list[str]]:
    """Run the named strategies in order while within ``work`` units (the first always runs).

    Returns the first smallest plan and the names of the strategies that ran.
    """
    bound = problem.lower_bound
    best: Solution | None = None
    spent = 0
    tried = []
    for name in strategies:
        order_fn, fit = STRATEGIES[name]
        cost = problem.strategy_cost(order_fn)
        if best is not None and spent + cost > work:
            break
        tried.append(name)
        order = order_fn(problem)
        offsets, arena = place_fresh(problem, order, fit, -1 if best is None else best.arena - 1)
        spent += cost
        if best is None or 0 <= arena < best.arena:
            best = Solution(name, offsets, arena, order, fit)
        if best.arena == bound:
            break  # nothing beats the lower bound, and later strategies lose ties
    if best is None:
        raise ValueError("no strategy given")
    return best, tried


def _plan(bufs: Sequence[Buffer], problem: Problem, best: Solution) -> MemoryPlan:
    return MemoryPlan(
        offsets={b.id: best.offsets[i] for i, b in enumerate(bufs)},
        arena_nbytes=best.arena,
        lower_bound_nbytes=problem.lower_bound,
        naive_nbytes=sum(problem.size),
        strategy=best.strategy,
    )


def _plan_with(buffers: Iterable[Buffer], alignment: int, strategies: Sequence[str]) -> MemoryPlan:
    """Run the named greedy strategies in order, no search, and keep the first smallest (tests call this)."""
    bufs = _check_buffers(buffers, alignment)
    problem = _problem(bufs, alignment)
    return _plan(bufs, problem, _greedy(problem, strategies, 1 << 62)[0])
