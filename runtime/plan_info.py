"""What a deploy needs to know about an artifact before loading it: ``load_plan(DIR) -> PlanInfo``.

Reads manifest.json and plan.json only (the plan's sha256 is checked against the manifest): no
kernel library is loaded and weights.bin is not mapped, so a server can size memory for many
models (``SharedArena.for_artifacts``), check a device's memory limit, or list inputs and outputs
cheaply. ``TensorSpec`` (name, dtype, shape) lives here too; ``Session`` exposes the same specs.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtime.artifact import FORMAT_VERSION, MANIFEST, PLAN
from runtime.errors import ArtifactError
from runtime.plan_check import check_plan

__all__ = ["TensorSpec", "PlanInfo", "load_plan", "tensor_spec"]


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def tensor_spec(record: dict[str, Any]) -> TensorSpec:
    return TensorSpec(record["name"], np.dtype(record["dtype"]), tuple(int(d) for d in record["shape"]))


@dataclass(frozen=True)
class PlanInfo:
    """An artifact's sizes and interface, read without loading kernels or weights.

    ``arenas``: bytes per memory space ("host", "cuda") one run needs; ``alignments``: each
    arena's alignment; ``target``: "cpu" or "cuda" (the compile option); ``providers``: the
    providers that run partitions, in plan order, and ``partition_spaces`` the memory spaces
    they run in; ``runnable_from_c``: every partition is C, so
    a C program can run the artifact through ``kernels/cpu/model.h`` with no Python at all.
    """

    path: Path
    name: str
    target: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    arenas: dict[str, int]
    alignments: dict[str, int]
    weights_nbytes: int
    providers: tuple[str, ...]
    partition_spaces: tuple[str, ...]
    num_steps: int

    @property
    def memory_spaces(self) -> tuple[str, ...]:
        return tuple(self.arenas)

    @property
    def runnable_from_c(self) -> bool:
        return bool(self.providers) and all(p == "c" for p in self.providers)

    def device_nbytes(self, space: str = "cuda") -> int:
        """Bytes one session needs in ``space`` for one run: its arena, plus the weights copy
        when a partition runs there (the host reads weights.bin memory-mapped)."""
        weights = self.weights_nbytes if space != "host" and space in self.partition_spaces else 0
        return self.arenas.get(space, 0) + weights


def _read(path: Path, what: str) -> tuple[bytes, dict[str, Any]]:
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


def load_plan(path: str | os.PathLike[str]) -> PlanInfo:
    """The plan of the artifact at ``path``: sizes, interface and target (``ArtifactError`` when
    the folder is not a readable artifact of this format or its plan does not match the manifest)."""
    root = Path(path)
    if not root.is_dir():
        raise ArtifactError(f"{root}: no such artifact folder")
    _, manifest = _read(root / MANIFEST, "manifest.json")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(f"{root / MANIFEST}: artifact format version {manifest.get('format_version')!r}; "
                            f"this runtime reads version {FORMAT_VERSION}")
    raw, plan = _read(root / PLAN, "plan.json")
    entry = (manifest.get("files") or {}).get(PLAN)
    if not isinstance(entry, dict) or hashlib.sha256(raw).hexdigest() != entry.get("sha256"):
        raise ArtifactError(f"{root / PLAN}: contents do not match the manifest's sha256")
    if plan.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(f"{root / PLAN}: unexpected plan format version")
    check_plan(plan, root / PLAN)
    try:
        arenas = {str(a["memory_space"]): int(a["nbytes"]) for a in plan["arenas"]}
        alignments = {str(a["memory_space"]): max(64, int(a["alignment"])) for a in plan["arenas"]}
        partitions = plan["partitions"]
        info = PlanInfo(
            path=root,
            name=str(plan.get("name", root.name)),
            target=str((manifest.get("options") or {}).get("target", "cpu")),
            inputs=tuple(tensor_spec(r) for r in plan["inputs"]),
            outputs=tuple(tensor_spec(r) for r in plan["outputs"]),
            arenas=arenas,
            alignments=alignments,
            weights_nbytes=int(plan["weights_nbytes"]),
            providers=tuple(str(p.get("runner", p["provider"])) for p in partitions),
            partition_spaces=tuple(sorted({str(p.get("memory_space", "host")) for p in partitions})),
            num_steps=len(plan["steps"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"{root / PLAN}: malformed plan ({type(exc).__name__}: {exc})") from None
    return info
