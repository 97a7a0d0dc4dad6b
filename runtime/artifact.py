"""The artifact folder: its schema constants, and reading + verifying it at load time.

The compiler writes these files (``compiler/artifact``) and the runtime reads them here. Only
JSON and raw bytes: loading never unpickles or evaluates anything. The manifest lists every file
with its size and sha256; on load the sizes of all files and the hashes of the plan and the
kernels are checked before any library is loaded (weights by size; fully hashed on request).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtime.errors import ArtifactError

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST",
    "PLAN",
    "WEIGHTS",
    "Artifact",
    "load_artifact",
    "sha256_file",
]

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
PLAN = "plan.json"
WEIGHTS = "weights.bin"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass
class Artifact:
    path: Path
    manifest: dict[str, Any]
    plan: dict[str, Any]
    weights: np.ndarray  # uint8, read-only (memory-mapped when non-empty)

    def file(self, rel: str) -> Path:
        return self.path / rel


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        raise ArtifactError(f"{path}: {what} is missing") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{path}: {what} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ArtifactError(f"{path}: {what} is not a JSON object")
    return data


def load_artifact(path: str | os.PathLike[str], *, verify_weights: bool = False) -> Artifact:
    """Read and verify the artifact folder at ``path``."""
    root = Path(path)
    if not root.is_dir():
        raise ArtifactError(f"{root}: no such artifact folder")
    manifest = _read_json(root / MANIFEST, "manifest.json")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise ArtifactError(
            f"{root / MANIFEST}: artifact format version {version!r}; this runtime reads version "
            f"{FORMAT_VERSION} (recompile the model with a matching onnx-aot)"
        )
    files = manifest.get("files")
    if not isinstance(files, dict) or PLAN not in files or WEIGHTS not in files:
        raise ArtifactError(f"{root / MANIFEST}: the file list is missing or incomplete")
    for rel, entry in files.items():
        file = _inside(root, rel)
        try:
            size = file.stat().st_size
        except FileNotFoundError:
            raise ArtifactError(f"{file}: listed in the manifest but missing") from None
        if size != entry.get("size"):
            raise ArtifactError(f"{file}: size {size} does not match the manifest ({entry.get('size')})")
        if rel != WEIGHTS or verify_weights:
            if sha256_file(file) != entry.get("sha256"):
                raise ArtifactError(f"{file}: contents do not match the manifest's sha256")
    plan = _read_json(root / PLAN, "plan.json")
    if plan.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(f"{root / PLAN}: unexpected plan format version")
    weights = _map_weights(root / WEIGHTS)
    return Artifact(root, manifest, plan, weights)


def _inside(root: Path, rel: str) -> Path:
    if not isinstance(rel, str) or rel.startswith(("/", "\\")) or ".." in Path(rel).parts:
        raise ArtifactError(f"{root / MANIFEST}: file entry {rel!r} points outside the artifact")
    return root / rel


def _map_weights(path: Path) -> np.ndarray:
    size = path.stat().st_size
    if size == 0:
        return np.zeros(0, np.uint8)
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    array = np.frombuffer(mapped, dtype=np.uint8)
    return array
