"""How a graph's buffers get their offsets: one memory-policy object per graph, chosen once.

The back half (compiler/back_half.py) takes every graph -- the model, an If branch, a Loop / Scan
body -- through the same stages; what differs between static shapes and symbolic ones
(docs/dynamic-shapes.md) is decided here, by the policy :func:`memory_policy` or
:func:`body_policy` picks, and nowhere else after the import:

- ``PlannedNow``: static shapes. The offsets are packed at compile time and verified.
- ``PlacedPerBinding``: a model with symbolic dims. Every buffer's offset is a placeholder the
  runtime places at each binding (compiler/dynamic.py); the figures plan.json records and the
  memory report shows are those at the max binding. Its providers must be ones whose kernels take
  run-time dims, its golden cases run at the min and a middle binding, and it alone can be
  specialized (``--opt-shape``).
- ``PlannedAtMax``: a control step's body of symbolic shapes. Its region is planned at the max
  binding (every binding's values fit the max binding's places); a body that places a value at an
  in-buffer offset following the symbols (a Concat's slice) cannot be, and keeps its program.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from compiler.codegen.cdims import DYN_EXT
from compiler.dynamic import Binding
from compiler.dynamic import bindings
from compiler.dynamic import describe_symbols
from compiler.dynamic import dynamic_report
from compiler.dynamic import opt_binding
from compiler.dynamic import placeholder_plan
from compiler.dynamic import plan_at
from compiler.dynamic import storage_at
from compiler.ir.graph import Graph
from compiler.memory import Buffer
from compiler.memory import MemoryPlan
from compiler.memory import plan_offsets
from compiler.memory import verify_plan
from compiler.memory.lifetimes import Storage
from compiler.providers.base import Provider
from compiler.providers.c.provider import CProvider
from compiler.providers.reference import ReferenceProvider
from runtime.errors import CompileError

__all__ = ["MemoryPolicy", "PlacedInBuffer", "PlacedPerBinding", "PlannedAtMax", "PlannedNow",
           "body_policy", "memory_policy"]

Reported = tuple[Storage, dict[str, MemoryPlan], dict[str, Any]]


class PlacedInBuffer(Exception):
    """A body value lies at an offset in its buffer that follows the symbols (a Concat's slice)."""


class MemoryPolicy:
    """The static policy's behaviour (offsets planned now); the others override what differs.
    ``alignment``: every memory space's alignment when fixed (a body's region), else None: the
    largest of the providers of each space."""

    def __init__(self, graph: Graph, alignment: Mapping[str, int] | None = None) -> None:
        self.graph = graph
        self.fixed_alignment = dict(alignment) if alignment is not None else None

    @property
    def summary(self) -> str:
        """What the progress line says about the graph's dims ("": nothing)."""
        return ""

    @property
    def dims(self) -> tuple[str, ...]:
        """The symbols the kernels read at run time, in plan order."""
        return tuple(sorted(self.graph.symbols))

    def ext_slots(self, runner: str) -> list[str]:
        """The ext slots a partition run by ``runner`` starts with (static shapes: none)."""
        return []

    def check_providers(self, providers: Sequence[Provider]) -> None:
        """Refuse providers that cannot run the graph's shapes (any can run static ones)."""

    def golden_bindings(self) -> list[Binding] | None:
        """The bindings the golden cases run at (None: the graph has no symbols)."""
        return None

    def specialize(self, spec: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
        """Every input's shape at the ``--opt-shape`` ``spec``."""
        raise CompileError("--opt-shape specializes a compile with ranges (--shape with LO..HI or --dim); "
                           "this compile has none")

    def alignment(self, providers: Sequence[Provider]) -> dict[str, int]:
        if self.fixed_alignment is not None:
            return dict(self.fixed_alignment)
        out: dict[str, int] = {}
        for p in providers:
            out[p.memory_space] = max(out.get(p.memory_space, 1), p.alignment)
        return out

    def storage(self, storage: Storage) -> Storage:
        """The storage the offsets are planned for."""
        return storage

    def plan(self, buffers: list[Buffer], alignment: int, budget_ms: float | None) -> MemoryPlan:
        """One memory space's plan: offsets packed now, verified."""
        mem_plan = plan_offsets(buffers, alignment, budget_ms=budget_ms)
        verify_plan(buffers, mem_plan, alignment)
        return mem_plan

    def reported(self, storage: Storage, mem_plans: dict[str, MemoryPlan],
                 alignment: Mapping[str, int]) -> Reported:
        """The storage and plans report/memory.json shows, and its further sections."""
        return storage, mem_plans, {}


class PlannedNow(MemoryPolicy):
    """Static shapes: offsets planned at compile time."""


class _Symbolic(MemoryPolicy):
    def ext_slots(self, runner: str) -> list[str]:
        """A C partition's slot 0 is the binding's array: the symbols' values, then every buffer's
        placed offset (compiler/codegen/cdims.py)."""
        return [DYN_EXT] if runner == "c" else []


class PlacedPerBinding(_Symbolic):
    """A model with symbolic dims: placeholders the runtime places per binding."""

    @property
    def summary(self) -> str:
        return f"; dynamic dims {describe_symbols(self.graph)}"

    def check_providers(self, providers: Sequence[Provider]) -> None:
        """A dynamic graph compiles with the C, CUDA and reference providers."""
        others = [p.name for p in providers
                  if not (isinstance(p, ReferenceProvider | CProvider) or p.name == "cuda")]
        if others:
            raise CompileError(f"dynamic dims ({describe_symbols(self.graph)}) run on the C, CUDA and "
                               f"reference kernels only; provider(s) {', '.join(others)} take static shapes")

    def golden_bindings(self) -> list[Binding] | None:
        at = bindings(self.graph)
        return [at["min"], at["middle"]]

    def specialize(self, spec: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
        return opt_binding(self.graph, spec)

    def plan(self, buffers: list[Buffer], alignment: int, budget_ms: float | None) -> MemoryPlan:
        """Every offset a placeholder, the figures at the max binding."""
        return placeholder_plan(buffers, alignment, self.graph)

    def reported(self, storage: Storage, mem_plans: dict[str, MemoryPlan],
                 alignment: Mapping[str, int]) -> Reported:
        """The runtime's placement at the max binding, and the min / middle / max figures."""
        at_max = bindings(self.graph)["max"]
        concrete = storage_at(storage, at_max)
        placed = {space: plan_at(concrete.buffers.get(space, []), alignment[space], at_max)
                  for space in mem_plans}
        return concrete, placed, {"dynamic": dynamic_report(self.graph, storage, alignment)}


class PlannedAtMax(_Symbolic):
    """A body of symbolic shapes: its storage evaluated at the max binding, then planned now."""

    def storage(self, storage: Storage) -> Storage:
        if any(type(offset) is not int for offset in storage.offset.values()):
            raise PlacedInBuffer
        return storage_at(storage, bindings(self.graph)["max"])


def memory_policy(graph: Graph) -> MemoryPolicy:
    """The policy of a model's graph: planned now, or (symbolic dims) placed per binding."""
    return PlacedPerBinding(graph) if graph.symbols else PlannedNow(graph)


def body_policy(graph: Graph, alignment: Mapping[str, int]) -> MemoryPolicy:
    """The policy of a control step's body, its region aligned as ``alignment`` says: planned now,
    or (symbolic shapes) planned at the max binding."""
    return PlannedAtMax(graph, alignment) if graph.symbols else PlannedNow(graph, alignment)
