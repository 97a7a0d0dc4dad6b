"""The artifact folder: its schema constants, and reading + verifying it at load time.

The compiler writes these files (``compiler/artifact``) and the runtime reads them here. Only
JSON and raw bytes: loading never unpickles or evaluates anything. The manifest lists every file
with its size and sha256; on load the sizes of all files and the hashes of the plan and the
kernels are checked before any library is loaded (weights by size; fully hashed on request).
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
from runtime.plan_schema import FORMAT_VERSION
from runtime.plan_schema import Plan

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST",
    "PLAN",
    "WEIGHTS",
    "Artifact",
    "load_artifact",
    "read_json",
    "sha256_file",
]

MANIFEST = "manifest.json"
PLAN = "plan.json"
WEIGHTS = "weights.bin"


@dataclass
class Artifact:
    path: Path
    manifest: dict[str, Any]
    plan: Plan
    weights: np.ndarray  # uint8, read-only (memory-mapped when non-empty)
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
        raise ArtifactError(f"{path}: {what} is missing") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{path}: {what} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ArtifactError(f"{path}: {what} is not a JSON object")
    return raw, data


def load_artifact(path: str | os.PathLike[str], *, verify_weights: bool = False) -> Artifact:
    """Read and verify the artifact folder at ``path``."""
    root = Path(path)
    if not root.is_dir():
        raise ArtifactError(f"{root}: no such artifact folder")
    _, manifest = read_json(root / MANIFEST, "manifest.json")
    check_format_version(manifest.get("format_version"), FORMAT_VERSION, root / MANIFEST,
                         manifest.get("compiler"))
    verify_files(root, manifest, (PLAN, WEIGHTS), WEIGHTS, verify_weights=verify_weights)
    target = manifest.get("target")
    cpu = target.get("cpu") if isinstance(target, dict) else None
    cpu_build = select_cpu_build(cpu if isinstance(cpu, dict) else None, where=str(root / MANIFEST))
    plan = Plan.from_json(read_json(root / PLAN, "plan.json")[1], root / PLAN)
    weights = _map_weights(root / WEIGHTS)
    return Artifact(root, manifest, plan, weights, cpu_build)


def _map_weights(path: Path) -> np.ndarray:
    size = path.stat().st_size
    if size == 0:
        return np.zeros(0, np.uint8)
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    array = np.frombuffer(mapped, dtype=np.uint8)
    return array
