"""The C execution provider, run side: load a generated library and call its partition entries.

Needs numpy's host and ctypes only (never the compiler, onnx or jinja2). The library follows
ABI version 1 (see ``compiler/providers/c/provider.py``): one ``int entry(void* const* ext, char* arena,
const char* weights, double* step_seconds)`` per partition, plus ``onnx_aot_abi_version`` and
``onnx_aot_set_num_threads``; an entry returning 4 (a checked step's index fault) has its details
read from ``onnx_aot_last_fault`` and raised as ``IndexRangeError`` naming the step's node. A call
costs about a microsecond: argument types are set once and the caller passes integer addresses it
caches, with a ``(c_void_p * n)`` array it fills.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import threading
from pathlib import Path
from typing import Any

from runtime.dlopen import open_library
from runtime.errors import ArtifactError
from runtime.errors import IndexRangeError
from runtime.errors import RuntimeKernelError

__all__ = ["ABI_VERSION", "CLibrary", "CEntry", "PoolStats", "pool_stats"]

ABI_VERSION = 1

# libgomp's threads spin this many rounds (about 0.3 ms) at a barrier or between parallel regions
# before they sleep: consecutive steps of one run hand over without a futex wake-up each (measured
# on ShuffleNet, 110 steps, 2 threads: 7.6-9.0 ms sleeping at once, 4.3-6.5 ms with this), and a
# finished run stops using a core within ~0.3 ms (libgomp's default spins ~3 ms). libgomp reads
# its environment once, when the first kernel library loads it; GOMP_SPINCOUNT or
# OMP_WAIT_POLICY set by the user win.
OPENMP_SPIN_COUNT = "30000"


def _bound_openmp_spinning() -> None:
    if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = OPENMP_SPIN_COUNT


_bound_openmp_spinning()

_ENTRY_ARGTYPES = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
_RETURN_CODES = {1: "ext pointer array is NULL", 2: "arena is NULL", 3: "weights are NULL"}
FAULT_INDEX = 4  # ONNX_AOT_FAULT_INDEX: onnx_aot_last_fault has {step local, value, size, axis}

# The thread count is a global of the loaded library, and loading one path twice yields the same
# library: this maps each dlopen handle to the count last set in it, so every CLibrary object
# keeps its own count (set again, only when it differs, right before its entries run).
_THREADS_IN_LIBRARY: dict[int, int] = {}

# One worker pool per process (templates/c/workers.c.j2): the first library loaded that has one
# provides it (and stays loaded: ctypes never unloads), every later library runs its kernels on
# it, so sessions in one process never oversubscribe the cores with a pool each.
_POOL: list[tuple[int, ctypes.CDLL]] = []
_POOL_LOCK = threading.Lock()
_POOL_SLOTS = 256  # ONNX_AOT_POOL_MAX: workers at most


def _share_pool(lib: ctypes.CDLL) -> None:
    try:
        own, use = lib.onnx_aot_pool, lib.onnx_aot_use_pool
    except AttributeError:
        return  # a library without a pool of its own (built before it)
    own.argtypes, own.restype = [], ctypes.c_void_p
    use.argtypes, use.restype = [ctypes.c_void_p], ctypes.c_int
    with _POOL_LOCK:
        if not _POOL:
            _POOL.append((int(own()), lib))
        else:
            use(_POOL[0][0])  # 0 for another pool version: that library keeps its own


@dataclasses.dataclass(frozen=True)
class PoolStats:
    """The shared pool's counts since it started: ``chunks[w]`` the chunks thread ``w`` claimed
    (0: the threads that submit jobs, w >= 1: worker w), ``busy`` the jobs that found no worker
    to reserve (every one in other threads' jobs, or the process's CPUs all busy with jobs) and ran
    on their caller alone, ``workers`` the workers started, ``peak`` the most threads inside jobs
    at once (callers and their workers; None from a library that predates it), ``stalls`` the jobs
    whose caller waited for a chunk claimed by a thread that had lost its core, ``collided`` the
    jobs a worker started on the CPU its caller ran on and ``moved`` those after which it moved to
    another of its CPUs (None: as peak)."""

    chunks: tuple[int, ...]
    busy: int
    workers: int
    peak: int | None = None
    stalls: int | None = None
    collided: int | None = None
    moved: int | None = None


def pool_stats() -> PoolStats | None:
    """The process's shared worker pool's counts; None before a library with a pool is loaded, or
    when the library that owns it predates the counts."""
    with _POOL_LOCK:
        if not _POOL:
            return None
        lib = _POOL[0][1]
    try:
        fn = lib.onnx_aot_pool_stats
    except AttributeError:
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    slots = _POOL_SLOTS + 1
    chunks, busy = (ctypes.c_long * slots)(), ctypes.c_long()
    workers = int(fn(chunks, slots, ctypes.byref(busy)))
    return PoolStats(tuple(int(c) for c in chunks[: workers + 1]), int(busy.value), workers,
                     _count(lib, "onnx_aot_pool_peak", ctypes.c_int),
                     _count(lib, "onnx_aot_pool_stalls", ctypes.c_long),
                     *_collisions(lib))


def _collisions(lib: ctypes.CDLL) -> tuple[int | None, int | None]:
    fn = getattr(lib, "onnx_aot_pool_collisions", None)
    if fn is None:
        return None, None  # a library that predates the counts
    fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_long
    return int(fn(0)), int(fn(1))


def _count(lib: ctypes.CDLL, symbol: str, restype: Any) -> int | None:
    fn = getattr(lib, symbol, None)
    if fn is None:
        return None  # a library that predates the count
    fn.argtypes, fn.restype = [], restype
    return int(fn())


class CEntry:
    """One partition entry: ``entry(ext_array, arena_addr, weights_addr, timings_addr)``."""

    __slots__ = ("symbol", "steps", "_fn", "_library")

    def __init__(self, symbol: str, fn: Any, library: CLibrary, steps: tuple[str, ...]) -> None:
        fn.argtypes = _ENTRY_ARGTYPES  # fn: a ctypes function
        fn.restype = ctypes.c_int
        self.symbol = symbol
        self.steps = steps  # each local step's node, as a message names it
        self._fn = fn
        self._library = library

    def __call__(
        self, ext_array: ctypes.Array[ctypes.c_void_p], arena_addr: int, weights_addr: int, timings_addr: int
    ) -> None:
        """Run the partition; ``timings_addr`` 0 skips per-step timing (else a float64 buffer)."""
        library = self._library
        if _THREADS_IN_LIBRARY.get(library._handle) != library._threads:
            library._apply_threads()
        rc = self._fn(ext_array, arena_addr, weights_addr, timings_addr)
        if rc != 0:
            if rc == FAULT_INDEX:
                raise self._index_fault()
            reason = _RETURN_CODES.get(rc, "kernel failure")
            raise RuntimeKernelError(f"C entry {self.symbol!r} returned {rc} ({reason})")

    def _index_fault(self) -> IndexRangeError:
        local, value, size, axis = self._library.last_fault()
        where = self.steps[local] if 0 <= local < len(self.steps) else f"C entry {self.symbol!r} step {local}"
        return IndexRangeError(where, value, axis, size)


class CLibrary:
    """A loaded ``model.so``; checks the ABI version on load."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            self._lib = open_library(self.path)  # never a stale library from the same path
        except OSError as exc:
            raise ArtifactError(f"cannot load C kernel library {self.path}: {exc}") from exc
        try:
            version_fn = self._lib.onnx_aot_abi_version
            threads_fn = self._lib.onnx_aot_set_num_threads
        except AttributeError as exc:
            raise ArtifactError(f"{self.path} is not an onnx-aot kernel library: {exc}") from exc
        version_fn.argtypes = []
        version_fn.restype = ctypes.c_int
        threads_fn.argtypes = [ctypes.c_int]
        threads_fn.restype = None
        version = int(version_fn())
        if version != ABI_VERSION:
            raise ArtifactError(
                f"{self.path} has kernel ABI version {version}, this runtime needs {ABI_VERSION}"
            )
        _share_pool(self._lib)
        self._set_threads = threads_fn
        self._handle = int(self._lib._handle)
        self._threads = 0  # OpenMP's default
        self._entries: dict[str, CEntry] = {}

    def set_threads(self, n: int) -> None:
        """Threads for this object's entry calls (n <= 0: OpenMP's default)."""
        self._threads = max(int(n), 0)
        self._apply_threads()

    def _apply_threads(self) -> None:
        self._set_threads(self._threads)
        _THREADS_IN_LIBRARY[self._handle] = self._threads

    def entry(self, symbol: str, steps: tuple[str, ...] = ()) -> CEntry:
        """The partition entry named ``symbol`` (looked up once, then cached); ``steps`` names the
        node of each of its steps, in order, for the faults it reports."""
        if symbol not in self._entries:
            try:
                fn = getattr(self._lib, symbol)
            except AttributeError as exc:
                raise ArtifactError(f"{self.path} has no entry {symbol!r}") from exc
            self._entries[symbol] = CEntry(symbol, fn, self, steps)
        return self._entries[symbol]

    def last_fault(self) -> tuple[int, int, int, int]:
        """This thread's last fault of a checked step: (step local, index value, axis size, axis)."""
        try:
            fn = self._lib.onnx_aot_last_fault
        except AttributeError as exc:
            raise ArtifactError(f"{self.path} reported a fault but has no onnx_aot_last_fault") from exc
        record = (ctypes.c_int64 * 4)()
        fn.argtypes = [ctypes.c_void_p]
        fn.restype = None
        fn(record)
        return int(record[0]), int(record[1]), int(record[2]), int(record[3])
