"""Does this CPU run the C library an artifact carries? Pure checks plus one reader of the host.

The compiler records in ``manifest.json: target.cpu`` the machine (``x86_64``, ``aarch64``), the
resolved ``-march`` and the CPU features that build may use, spelled as the Linux kernel spells
them in ``/proc/cpuinfo`` (``avx2``, ``fma``, ``avx512f``...). Before any library is loaded the
runtime compares them with the host's flags: a library built for AVX-512 on a machine without it
would die with SIGILL in the middle of a request, so this is an ``ArtifactError`` at load instead,
naming the missing features and saying that a recompile for a lower target is needed.

An artifact written before features were recorded has only the ``-march`` name; the x86-64
levels (``x86-64-v2/v3/v4``) and a few common CPU names map to their features here. The functions
take the flags as an argument so tests (and a later multi-build loader choosing the best build)
can ask "would this run on a CPU with these flags?" without that CPU.

``ONNX_AOT_TEST_CPU_FLAGS`` (test-only: comma- or space-separated flags) replaces what
``host_cpu_flags()`` reads from ``/proc/cpuinfo``, so tests can load an artifact as on another
CPU (an AVX2-only host for an AVX-512 build); never set it in production.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any

from runtime.errors import ArtifactError

__all__ = [
    "MACRO_FEATURES",
    "MARCH_FEATURES",
    "X86_LEVELS",
    "TEST_FLAGS_ENV",
    "host_cpu_flags",
    "host_x86_level",
    "required_features",
    "missing_features",
    "check_cpu_target",
]

# Predefined compiler macro -> /proc/cpuinfo flag. Only features code generation can use.
MACRO_FEATURES: dict[str, str] = {
    "__SSE__": "sse", "__SSE2__": "sse2", "__SSE3__": "pni", "__SSSE3__": "ssse3",
    "__SSE4_1__": "sse4_1", "__SSE4_2__": "sse4_2", "__POPCNT__": "popcnt",
    "__AVX__": "avx", "__AVX2__": "avx2", "__FMA__": "fma", "__F16C__": "f16c",
    "__BMI__": "bmi1", "__BMI2__": "bmi2", "__LZCNT__": "abm", "__MOVBE__": "movbe",
    "__AVX512F__": "avx512f", "__AVX512BW__": "avx512bw", "__AVX512CD__": "avx512cd",
    "__AVX512DQ__": "avx512dq", "__AVX512VL__": "avx512vl", "__AVX512VNNI__": "avx512_vnni",
    "__AVX512BF16__": "avx512_bf16", "__AVX512FP16__": "avx512_fp16",
    "__AVX512VBMI__": "avx512vbmi", "__AVX512IFMA__": "avx512ifma", "__AVXVNNI__": "avx_vnni",
    "__AMX_TILE__": "amx_tile", "__AMX_BF16__": "amx_bf16", "__AMX_INT8__": "amx_int8",
    # aarch64 (the kernel's "Features" line)
    "__ARM_NEON": "asimd", "__ARM_FEATURE_SVE": "sve", "__ARM_FEATURE_SVE2": "sve2",
    "__ARM_FEATURE_DOTPROD": "asimddp", "__ARM_FEATURE_FP16_VECTOR_ARITHMETIC": "asimdhp",
    "__ARM_FEATURE_BF16": "bf16", "__ARM_FEATURE_MATMUL_INT8": "i8mm",
}

_V1 = ("sse", "sse2")
_V2 = (*_V1, "pni", "ssse3", "sse4_1", "sse4_2", "popcnt")
_V3 = (*_V2, "avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "abm", "movbe")
_V4 = (*_V3, "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")

# For manifests that carry only the -march name (no feature list).
MARCH_FEATURES: dict[str, tuple[str, ...]] = {
    "x86-64": _V1, "x86-64-v2": _V2, "x86-64-v3": _V3, "x86-64-v4": _V4,
    "nehalem": _V2, "haswell": _V3, "broadwell": _V3, "skylake": _V3, "alderlake": (*_V3, "avx_vnni"),
    "znver1": _V3, "znver2": _V3, "znver3": _V3,
    "skylake-avx512": _V4, "cascadelake": (*_V4, "avx512_vnni"), "icelake-server": (*_V4, "avx512_vnni"),
    "znver4": (*_V4, "avx512_vnni", "avx512_bf16"),
    "sapphirerapids": (*_V4, "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16",
                       "amx_int8"),
}


X86_LEVELS = ("x86-64-v2", "x86-64-v3", "x86-64-v4")  # the levels ``--cpu`` accepts, lowest first
TEST_FLAGS_ENV = "ONNX_AOT_TEST_CPU_FLAGS"


def host_cpu_flags(cpuinfo: str | None = None) -> frozenset[str] | None:
    """The host's CPU flags from ``/proc/cpuinfo`` (or the given text); None when unknown.

    Without ``cpuinfo``, ``$ONNX_AOT_TEST_CPU_FLAGS`` (test-only) overrides the real flags.
    """
    if cpuinfo is None:
        fake = os.environ.get(TEST_FLAGS_ENV)
        if fake is not None:
            return frozenset(fake.replace(",", " ").split())
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo = f.read()
        except OSError:
            return None
    for line in cpuinfo.splitlines():
        key, sep, rest = line.partition(":")
        if sep and key.strip().lower() in ("flags", "features"):
            return frozenset(rest.split())
    return None


def host_x86_level(flags: Iterable[str] | None = None, machine: str | None = None) -> str | None:
    """The highest x86-64-vN level (``X86_LEVELS``) whose features ``flags`` has; None on a
    machine that is not x86-64 or whose flags are unknown (or below v2)."""
    if not _same_machine(machine if machine is not None else platform.machine(), "x86_64"):
        return None
    have = frozenset(flags) if flags is not None else host_cpu_flags()
    if have is None:
        return None
    best = None
    for level in X86_LEVELS:
        if not missing_features(MARCH_FEATURES[level], have):
            best = level
    return best


def required_features(cpu: Mapping[str, Any]) -> tuple[str, ...]:
    """The features a build needs: the recorded list, else what its ``-march`` name implies."""
    features = cpu.get("features")
    if isinstance(features, list) and all(isinstance(f, str) for f in features):
        return tuple(features)
    march = str(cpu.get("march") or "").split("+", 1)[0]
    return MARCH_FEATURES.get(march, ())


def missing_features(required: Iterable[str], flags: Iterable[str]) -> list[str]:
    """Features in ``required`` that ``flags`` lacks, in ``required``'s order."""
    have = set(flags)
    return [f for f in required if f not in have]


def _same_machine(built: str, host: str) -> bool:
    aliases = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}
    return aliases.get(built.lower(), built.lower()) == aliases.get(host.lower(), host.lower())


def check_cpu_target(cpu: Mapping[str, Any] | None, *, where: str, machine: str | None = None,
                     flags: Iterable[str] | None = None) -> None:
    """Raise ``ArtifactError`` when a build described by ``cpu`` cannot run on this host.

    ``machine`` and ``flags`` default to the host's (``platform.machine()``, ``/proc/cpuinfo``);
    when the host's flags cannot be read, only the machine is checked. ``where`` names the file.
    """
    if not cpu:
        return
    host_machine = machine if machine is not None else platform.machine()
    built = str(cpu.get("machine") or "")
    march = str(cpu.get("march") or "?")
    if built and host_machine and not _same_machine(built, host_machine):
        raise ArtifactError(
            f"{where}: the C kernels were built for {built} (-march={march}); this machine is "
            f"{host_machine}: recompile the model on (or for) this machine")
    host_flags = frozenset(flags) if flags is not None else host_cpu_flags()
    if host_flags is None:
        return
    missing = missing_features(required_features(cpu), host_flags)
    if missing:
        raise ArtifactError(
            f"{where}: the C kernels were built for -march={march}, which needs CPU feature(s) "
            f"{', '.join(missing)} that this CPU lacks; recompile the model for a lower target "
            f"(e.g. BuildOptions(isa='x86-64-v2') or on this machine with -march=native)")
