"""Turn a schedule and its memory plans into the plan records: plan.json, weights, partitions.

This is where every value gets its final location (arena offset, weights offset or external
slot), where the constants are laid out in weights.bin (64-byte aligned, little-endian, in order
of first use), and where the memory report's data is computed. plan.json is built as the typed
records of ``runtime/plan_schema.py``, which the runtime reads back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from typing import Any

import numpy as np

from compiler.codegen.cdims import DYN_EXT
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.ir.narrow import Affine
from compiler.memory import MemoryPlan
from compiler.memory.lifetimes import Storage
from compiler.memory_policy import MemoryPolicy
from compiler.partition.partitioner import Partition
from compiler.partition.partitioner import Schedule
from compiler.providers.base import GenLocation
from compiler.providers.base import GenPartition
from compiler.providers.base import GenStep
from compiler.providers.base import Provider
from runtime.contract import ALIGNMENT
from runtime.contract import WEIGHT_ALIGNMENT
from runtime.contract import round_up
from runtime.narrow_weights import StoredForm
from runtime.narrow_weights import StoredTable
from runtime.plan_schema import NARROW_FORMAT_VERSION
from runtime.plan_schema import OLDEST_FORMAT_VERSION
from runtime.plan_schema import CudaModule
from runtime.plan_schema import KernelLaunch
from runtime.plan_schema import OnnxNodeFate
from runtime.plan_schema import Plan
from runtime.plan_schema import PlanArena
from runtime.plan_schema import PlanAssumption
from runtime.plan_schema import PlanBuffer
from runtime.plan_schema import PlanConstant
from runtime.plan_schema import PlanOutput
from runtime.plan_schema import PlanPartition
from runtime.plan_schema import PlanSchedule
from runtime.plan_schema import PlanStep
from runtime.plan_schema import PlanSymbol
from runtime.plan_schema import PlanValue
from runtime.plan_schema import StepScratch
from runtime.plan_schema import TensorSpec
from runtime.plan_schema import ValueLocation
from runtime.symbolic import Expr

__all__ = ["ALIGNMENT", "Compiled", "CompiledPlan", "NestedSchedule", "PlannedGraph", "build_plan",
           "attach_code", "WEIGHT_ALIGNMENT", "jsonable"]



@dataclass
class CompiledPlan:
    plan: Plan
    weights: bytes
    partitions: list[GenPartition]
    memory_report: dict[str, Any]


@dataclass
class NestedSchedule:
    """One body of a control step (compiler/nested.py), scheduled and planned (host arena,
    offsets relative to the step's region)."""

    graph: Graph
    refs: list[str]
    schedule: Schedule
    storage: Storage
    mem_plan: MemoryPlan
    control: dict[int, Compiled]  # the compiled control steps inside, by id(node)
    policy: MemoryPolicy


@dataclass
class PlannedGraph:
    """A graph through the back half (compiler/back_half.py): scheduled, stored, memory planned."""

    graph: Graph
    schedule: Schedule
    storage: Storage
    mem_plans: dict[str, MemoryPlan]  # memory space -> its plan
    alignment: dict[str, int]  # memory space -> its alignment
    control: dict[int, Compiled]  # the compiled control steps, by id(node)
    providers: list[Provider]  # (a ControlProvider first when there are compiled control steps)
    policy: MemoryPolicy


@dataclass
class Compiled:
    """A control step compiled: its bodies, its region's size and the attributes plan.json gets."""

    schedules: list[NestedSchedule]
    region_nbytes: int
    attrs: dict[str, Any] = field(default_factory=dict)


def jsonable(obj: Any) -> Any:
    """Attribute values as plain JSON types (numpy scalars and arrays, tuples converted)."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.dtype):
        return obj.name
    if isinstance(obj, bool | int | float | str) or obj is None:
        return obj
    if isinstance(obj, Expr):  # a dim of a dynamic graph (docs/dynamic-shapes.md)
        return {"expr": obj.to_json()}
    raise TypeError(f"attribute value of type {type(obj).__name__} cannot be stored in plan.json")


def _spec(value: Value, name: str | None = None) -> TensorSpec:
    assert value.dtype is not None and value.shape is not None
    return TensorSpec(name or value.name, value.dtype, tuple(value.shape))


@dataclass(frozen=True)
class _Weights:
    """weights.bin: the constants in order of first use, each 64-byte aligned; the constants stored
    narrow (compiler/ir/narrow.py) cut out of it and appended as their stored forms. ``image_nbytes``:
    the weights image the kernels read (weights.bin's size when nothing is stored narrow)."""

    data: bytes
    records: tuple[PlanConstant, ...]
    image_nbytes: int

    @property
    def format_version(self) -> int:
        """The oldest plan format that holds these records."""
        narrow = any(r.stored is not None for r in self.records)
        return NARROW_FORMAT_VERSION if narrow else OLDEST_FORMAT_VERSION


def _little_endian(array: np.ndarray) -> bytes:
    return np.ascontiguousarray(array.astype(array.dtype.newbyteorder("<"), copy=False)).tobytes()


class _WeightsLayout:
    """Lays out the constants of the model and of its nested schedules in one weights.bin (an array
    the outer graph and a body share, such as an outer constant a branch reads, is stored once)."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.records: list[PlanConstant] = []
        self.offset = 0  # in the weights image
        self.by_array: dict[int, int] = {}  # id(array) -> offset (the graphs keep the arrays alive)
        self.narrow: list[tuple[int, Affine]] = []  # (record index, stored form)

    def add(self, graph: Graph, steps: list[Node], storage: Storage) -> dict[str, int]:
        """The offsets of the constants ``steps`` read (root value name -> byte offset)."""
        offsets: dict[str, int] = {}
        for node in steps:
            for value in node.inputs:
                root = storage.root[value.name] if value is not None else ""
                if value is None or storage.kind[root] != "weights" or root in offsets:
                    continue
                array = graph.constants[root].const
                assert array is not None
                if array.dtype == object:
                    continue  # a symbolic constant: plan.json holds its expressions (_Locator)
                if id(array) not in self.by_array:
                    self._append(root, array, graph.narrowing.narrow_form(array))
                offsets[root] = self.by_array[id(array)]
        return offsets

    def _append(self, root: str, array: np.ndarray, narrow: Affine | None) -> None:
        self.by_array[id(array)] = self.offset
        padded = round_up(array.nbytes, WEIGHT_ALIGNMENT)
        if narrow is None:
            self.chunks.append(_little_endian(array) + b"\0" * (padded - array.nbytes))
        else:  # cut out of weights.bin (runtime/narrow_weights.py), stored narrow after the rest
            self.narrow.append((len(self.records), narrow))
        self.records.append(PlanConstant(root, self.offset, array.nbytes, array.dtype, tuple(array.shape)))
        self.offset += padded

    def finish(self) -> _Weights:
        records = list(self.records)
        at = sum(len(c) for c in self.chunks)
        for index, form in self.narrow:
            placed: list[int] = []
            for array in (form.codes, form.scale, form.zero):
                placed.append(at)
                if array is not None:
                    data = _little_endian(array)
                    padded = round_up(len(data), WEIGHT_ALIGNMENT)
                    self.chunks.append(data + b"\0" * (padded - len(data)))
                    at += padded
            tables = [None if a is None else StoredTable(off, a.dtype.name, tuple(a.shape))
                      for a, off in ((form.scale, placed[1]), (form.zero, placed[2]))]
            stored = StoredForm(form.codes.dtype.name, placed[0], form.codes.nbytes, tables[0], tables[1])
            records[index] = dataclasses.replace(records[index], stored=stored)
        return _Weights(b"".join(self.chunks), tuple(records), self.offset)


@dataclass(frozen=True)
class _Locator:
    """Every value's final place: the root's storage kind plus its arena or weights offset."""

    storage: Storage
    weights: Mapping[str, int]  # root -> offset in weights.bin
    arena: Mapping[str, tuple[str, int]]  # buffer id -> (memory space, offset)
    symbolic: Mapping[str, np.ndarray]  # root -> a symbolic constant's elements (dynamic graphs)

    @classmethod
    def build(cls, graph: Graph, storage: Storage, weights: Mapping[str, int],
              mem_plans: dict[str, MemoryPlan]) -> _Locator:
        arena = {str(bid): (space, off)
                 for space, mplan in mem_plans.items() for bid, off in mplan.offsets.items()}
        symbolic = {name: v.const for name, v in graph.constants.items()
                    if v.const is not None and v.const.dtype == object}
        return cls(storage, weights, arena, symbolic)

    def location(self, name: str) -> ValueLocation:
        """plan.json's location of value ``name``."""
        root = self.storage.root[name]
        kind = self.storage.kind[root]
        if kind == "ext":
            return ValueLocation("ext", ext=root)
        if kind == "weights" and root in self.symbolic:
            return ValueLocation("symbolic", elements=tuple(self.symbolic[root].reshape(-1).tolist()))
        if kind == "weights":
            return ValueLocation("weights", self.weights[root])
        space, off = self.arena[root]
        return ValueLocation("arena", off + self.storage.offset[name], space)

    def operand(self, value: Value, ext: list[str], space_here: str) -> GenLocation:
        """The code generators' location of ``value`` in a partition whose ext slots are ``ext``
        (a new graph input or output gets the next slot)."""
        where = self.location(value.name)
        if where.kind == "ext":
            if where.ext not in ext:
                ext.append(where.ext)
            return GenLocation("ext", ext.index(where.ext))
        if where.kind == "weights":
            return GenLocation("weights", where.offset, space_here)
        return GenLocation("arena", where.offset, where.space)

    def scratch(self, step: int) -> GenLocation | None:
        found = self.arena.get(f"scratch/{step}")
        return GenLocation("arena", found[1], found[0]) if found is not None else None


@dataclass(frozen=True)
class _PartitionOut:
    """One partition as the code generators see it and as plan.json records it."""

    plan: GenPartition
    record: PlanPartition
    steps: tuple[PlanStep, ...]


def _step_record(t: int, node: Node, part: Partition, scratch: GenLocation | None, nbytes: int,
                 schedules: tuple[PlanSchedule, ...] | None) -> PlanStep:
    return PlanStep(
        index=t, name=node.name, op_type=node.op_type, domain=node.domain, provider=part.provider.name,
        partition=part.index, onnx_nodes=tuple(node.origin),
        inputs=tuple(v.name if v is not None else None for v in node.inputs),
        outputs=tuple(v.name for v in node.outputs), attrs=jsonable(node.attrs),
        scratch=StepScratch(scratch.offset, nbytes) if scratch is not None else None, schedules=schedules)


_Nested = Callable[[int, Node], "tuple[PlanSchedule, ...] | None"]


def _partition(part: Partition, steps: list[Node], locator: _Locator, scratch_sizes: Mapping[str, int],
               referenced: dict[str, None], prefix: str, nested: _Nested,
               policy: MemoryPolicy) -> _PartitionOut:
    """Locate the operands of ``part``'s steps (adding their names to ``referenced``); its entry is
    ``prefix`` + its index, a control step's schedules come from ``nested``; the ``policy`` gives
    the run-time dims and the first ext slots (a dynamic graph's C partition: the binding's array)."""
    runner = getattr(part.provider, "runner", part.provider.name)
    ext = policy.ext_slots(runner)
    dyn = f"((const int64_t*)ext[{ext.index(DYN_EXT)}])" if DYN_EXT in ext else ""
    symbols = policy.dims
    space_here = part.provider.memory_space
    step_plans: list[GenStep] = []
    records: list[PlanStep] = []
    for local, t in enumerate(part.steps):
        node = steps[t]
        for value in (*node.inputs, *node.outputs):
            if value is not None:
                referenced[value.name] = None
        ins = tuple(locator.operand(v, ext, space_here) if v is not None else None for v in node.inputs)
        outs = tuple(locator.operand(v, ext, space_here) for v in node.outputs)
        scratch = locator.scratch(t)
        nbytes = scratch_sizes.get(f"scratch/{t}", 0)
        step_plans.append(GenStep(t, local, node, ins, outs, scratch, nbytes, symbols, dyn))
        records.append(_step_record(t, node, part, scratch, nbytes, nested(t, node)))
    entry = f"{prefix}{part.index}"
    record = PlanPartition(part.index, part.provider.name, runner, space_here, entry, part.steps[0],
                           part.steps[-1], tuple(ext))
    return _PartitionOut(GenPartition(part.index, part.provider.name, entry, tuple(step_plans), tuple(ext)),
                         record, tuple(records))


def _value_records(graph: Graph, names: dict[str, None], locator: _Locator) -> dict[str, PlanValue]:
    values: dict[str, Value] = {v.name: v for v in graph.values()}
    out: dict[str, PlanValue] = {}
    for name in names:
        spec = _spec(values[name])
        out[name] = PlanValue(name, spec.dtype, spec.shape, locator.location(name))
    return out


def _onnx_nodes(graph: Graph, schedule: Schedule) -> dict[str, OnnxNodeFate]:
    fates: dict[str, OnnxNodeFate] = {}
    for t, node in enumerate(schedule.steps):
        for origin in node.origin:
            fates[origin] = OnnxNodeFate(schedule.provider_of_step[t], schedule.partition_of_step[t], t)
    for name, reason in graph.eliminated.items():
        fates.setdefault(name, OnnxNodeFate(eliminated=reason))
    return fates


def _arenas(mem_plans: dict[str, MemoryPlan], storage: Storage,
            alignment: dict[str, int]) -> tuple[tuple[PlanArena, ...], tuple[PlanBuffer, ...]]:
    arenas: list[PlanArena] = []
    buffers: list[PlanBuffer] = []
    for space, mplan in mem_plans.items():
        arenas.append(PlanArena(space, mplan.arena_nbytes, alignment[space], mplan.lower_bound_nbytes,
                                mplan.naive_nbytes, mplan.strategy))
        buffers += [PlanBuffer(str(buf.id), space, mplan.offsets[buf.id], buf.nbytes, buf.first_step,
                               buf.last_step, tuple(storage.tensors.get(str(buf.id), [])))
                    for buf in storage.buffers.get(space, [])]
    return tuple(arenas), tuple(buffers)


def _symbols(graph: Graph) -> tuple[PlanSymbol, ...]:
    return tuple(PlanSymbol(name, lo, hi, graph.value_symbols.get(name))
                 for name, (lo, hi) in sorted(graph.symbols.items()))


def _assumptions(graph: Graph) -> tuple[PlanAssumption, ...]:
    return tuple(PlanAssumption(node, a, b) for node, a, b in graph.assumptions)


def _outputs(graph: Graph) -> tuple[PlanOutput, ...]:
    names = graph.output_names
    return tuple(PlanOutput(_spec(v, names[k] if k < len(names) else None), v.name)
                 for k, v in enumerate(graph.outputs))


def build_plan(planned: PlannedGraph) -> CompiledPlan:
    """The plan records, weights.bin's bytes, the partitions for code generation (the nested
    schedules' after the model's), the memory report (as the memory policy shows it)."""
    graph, schedule, storage, mem_plans = planned.graph, planned.schedule, planned.storage, planned.mem_plans
    layout = _WeightsLayout()
    nested_parts: list[GenPartition] = []
    level = _Level(graph, layout, nested_parts)
    parts, values = level.build(graph, schedule, storage, mem_plans, planned.control, "onnx_aot_partition_",
                                planned.policy)
    weights = layout.finish()
    arenas, buffers = _arenas(mem_plans, storage, planned.alignment)
    plan = Plan(
        format_version=weights.format_version, name=graph.name, inputs=tuple(_spec(v) for v in graph.inputs),
        outputs=_outputs(graph), constants=weights.records, weights_nbytes=weights.image_nbytes,
        arenas=arenas, buffers=buffers, values=values,
        steps=tuple(step for p in parts for step in p.steps), partitions=tuple(p.record for p in parts),
        onnx_nodes=_onnx_nodes(graph, schedule), symbols=_symbols(graph), assumptions=_assumptions(graph))
    shown, shown_plans, sections = planned.policy.reported(storage, mem_plans, planned.alignment)
    report = {**memory_report(schedule, shown, shown_plans, planned.alignment), **sections}
    nested_report = _nested_report(schedule, planned.control)
    if nested_report:
        report["nested"] = nested_report
    return CompiledPlan(plan, weights.data, [p.plan for p in parts] + nested_parts, report)


@dataclass(frozen=True)
class _Level:
    """Builds the records of one schedule level, and of the nested schedules under it."""

    top: Graph
    layout: _WeightsLayout
    nested_parts: list[GenPartition]  # the nested schedules' partitions, for code generation

    def build(self, graph: Graph, schedule: Schedule, storage: Storage, mem_plans: dict[str, MemoryPlan],
              control: Mapping[int, Compiled], prefix: str,
              policy: MemoryPolicy) -> tuple[list[_PartitionOut], dict[str, PlanValue]]:
        locator = _Locator.build(graph, storage, self.layout.add(graph, schedule.steps, storage), mem_plans)
        scratch_sizes = {str(b.id): b.nbytes for bs in storage.buffers.values() for b in bs}
        # a nested schedule's inputs and outputs are bound by name even where no step reads them
        referenced: dict[str, None] = {} if graph is self.top else dict.fromkeys(
            v.name for v in (*graph.inputs, *graph.outputs))

        def nested(t: int, node: Node) -> tuple[PlanSchedule, ...] | None:
            compiled = control.get(id(node))
            if compiled is None:
                return None
            return tuple(self.schedule(body, f"{prefix}{t}_{s}_")
                         for s, body in enumerate(compiled.schedules))

        parts = [_partition(part, schedule.steps, locator, scratch_sizes, referenced, prefix, nested, policy)
                 for part in schedule.partitions]
        return parts, _value_records(graph, referenced, locator)

    def schedule(self, body: NestedSchedule, prefix: str) -> PlanSchedule:
        mem_plans = {"host": body.mem_plan}
        parts, values = self.build(body.graph, body.schedule, body.storage, mem_plans, body.control, prefix,
                                   body.policy)
        self.nested_parts.extend(p.plan for p in parts)
        _, buffers = _arenas(mem_plans, body.storage, {"host": ALIGNMENT})
        return PlanSchedule(
            inputs=tuple(v.name for v in body.graph.inputs), refs=tuple(body.refs),
            outputs=tuple(v.name for v in body.graph.outputs), arena_nbytes=body.mem_plan.arena_nbytes,
            buffers=buffers, values=values, steps=tuple(step for p in parts for step in p.steps),
            partitions=tuple(p.record for p in parts))


def _nested_report(schedule: Schedule, control: Mapping[int, Compiled]) -> dict[str, Any]:
    """report/memory.json's ``nested``: per compiled control step (by step index) the memory report
    of each of its schedules, offsets relative to the step's region (and theirs, nested)."""
    out: dict[str, Any] = {}
    for t, node in enumerate(schedule.steps):
        compiled = control.get(id(node))
        if compiled is None:
            continue
        out[str(t)] = []
        for body in compiled.schedules:
            report = memory_report(body.schedule, body.storage, {"host": body.mem_plan}, {"host": ALIGNMENT})
            inner = _nested_report(body.schedule, body.control)
            out[str(t)].append({**report, **({"nested": inner} if inner else {})})
    return out


def attach_code(plan: Plan, provider: str, *, library: str | None = None, module: CudaModule | None = None,
                launches: Mapping[int, tuple[KernelLaunch, ...]] | None = None) -> Plan:
    """``plan`` with what code generation made for ``provider``'s partitions: their ``library``
    (C) or ``module`` (CUDA), nested schedules' partitions too, and each step's ``launches`` (by
    step index)."""
    steps = tuple(_nested_code(s, provider, library, module) for s in plan.steps)
    if launches:
        steps = tuple(dataclasses.replace(s, launches=launches[s.index]) if s.index in launches else s
                      for s in steps)
    return dataclasses.replace(plan, partitions=_with_code(plan.partitions, provider, library, module),
                               steps=steps)


def _with_code(partitions: tuple[PlanPartition, ...], provider: str, library: str | None,
               module: CudaModule | None) -> tuple[PlanPartition, ...]:
    return tuple(dataclasses.replace(p, library=library or p.library, module=module or p.module)
                 if p.provider == provider else p for p in partitions)


def _nested_code(step: PlanStep, provider: str, library: str | None, module: CudaModule | None) -> PlanStep:
    if step.schedules is None:
        return step
    schedules = tuple(dataclasses.replace(
        s, partitions=_with_code(s.partitions, provider, library, module),
        steps=tuple(_nested_code(t, provider, library, module) for t in s.steps)) for s in step.schedules)
    return dataclasses.replace(step, schedules=schedules)


def memory_report(schedule: Schedule, storage: Storage, mem_plans: dict[str, MemoryPlan],
                  alignment: dict[str, int]) -> dict[str, Any]:
    """report/memory.json: per arena its figures and buffers, per step the bytes live in all arenas."""
    n = len(schedule.steps)
    live_total = [0] * n
    arenas: dict[str, Any] = {}
    for space, mplan in mem_plans.items():
        live = [0] * n
        entries = []
        for buf in storage.buffers.get(space, []):
            size = round_up(buf.nbytes, alignment[space])
            for t in range(buf.first_step, buf.last_step + 1):
                live[t] += size
            tensor = storage.tensors.get(str(buf.id)) or [str(buf.id)]
            entries.append({"id": str(buf.id), "tensor": tensor[0],
                            "offset": mplan.offsets[buf.id], "nbytes": buf.nbytes,
                            "first_step": buf.first_step, "last_step": buf.last_step})
        for t in range(n):
            live_total[t] += live[t]
        peak = max(range(n), key=lambda t: (live[t], -t)) if n else 0
        arenas[space] = {"arena_nbytes": mplan.arena_nbytes,
                         "lower_bound_nbytes": mplan.lower_bound_nbytes,
                         "naive_nbytes": mplan.naive_nbytes, "alignment": alignment[space],
                         "peak_step": peak, "buffers": entries}
    steps = [{"index": t, "name": node.name, "op_type": node.op_type,
              "provider": schedule.provider_of_step[t], "live_nbytes": live_total[t]}
             for t, node in enumerate(schedule.steps)]
    return {"arenas": arenas, "steps": steps}
