"""numpy's BLAS thread count, held at one while a session's reference steps run beside C kernels.

A session whose plan has C partitions runs their kernels on the process's worker pool.
Reference steps call numpy, whose BLAS (OpenBLAS in numpy's wheels) keeps a thread pool of its own:
with both pools at full size the two fight for the same cores (a CRNN's numpy LSTM ran 5-6x
onnxruntime's time that way, 2.3-3.2x without the fight; issue 21), and OpenBLAS's threads keep
spinning after a call, into the C kernels that follow. So such a session sets BLAS to one thread
for the length of each reference partition and restores the count after it. The count is the
process's: while the guards of several runs overlap (sessions run from several threads), the
first one in sets it to one and the last one out restores it, so no run's reference steps get
BLAS threads back while another's are still inside.

The library is found among the shared objects this process has loaded (``/proc/self/maps``) by its
``openblas_set_num_threads`` / ``openblas_get_num_threads`` functions (also their 64-bit-index
and scipy-openblas names, numpy 2's wheels). Where there is none (another BLAS, another OS), the
guard does nothing.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from collections.abc import Callable
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["blas_threads", "set_blas_threads", "single_threaded_blas"]

_PREFIXES = ("scipy_openblas", "openblas")
_SUFFIXES = ("64_", "")
_GUARD = threading.Lock()
_held = [0, 0]  # [guards inside now, the count the first of them found]


@functools.cache
def _functions() -> tuple[Callable[[int], None], Callable[[], int]] | None:
    """(set, get) of the loaded OpenBLAS's thread count; None when there is none."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            paths = sorted({line.split()[-1] for line in f if "blas" in line.lower() and "/" in line})
    except OSError:
        return None
    for path in paths:
        if not os.path.basename(path).lower().startswith(("libopenblas", "libscipy_openblas")):
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in _PREFIXES:
            for suffix in _SUFFIXES:
                setter = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
                getter = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
                if setter is not None and getter is not None:
                    setter.argtypes, setter.restype = [ctypes.c_int], None
                    getter.argtypes, getter.restype = [], ctypes.c_int
                    return setter, getter
    return None


def blas_threads() -> int | None:
    """The loaded OpenBLAS's thread count (None without one)."""
    found = _functions()
    return int(found[1]()) if found is not None else None


def set_blas_threads(n: int) -> bool:
    """Set the loaded OpenBLAS's thread count; False (nothing done) without one."""
    found = _functions()
    if found is not None:
        found[0](int(n))
    return found is not None


@contextmanager
def single_threaded_blas() -> Iterator[None]:
    """numpy's BLAS on one thread inside the block, its previous count restored when the last of
    the blocks open at the same time (in any thread) ends."""
    found = _functions()
    if found is None:
        yield
        return
    setter, getter = found
    with _GUARD:
        if _held[0] == 0:
            _held[1] = int(getter())
            if _held[1] > 1:
                setter(1)
        _held[0] += 1
    try:
        yield
    finally:
        with _GUARD:
            _held[0] -= 1
            if _held[0] == 0 and _held[1] > 1:
                setter(_held[1])
