"""Build a generated ``model.cu`` for the host: g++ against ``cuda_host.h``, loaded with ctypes.

``prepare_source`` rewrites what C++ cannot spell (``extern __shared__ T name[];`` becomes a
pointer to the launch's dynamic shared memory) and appends one C entry per ``__global__`` function
(``oa_launch_<name>``, see ``cuda_host.h``). ``HostModule(source)`` builds that with
``g++ -x c++ -std=c++17 -O1 -shared -include cuda_host.h`` into the cache folder
(``$ONNX_AOT_CUDA_HOST_CACHE``, default ``~/.cache/onnx-aot/cuda_host``), keyed by the sha256 of
the header, the prepared source, the flags and the compiler's version, so a rerun does not compile.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["HEADER", "HostBuildError", "HostKernelError", "HostModule", "HostBuffer", "kernel_names",
           "prepare_source", "cache_dir"]

HEADER = Path(__file__).with_name("cuda_host.h")
def _fma_flags() -> tuple[str, ...]:
    """-mfma where the CPU has FMA: fmaf is then one instruction, not a libm call (3-4x faster
    GEMM inner loops); contraction stays off, so only the kernels' own fmaf calls are fused."""
    try:
        has_fma = " fma " in Path("/proc/cpuinfo").read_text().replace("\n", " ")
    except OSError:
        has_fma = False
    return ("-mfma",) if has_fma and platform.machine() in ("x86_64", "AMD64") else ()


# -ftrivial-auto-var-init=pattern (GCC 12+): a local the kernel reads before writing holds 0xfe
# bytes (a huge negative float), not whatever the stack held
FLAGS = ("-x", "c++", "-std=c++17", "-O1", "-fPIC", "-shared", "-fno-strict-aliasing", "-ffp-contract=off",
         "-ftrivial-auto-var-init=pattern", "-Wno-attributes", *_fma_flags())
KERNEL_RE = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\(\s*(\d*)[^)]*\)\s+)?(\w+)\s*\(")
DYN_SHARED_RE = re.compile(
    r"extern\s+__shared__\s+(?:__align__\(\s*\d+\s*\)\s+)?([A-Za-z_][\w ]*?)\s+(\w+)\s*\[\s*\]\s*;"
)


class HostBuildError(RuntimeError):
    """g++ rejected the prepared source (the message holds its first errors)."""


class HostKernelError(RuntimeError):
    """A kernel failed on the host: a partial barrier, a bad warp mask, a memory fault."""


def cache_dir() -> Path:
    root = os.environ.get("ONNX_AOT_CUDA_HOST_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "onnx-aot" / "cuda_host"


def kernel_names(source: str) -> list[str]:
    """The ``__global__`` functions of ``source``, in order."""
    return [name for _, name in KERNEL_RE.findall(source)]


def prepare_source(source: str) -> str:
    """``source`` with dynamic shared memory as pointers and a C entry per kernel appended."""
    text = DYN_SHARED_RE.sub(r"\1* const \2 = (\1*)oa_dyn_shared;", source)
    entries = "".join(f"OA_KERNEL({name}, {bound or 0})\n" for bound, name in KERNEL_RE.findall(source))
    return f"{text}\n\n// host entries (tests/support/cuda_host/build.py)\n{entries}"


def _compiler_version(cxx: str) -> str:
    out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.splitlines()[0] if out.stdout else cxx


def build_library(source: str, cxx: str = "g++", flags: Sequence[str] = FLAGS) -> Path:
    """The cached shared library of ``source`` (a generated model.cu), compiled when missing."""
    prepared = prepare_source(source)
    key = hashlib.sha256()
    for part in (HEADER.read_bytes(), prepared.encode(), " ".join(flags).encode(),
                 _compiler_version(cxx).encode()):
        key.update(hashlib.sha256(part).digest())
    digest = key.hexdigest()[:24]
    folder = cache_dir()
    lib = folder / f"{digest}.so"
    if lib.is_file():
        return lib
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        src = Path(tmp) / "model.cu"
        src.write_text(prepared)
        out = Path(tmp) / "model.so"
        cmd = [cxx, *flags, "-include", str(HEADER), str(src), "-o", str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            errors = "\n".join(done.stderr.splitlines()[:30])
            raise HostBuildError(f"g++ failed on the prepared model.cu ({src}):\n{errors}")
        os.replace(out, lib)  # atomic: a concurrent build of the same source is harmless
        if os.environ.get("ONNX_AOT_CUDA_HOST_KEEP"):
            shutil.copy(src, folder / f"{digest}.cu")
    return lib


class HostBuffer:
    """Host memory from ``oa_host_alloc`` (guard pages on both sides) seen as a uint8 array; it
    ends ``align`` bytes (a power of two) from the upper guard page at most."""

    def __init__(self, module: HostModule, nbytes: int, align: int = 256) -> None:
        self._lib = module.lib
        self.nbytes = max(int(nbytes), 1)
        self.align = int(align)
        address = self._lib.oa_host_alloc(self.nbytes, self.align)
        if not address:
            raise MemoryError(f"oa_host_alloc({self.nbytes}) failed")
        self.address = int(address)
        self.array = np.ctypeslib.as_array((ctypes.c_uint8 * self.nbytes).from_address(self.address))

    def read_only(self) -> None:
        self.array.flags.writeable = False
        if self._lib.oa_host_protect(ctypes.c_void_p(self.address), self.nbytes, self.align, 0) != 0:
            raise OSError("mprotect failed")

    def free(self) -> None:
        if self.address:
            self._lib.oa_host_protect(ctypes.c_void_p(self.address), self.nbytes, self.align, 1)
            self._lib.oa_host_free(ctypes.c_void_p(self.address), self.nbytes, self.align)
            self.address = 0


class HostModule:
    """A generated model.cu built for the host; ``launch`` runs one kernel launch to completion.
    ``reverse``: blocks and threads run in descending order (ascending by default)."""

    def __init__(self, source: str, cxx: str = "g++", *, reverse: bool = False) -> None:
        self.kernels = kernel_names(source)
        self.path = build_library(source, cxx)
        lib = ctypes.CDLL(str(self.path))
        lib.oa_last_error.restype = ctypes.c_char_p
        lib.oa_host_alloc.restype = ctypes.c_void_p
        lib.oa_host_alloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
        lib.oa_host_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
        lib.oa_host_protect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int]
        lib.oa_set_order.argtypes = [ctypes.c_int]
        self.reverse = reverse  # set before every launch: one loaded library may back two modules
        self.lib = lib
        self._entries: dict[str, Any] = {}

    def alloc(self, nbytes: int, align: int = 256) -> HostBuffer:
        return HostBuffer(self, nbytes, align)

    def launch(self, kernel: str, grid: Sequence[int], block: Sequence[int], shared: int,
               args: Sequence[Any]) -> None:
        """Run ``kernel`` over ``grid`` x ``block``; ``args`` are numpy scalars (pointers as
        uint64) in the kernel's parameter order. Raises ``HostKernelError`` when it fails."""
        entry = self._entries.get(kernel)
        if entry is None:
            if kernel not in self.kernels:
                raise HostKernelError(f"kernel {kernel!r} is not in the module")
            entry = getattr(self.lib, f"oa_launch_{kernel}")
            entry.restype = ctypes.c_int
            self._entries[kernel] = entry
        storage = [np.array(a) for a in args]  # 0-d arrays keep each scalar's type and bytes
        pointers = (ctypes.c_void_p * max(len(storage), 1))(*[s.ctypes.data for s in storage])
        g = (ctypes.c_uint * 3)(*[int(v) for v in (list(grid) + [1, 1])[:3]])
        b = (ctypes.c_uint * 3)(*[int(v) for v in (list(block) + [1, 1])[:3]])
        self.lib.oa_set_order(int(self.reverse))
        if entry(g, b, ctypes.c_uint(int(shared)), pointers) != 0:
            raise HostKernelError(self.lib.oa_last_error().decode(errors="replace"))
