"""Turn a schedule and its memory plans into the plan records: plan.json, weights, partitions.

This is where every value gets its final location (arena offset, weights offset or external
slot), where the constants are laid out in weights.bin (64-byte aligned, little-endian, in order
of first use), and where the memory report's data is computed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.ir.graph import Graph, Value
from compiler.memory import MemoryPlan
from compiler.memory.lifetimes import Storage
from compiler.partition.partitioner import Schedule
from compiler.providers.base import Location, PartitionPlan, Provider, StepPlan
from runtime.artifact import FORMAT_VERSION

__all__ = ["CompiledPlan", "build_plan", "WEIGHT_ALIGNMENT", "jsonable"]

WEIGHT_ALIGNMENT = 64


@dataclass
class CompiledPlan:
    plan: dict[str, Any]
    weights: bytes
    partitions: list[PartitionPlan]
    memory_report: dict[str, Any]


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
    raise TypeError(f"attribute value of type {type(obj).__name__} cannot be stored in plan.json")


def _spec(value: Value, name: str | None = None) -> dict[str, Any]:
    assert value.dtype is not None and value.shape is not None
    return {"name": name or value.name, "dtype": value.dtype.name, "shape": list(value.shape)}


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def build_plan(
    graph: Graph,
    schedule: Schedule,
    storage: Storage,
    mem_plans: dict[str, MemoryPlan],
    alignment: dict[str, int],
    providers: dict[str, Provider],
) -> CompiledPlan:
    steps = schedule.steps
    values: dict[str, Value] = {v.name: v for v in graph.values()}

    # weights.bin: constants in order of first use
    const_offsets: dict[str, int] = {}
    chunks: list[bytes] = []
    constants: list[dict[str, Any]] = []
    offset = 0
    for node in steps:
        for value in node.inputs:
            if value is None:
                continue
            root = storage.root[value.name]
            if storage.kind[root] != "weights" or root in const_offsets:
                continue
            array = graph.constants[root].const
            assert array is not None
            data = np.ascontiguousarray(array.astype(array.dtype.newbyteorder("<"), copy=False)).tobytes()
            const_offsets[root] = offset
            constants.append({"name": root, "offset": offset, "nbytes": len(data),
                              "dtype": array.dtype.name, "shape": list(array.shape)})
            padded = _align(len(data), WEIGHT_ALIGNMENT)
            chunks.append(data + b"\0" * (padded - len(data)))
            offset += padded
    weights = b"".join(chunks)

    arena_offset: dict[str, tuple[str, int]] = {}
    for space, mplan in mem_plans.items():
        for bid, off in mplan.offsets.items():
            arena_offset[str(bid)] = (space, off)

    def location_json(name: str) -> list[Any]:
        root = storage.root[name]
        kind = storage.kind[root]
        if kind == "ext":
            return ["ext", root]
        if kind == "weights":
            return ["weights", const_offsets[root]]
        space, off = arena_offset[root]
        return ["arena", off + storage.offset[name], space]

    scratch_sizes = {str(b.id): b.nbytes for bs in storage.buffers.values() for b in bs}
    partitions: list[PartitionPlan] = []
    step_records: list[dict[str, Any]] = []
    partition_records: list[dict[str, Any]] = []
    referenced: dict[str, None] = {}
    for part in schedule.partitions:
        ext: list[str] = []

        def loc(value: Value, ext: list[str] = ext, space_here: str = part.provider.memory_space) -> Location:
            root = storage.root[value.name]
            referenced[value.name] = None
            kind = storage.kind[root]
            if kind == "ext":
                if root not in ext:
                    ext.append(root)
                return Location("ext", ext.index(root))
            if kind == "weights":
                return Location("weights", const_offsets[root], space_here)
            space, off = arena_offset[root]
            return Location("arena", off + storage.offset[value.name], space)

        step_plans: list[StepPlan] = []
        for local, t in enumerate(part.steps):
            node = steps[t]
            ins = tuple(loc(v) if v is not None else None for v in node.inputs)
            outs = tuple(loc(v) for v in node.outputs)
            scratch_id = f"scratch/{t}"
            scratch = (Location("arena", arena_offset[scratch_id][1], arena_offset[scratch_id][0])
                       if scratch_id in arena_offset else None)
            nbytes = scratch_sizes.get(scratch_id, 0)
            step_plans.append(StepPlan(t, local, node, ins, outs, scratch, nbytes))
            step_records.append({
                "index": t,
                "name": node.name,
                "op_type": node.op_type,
                "domain": node.domain,
                "provider": part.provider.name,
                "partition": part.index,
                "onnx_nodes": list(node.origin),
                "inputs": [v.name if v is not None else None for v in node.inputs],
                "outputs": [v.name for v in node.outputs],
                "attrs": jsonable(node.attrs),
                "scratch": ({"offset": scratch.offset, "nbytes": nbytes} if scratch else None),
            })
        entry = f"onnx_aot_partition_{part.index}"
        partitions.append(PartitionPlan(part.index, part.provider.name, entry, tuple(step_plans),
                                        tuple(ext)))
        partition_records.append({
            "index": part.index,
            "provider": part.provider.name,
            "runner": getattr(part.provider, "runner", part.provider.name),
            "memory_space": part.provider.memory_space,
            "entry": entry,
            "first_step": part.steps[0],
            "last_step": part.steps[-1],
            "ext": list(ext),
        })

    value_records = {}
    for name in referenced:
        value = values[name]
        value_records[name] = {"dtype": value.dtype.name if value.dtype else None,
                               "shape": list(value.shape or ()),
                               "location": location_json(name)}

    onnx_nodes: dict[str, Any] = {}
    for t, node in enumerate(steps):
        for origin in node.origin:
            onnx_nodes[origin] = {"provider": schedule.provider_of_step[t],
                                  "partition": schedule.partition_of_step[t], "step": t}
    for name, reason in graph.eliminated.items():
        onnx_nodes.setdefault(name, {"eliminated": reason})

    buffers_json = []
    arenas_json = []
    for space, mplan in mem_plans.items():
        arenas_json.append({"memory_space": space, "nbytes": mplan.arena_nbytes,
                            "alignment": alignment[space],
                            "lower_bound_nbytes": mplan.lower_bound_nbytes,
                            "naive_nbytes": mplan.naive_nbytes, "strategy": mplan.strategy})
        for buf in storage.buffers.get(space, []):
            buffers_json.append({"id": str(buf.id), "arena": space,
                                 "offset": mplan.offsets[buf.id], "nbytes": buf.nbytes,
                                 "first_step": buf.first_step, "last_step": buf.last_step,
                                 "values": storage.tensors.get(str(buf.id), [])})

    plan = {
        "format_version": FORMAT_VERSION,
        "name": graph.name,
        "inputs": [_spec(v) for v in graph.inputs],
        "outputs": [dict(_spec(v, graph.output_names[k] if k < len(graph.output_names) else None),
                         value=v.name) for k, v in enumerate(graph.outputs)],
        "constants": constants,
        "weights_nbytes": len(weights),
        "arenas": arenas_json,
        "buffers": buffers_json,
        "values": value_records,
        "steps": step_records,
        "partitions": partition_records,
        "onnx_nodes": onnx_nodes,
    }
    report = memory_report(schedule, storage, mem_plans, alignment, values)
    return CompiledPlan(plan, weights, partitions, report)


def memory_report(schedule: Schedule, storage: Storage, mem_plans: dict[str, MemoryPlan],
                  alignment: dict[str, int], values: dict[str, Value]) -> dict[str, Any]:
    n = len(schedule.steps)
    live_total = [0] * n
    arenas: dict[str, Any] = {}
    for space, mplan in mem_plans.items():
        live = [0] * n
        entries = []
        for buf in storage.buffers.get(space, []):
            size = _align(buf.nbytes, alignment[space])
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
