"""The classic static memory planners, written plainly, for comparing ours against.

Each planner takes the buffers and the alignment and returns ``{buffer id: offset}``; sizes are
rounded up to the alignment first, as every one of these systems does. They follow the published
code closely enough to reproduce its results, not its data structures:

- ``tflite_greedy_by_size``: TFLite's arena planner (``lite/arena_planner.cc``,
  ``simple_memory_arena.cc``): tensors alive for the whole run first, then by size descending
  (ties: earlier first use), each in the smallest gap among tensors alive at the same time.
- ``tflm_greedy_first_fit``: TFLite Micro's ``GreedyMemoryPlanner``: size descending, each at the
  lowest address where it fits.
- ``tvm_greedy_by_size`` / ``tvm_greedy_by_conflicts``: TVM USMP (``tir/usmp/algo/greedy.cc``):
  sorted by size (ties: more conflicts, then name descending) or by conflict count (ties: size,
  then name descending); each buffer goes just past the highest placed conflicting buffer, with
  no gap filling.
- ``tvm_hill_climb``: TVM USMP's ``hill_climb.cc``: starts from the size order, re-runs a
  first-fit greedy up to ``max_attempts`` times, each time swapping a buffer that conflicts with
  one at the top of the arena with a first- or second-level neighbour, keeps improvements,
  accepts a worse result with a probability that decays with the attempt count, and returns
  the last accepted plan (as TVM does), stopping early at the lower bound. Seeded.
- ``glow_max_pressure``: Glow's ``MemoryAllocator::allocate``: repeatedly the step with the most
  unplaced live bytes, its largest unplaced buffer (ties: longest lifetime), at the lowest
  address where it fits.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from collections.abc import Hashable
from collections.abc import Sequence

from compiler.memory.packing import Buffer

__all__ = ["CLASSICS", "arena_of", "glow_max_pressure", "tflite_greedy_by_size", "tflm_greedy_first_fit",
           "tvm_greedy_by_conflicts", "tvm_greedy_by_size", "tvm_hill_climb"]

Offsets = dict[Hashable, int]


class _Instance:
    def __init__(self, buffers: Sequence[Buffer], alignment: int) -> None:
        self.bufs = list(buffers)
        self.n = len(self.bufs)
        self.size = [-(-b.nbytes // alignment) * alignment for b in self.bufs]
        self.first = [b.first_step for b in self.bufs]
        self.last = [b.last_step for b in self.bufs]
        self.conflicts: list[list[int]] = [[] for _ in range(self.n)]
        active: list[int] = []
        for i in sorted((i for i in range(self.n) if self.size[i]), key=lambda i: self.first[i]):
            active = [j for j in active if self.last[j] >= self.first[i]]
            for j in active:
                self.conflicts[i].append(j)
                self.conflicts[j].append(i)
            active.append(i)

    def offsets(self, offs: list[int]) -> Offsets:
        return {b.id: offs[i] for i, b in enumerate(self.bufs)}


def _placed_spans(inst: _Instance, i: int, offs: list[int | None]) -> list[tuple[int, int]]:
    spans = []
    for j in inst.conflicts[i]:
        o = offs[j]
        if o is not None:
            spans.append((o, o + inst.size[j]))
    spans.sort()
    return spans


def _best_fit(spans: list[tuple[int, int]], size: int) -> int:
    best, best_gap, top = None, None, 0
    for o, e in spans:
        if o >= top + size and (best_gap is None or o - top < best_gap):
            best, best_gap = top, o - top
        top = max(top, e)
    return top if best is None else best


def _first_fit(spans: list[tuple[int, int]], size: int) -> int:
    candidate = 0
    for o, e in spans:
        if candidate + size > o and e > candidate:
            candidate = e
    return candidate


def _after_all(spans: list[tuple[int, int]], size: int) -> int:
    return max((e for _, e in spans), default=0)


Fitter = Callable[[list[tuple[int, int]], int], int]


def _run(inst: _Instance, order: Sequence[int], fit: Fitter) -> list[int]:
    offs: list[int | None] = [None] * inst.n
    for i in order:
        offs[i] = fit(_placed_spans(inst, i, offs), inst.size[i]) if inst.size[i] else 0
    return [o or 0 for o in offs]


def tflite_greedy_by_size(buffers: Sequence[Buffer], alignment: int) -> Offsets:
    inst = _Instance(buffers, alignment)
    lo = min(inst.first, default=0)
    hi = max(inst.last, default=0)

    def key(i: int) -> tuple[int, int, int, int]:
        whole_run = inst.first[i] == lo and inst.last[i] == hi
        return (0 if whole_run else 1, 0 if whole_run else -inst.bufs[i].nbytes, inst.first[i], i)

    return inst.offsets(_run(inst, sorted(range(inst.n), key=key), _best_fit))


def tflm_greedy_first_fit(buffers: Sequence[Buffer], alignment: int) -> Offsets:
    inst = _Instance(buffers, alignment)
    order = sorted(range(inst.n), key=lambda i: (-inst.size[i], i))
    return inst.offsets(_run(inst, order, _first_fit))


def _tvm_size_key(inst: _Instance) -> Callable[[int], tuple[int, int, str]]:
    # TVM breaks the last tie by name, descending; names here are the ids as strings
    rank = {s: k for k, s in enumerate(sorted({str(b.id) for b in inst.bufs}, reverse=True))}
    return lambda i: (-inst.size[i], -len(inst.conflicts[i]), f"{rank[str(inst.bufs[i].id)]:09d}")


def tvm_greedy_by_size(buffers: Sequence[Buffer], alignment: int) -> Offsets:
    inst = _Instance(buffers, alignment)
    order = sorted(range(inst.n), key=_tvm_size_key(inst))
    return inst.offsets(_run(inst, order, _after_all))


def tvm_greedy_by_conflicts(buffers: Sequence[Buffer], alignment: int) -> Offsets:
    inst = _Instance(buffers, alignment)
    rank = {s: k for k, s in enumerate(sorted({str(b.id) for b in inst.bufs}, reverse=True))}
    conflicts, size = inst.conflicts, inst.size
    order = sorted(range(inst.n), key=lambda i: (-len(conflicts[i]), -size[i], rank[str(inst.bufs[i].id)]))
    return inst.offsets(_run(inst, order, _after_all))


def _live_peak(inst: _Instance) -> int:
    events = sorted([(inst.first[i], inst.size[i]) for i in range(inst.n)]
                    + [(inst.last[i] + 1, -inst.size[i]) for i in range(inst.n)])
    live = peak = 0
    for _, delta in events:
        live += delta
        peak = max(peak, live)
    return peak


def tvm_hill_climb(buffers: Sequence[Buffer], alignment: int, *, max_attempts: int = 500,
                   seed: int = 0) -> Offsets:
    inst = _Instance(buffers, alignment)
    rng = random.Random(seed)
    size = inst.size
    order = sorted(range(inst.n), key=_tvm_size_key(inst))
    pos = {b: k for k, b in enumerate(order)}
    desired = _live_peak(inst)

    def swap(i1: int, i2: int) -> None:
        b1, b2 = order[i1], order[i2]
        order[i1], order[i2] = b2, b1
        pos[b1], pos[b2] = i2, i1

    total_size = 0
    result: list[int] = []
    offs: list[int] = []
    swap_i1 = swap_i2 = -1
    for attempt in range(max_attempts):
        rollback = offs
        offs = _run(inst, order, _first_fit)
        total = max((offs[i] + size[i] for i in range(inst.n)), default=0)
        if not total_size or total_size > total or (
            rng.randrange(100) < 50 * (total - total_size) // max(total, 1) // max(attempt, 1)
        ):
            result, total_size = offs, total
            if total_size <= desired:
                break
        else:
            swap(swap_i2, swap_i1)
            offs = rollback
        pool = max((offs[i] + size[i] for i in range(inst.n)), default=0)
        top = sorted((i for i in range(inst.n) if size[i] and offs[i] + size[i] == pool), key=pos.__getitem__)
        if not top:
            break
        node = top[rng.randrange(len(top))]
        first_level, second_level = [], []
        for c1 in inst.conflicts[node]:
            if pos[node] > pos[c1]:
                first_level.append(c1)
            for c2 in inst.conflicts[c1]:
                if pos[c1] > pos[c2]:
                    second_level.append(c2)
        if not first_level:
            continue
        first_level.sort(key=pos.__getitem__)
        second_level.sort(key=pos.__getitem__)
        buf1 = first_level[rng.randrange(len(first_level))]
        buf2 = buf1
        while buf2 == buf1:
            if second_level and rng.randrange(100) > 25:
                buf2 = second_level[rng.randrange(len(second_level))]
            else:
                buf2 = first_level[rng.randrange(len(first_level))]
            if len(second_level) < 2 and len(first_level) < 2:
                break
        if buf1 == buf2:
            continue
        swap_i1, swap_i2 = pos[buf1], pos[buf2]
        swap(swap_i1, swap_i2)
    return inst.offsets(result or [0] * inst.n)


def glow_max_pressure(buffers: Sequence[Buffer], alignment: int) -> Offsets:
    inst = _Instance(buffers, alignment)
    size, first, last = inst.size, inst.first, inst.last
    steps = sorted({s for i in range(inst.n) if size[i] for s in range(first[i], last[i] + 1)})
    live = {s: 0 for s in steps}
    at: dict[int, list[int]] = {s: [] for s in steps}
    for i in sorted((i for i in range(inst.n) if size[i]), key=lambda i: (first[i], i)):
        for s in range(first[i], last[i] + 1):
            live[s] += size[i]
            at[s].append(i)
    offs: list[int | None] = [None] * inst.n
    for _ in range(sum(1 for i in range(inst.n) if size[i])):
        peak = max(steps, key=lambda s: (live[s], -s))
        pick = at[peak][0]
        for i in at[peak]:
            longer = last[i] - first[i] > last[pick] - first[pick]
            if size[i] > size[pick] or (size[i] == size[pick] and longer):
                pick = i
        offs[pick] = _first_fit(_placed_spans(inst, pick, offs), size[pick])
        for s in range(first[pick], last[pick] + 1):
            live[s] -= size[pick]
            at[s].remove(pick)
    return inst.offsets([o or 0 for o in offs])


def arena_of(buffers: Sequence[Buffer], offsets: Offsets, alignment: int) -> int:
    """The arena a plan needs: the highest aligned end of any buffer."""
    return max((offsets[b.id] + -(-b.nbytes // alignment) * alignment for b in buffers if b.nbytes),
               default=0)


Planner = Callable[[Sequence[Buffer], int], Offsets]

CLASSICS: dict[str, Planner] = {
    "tflite_greedy_by_size": tflite_greedy_by_size,
    "tflm_greedy_first_fit": tflm_greedy_first_fit,
    "tvm_greedy_by_size": tvm_greedy_by_size,
    "tvm_greedy_by_conflicts": tvm_greedy_by_conflicts,
    "tvm_hill_climb": tvm_hill_climb,
    "glow_max_pressure": glow_max_pressure,
}
