"""Rebuilding an artifact's C kernels for this CPU, on request (``Session(dir, rebuild=True)``).

The artifact ships the C source of every build (listed in the manifest with its sha256). A
rebuild takes the source of the build this CPU runs (``runtime/cpu_builds.py``), checks its
bytes against the manifest's sha256, and compiles it with ``$CC`` (default ``cc``) and the
preferred build's recorded flags (its ``-O`` level), ``-march=...`` replaced by ``-march=native``,
``-fopenmp`` exactly when the source still uses OpenMP (``uses_openmp``: kernels on the worker
pool need none, and a library built without it does not depend on libgomp), and without
``-Werror`` (a different compiler version may warn where the build machine's did not; a warning
must not stop a deploy). The library goes into a cache --
``$ONNX_AOT_RUNTIME_CACHE_DIR``, default ``~/.cache/onnx-aot/runtime`` -- never into the
artifact folder, named by sha256(source) and a hash of the host's identity (machine, ISA
flags, compiler version, flags), written atomically (temporary file + rename); the next load
finds it there and compiles nothing.

Only the standard library (subprocess): the runtime never needs the compiler package.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from runtime.cpu_builds import CpuBuild
from runtime.errors import ArtifactError
from runtime.isa import MACRO_FEATURES
from runtime.isa import host_cpu_flags

__all__ = ["CACHE_ENV", "rebuild_cache_dir", "rebuild_flags", "rebuild_library", "uses_openmp"]

CACHE_ENV = "ONNX_AOT_RUNTIME_CACHE_DIR"
_KNOWN_FEATURES = frozenset(MACRO_FEATURES.values())
_STDERR_LIMIT = 4000
# An OpenMP region, a call of an OpenMP function or its header: C text that needs -fopenmp.
_OPENMP = re.compile(r"^[ \t]*#[ \t]*pragma[ \t]+omp\b|\bomp_\w+[ \t]*\(|#[ \t]*include[ \t]*<omp\.h>", re.M)


def uses_openmp(source: str) -> bool:
    """Whether C ``source`` needs OpenMP (``-fopenmp``, libgomp): a ``#pragma omp``, an
    ``omp_...(`` call or ``<omp.h>``. The build (compiler/codegen/toolchain.py) and a rebuild
    decide with it; kernels on the worker pool need none."""
    return _OPENMP.search(source) is not None


def rebuild_cache_dir() -> Path:
    """``$ONNX_AOT_RUNTIME_CACHE_DIR`` when set, else ``~/.cache/onnx-aot/runtime``."""
    env = os.environ.get(CACHE_ENV, "")
    return Path(env) if env else Path.home() / ".cache" / "onnx-aot" / "runtime"


def rebuild_flags(recorded: tuple[str, ...] | list[str], openmp: bool | None = None) -> list[str]:
    """The recorded build flags with ``-march=native`` (and no ``-Werror``); ``openmp`` (whether
    the source uses it) adds or drops ``-fopenmp``, None keeps what was recorded."""
    flags = [f for f in recorded if not f.startswith(("-march=", "-mtune=")) and f != "-Werror"]
    if openmp is not None:
        flags = [f for f in flags if f != "-fopenmp"] + (["-fopenmp"] if openmp else [])
    if "-shared" not in flags:
        flags.append("-shared")
    return [*flags, "-march=native"]


def _preferred_flags(manifest: dict[str, Any]) -> tuple[str, ...]:
    """The preferred build's flags (its -O level, not the portable build's cheaper one)."""
    builds = manifest.get("target", {}).get("cpu", {}).get("builds") or [{}]
    flags = builds[0].get("flags") if isinstance(builds[0], dict) else None
    return tuple(str(f) for f in flags) if isinstance(flags, list) else ()


def _cc_version(cc: str, where: str) -> str:
    if shutil.which(cc) is None:
        raise ArtifactError(f"{where}: rebuilding the C kernels for this CPU needs a C compiler; "
                            f"{cc!r} was not found (install one, set $CC, or load without rebuild)")
    try:
        proc = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False)
    except OSError as exc:
        raise ArtifactError(f"{where}: cannot run C compiler {cc!r}: {exc}") from exc
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise ArtifactError(f"{where}: C compiler {cc!r} does not answer --version")
    return lines[0]


def _host_identity(cc_version: str, flags: list[str]) -> str:
    host = host_cpu_flags() or frozenset()
    blob = json.dumps({"machine": platform.machine(), "isa": sorted(host & _KNOWN_FEATURES),
                       "cc": cc_version, "flags": flags}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def rebuild_library(root: Path, manifest: dict[str, Any], build: CpuBuild, *,
                    cc: str | None = None, cache: Path | None = None) -> CpuBuild:
    """``build`` with ``rebuilt`` set to its library compiled for this CPU (from the cache when
    an earlier rebuild made it). ``ArtifactError`` when there is no source, its hash does not
    match, there is no C compiler or the compile fails."""
    where = str(root / "manifest.json")
    if build.source is None:
        raise ArtifactError(f"{where}: this artifact records no C source per build; it cannot be "
                            f"rebuilt (recompile it with a newer onnx-aot)")
    entry = manifest.get("files", {}).get(build.source)
    if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
        raise ArtifactError(f"{root / build.source}: C source not listed in the manifest")
    try:
        source = (root / build.source).read_bytes()
    except OSError as exc:
        raise ArtifactError(f"{root / build.source}: cannot read the C source: {exc}") from exc
    source_sha = hashlib.sha256(source).hexdigest()
    if source_sha != entry["sha256"]:
        raise ArtifactError(f"{root / build.source}: sha256 does not match the manifest (the C source "
                            f"was modified); not compiling it")
    cc = cc or os.environ.get("CC") or "cc"
    version = _cc_version(cc, where)
    flags = rebuild_flags(_preferred_flags(manifest) or build.flags,
                          uses_openmp(source.decode("utf-8", errors="replace")))
    cache = cache if cache is not None else rebuild_cache_dir()
    target = cache / f"{source_sha[:32]}-{_host_identity(version, flags)[:16]}.so"
    if target.is_file():
        return dataclasses.replace(build, rebuilt=target)
    with tempfile.TemporaryDirectory(prefix="onnx-aot-rebuild-") as tmp:
        work = Path(tmp)
        (work / "model.c").write_bytes(source)
        argv = [cc, *flags, "model.c", "-o", "model.so", "-lm"]
        try:
            proc = subprocess.run(argv, cwd=work, capture_output=True, text=True, check=False)
        except OSError as exc:
            raise ArtifactError(f"{where}: cannot run C compiler {cc!r}: {exc}") from exc
        if proc.returncode != 0:
            raise ArtifactError(f"{root / build.source}: rebuilding for this CPU failed ({' '.join(argv)}):\n"
                                f"{(proc.stderr or proc.stdout).strip()[:_STDERR_LIMIT]}")
        cache.mkdir(parents=True, exist_ok=True)
        fd, part = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=cache)
        os.close(fd)
        try:
            shutil.copyfile(work / "model.so", part)
            os.chmod(part, 0o755)
            os.replace(part, target)
        except BaseException:
            Path(part).unlink(missing_ok=True)
            raise
    return dataclasses.replace(build, rebuilt=target)
