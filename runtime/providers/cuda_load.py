"""Loading a CUDA partition's module with cupy: cubin, PTX, or the shipped ``.cu`` through NVRTC.

``load_module`` tries ``cuda_module.module_candidates`` in order and keeps the first whose every
kernel loads; what failed before it is kept in ``LoadedModule.notes``. The NVRTC path re-checks
the source against the manifest's sha256 (the "hash-checked" source), compiles it once for the
device's arch, and keeps the cubin in the cache folder (``$ONNX_AOT_CUDA_CACHE``, default
``~/.cache/onnx-aot/cuda``) under a key made of the source hash, the arch, the options and the
NVRTC version; a damaged cache entry is rebuilt. cupy is passed in, never imported here.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from runtime.artifact import Artifact
from runtime.errors import ArtifactError
from runtime.plan_schema import CudaModule
from runtime.providers.cuda_module import DEFAULT_NVRTC_OPTIONS
from runtime.providers.cuda_module import DeviceInfo
from runtime.providers.cuda_module import ModuleChoice
from runtime.providers.cuda_module import arch_mismatch
from runtime.providers.cuda_module import module_candidates
from runtime.providers.cuda_module import nvrtc_cache_dir
from runtime.providers.cuda_module import nvrtc_cache_key
from runtime.providers.cuda_module import nvrtc_cache_path

__all__ = ["LoadedModule", "load_module", "device_info"]


@dataclass
class LoadedModule:
    source: str  # "cubin" | "ptx" | "nvrtc"
    path: Path  # the file loaded (for NVRTC: the cached cubin)
    choice: ModuleChoice
    functions: dict[str, Any]  # kernel name -> cupy RawKernel
    raw: Any  # the cupy RawModule (kept alive with the functions)
    notes: list[str] = field(default_factory=list)  # candidates that failed before this one
    cache_hit: bool | None = None  # NVRTC only: found in the cache


def device_info(cp: Any) -> DeviceInfo:
    return DeviceInfo(int(cp.cuda.Device().compute_capability), int(cp.cuda.runtime.driverGetVersion()))


def _cuda_facts(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest's ``target.providers.cuda`` facts (none: no nvcc ran, NVRTC only)."""
    target = manifest.get("target")
    providers = target.get("providers") if isinstance(target, dict) else None
    found = providers.get("cuda") if isinstance(providers, dict) else None
    return dict(found) if isinstance(found, dict) else {}


def _listed(artifact: Artifact, rel: str) -> Path:
    if rel not in artifact.manifest["files"]:
        raise ArtifactError(f"{artifact.path / rel}: CUDA module file not listed in the manifest")
    return Path(artifact.file(rel))


def _functions(raw: Any, names: list[str]) -> dict[str, Any]:
    functions = {}
    for name in names:
        fn = raw.get_function(name)
        int(fn.max_threads_per_block)  # cupy loads lazily: this loads the module and finds the kernel
        functions[name] = fn
    return functions


def load_module(cp: Any, artifact: Artifact, module: CudaModule, names: list[str]) -> LoadedModule:
    """Load the best binary of ``module`` for this device that has every kernel in ``names``."""
    device = device_info(cp)
    facts = _cuda_facts(artifact.manifest)
    notes: list[str] = []
    for choice in module_candidates(module, facts, device):
        path = _listed(artifact, choice.path)
        if choice.kind == "nvrtc":
            mismatch = arch_mismatch(module, facts, device)
            try:
                raw, path, hit = _nvrtc_module(cp, artifact, choice, DEFAULT_NVRTC_OPTIONS, names)
            except (ArtifactError, ImportError) as exc:
                lead = f"{artifact.path}: {mismatch}\n(NVRTC: {exc})" if mismatch else f"{exc}"
                raise ArtifactError(lead + "".join(f"\n(also failed: {n})" for n in notes)) from None
            return LoadedModule("nvrtc", path, choice, _functions(raw, names), raw, notes, hit)
        try:
            raw = cp.RawModule(path=str(path))
            return LoadedModule(choice.kind, path, choice, _functions(raw, names), raw, notes)
        except Exception as exc:  # CUDADriverError: wrong arch, PTX too new, missing kernel
            notes.append(f"{choice.kind} {choice.path}: {exc}")
    raise ArtifactError(f"{artifact.path}: no CUDA module loads: {'; '.join(notes)}")  # unreachable


def _nvrtc_module(cp: Any, artifact: Artifact, choice: ModuleChoice, options: tuple[str, ...],
                  names: list[str]) -> tuple[Any, Path, bool]:
    path = _listed(artifact, choice.path)
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != artifact.manifest["files"][choice.path].get("sha256"):
        raise ArtifactError(f"{path}: contents do not match the manifest's sha256")
    from cupy.cuda import nvrtc  # type: ignore[import-not-found]

    cubin = hasattr(nvrtc, "getCUBIN")  # NVRTC >= 11.1; else PTX for the driver to finish
    arch = choice.arch if cubin else "compute_" + choice.arch.removeprefix("sm_")
    flags = (*options, f"--gpu-architecture={arch}")
    key = nvrtc_cache_key(digest, choice.arch, flags, tuple(nvrtc.getVersion()))
    cached = nvrtc_cache_path(nvrtc_cache_dir(), key, "cubin" if cubin else "ptx")
    if cached.is_file():
        try:
            raw = cp.RawModule(path=str(cached))
            _functions(raw, names)
            return raw, cached, True
        except Exception:
            pass  # a damaged or foreign cache entry: rebuild it below
    binary = compile_with_nvrtc(nvrtc, data.decode("utf-8"), path.name, flags, cubin)
    target = _store(cached, binary)
    return cp.RawModule(path=str(target)), target, False


def compile_with_nvrtc(nvrtc: Any, source: str, name: str, flags: tuple[str, ...], cubin: bool) -> bytes:
    """Compile ``source`` with cupy's NVRTC binding; ``ArtifactError`` with NVRTC's log on failure."""
    program = nvrtc.createProgram(source, name, [], [])
    try:
        try:
            nvrtc.compileProgram(program, list(flags))
        except Exception as exc:
            log = nvrtc.getProgramLog(program)
            raise ArtifactError(
                f"{name}: NVRTC could not compile it ({' '.join(flags)}): {exc}\n{log}") from None
        result = nvrtc.getCUBIN(program) if cubin else nvrtc.getPTX(program)
    finally:
        nvrtc.destroyProgram(program)
    return result.encode() if isinstance(result, str) else bytes(result)


def _store(path: Path, binary: bytes) -> Path:
    """Write atomically into the cache; an unwritable cache falls back to a private temp file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(binary)
        os.replace(tmp, path)
        return path
    except OSError:
        fd, tmp = tempfile.mkstemp(prefix="onnx-aot-", suffix=path.suffix)
        with os.fdopen(fd, "wb") as f:
            f.write(binary)
        return Path(tmp)
