"""How many threads a run uses when the caller does not say: measured, not assumed (issue 22).

On an idle machine a run is fastest on every core the process may run on (``available_cpus``: its
affinity mask, what the C library's default team counts too). On a busy one that is not always
so: the kernels run on the process's worker pool (templates/c/workers.c.j2), where a worker that
lost its core claims fewer chunks instead of holding the step, but the calling thread still waits
for a chunk a descheduled worker had claimed, and OpenMP regions left in older artifacts end in a
barrier (measured on a 2-core machine with one other process busy, OpenMP: SqueezeNet 4.9 ms on
one thread, 31 ms on two). ``ThreadChoice`` picks the thread count per run from the run times it
sees: it measures every candidate (all cores, and one) a few times, then runs the fastest by the
median of its recent runs, and keeps re-measuring each other candidate once every
``EXPLORE_EVERY`` runs, so it follows the machine when its load changes: a re-measurement faster
than the count in use drops the explored count's older, slower samples and measures it again on the
next run, so the way back after a brief burst of load takes about ``EXPLORE_EVERY`` runs, not one
such period per sample of its median. Never slower than the better of the two by more than its
exploring costs. A run's results
do not depend on the thread count: the kernels split their work by output elements, never an
accumulation across threads.
"""

from __future__ import annotations

import os
import threading
from collections import deque

__all__ = ["ThreadChoice", "EXPLORE_EVERY", "WINDOW", "available_cpus"]

EXPLORE_EVERY = 16  # runs between two re-measurements of a candidate not in use
WINDOW = 5  # recent run times kept per candidate (their median is its estimate)
FIRST = 2  # runs of each candidate at the start (the very first run of all is not counted: cold)


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one, else all)."""
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        try:
            return max(1, len(affinity(0)))
        except OSError:
            pass
    return os.cpu_count() or 1


class ThreadChoice:
    """The thread count for each run, from the run times of ``candidates`` (see the module)."""

    def __init__(self, most: int, prefer: int | None = None) -> None:
        """Candidates: ``most`` threads and one; ``prefer`` (one of them) runs first -- a new
        binding of a dynamic plan starts from what the session's other bindings found."""
        self.candidates = tuple(sorted({max(1, int(most)), 1}, reverse=True))
        self._times: dict[int, deque[float]] = {n: deque(maxlen=WINDOW) for n in self.candidates}
        self._runs = 0
        self._lock = threading.Lock()
        self.current = prefer if prefer in self.candidates else self.candidates[0]

    def choose(self) -> int:
        """The thread count of the next run."""
        with self._lock:
            self._runs += 1
            if len(self.candidates) == 1:
                return self.current
            if self._runs == 1:
                return self.current  # the cold run (not counted)
            for n in sorted(self.candidates, key=lambda c: c != self.current):  # the start:
                if len(self._times[n]) < FIRST:  # each candidate FIRST times, the preferred first
                    return n
            if self._runs % EXPLORE_EVERY == 0:
                others = [n for n in self.candidates if n != self.current]
                return others[(self._runs // EXPLORE_EVERY) % len(others)]
            return self.current

    def record(self, threads: int, seconds: float) -> None:
        """The wall time of a run on ``threads`` threads."""
        with self._lock:
            if self._runs <= 1 or threads not in self._times:
                return  # the first run pays one-time costs (page faults, thread start)
            self._times[threads].append(seconds)
            if threads != self.current:
                self._forget_stale(threads, seconds)
            estimates = {n: _median(t) for n, t in self._times.items() if len(t) >= FIRST}
            if len(estimates) == len(self.candidates):
                self.current = min(estimates, key=lambda n: (estimates[n], -n))

    def _forget_stale(self, explored: int, seconds: float) -> None:
        """A re-measurement that beats the count in use means the load has changed since the
        explored count's older samples: those slower than the count in use are dropped, and the
        start's rule (each candidate ``FIRST`` times) re-measures it on the next run, instead of
        waiting ``EXPLORE_EVERY`` runs for each of the samples its median needs."""
        current = self._times[self.current]
        bar = _median(current) if len(current) >= FIRST else 0.0
        if seconds >= bar:
            return
        self._times[explored] = deque((t for t in self._times[explored] if t < bar), maxlen=WINDOW)

    def estimates(self) -> dict[int, float | None]:
        """Each candidate's median recent run time in seconds (None before it has been measured)."""
        with self._lock:
            return {n: (_median(t) if t else None) for n, t in self._times.items()}


def _median(values: deque[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
