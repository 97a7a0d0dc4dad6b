"""The CUDA toolchain: build the generated ``model.cu`` into cubins and PTX with nvcc, cached.

``build_cuda`` compiles one source for each requested real architecture (``-cubin``, e.g.
sm_80 and sm_90) and, for forward compatibility, to PTX for one virtual architecture
(compute_80), with warnings as errors (nvcc's ``-Werror all-warnings`` and ptxas's
``-Werror``). The source is compiled under a fixed name in a fresh temporary folder, so no path
or time reaches the outputs. Each output is cached by sha256(source, flags, nvcc version,
target) in the build cache (``compiler.codegen.build_cache.cuda_cache_dir``); missing targets
are built in parallel nvcc processes. Without nvcc, nothing is built and the runtime compiles
the shipped source with NVRTC.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from compiler.codegen.build_cache import BuildCache
from compiler.codegen.build_cache import content_key
from compiler.codegen.build_cache import copy_atomic
from compiler.codegen.build_cache import cuda_cache_dir
from compiler.codegen.build_cache import trim_output
from compiler.codegen.options import BuildOptions
from runtime.errors import CompileError

__all__ = [
    "CudaBuild",
    "DEFAULT_ARCHS",
    "DEFAULT_PTX_ARCH",
    "NVCC_FLAGS",
    "build_cuda",
    "find_nvcc",
    "min_driver",
    "nvcc_version",
]

SOURCE_NAME = "model.cu"
DEFAULT_ARCHS = ("sm_80", "sm_90")
DEFAULT_PTX_ARCH = "compute_80"
NVCC_FLAGS = ("-O3", "-std=c++17", "-Werror", "all-warnings", "-Xptxas", "-Werror")
_ARCH = re.compile(r"(sm|compute)_\d+[a-z]?")

# Minimum Linux driver that loads code from a CUDA major release under minor-version
# compatibility: CUDA Toolkit release notes, table "CUDA Toolkit and Minimum Required Driver
# Version for CUDA Minor Version Compatibility" (13.x: >= 580; 12.x: >= 525.60.13). CUDA 13.0
# GA itself ships with 580.65.06, so its PTX JIT-compiles on any 580-series driver too.
_MIN_DRIVER = {13: ">= 580", 12: ">= 525.60.13"}


@dataclass(frozen=True)
class CudaBuild:
    """What was built: file names relative to the output folder, and toolchain facts."""

    cubins: dict[str, str]  # arch -> file name
    ptx: str | None
    nvcc: str
    nvcc_version: str  # e.g. "13.0.88"
    cuda_version: str  # e.g. "13.0"
    flags: tuple[str, ...]
    cached: bool  # every output came from the cache


def find_nvcc(options: BuildOptions) -> str | None:
    """``options.extra["nvcc"]`` ("none" disables the build), else nvcc on PATH or in
    /usr/local/cuda/bin, else None."""
    chosen = options.extra.get("nvcc")
    if chosen is not None:
        return None if chosen in ("", "none") else chosen
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.is_file() and os.access(default, os.X_OK) else None


@functools.cache
def nvcc_version(nvcc: str) -> tuple[str, str]:
    """``(full version, major.minor)`` from ``nvcc --version``, e.g. ("13.0.88", "13.0")."""
    try:
        proc = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False)
    except OSError as exc:
        raise CompileError(f"cannot run nvcc {nvcc!r}: {exc}") from exc
    match = re.search(r"release (\d+\.\d+), V(\d+\.\d+\.\d+)", proc.stdout)
    if proc.returncode != 0 or match is None:
        raise CompileError(f"nvcc {nvcc!r} does not answer --version: {(proc.stderr or proc.stdout)[:500]}")
    return match.group(2), match.group(1)


def min_driver(cuda_version: str) -> str | None:
    """The minimum driver (as ">= X") that loads cubins and PTX built by this CUDA release."""
    major = int(cuda_version.split(".")[0])
    return _MIN_DRIVER.get(major)


def _target_argv(nvcc: str, flags: tuple[str, ...], arch: str, out: str) -> list[str]:
    mode = "-ptx" if arch.startswith("compute_") else "-cubin"
    return [nvcc, mode, f"-arch={arch}", *flags, SOURCE_NAME, "-o", out]


def build_cuda(
    source_text: str,
    out_dir: Path,
    options: BuildOptions,
    nvcc: str,
    archs: tuple[str, ...] = DEFAULT_ARCHS,
    ptx_arch: str | None = DEFAULT_PTX_ARCH,
) -> CudaBuild:
    """Build ``model.<arch>.cubin`` per arch and ``model.ptx`` into ``out_dir`` (through the cache).

    Raises ``CompileError`` with nvcc's trimmed output when a build fails (the source stays in
    ``out_dir/model.cu`` for inspection).
    """
    for arch in (*archs, *([ptx_arch] if ptx_arch else [])):
        if not _ARCH.fullmatch(arch):
            raise CompileError(f"bad CUDA architecture {arch!r} (expected sm_NN or compute_NN)")
    version, cuda = nvcc_version(nvcc)
    flags = (*NVCC_FLAGS, *shlex.split(options.extra.get("nvcc_flags", "")))
    targets = {arch: f"model.{arch}.cubin" for arch in archs}
    if ptx_arch:
        targets[ptx_arch] = "model.ptx"
    keys = {arch: content_key(source=source_text, flags=flags, nvcc=version, arch=arch) for arch in targets}
    suffix = {arch: ".ptx" if arch.startswith("compute_") else ".cubin" for arch in targets}
    cache = BuildCache(cuda_cache_dir(), mode=0o644)
    missing = [a for a in targets if not cache.has(keys[a], suffix[a])]
    out_dir = Path(out_dir)
    if missing:
        with tempfile.TemporaryDirectory(prefix="onnx-aot-nvcc-") as tmp:
            work = Path(tmp)
            (work / SOURCE_NAME).write_text(source_text)
            _run_nvcc(nvcc, flags, {arch: targets[arch] for arch in missing}, work, out_dir / SOURCE_NAME)
            for arch in missing:
                if not cache.store(work / targets[arch], keys[arch], suffix[arch]):
                    copy_atomic(work / targets[arch], out_dir / targets[arch], 0o644)  # unwritable cache
    for arch, name in targets.items():
        cache.fetch(keys[arch], suffix[arch], out_dir / name)
    return CudaBuild(
        cubins={a: targets[a] for a in archs},
        ptx="model.ptx" if ptx_arch else None,
        nvcc=nvcc,
        nvcc_version=version,
        cuda_version=cuda,
        flags=flags,
        cached=not missing,
    )


def _run_nvcc(nvcc: str, flags: tuple[str, ...], targets: dict[str, str], work: Path, source: Path) -> None:
    """One nvcc per target (arch -> output file name) in parallel; CompileError naming ``source``."""
    procs = []
    for arch, out in targets.items():
        argv = _target_argv(nvcc, flags, arch, out)
        try:
            proc = subprocess.Popen(argv, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True)
        except OSError as exc:
            raise CompileError(f"cannot run nvcc {nvcc!r}: {exc}") from exc
        procs.append((arch, argv, proc))
    failures = []
    for arch, argv, proc in procs:
        output, _ = proc.communicate()
        if proc.returncode != 0:
            failures.append(f"nvcc for {arch} failed ({shlex.join(argv)}):\n{trim_output(output)}")
    if failures:
        raise CompileError(f"CUDA compilation of {source} failed:\n" + "\n".join(failures))
