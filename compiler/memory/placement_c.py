"""The planner's placement loop in C, built once per machine and loaded with ctypes.

``place_fresh`` (``compiler.memory.greedy``) visits every conflicting pair of buffers and sorts
the spans each buffer meets; in Python that costs ~0.1 µs per pair, so a dense instance (1,000
buffers, ~200 live at every step: 200,000 pairs) took ~60 ms. The same loop in C
(``templates/c/planner.c.j2``) takes well under a millisecond, which keeps the default heuristic
within its 10 ms for 1,000 buffers at any density.

The library is compiled without ``-march`` (portable on the build machine's architecture) into
the build cache (``compiler.codegen.build_cache``), keyed by its source, the C compiler's identity
and the machine, and loaded once per process. Where it cannot be built (no C compiler) or
``ONNX_AOT_PLANNER=python`` is set, the planner uses the Python loop: both give the same offsets
(tests compare them), so the plan never depends on which one ran.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from compiler.codegen.build_cache import BuildCache
from compiler.codegen.build_cache import c_cache_dir
from compiler.codegen.build_cache import content_key
from compiler.codegen.toolchain import compiler_version
from runtime.errors import CompileError

__all__ = ["c_loop_available", "place_in_c"]

_VERSION = 2
_I64P = ctypes.POINTER(ctypes.c_int64)


@dataclasses.dataclass(frozen=True)
class _Context:
    version: int


def _source() -> str:
    from compiler.codegen.env import render

    return render("c/planner.c.j2", _Context(_VERSION))


@functools.cache
def _library() -> ctypes.CDLL | None:
    """The loaded planner library, or None where it cannot be had (the Python loop is used)."""
    if os.environ.get("ONNX_AOT_PLANNER", "") == "python":
        return None
    cc = os.environ.get("CC", "") or "cc"
    try:
        source = _source()
        identity = compiler_version(cc)
    except (CompileError, OSError):
        return None
    cache = BuildCache(c_cache_dir())
    key = "planner-" + content_key(source=source, cc=identity, machine=os.uname().machine)[:32]
    if not cache.has(key, ".so"):
        try:
            _build(cc, source, cache, key)
        except (OSError, subprocess.SubprocessError):
            return None
    try:
        lib = ctypes.CDLL(str(cache.path(key, ".so")))
    except OSError:
        return None
    for fn in (lib.onnx_aot_place, lib.onnx_aot_place_scan):
        fn.restype = ctypes.c_int64
        fn.argtypes = [ctypes.c_int64, _I64P, _I64P, _I64P, _I64P, ctypes.c_int32, ctypes.c_int64, _I64P]
    return lib


def _build(cc: str, source: str, cache: BuildCache, key: str) -> None:
    with tempfile.TemporaryDirectory(prefix="onnx-aot-planner-") as tmp:
        work = Path(tmp)
        (work / "planner.c").write_text(source)
        argv = [cc, "-O3", "-std=c11", "-fPIC", "-shared", "planner.c", "-o", "planner.so"]
        subprocess.run(argv, cwd=work, capture_output=True, check=True, timeout=120)
        if not cache.store(work / "planner.so", key, ".so"):
            raise OSError(f"cannot write the planner library into {cache.folder}")


def c_loop_available() -> bool:
    """Whether the C placement loop is built and loaded (building it on first use)."""
    return _library() is not None


def _ptr(array: np.ndarray) -> ctypes._Pointer[ctypes.c_int64]:
    return array.ctypes.data_as(_I64P)


def place_in_c(
    order: np.ndarray, size: np.ndarray, best_fit: bool, limit: int, *,
    first: np.ndarray | None = None, last: np.ndarray | None = None,
    indptr: np.ndarray | None = None, indices: np.ndarray | None = None,
) -> tuple[list[int], int] | None:
    """Run the C placement loop: (offsets, arena), arena -1 once past ``limit``; None without C.

    All arrays are contiguous int64. Give either the lifetimes (``first``, ``last``: the scan
    over all placed buffers, fastest up to a few thousand buffers) or the conflict lists
    (``indices[indptr[i]:indptr[i + 1]]``: the buffers placed before ``i`` whose lifetimes meet
    its own). Both give the same offsets.
    """
    lib = _library()
    if lib is None:
        return None
    offsets = np.zeros(len(size), dtype=np.int64)
    if first is not None and last is not None:
        arena = lib.onnx_aot_place_scan(len(order), _ptr(order), _ptr(size), _ptr(first), _ptr(last),
                                        int(best_fit), limit, _ptr(offsets))
    elif indptr is not None and indices is not None:
        arena = lib.onnx_aot_place(len(order), _ptr(order), _ptr(size), _ptr(indptr), _ptr(indices),
                                   int(best_fit), limit, _ptr(offsets))
    else:
        raise TypeError("place_in_c needs first/last or indptr/indices")
    if arena == -2:
        raise MemoryError("the memory planner could not allocate its working lists")
    if arena == -1:
        return [], -1
    return offsets.tolist(), int(arena)
