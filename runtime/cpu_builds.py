"""Choosing which of an artifact's C builds this CPU runs.

A CPU artifact carries its C kernels built for the requested target (``--cpu``; the build
machine's level by default) and, on x86-64, a portable ``x86-64-v2`` build of the same source.
``manifest.json: target.cpu.builds`` lists them in preference order, each with its ``library``
and ``source`` (artifact-relative), ``march``, ``flags`` and ``features`` (``/proc/cpuinfo``
spelling). Every build has the same entries, ext slots, arena and scratch offsets and weights
layout, so any of them runs the one ``plan.json``.

``select_cpu_build`` picks the first build whose features the host has. When that is not the
first, it warns with ``CpuFallbackWarning`` naming the build used and the features the preferred
one needs that this CPU lacks; when none fits it raises ``ArtifactError`` naming the missing
features. A manifest without ``builds`` (one build: the plan's own library) is checked as before
with ``check_cpu_target``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from runtime.errors import ArtifactError
from runtime.errors import CpuFallbackWarning
from runtime.isa import check_cpu_target
from runtime.isa import host_cpu_flags
from runtime.isa import missing_features
from runtime.isa import required_features

__all__ = ["CpuBuild", "select_cpu_build"]


@dataclass(frozen=True)
class CpuBuild:
    """The C build a session runs (``Session.cpu_build``)."""

    index: int  # position in target.cpu.builds (0: the preferred build)
    library: str | None  # artifact-relative; None for a manifest without ``builds``
    source: str | None
    march: str
    features: tuple[str, ...]
    flags: tuple[str, ...]
    preferred_missing: tuple[str, ...] = ()  # what the preferred build needs that this CPU lacks
    rebuilt: Path | None = field(default=None)  # the library rebuilt for this CPU (rebuild=True)

    @property
    def fallback(self) -> bool:
        return self.index > 0


def _builds(cpu: Mapping[str, Any], where: str) -> list[Mapping[str, Any]]:
    builds = cpu.get("builds")
    if not isinstance(builds, list) or not builds or not all(isinstance(b, Mapping) for b in builds):
        raise ArtifactError(f"{where}: target.cpu.builds is not a non-empty list of build records")
    for build in builds:
        if not isinstance(build.get("library"), str) or not isinstance(build.get("source"), str):
            raise ArtifactError(f"{where}: a target.cpu.builds record names no library or source")
    return builds


def select_cpu_build(cpu: Mapping[str, Any] | None, *, where: str, machine: str | None = None,
                     flags: Iterable[str] | None = None) -> CpuBuild | None:
    """The first build in ``cpu`` (``manifest.json: target.cpu``) this host can run.

    ``machine`` and ``flags`` default to the host's. None when the manifest records no CPU build.
    """
    if not cpu:
        return None
    if "builds" not in cpu:  # one build, described by target.cpu itself
        check_cpu_target(cpu, where=where, machine=machine, flags=flags)
        return CpuBuild(0, None, None, str(cpu.get("march") or "?"), required_features(cpu), ())
    builds = _builds(cpu, where)
    check_cpu_target({"machine": cpu.get("machine"), "march": builds[0].get("march"), "features": []},
                     where=where, machine=machine, flags=())  # the machine only
    host_flags = frozenset(flags) if flags is not None else host_cpu_flags()
    missing = [missing_features(required_features(b), host_flags) if host_flags is not None else []
               for b in builds]
    for index, build in enumerate(builds):
        if missing[index]:
            continue
        chosen = CpuBuild(index, str(build["library"]), str(build["source"]), str(build.get("march") or "?"),
                          required_features(build), tuple(str(f) for f in build.get("flags") or ()),
                          tuple(missing[0]))
        if index:
            first = builds[0]
            warnings.warn(
                f"{where}: this CPU lacks {', '.join(missing[0])}, which the preferred C build "
                f"{first['library']} (-march={first.get('march')}) needs; running the "
                f"{build['library']} build (-march={chosen.march}) instead, which may be slower "
                f"(recompile with --cpu native on this machine, or load with rebuild=True)",
                CpuFallbackWarning, stacklevel=4)
        return chosen
    needs = "; ".join(f"{b['library']} (-march={b.get('march')}) needs {', '.join(m)}"
                      for b, m in zip(builds, missing, strict=True))
    raise ArtifactError(
        f"{where}: no C kernel build of this artifact runs on this CPU: {needs}; recompile the "
        f"model for a lower target (e.g. onnx-aot compile --cpu x86-64-v2, or on this machine)")
