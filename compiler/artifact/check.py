"""The compile's last step before an artifact is put in place: run it once, on its golden cases.

``write_artifact`` writes the whole folder into a temporary sibling of the output; before renaming
it into place it calls :func:`check_artifact`, which loads a runtime ``Session`` on that folder
exactly as a deployment would (manifest, plan, weights, the C library of this CPU, CUDA code) and
runs the golden cases ``compiler/artifact/golden.py`` stored (each at its binding of a dynamic
graph) through ``runtime.selftest.run_golden_cases``, the code ``onnx-aot verify`` runs. A load that
fails, a step that raises, or an output off its recorded tolerance is an ``ArtifactCheckError``
naming the step or the output; the temporary folder is then removed and the output path keeps what
it held. The reference outputs were computed before the build, so the check costs one load and one
run per case (measured: 2-4 ms on a small model, ~80 ms on ResNet-50, ~180 ms on a dynamic YOLOv8n).

It is skipped, with an ``UncheckedArtifactWarning``, where it cannot run: no golden cases (their
reason: ``--golden-cases 0``, a graph that draws random numbers, a value over the reference run's
cap), a CUDA artifact on a host without a usable CUDA device, or one none of whose C builds this CPU
runs (``--cpu`` above this host's level without a portable build). An artifact whose preferred C build
needs CPU features this host lacks is checked on the build this CPU runs (a progress line says so).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path

from runtime.artifact import MANIFEST
from runtime.cpu_builds import select_cpu_build
from runtime.errors import ArtifactCheckError
from runtime.errors import ArtifactError
from runtime.errors import CpuFallbackWarning
from runtime.errors import UncheckedArtifactWarning
from runtime.plan_schema import Plan
from runtime.selftest import VerifyReport

__all__ = ["check_artifact", "warn_unchecked"]

Progress = Callable[[str], None]


def warn_unchecked(out: Path, reason: str) -> None:
    """Say that the artifact ``out`` goes out without its run checked, and why."""
    warnings.warn(f"{out}: the artifact's run was not checked: {reason}", UncheckedArtifactWarning,
                  stacklevel=2)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _no_build_for_this_cpu(folder: Path) -> str | None:
    """Why none of the C builds in the manifest at ``folder`` runs on this CPU (None: one does, or
    the artifact has no C build)."""
    manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    target = manifest.get("target")
    cpu = target.get("cpu") if isinstance(target, dict) else None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CpuFallbackWarning)
            select_cpu_build(cpu if isinstance(cpu, dict) else None, where="the artifact")
    except ArtifactError as exc:
        return _one_line(exc).removeprefix("the artifact: ")
    return None


def check_artifact(folder: Path, plan: Plan, out: Path, say: Progress) -> VerifyReport | None:
    """Run the golden cases of the artifact written at ``folder`` (to become ``out``): return their
    report when every output is within its tolerance (None: not run here), else raise
    ``ArtifactCheckError``."""
    from runtime.session import Session

    spaces = {a.memory_space for a in plan.arenas} | {p.memory_space for p in plan.partitions}
    if "cuda" in spaces:
        from runtime.providers.cuda import cuda_available

        if not cuda_available():
            say("no usable CUDA device here (cupy and a GPU): the artifact's first run is not checked")
            warn_unchecked(out, "this host has no usable CUDA device to run it on (cupy and a GPU)")
            return None
    foreign = _no_build_for_this_cpu(folder)
    if foreign is not None:  # compiled for another machine (--cpu above this host's, no portable build)
        say(f"no C build of the artifact runs on this CPU: its first run is not checked ({foreign})")
        warn_unchecked(out, f"no C build of it runs on this CPU ({foreign})")
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CpuFallbackWarning)  # said below, as a progress line
        try:
            session = Session(folder, threads=os.cpu_count() or 1)
        except ArtifactError as exc:
            raise ArtifactCheckError(f"{out}: the built artifact does not load: {_one_line(exc)}; "
                                     "nothing was written") from None
    build = session.cpu_build
    if build is not None and build.fallback:
        say(f"this CPU lacks {', '.join(build.preferred_missing)} for the preferred C build: checking the "
            f"-march={build.march} build instead")
    try:
        report = session.verify(raise_on_mismatch=False)
    except ArtifactError as exc:  # a step failed: the message names it
        message = _one_line(exc).replace(f"{folder}: ", "")
        raise ArtifactCheckError(f"{out}: the built artifact fails its first run on the golden inputs: "
                                 f"{message}; nothing was written") from None
    if report.skipped is not None:  # make_golden stored no case; its reason was given already
        return None
    if not report.ok:
        bad = [c for c in report.checks if not c.ok]
        detail = ", ".join(f"case {c.case} output {c.output!r}: relative error {c.error:.3g} over "
                           f"tolerance {c.tolerance:.3g}" for c in bad[:4])
        raise ArtifactCheckError(f"{out}: the built artifact disagrees with the reference kernels on its "
                                 f"golden inputs ({detail}); nothing was written",
                                 tuple((c.case, c.output, c.error) for c in bad))
    worst = report.worst
    assert worst is not None
    say(f"checked the artifact: {report.cases} golden case(s) ran and match the reference "
        f"(worst relative error {worst.error:.3g}, output {worst.output!r})")
    return report
