"""Which CUDA binary a partition loads, and where NVRTC results are cached: pure logic, no cupy.

A CUDA partition's ``module`` record names the shipped ``.cu`` source, the cubins nvcc built (per
arch, possibly none) and a PTX (or null). The manifest's ``target.providers.cuda`` facts say which
toolkit made them. ``module_candidates`` orders what to try on a given device and driver:

1. a cubin the device can run: same major compute capability, minor not above the device's
   (``sm_80`` runs on 8.6, not on 9.0; an arch-specific ``sm_90a`` only on 9.0 itself), built by a
   toolkit whose major version the driver supports (CUDA minor-version compatibility);
2. the PTX, when its virtual arch is not above the device's and the driver is at least the
   toolkit that wrote it (the driver JIT rejects newer PTX: CUDA 13 PTX does not load on 12.x);
3. the ``.cu`` compiled at load with NVRTC for the device's arch, cached by source sha256.

The loader tries them in order and falls through on a load failure, so a wrong fact costs time,
never correctness. Versions are CUDA's integer form (12040 = 12.4), as
``cudaDriverGetVersion`` reports them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.errors import ArtifactError
from runtime.plan_schema import CudaModule

__all__ = [
    "DeviceInfo",
    "ModuleChoice",
    "parse_cuda_version",
    "parse_arch",
    "module_candidates",
    "choose_module",
    "arch_mismatch",
    "nvrtc_cache_dir",
    "nvrtc_cache_key",
    "nvrtc_cache_path",
    "DEFAULT_NVRTC_OPTIONS",
]

CACHE_ENV = "ONNX_AOT_CUDA_CACHE"
DEFAULT_NVRTC_OPTIONS = ("--std=c++17",)


@dataclass(frozen=True)
class DeviceInfo:
    compute_capability: int  # 90 for an H100 (cupy's Device().compute_capability is the string "90")
    driver_version: int  # cudaDriverGetVersion(): 12040 = CUDA 12.4


@dataclass(frozen=True)
class ModuleChoice:
    kind: str  # "cubin" | "ptx" | "nvrtc"
    path: str  # artifact-relative file: the cubin, the PTX, or the .cu NVRTC compiles
    arch: str  # the real arch the code ends up as, e.g. "sm_90"
    reason: str  # why this candidate is in the list, for messages and reports


def parse_cuda_version(value: Any) -> int | None:
    """CUDA's integer version from 12040, "12.4", "12.4.131", "V12.4.131" or "release 12.4"."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value if value >= 1000 else None
    if isinstance(value, str):
        match = re.search(r"(\d+)\.(\d+)", value)
        if match:
            return int(match.group(1)) * 1000 + int(match.group(2)) * 10
        if value.isdigit() and int(value) >= 1000:
            return int(value)
    return None


def parse_arch(name: str) -> tuple[int, bool] | None:
    """``"sm_90"`` -> (90, False), ``"sm_90a"`` -> (90, True) (arch-specific), ``"compute_80"``."""
    match = re.fullmatch(r"(?:sm|compute)_(\d+)([af]?)", name)
    if not match:
        return None
    return int(match.group(1)), match.group(2) != ""


def _cubin_runs_on(arch: str, cc: int) -> bool:
    parsed = parse_arch(arch)
    if parsed is None:
        return False
    built, specific = parsed
    if specific:
        return built == cc
    return built // 10 == cc // 10 and built % 10 <= cc % 10


def module_candidates(module: CudaModule, facts: Mapping[str, Any],
                      device: DeviceInfo) -> list[ModuleChoice]:
    """What to try, best first, for ``device``; NVRTC on the source is always last."""
    cc, driver = device.compute_capability, device.driver_version
    toolkit = parse_cuda_version(facts.get("cuda_version"))
    arch = f"sm_{cc}"
    out: list[ModuleChoice] = []
    cubins = module.cubins
    parsed = {a: p for a in cubins if (p := parse_arch(a)) is not None and _cubin_runs_on(a, cc)}
    # the newest arch first (the exact one, then older minors), arch-specific before portable
    fitting = sorted(parsed, key=lambda a: (-parsed[a][0], not parsed[a][1], a))
    for name in fitting:
        if toolkit is not None and driver // 1000 < toolkit // 1000:
            continue  # a CUDA 13 cubin needs a CUDA 13 driver
        out.append(ModuleChoice("cubin", str(cubins[name]), arch, f"cubin {name} runs on sm_{cc}"))
    ptx = module.ptx
    if ptx:
        ptx_arch = parse_arch(str(facts.get("ptx_arch") or "")) or parse_arch(_ptx_arch_from_name(str(ptx)))
        arch_ok = ptx_arch is None or ptx_arch[0] <= cc
        if arch_ok and toolkit is not None and driver >= toolkit:
            out.append(ModuleChoice("ptx", str(ptx), arch,
                                    f"PTX from CUDA {_fmt(toolkit)} JIT-compiled by driver {_fmt(driver)}"))
    why = "no cubin for this device" if not fitting else "the cubins did not load"
    if ptx and (toolkit is None or driver < toolkit):
        why += (f"; the PTX needs a driver for CUDA {_fmt(toolkit)} or newer, this one is "
                f"{_fmt(driver)}" if toolkit is not None else "; the PTX's CUDA version is unknown")
    out.append(ModuleChoice("nvrtc", module.source, arch, why))
    return out


def choose_module(module: CudaModule, facts: Mapping[str, Any], device: DeviceInfo) -> ModuleChoice:
    """The first candidate: what a device like ``device`` loads when nothing fails."""
    return module_candidates(module, facts, device)[0]


def arch_mismatch(module: CudaModule, facts: Mapping[str, Any], device: DeviceInfo) -> str | None:
    """Why no prebuilt binary (cubin or PTX) of ``module`` can run on ``device``; None when one can.

    Then only NVRTC on the shipped source is left; when that is missing or fails, this sentence
    is the error the user sees, saying what the artifact was built for and what would be needed.
    """
    choices = module_candidates(module, facts, device)
    if any(c.kind != "nvrtc" for c in choices):
        return None
    cc = device.compute_capability
    cubins = sorted(module.cubins)
    built = ", ".join(cubins) if cubins else "no cubins"
    ptx = module.ptx
    ptx_arch = str(facts.get("ptx_arch") or _ptx_arch_from_name(str(ptx or ""))) if ptx else ""
    toolkit = parse_cuda_version(facts.get("cuda_version"))
    if ptx:
        built += f", PTX {ptx_arch or '?'}"
    if toolkit is not None:
        built += f" (CUDA {_fmt(toolkit)})"
    why = [f"no cubin runs on sm_{cc}"] if cubins else ["no cubins were built (no nvcc at compile time)"]
    if ptx:
        parsed = parse_arch(ptx_arch) if ptx_arch else None
        if parsed is not None and parsed[0] > cc:
            why.append(f"the PTX needs compute capability {parsed[0] // 10}.{parsed[0] % 10} or newer")
        elif toolkit is None or device.driver_version < toolkit:
            why.append(f"the PTX needs a driver for CUDA {_fmt(toolkit)} or newer, this one is "
                       f"{_fmt(device.driver_version)}")
    return (f"the CUDA kernels were built for {built}; this device is sm_{cc} (compute capability "
            f"{cc // 10}.{cc % 10}, driver {_fmt(device.driver_version)}): {'; '.join(why)}. Recompile with "
            f"--target cuda for sm_{cc}, or make NVRTC available so the shipped source is compiled "
            f"for this device at load")


def _ptx_arch_from_name(path: str) -> str:
    match = re.search(r"(compute_\d+[af]?)", path)
    return match.group(1) if match else ""


def _fmt(version: int | None) -> str:
    return "?" if version is None else f"{version // 1000}.{version % 1000 // 10}"


def nvrtc_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$ONNX_AOT_CUDA_CACHE`` when set and non-empty, else ``~/.cache/onnx-aot/cuda``."""
    env = os.environ if environ is None else environ
    value = env.get(CACHE_ENV, "")
    if value.strip():
        return Path(value).expanduser()
    return Path("~/.cache/onnx-aot/cuda").expanduser()


def nvrtc_cache_key(source_sha256: str, arch: str, options: tuple[str, ...] | list[str],
                    nvrtc_version: tuple[int, int]) -> str:
    """``<source sha256>-<arch>-<digest of options and NVRTC version>``: one file per way of compiling."""
    if not re.fullmatch(r"[0-9a-f]{64}", source_sha256):
        raise ArtifactError(f"not a sha256 hex digest: {source_sha256!r}")
    if parse_arch(arch) is None:
        raise ArtifactError(f"not a CUDA arch: {arch!r}")
    how = json.dumps({"options": list(options), "nvrtc": list(nvrtc_version)}, sort_keys=True)
    return f"{source_sha256}-{arch}-{hashlib.sha256(how.encode()).hexdigest()[:16]}"


def nvrtc_cache_path(cache_dir: Path, key: str, binary: str = "cubin") -> Path:
    return cache_dir / f"{key}.{binary}"
