"""``onnx-aot strip DIR``: remove an artifact's optional parts for deployment, hashes kept valid.

The manifest marks ``"optional": true`` what a deployment can do without: the memory report
(``report/``: ``inspect`` needs it), the portable CPU build (``kernels/cpu/x86-64-v2/``: the
fallback for a CPU below the preferred target) and the golden self-test cases (``verify`` needs
them). Stripping first checks every file against the manifest (a damaged artifact is refused, not
slimmed), deletes the optional files, drops them from the manifest's file list and the portable
build from ``target.cpu.builds``, and replaces ``manifest.json`` atomically. What is left loads,
runs and passes every integrity check as before.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from runtime.artifact import MANIFEST
from runtime.artifact import PLAN
from runtime.artifact import WEIGHTS
from runtime.artifact import artifact_problem
from runtime.artifact import read_json
from runtime.errors import ArtifactError
from runtime.integrity import verify_files

__all__ = ["strip_artifact"]


def strip_artifact(path: str | os.PathLike[str]) -> tuple[list[str], int]:
    """Remove the optional files of the artifact at ``path``; (their relative paths, bytes freed)."""
    root = Path(path)
    problem = artifact_problem(root)
    if problem is not None:
        raise ArtifactError(problem)
    _, manifest = read_json(root / MANIFEST, "manifest.json")
    verify_files(root, manifest, (PLAN, WEIGHTS), WEIGHTS)
    files: dict[str, Any] = manifest["files"]
    optional = sorted(rel for rel, entry in files.items() if entry.get("optional") is True)
    if not optional:
        return [], 0
    cpu = manifest.get("target", {}).get("cpu")
    if isinstance(cpu, dict) and isinstance(cpu.get("builds"), list):
        cpu["builds"] = [b for k, b in enumerate(cpu["builds"])
                         if k == 0 or not (isinstance(b, dict) and b.get("library") in optional)]
    removed, freed = [], 0
    for rel in optional:
        del files[rel]
        file = root / rel
        if file.is_file():
            freed += file.stat().st_size
            removed.append(rel)
    tmp = root / f".{MANIFEST}.strip-{os.getpid()}"
    tmp.write_bytes((json.dumps(manifest, indent=1, ensure_ascii=False) + "\n").encode("utf-8"))
    os.replace(tmp, root / MANIFEST)  # the manifest no longer lists them before they go
    for rel in removed:
        (root / rel).unlink()
    for folder in sorted({(root / rel).parent for rel in removed}, key=lambda p: -len(p.parts)):
        if folder != root and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    return removed, freed
