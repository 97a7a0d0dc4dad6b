"""The artifact folder: its schema constants, and reading + verifying it at load time.

The compiler writes these files (``compiler/artifact``) and the runtime reads them here. Only
JSON and raw bytes: loading never unpickles or evaluates anything. The manifest lists every file
with its size and sha256; on load the sizes of all files and the hashes of the plan and the
kernels are checked before any library is loaded (weights by size; fully hashed on request).
Files the manifest marks ``"optional": true`` (the memory report, the portable CPU build, the
golden cases: what ``onnx-aot strip`` removes) may be absent; a build whose library is absent is
not offered to the CPU-build choice.
"""

from __future__ import annotations

import json
import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtime.cpu_builds import CpuBuild
from runtime.cpu_builds import select_cpu_build
from runtime.errors import ArtifactError
from runtime.integrity import check_format_version
from runtime.integrity import sha256_file
from runtime.integrity import verify_files
from runtime.json_fields import Where
from runtime.narrow_weights import widen_weights
from runtime.plan_schema import FORMAT_VERSION
from runtime.plan_schema import OLDEST_FORMAT_VERSION
from runtime.plan_schema import Plan

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST",
    "PLAN",
    "WEIGHTS",
    "RECOMPILE",
    "Artifact",
    "artifact_problem",
    "load_artifact",
    "read_json",
    "sha256_file",
]

MANIFEST = "manifest.json"
PLAN = "plan.json"
WEIGHTS = "weights.bin"
RECOMPILE = "recompile the model (onnx-aot compile MODEL.onnx -o DIR) or copy the artifact folder again"


@dataclass
class Artifact:
    path: Path
    manifest: dict[str, Any]
    plan: Plan
    # the weights image the kernels read: uint8, read-only; weights.bin memory-mapped, or the image
    # widened from it at load when the plan stores constants narrow (runtime/narrow_weights.py)
    weights: np.ndarray
    cpu_build: CpuBuild | None = None  # the C build this CPU runs (runtime/cpu_builds.py)

    def file(self, rel: str) -> Path:
        return self.path / rel

    def library_file(self, rel: str) -> Path:
        """The file to load for the plan's C library ``rel``: the chosen CPU build's library (a
        rebuilt one when there is one) in place of the preferred build's."""
        build = self.cpu_build
        if build is not None and build.library is not None and rel == self._preferred_library():
            return build.rebuilt if build.rebuilt is not None else self.path / build.library
        return self.path / rel

    def _preferred_library(self) -> str | None:
        builds = self.manifest.get("target", {}).get("cpu", {}).get("builds") or [{}]
        library = builds[0].get("library")
        return str(library) if library else None


def read_json(path: Path, what: str) -> tuple[bytes, dict[str, Any]]:
    """The bytes of the JSON file ``path`` and the object they hold (``ArtifactError`` naming the
    file when it is missing, not JSON or not an object)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ArtifactError(f"{path.parent}: {what} is missing: not an artifact folder, or an incomplete "
                            f"one ({RECOMPILE})") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{path}: not valid JSON ({exc}): the artifact is damaged; {RECOMPILE}") from None
    if not isinstance(data, dict):
        raise ArtifactError(f"{path}: not a JSON object: the artifact is damaged; {RECOMPILE}")
    return raw, data


def load_artifact(path: str | os.PathLike[str], *, verify_weights: bool = False) -> Artifact:
    """Read and verify the artifact folder at ``path``."""
    root = Path(path)
    problem = artifact_problem(root)
    if problem is not None:
        raise ArtifactError(problem)
    _, manifest = read_json(root / MANIFEST, "manifest.json")
    check_format_version(manifest.get("format_version"), FORMAT_VERSION, root / MANIFEST,
                         manifest.get("compiler"), oldest=OLDEST_FORMAT_VERSION)
    verify_files(root, manifest, (PLAN, WEIGHTS), WEIGHTS, verify_weights=verify_weights)
    target = manifest.get("target")
    cpu = target.get("cpu") if isinstance(target, dict) else None
    cpu_build = select_cpu_build(_present_builds(root, cpu) if isinstance(cpu, dict) else None,
                                 where=str(root / MANIFEST))
    plan = Plan.from_json(read_json(root / PLAN, "plan.json")[1], root / PLAN)
    weights = widen_weights(plan.constants, _map_weights(root / WEIGHTS), plan.weights_nbytes,
                            Where(str(root / PLAN)).key("constants"))
    return Artifact(root, manifest, plan, weights, cpu_build)


def artifact_problem(path: Path) -> str | None:
    """Why ``path`` cannot be an artifact folder (a model, a file, nothing there), saying how to
    make one; None for a folder."""
    if path.is_dir():
        return None
    if path.is_file():
        if path.suffix.lower() == ".onnx":
            return (f"{path} is an ONNX model, not an artifact folder; compile it first with: "
                    f"onnx-aot compile {path} -o DIR")
        return (f"{path} is a file, not an artifact folder (the folder that "
                "'onnx-aot compile MODEL.onnx -o DIR' writes)")
    return f"{path}: no such artifact folder (make one with: onnx-aot compile MODEL.onnx -o {path})"


def _present_builds(root: Path, cpu: dict[str, Any]) -> dict[str, Any]:
    """``target.cpu`` without the optional builds whose library was removed (``onnx-aot strip``);
    the preferred build is required, so verify_files has already found it."""
    builds = cpu.get("builds")
    if not isinstance(builds, list) or len(builds) < 2:
        return cpu
    kept = [b for k, b in enumerate(builds)
            if k == 0 or not isinstance(b, dict) or not isinstance(b.get("library"), str)
            or (root / b["library"]).is_file()]
    return {**cpu, "builds": kept}


def _map_weights(path: Path) -> np.ndarray:
    size = path.stat().st_size
    if size == 0:
        return np.zeros(0, np.uint8)
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    array = np.frombuffer(mapped, dtype=np.uint8)
    return array
