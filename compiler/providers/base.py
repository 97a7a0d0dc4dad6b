"""The compile-side provider interface and the plan records providers generate code from.

A provider claims the nodes it can run (with their attributes, dtypes and shapes) and, for the
partitions it was given, writes the kernel sources and binaries into the artifact. The run side
of each provider lives in ``runtime/providers/`` so the runtime never needs the compiler.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from compiler.ir.graph import Graph, Node, Value
from runtime.errors import CompileError

__all__ = ["Location", "StepPlan", "PartitionPlan", "BuildOptions", "Provider", "shape_of"]


@dataclass(frozen=True)
class Location:
    """Where a value's bytes are during a run.

    ``space`` is "arena" (byte ``offset`` into the memory space's arena), "weights" (byte
    ``offset`` into weights.bin) or "ext" (``offset`` is a slot in the partition's external
    pointer array: a graph input or output the caller owns).
    """

    space: str
    offset: int
    memory_space: str = "host"  # for "arena" and "weights": which space's arena / weights copy

    def to_json(self) -> list[object]:
        return [self.space, self.offset]


@dataclass(frozen=True)
class StepPlan:
    """One scheduled kernel with the locations of its operands."""

    index: int  # global step index (the memory plan's time axis)
    local: int  # index within its partition (the slot in the per-step timing buffer)
    node: Node
    inputs: tuple[Location | None, ...]
    outputs: tuple[Location, ...]
    scratch: Location | None  # kernel scratch in the arena, live for this step only
    scratch_nbytes: int


@dataclass(frozen=True)
class PartitionPlan:
    """A run of consecutive steps on one provider, executed by one call."""

    index: int
    provider: str
    entry: str  # the C symbol (or name) of the partition's entry function
    steps: tuple[StepPlan, ...]
    ext: tuple[str, ...]  # value names bound to ext slots, in slot order


@dataclass(frozen=True)
class BuildOptions:
    """Toolchain choices recorded in the manifest."""

    cc: str = "cc"
    isa: str = "native"  # -march value
    # a second, portable build of the same kernels (-march value; None: only ``isa``), shipped so
    # the artifact also runs on CPUs that lack ``isa``'s features (compile_model sets x86-64-v2)
    portable_isa: str | None = None
    # its optimization flags: -O2 compiles ~20% faster than -O3 and runs ResNet-50 within ~3%
    # (docs/performance.md), which keeps a cold compile of both builds within budget
    portable_opt_flags: tuple[str, ...] = ("-O2",)
    opt_flags: tuple[str, ...] = ("-O3",)
    extra: dict[str, str] = field(default_factory=dict)


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
        self, partitions: list[PartitionPlan], kernels_dir: Path, options: BuildOptions
    ) -> dict[str, object]:
        """Write sources (and binaries) for ``partitions`` under ``kernels_dir``.

        Returns the facts the manifest records (compiler, flags, ISA, file names).
        """
        ...


def shape_of(value: Value | None) -> tuple[int, ...]:
    """A value's static shape; CompileError naming the value when it has none."""
    if value is None or value.shape is None:
        raise CompileError(f"value {getattr(value, 'name', None)!r} has no static shape")
    return tuple(int(d) for d in value.shape)
