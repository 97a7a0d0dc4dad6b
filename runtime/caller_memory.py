"""Memory the caller owns: turning a caller's buffer into an arena, and one-run-at-a-time guards.

A plan is a base pointer plus offsets, so a run can happen in any block of the right size (TNN's
SHARE_MEMORY_MODE_SET_FROM_EXTERNAL). ``host_arena`` accepts anything writable with the buffer
protocol (bytearray, numpy array, mmap, memoryview); ``device_arena`` a cupy array, a cupy
``MemoryPointer`` or a cupy ``Memory`` / ``UnownedMemory``. Both return a 1-D uint8 view that
starts at the plan's alignment (skipping up to ``alignment - 1`` leading bytes of a misaligned
buffer) and raise ``InputError`` naming the size needed when the buffer is too small or
read-only. ``ExclusiveUse`` guards memory that only one run may use at a time: a second,
concurrent run raises ``ConcurrentRunError`` instead of corrupting the first one's data.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from runtime.errors import ConcurrentRunError
from runtime.errors import InputError

__all__ = ["host_arena", "device_arena", "arena_for_space", "ExclusiveUse", "needed_message"]


def needed_message(space: str, nbytes: int, alignment: int) -> str:
    return (f"the plan's {space} arena needs {nbytes} bytes at a {alignment}-byte aligned address "
            f"({nbytes + alignment - 1} bytes for a buffer of any alignment)")


def host_arena(buffer: Any, nbytes: int | None, alignment: int, what: str = "arena") -> np.ndarray:
    """A writable, ``alignment``-aligned uint8 view of ``nbytes`` bytes at the start of ``buffer``
    (``None``: all of it from its first aligned byte)."""
    if isinstance(buffer, np.ndarray):
        if not buffer.flags.c_contiguous:
            raise InputError(f"{what}: the host buffer must be C-contiguous")
        raw = buffer.reshape(-1).view(np.uint8)
    else:
        try:
            view = memoryview(buffer)
        except TypeError:
            raise InputError(f"{what}: expected a writable host buffer (bytearray, numpy array, mmap), "
                             f"got {type(buffer).__name__}") from None
        if not view.contiguous:
            raise InputError(f"{what}: the host buffer must be contiguous")
        raw = np.frombuffer(view.cast("B"), dtype=np.uint8) if view.nbytes else np.zeros(0, np.uint8)
        if view.readonly:
            raw.setflags(write=False)
    if not raw.flags.writeable:
        raise InputError(f"{what}: the host buffer is read-only"
                         + (f"; {needed_message('host', nbytes, alignment)}" if nbytes is not None else ""))
    if nbytes == 0:
        return raw[:0]
    start = (-int(raw.ctypes.data)) % alignment if raw.size else 0
    if nbytes is None:
        return raw[start:]
    if raw.size - start < nbytes:
        raise InputError(f"{what}: the host buffer has {raw.size} bytes"
                         + (f" ({start} skipped to reach alignment)" if start else "")
                         + f"; {needed_message('host', nbytes, alignment)}")
    return raw[start:start + nbytes]


def device_arena(buffer: Any, nbytes: int | None, alignment: int, what: str = "arena") -> Any:
    """The same for device memory: a cupy uint8 array of ``nbytes`` bytes, ``alignment``-aligned."""
    from runtime.providers.cuda import cupy_or_error

    cp = cupy_or_error()
    if isinstance(buffer, cp.ndarray):
        if not buffer.flags.c_contiguous:
            raise InputError(f"{what}: the device buffer must be C-contiguous")
        raw = buffer.reshape(-1).view(cp.uint8)
    elif isinstance(buffer, cp.cuda.MemoryPointer):
        raw = cp.ndarray((int(buffer.mem.size) - (int(buffer.ptr) - int(buffer.mem.ptr)),), cp.uint8, buffer)
    elif hasattr(buffer, "ptr") and hasattr(buffer, "size"):  # cupy.cuda.Memory / UnownedMemory
        raw = cp.ndarray((int(buffer.size),), cp.uint8, cp.cuda.MemoryPointer(buffer, 0))
    else:
        raise InputError(f"{what}: expected device memory (a cupy array, MemoryPointer or Memory), "
                         f"got {type(buffer).__name__}")
    if nbytes == 0:
        return raw[:0]
    start = (-int(raw.data.ptr)) % alignment if int(raw.size) else 0
    if nbytes is None:
        return raw[start:]
    if int(raw.size) - start < nbytes:
        raise InputError(f"{what}: the device buffer has {int(raw.size)} bytes; "
                         f"{needed_message('cuda', nbytes, alignment)}")
    return raw[start:start + nbytes]


def arena_for_space(space: str, buffer: Any, nbytes: int | None, alignment: int, what: str) -> Any:
    if space == "host":
        return host_arena(buffer, nbytes, alignment, what)
    if space == "cuda":
        return device_arena(buffer, nbytes, alignment, what)
    raise InputError(f"{what}: caller-owned memory for space {space!r} is not supported")


class ExclusiveUse:
    """A non-blocking lock: ``enter()`` raises ``ConcurrentRunError`` while another run holds it."""

    __slots__ = ("_lock", "what")

    def __init__(self, what: str) -> None:
        self._lock = threading.Lock()
        self.what = what

    def enter(self) -> None:
        if not self._lock.acquire(blocking=False):
            raise ConcurrentRunError(
                f"{self.what} is in use by another run: sessions on caller-owned or shared memory "
                f"run one call at a time (use a Session without arena=/shared_arena= for concurrent "
                f"runs, or one arena per thread)")

    def exit(self) -> None:
        self._lock.release()

    @property
    def busy(self) -> bool:
        return self._lock.locked()
