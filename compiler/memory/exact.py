"""Exact search for the memory planner: branch and bound over canonical placements.

The branch and bound walks *canonical* placements: buffers in non-decreasing offset order (ties by
index), each at its first fit among those placed before it. Some optimal plan has this form (take
an optimal plan with the least sum of offsets: no buffer can drop to a lower gap, since the
buffers above it cannot be in the way), so a search that completes is exact. A buffer whose first
fit lies wholly below the current offset can never be placed any more, which prunes, and so does
the room left at each step between the current offset and the target arena.
"""

from __future__ import annotations

from compiler.memory.greedy import Problem
from compiler.memory.greedy import first_fit

__all__ = ["BranchAndBound", "Budget"]


class Budget:
    """Work units left; every stage of the search draws on it."""

    def __init__(self, units: int) -> None:
        self.left = units

    def spend(self, units: int) -> None:
        self.left -= units


class BranchAndBound:
    """Depth-first search over canonical placements for one whose arena is at most a target."""

    def __init__(self, p: Problem, budget: Budget, work: int) -> None:
        self.p, self.budget, self.work = p, budget, work
        self.items = items = p.nonempty
        local = {i: k for k, i in enumerate(items)}
        self.m = m = len(items)
        self.size = [p.size[i] for i in items]
        self.conf = [[local[j] for j in p.conflicts[i]] for i in items]
        first = [p.first[i] for i in items]
        last = [p.last[i] for i in items]
        points = sorted(set(first))  # the live bytes peak at some buffer's first step
        index = {s: k for k, s in enumerate(points)}
        self.n_points = len(points)
        self.cover: list[list[int]] = []
        for b in range(m):
            k, cover = index[first[b]], []
            while k < len(points) and points[k] <= last[b]:
                cover.append(k)
                k += 1
            self.cover.append(cover)
        self.area = [self.size[b] * (last[b] - first[b] + 1) for b in range(m)]
        self.off = [-1] * m
        self.ff = [0] * m  # first fit of each unplaced buffer among the placed ones
        self.unplaced = [0] * len(points)  # bytes of unplaced buffers live at each point
        for b in range(m):
            for k in self.cover[b]:
                self.unplaced[k] += self.size[b]
        self.target = 0
        self.found: list[int] | None = None

    def run(self, target: int) -> list[int] | None:
        """Offsets (indexed like the problem) of a plan with arena <= ``target``, or None."""
        self.target = target
        self._dfs(0, -1, 0, [])
        if self.found is None:
            return None
        offsets = [0] * self.p.n
        for b, i in enumerate(self.items):
            offsets[i] = self.found[b]
        return offsets

    def _first_fit(self, b: int) -> int:
        off, size = self.off, self.size
        spans = [(off[j], off[j] + size[j]) for j in self.conf[b] if off[j] >= 0]
        return first_fit(spans, size[b]) if spans else 0

    def _spend(self, units: int) -> None:
        units //= 2  # the entries it counts are cheaper to visit than the local search's
        self.work -= units
        self.budget.spend(units)

    def _dfs(self, floor: int, last: int, placed: int, high: list[int]) -> bool:
        """Extend the placement; True stops the search (found, or out of work).

        ``high`` holds the placed buffers that end above ``floor``.
        """
        if self.work <= 0:
            return True
        m, size, off, ff, target = self.m, self.size, self.off, self.ff, self.target
        if placed == m:
            self.found = list(off)
            return True
        # Each point's unplaced buffers go above the floor, beside what already sits there.
        room = [target - floor] * self.n_points
        high = [b for b in high if off[b] + size[b] > floor]
        units = self.n_points + m
        for b in high:
            taken = off[b] + size[b] - max(off[b], floor)
            units += len(self.cover[b])
            for k in self.cover[b]:
                room[k] -= taken
        unplaced = self.unplaced
        self._spend(units)
        if any(u > r for u, r in zip(unplaced, room, strict=True)):
            return False
        candidates = []
        for b in range(m):
            if off[b] >= 0:
                continue
            g = ff[b]
            end = g + size[b]
            if end > target or end <= floor:
                return False  # too high, or stuck in a gap nothing can fill any more
            if g > floor or (g == floor and b > last):
                candidates.append((g, -self.area[b], b))
        candidates.sort()
        for g, _, b in candidates:
            end = g + size[b]
            off[b] = g
            for k in self.cover[b]:
                unplaced[k] -= size[b]
            changed = []
            units = len(self.conf[b])
            for j in self.conf[b]:
                if off[j] < 0 and ff[j] < end and g < ff[j] + size[j]:
                    changed.append((j, ff[j]))
                    ff[j] = self._first_fit(j)
                    units += len(self.conf[j])
            self._spend(units)
            stop = self._dfs(g, b, placed + 1, high + [b])
            for j, old in changed:
                ff[j] = old
            for k in self.cover[b]:
                unplaced[k] += size[b]
            off[b] = -1
            if stop:
                return True
        return False
