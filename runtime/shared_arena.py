"""One block of memory several sessions run in, one after another (TNN's SHARE_MEMORY_MODE_SHARE_ONE_THREAD).

A pipeline of models served by one thread never runs two of them at once, so their arenas can be
the same bytes: ``SharedArena.for_artifacts([a, b, c])`` reads each plan (``load_plan``, no
kernels or weights) and allocates, per memory space, the largest arena any of them needs, at the
largest alignment. ``Session(path, shared_arena=arena)`` checks the arena is big enough and runs
inside it. Every session on the arena shares its ``ExclusiveUse`` guard: a call that starts while
another session's run is using the arena raises ``ConcurrentRunError``. Intermediates do not
survive from one session's run to the next (outputs are the caller's arrays, never arena bytes).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any

from runtime.caller_memory import ExclusiveUse
from runtime.caller_memory import arena_for_space
from runtime.errors import InputError
from runtime.memory import memory_space
from runtime.plan_info import PlanInfo
from runtime.plan_info import load_plan

__all__ = ["SharedArena"]


class SharedArena:
    """Per-memory-space blocks shared by sessions that run one after another on one thread.

    ``SharedArena({"host": nbytes})`` allocates; ``SharedArena.from_buffers({"host": buf})``
    adopts caller-owned memory; ``for_artifacts`` sizes from plans. ``nbytes`` maps each space
    to its usable size, ``alignment`` to its alignment.
    """

    def __init__(self, nbytes: Mapping[str, int], *, alignment: int | Mapping[str, int] = 64) -> None:
        aligns = {s: _alignment(alignment, s) for s in nbytes}
        self.nbytes: dict[str, int] = {str(s): int(n) for s, n in nbytes.items()}
        self.alignment: dict[str, int] = aligns
        for space, n in self.nbytes.items():
            if n < 0:
                raise InputError(f"SharedArena: negative size {n} for {space!r}")
        self.buffers: dict[str, Any] = {
            space: memory_space(space).allocate(n, aligns[space]) for space, n in self.nbytes.items()
        }
        self.guard = ExclusiveUse("this SharedArena")

    @classmethod
    def from_buffers(cls, buffers: Mapping[str, Any], *,
                     alignment: int | Mapping[str, int] = 64) -> SharedArena:
        """A shared arena in memory the caller owns (bytearray/numpy on "host", cupy on "cuda")."""
        self = cls.__new__(cls)
        self.alignment = {s: _alignment(alignment, s) for s in buffers}
        self.buffers = {space: arena_for_space(space, buffer, None, self.alignment[space],
                                               f"SharedArena {space!r} buffer")
                        for space, buffer in buffers.items()}
        self.nbytes = {space: int(b.size) for space, b in self.buffers.items()}
        self.guard = ExclusiveUse("this SharedArena")
        return self

    @classmethod
    def for_artifacts(cls, paths: Iterable[str | os.PathLike[str] | PlanInfo]) -> SharedArena:
        """Sized to the largest arena of the given artifacts in each memory space."""
        infos = [p if isinstance(p, PlanInfo) else load_plan(p) for p in paths]
        if not infos:
            raise InputError("SharedArena.for_artifacts: no artifacts given")
        nbytes: dict[str, int] = {}
        aligns: dict[str, int] = {}
        for info in infos:
            for space, n in info.arenas.items():
                nbytes[space] = max(nbytes.get(space, 0), n)
                aligns[space] = max(aligns.get(space, 64), info.alignments.get(space, 64))
        return cls(nbytes, alignment=aligns)

    def view(self, space: str, nbytes: int, alignment: int, who: str) -> Any:
        """The first ``nbytes`` of this arena's ``space`` block, checked against a plan's needs."""
        if space not in self.buffers:
            raise InputError(f"{who}: the shared arena has no {space!r} block; the plan needs "
                             f"{nbytes} bytes there (size it with SharedArena.for_artifacts)")
        have = self.nbytes[space]
        if have < nbytes or self.alignment[space] % alignment:
            raise InputError(f"{who}: the shared arena's {space!r} block has {have} bytes "
                             f"({self.alignment[space]}-byte aligned); the plan needs {nbytes} bytes "
                             f"{alignment}-byte aligned (size it with SharedArena.for_artifacts)")
        return self.buffers[space][:nbytes]

    def __repr__(self) -> str:
        sizes = ", ".join(f"{s}={n}" for s, n in self.nbytes.items())
        return f"SharedArena({sizes})"


def _alignment(alignment: int | Mapping[str, int], space: str) -> int:
    value = alignment.get(space, 64) if isinstance(alignment, Mapping) else alignment
    value = max(int(value), 1)
    if value & (value - 1):
        raise InputError(f"SharedArena: alignment {value} for {space!r} is not a power of two")
    return value
