"""What a run runs: a ``Bound`` plan, its partitions' one interface, and the memory they run in.

A ``Bound`` is a static plan with its partitions loaded: a static artifact's plan (made once at
load) or a dynamic plan at one binding of its symbols (``runtime/dynamic.py`` makes and caches
those). ``Session`` runs either the same way.

Every loaded partition -- reference, C, CUDA, control -- runs as ``part.run(memory, ext,
timings=None)``: ``memory`` maps each memory space to the run's arena there and carries the host
arena's address (``arena_addr``) and the C partitions' pointer arrays (``pointers``, by partition
index); ``ext`` maps value names to the caller's arrays (graph inputs and outputs; ``DYN_EXT`` the
binding a dynamic plan's C partitions read); ``timings`` (float64, one per step) asks for each
step's wall time. In a session's ``RunContext`` (``fill``) a C partition fills its pointer array
from ``ext`` at each call; a control step's body (``runtime/providers/control.py``) gives its
partitions memory whose pointer arrays it filled once per execution and rewrites only where a
place moves.

``value_view`` is the one way a partition reads a plan value: a view of an arena, of the weights,
of a caller's array, or a bound plan's small symbolic tensor.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.address import data_address
from runtime.memory import memory_space
from runtime.plan_schema import PlanValue

__all__ = ["Bound", "bound_of", "Memory", "RunContext", "CPartition", "View", "value_view", "run_all"]

View = Callable[[dict[str, Any], dict[str, Any]], Any]  # (memory, ext) -> the value's array
_NO_BINDING = np.zeros(0, np.int64)
_NO_BINDING.flags.writeable = False


@dataclass
class Bound:
    """A static plan, loaded: what a run at one binding (a static plan's only one) uses."""

    key: tuple[int, ...]  # the binding: the symbols' values in name order (() for a static plan)
    text: str  # the binding as "W=320, n=2"
    plan: Any
    partitions: list[tuple[str, Any]]  # (runner, loaded partition), in plan order
    outputs: list[tuple[tuple[int, ...], np.dtype]]  # each graph output's shape and dtype
    arenas: dict[str, tuple[int, int]]  # space -> (nbytes, alignment) at this binding
    dyn: np.ndarray  # what C partitions read through their ext slot DYN_EXT (runtime/binding.py)
    choice: Any = None  # this binding's ThreadChoice (runtime/threads.py), made at its first run


def bound_of(plan: Any, partitions: list[tuple[str, Any]], key: tuple[int, ...] = (), text: str = "",
             dyn: np.ndarray = _NO_BINDING) -> Bound:
    """``plan`` (static: every dim an int) with its loaded ``partitions``."""
    arenas = {a.memory_space: (a.nbytes, max(64, a.alignment)) for a in plan.arenas}
    outputs = [(s.shape, s.dtype) for s in plan.output_specs]
    return Bound(key, text, plan, partitions, outputs, arenas, dyn)


class Memory(dict[str, Any]):
    """Space -> arena for a run of some partitions, plus what C entries read (module docstring)."""

    __slots__ = ("arena_addr", "pointers", "fill")
    arena_addr: int  # the host arena's address (a C entry's arena argument)
    pointers: dict[int, Any]  # partition index -> its entry's pointer array
    fill: bool  # C partitions fill their pointer arrays from ext (else: filled by the caller)

    def __init__(self, arenas: dict[str, Any], arena_addr: int, pointers: dict[int, Any], fill: bool) -> None:
        super().__init__(arenas)
        self.arena_addr, self.pointers, self.fill = arena_addr, pointers, fill


class RunContext(Memory):
    """A session's per-run memory: one arena per memory space, one pointer array per C partition
    (filled at each call). ``sized``: the ``Bound`` its arenas were last checked or grown for."""

    __slots__ = ("_keep", "sized")

    def __init__(self, arenas: dict[str, Any] | None = None) -> None:
        arenas = arenas or {}
        keep = np.zeros(64, np.uint8)  # a valid address when the host arena is empty
        host = arenas.get("host")
        super().__init__(arenas, (host if host is not None and host.size else keep).ctypes.data, {}, True)
        self._keep = keep
        self.sized: Bound | None = None

    def fit(self, bound: Bound) -> None:
        """Grow each arena to at least ``bound``'s size (a pooled context serves every binding)."""
        for space, (nbytes, alignment) in bound.arenas.items():
            have = self.get(space)
            if have is None or have.size < nbytes:
                self[space] = memory_space(space).allocate(nbytes, alignment)
                if space == "host" and self[space].size:
                    self.arena_addr = self[space].ctypes.data
        self.sized = bound


class CPartition:
    """A C partition: its entry (``runtime.providers.c.CEntry``) and the values its ext pointer
    slots take, in slot order; ``index``: its place in its plan's (or schedule's) partitions."""

    def __init__(self, entry: Any, ext: Sequence[str], index: int, weights_addr: int) -> None:
        self.entry = entry
        self.ext = tuple(ext)
        self.index = index
        self.weights_addr = weights_addr
        self.pointer_array = ctypes.c_void_p * max(len(self.ext), 1)

    def run(self, memory: Memory, ext: dict[str, Any], timings: np.ndarray | None = None) -> None:
        try:
            pointers = memory.pointers[self.index]
        except KeyError:  # a session's context: made at the partition's first run in it
            pointers = memory.pointers[self.index] = self.pointer_array()
        if memory.fill:
            for slot, name in enumerate(self.ext):
                pointers[slot] = data_address(ext[name])  # ~0.2 us; .ctypes.data ~1.6 us
        self.entry(pointers, memory.arena_addr, self.weights_addr,
                   0 if timings is None else data_address(timings))


def run_all(partitions: Sequence[tuple[str, Any]], memory: Memory, ext: dict[str, Any]) -> None:
    """Run ``partitions`` in order."""
    for _, part in partitions:
        part.run(memory, ext)


def value_view(value: PlanValue, weights: Any) -> View:
    """How a partition reads ``value`` in a run: from its arena in ``memory``, the ``weights``
    (that memory space's image), the caller's array in ``ext``, or a bound plan's elements."""
    dtype, shape, nbytes, where = value.dtype, value.shape, value.nbytes, value.location
    off, space, name = where.offset, where.space, where.ext
    if where.kind == "arena":
        return lambda memory, ext: memory[space][off:off + nbytes].view(dtype).reshape(shape)
    if where.kind == "weights":
        const = weights[off:off + nbytes].view(dtype).reshape(shape)
        return lambda memory, ext: const
    if where.kind == "symbolic":  # a bound dynamic plan's small tensor (a Reshape target, a trip count)
        held = np.array(where.elements, dtype).reshape(shape)
        held.flags.writeable = False
        return lambda memory, ext: held
    return lambda memory, ext: ext[name].reshape(shape)
