"""What a deploy needs to know about an artifact before loading it: ``load_plan(DIR) -> PlanInfo``.

Reads manifest.json and plan.json only (the plan's sha256 is checked against the manifest): no
kernel library is loaded and weights.bin is not mapped, so a server can size memory for many
models (``SharedArena.for_artifacts``), check a device's memory limit, or list inputs and outputs
cheaply. Its ``TensorSpec`` records (name, dtype, shape) are those ``Session`` exposes.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

from runtime.artifact import MANIFEST
from runtime.artifact import PLAN
from runtime.artifact import read_json
from runtime.dynamic import interface
from runtime.errors import ArtifactError
from runtime.integrity import check_format_version
from runtime.plan_schema import FORMAT_VERSION
from runtime.plan_schema import OLDEST_FORMAT_VERSION
from runtime.plan_schema import Plan
from runtime.plan_schema import TensorSpec

__all__ = ["PlanInfo", "load_plan"]


@dataclass(frozen=True)
class PlanInfo:
    """An artifact's sizes and interface, read without loading kernels or weights.

    ``inputs`` / ``outputs`` are the specs a ``Session`` reports: for a dynamic plan ``None`` for
    each dynamic dim, with ``ranges`` and ``dims`` (``runtime.plan_schema.TensorSpec``), and
    ``symbols`` maps each symbol to its ``(min, max)`` (empty for a static plan).
    ``arenas``: bytes per memory space ("host", "cuda") one run needs (a dynamic plan's: at its
    max binding, every symbol at its max); ``alignments``: each
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
    symbols: dict[str, tuple[int, int]] = field(default_factory=dict)

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


def load_plan(path: str | os.PathLike[str]) -> PlanInfo:
    """The plan of the artifact at ``path``: sizes, interface and target (``ArtifactError`` when
    the folder is not a readable artifact of this format or its plan does not match the manifest)."""
    root = Path(path)
    if not root.is_dir():
        raise ArtifactError(f"{root}: no such artifact folder")
    _, manifest = read_json(root / MANIFEST, "manifest.json")
    check_format_version(manifest.get("format_version"), FORMAT_VERSION, root / MANIFEST,
                         manifest.get("compiler"), oldest=OLDEST_FORMAT_VERSION)
    raw, data = read_json(root / PLAN, "plan.json")
    entry = (manifest.get("files") or {}).get(PLAN)
    if not isinstance(entry, dict) or hashlib.sha256(raw).hexdigest() != entry.get("sha256"):
        raise ArtifactError(f"{root / PLAN}: contents do not match the manifest's sha256")
    plan = Plan.from_json(data, root / PLAN)
    inputs, outputs = interface(plan)
    return PlanInfo(
        path=root,
        name=plan.name,
        target=str((manifest.get("options") or {}).get("target", "cpu")),
        inputs=inputs,
        outputs=outputs,
        arenas={a.memory_space: a.nbytes for a in plan.arenas},
        alignments={a.memory_space: max(64, a.alignment) for a in plan.arenas},
        weights_nbytes=plan.weights_nbytes,
        providers=tuple(p.runner for p in plan.partitions),
        partition_spaces=tuple(sorted({p.memory_space for p in plan.partitions})),
        num_steps=len(plan.steps),
        symbols=plan.ranges,
    )
