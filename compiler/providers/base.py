"""The compile-side provider interface and the records providers generate code from.

A provider claims the nodes it can run (with their attributes, dtypes and shapes) and, for the
partitions it was given, writes the kernel sources and binaries into the artifact and returns
what it wrote as a typed record (``GeneratedC``, ``GeneratedCuda``; None when it writes nothing),
which the artifact writer turns into the manifest's ``target.providers`` facts and the plan's
library / module / launch fields. The run side of each provider lives in ``runtime/providers/``
so the runtime never needs the compiler.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from typing import Protocol

from compiler.codegen.options import BuildOptions
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from runtime.errors import CompileError
from runtime.plan_schema import KernelLaunch
from runtime.symbolic import Expr
from runtime.symbolic import as_dim

__all__ = [
    "GenLocation", "GenStep", "GenPartition", "Provider", "shape_of",
    "CLibraryBuild", "GeneratedC", "GeneratedCuda", "Generated",
]


@dataclass(frozen=True)
class GenLocation:
    """Where a value's bytes are during a run, as the code generators address them (the plan's
    ``ValueLocation`` is the runtime's form; the words are runtime/contract.py's).

    ``kind`` is "arena" (byte ``offset`` into the ``space`` arena), "weights" (byte ``offset``
    into weights.bin's copy in ``space``) or "ext" (``offset`` is a slot in the partition's
    external pointer array: a graph input or output the caller owns). ``space`` is the memory
    space, "host" or "cuda". In a dynamic graph an arena offset is an ``Expr`` of the symbols and
    the buffers' placeholders (compiler/dynamic.py).
    """

    kind: str
    offset: Any
    space: str = "host"  # for "arena" and "weights": which space's arena / weights copy


@dataclass(frozen=True)
class GenStep:
    """One scheduled kernel with the locations of its operands: what a provider's ``generate``
    reads (``Gen*``; ``Generated*`` is what it returns). The plan's ``PlanStep`` is the runtime's
    record of the same step."""

    index: int  # global step index (the memory plan's time axis)
    local: int  # index within its partition (the slot in the per-step timing buffer)
    node: Node
    inputs: tuple[GenLocation | None, ...]
    outputs: tuple[GenLocation, ...]
    scratch: GenLocation | None  # kernel scratch in the arena, live for this step only
    scratch_nbytes: int
    # a dynamic graph's symbols (plan order) and the C text of its binding array (compiler/codegen/
    # cdims.py): locations' offsets and a kernel's sizes may be expressions over them
    symbols: tuple[str, ...] = ()
    dyn: str = ""


@dataclass(frozen=True)
class GenPartition:
    """A run of consecutive steps on one provider, executed by one call."""

    index: int
    provider: str
    entry: str  # the C symbol (or name) of the partition's entry function
    steps: tuple[GenStep, ...]
    ext: tuple[str, ...]  # value names bound to ext slots, in slot order


@dataclass(frozen=True)
class CLibraryBuild:
    """One build of a model's C kernels; paths relative to the provider's kernels folder."""

    isa: str  # the resolved -march
    flags: tuple[str, ...]
    source: str
    library: str


@dataclass(frozen=True)
class GeneratedC:
    """What the C provider wrote: its builds, preferred first (the first is ``source`` + ``library``)."""

    cc: str
    cc_version: str
    builds: tuple[CLibraryBuild, ...]

    @property
    def library(self) -> str:
        return self.builds[0].library

    def manifest(self) -> dict[str, Any]:
        """The manifest's ``target.providers.c`` facts."""
        first = self.builds[0]
        return {
            "cc": self.cc,
            "cc_version": self.cc_version,
            "flags": list(first.flags),
            "isa": first.isa,
            "sources": [first.source],
            "library": first.library,
            "builds": [{"isa": b.isa, "flags": list(b.flags), "source": b.source, "library": b.library}
                       for b in self.builds],
        }


@dataclass(frozen=True)
class GeneratedCuda:
    """What the CUDA provider wrote: the source, cubins and PTX built from it (none without nvcc),
    and each step's launches (plan.json's records, by global step index; ``()`` for a step that
    launches nothing)."""

    source: str
    cubins: Mapping[str, str]  # arch -> file name, in build order
    ptx: str | None
    ptx_arch: str | None
    nvcc_version: str | None
    cuda_version: str | None
    min_driver: str | None
    nvcc_flags: tuple[str, ...] | None  # None: nothing was built
    launches: Mapping[int, tuple[KernelLaunch, ...]]

    def manifest(self) -> dict[str, Any]:
        """The manifest's ``target.providers.cuda`` facts (the launches go to plan.json)."""
        facts: dict[str, Any] = {
            "source": self.source, "cubins": dict(self.cubins), "ptx": self.ptx,
            "ptx_arch": self.ptx_arch, "nvcc_version": self.nvcc_version,
            "cuda_version": self.cuda_version, "min_driver": self.min_driver,
        }
        if self.nvcc_flags is not None:
            facts["nvcc_flags"] = list(self.nvcc_flags)
        return facts


Generated = GeneratedC | GeneratedCuda | None


class Provider(Protocol):
    name: str
    memory_space: str  # "host" or "cuda"
    alignment: int

    def claims(self, graph: Graph) -> set[Node]:
        """The nodes of ``graph`` this provider can run as they are."""
        ...

    def scratch_nbytes(self, node: Node) -> int:
        """Bytes of kernel scratch ``node`` needs for one step (0 for none)."""
        ...

    def generate(
        self, partitions: list[GenPartition], kernels_dir: Path, options: BuildOptions
    ) -> Generated:
        """Write sources (and binaries) for ``partitions`` under ``kernels_dir``; say what was written
        (None: nothing)."""
        ...


def shape_of(value: Value | None, symbolic: bool = False) -> tuple[int, ...]:
    """A value's static shape; CompileError naming the value when it has none. ``symbolic``
    keeps a dynamic graph's dims as expressions (``runtime.symbolic.Expr``) for a kernel that takes
    run-time dims; without it a symbolic dim is a CompileError too."""
    if value is None or value.shape is None:
        raise CompileError(f"value {getattr(value, 'name', None)!r} has no static shape")
    if symbolic:
        return tuple(as_dim(d) for d in value.shape)  # type: ignore[misc]
    if any(isinstance(d, Expr) for d in value.shape):
        raise CompileError(f"value {value.name!r} has dynamic dims {value.shape}")
    return tuple(int(d) for d in value.shape)
