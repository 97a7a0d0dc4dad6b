"""A CUDA partition's steps as a program: kernel launches and byte copies, parsed from plan.json.

Pure numpy, no cupy: ``parse_steps`` turns a partition's steps (plan.json's records, already
checked by ``runtime/plan_schema.py``) into ``Launch`` records (kernel
name, grid, block, dynamic shared memory, and an argument tuple of numpy scalars whose weights
pointers are final and whose arena pointers are offsets, bound per arena by ``bind``) and
``Copy`` records (a Transfer between host and device, or a view copy whose bytes moved), dropping
views that share their input's bytes. What the schema cannot check alone (offsets against the
arena and weights sizes, copies between spaces) is checked here, so a bad plan fails at load naming
the step, never at launch time.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.contract import TRANSFER
from runtime.errors import ArtifactError
from runtime.plan_schema import KernelLaunch
from runtime.plan_schema import Plan
from runtime.plan_schema import PlanPartition
from runtime.plan_schema import PlanStep
from runtime.plan_schema import PlanValue

__all__ = ["H2H", "H2D", "D2H", "D2D", "VIEW_OPS", "Place", "Launch", "Copy", "value_place",
           "parse_launch", "parse_steps", "bind", "uses_device_arena"]

# cudaMemcpyKind (CUDA runtime ABI constants)
H2H, H2D, D2H, D2D = 0, 1, 2, 3
_KINDS = {("host", "host"): H2H, ("host", "cuda"): H2D, ("cuda", "host"): D2H, ("cuda", "cuda"): D2D}
VIEW_OPS = frozenset({"Reshape", "Identity", "Flatten", "Squeeze", "Unsqueeze"})
_SCALARS: dict[str, Callable[[Any], Any]] = {"i32": np.int32, "i64": np.int64, "f32": np.float32,
                                             "f64": np.float64}


@dataclass(frozen=True)
class Place:
    """Where a value's bytes are: ``space`` "host"/"cuda", ``kind`` "arena"/"weights"/"ext"."""

    space: str
    kind: str
    where: int | str  # byte offset, or the ext value's name
    nbytes: int


@dataclass(frozen=True)
class Launch:
    step: str
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int
    args: tuple[Any, ...]  # numpy scalars; arena pointers hold 0 until bound
    arena_slots: tuple[tuple[int, int], ...]  # (argument index, arena offset)


@dataclass(frozen=True)
class Copy:
    step: str
    src: Place
    dst: Place
    nbytes: int
    kind: int  # cudaMemcpyKind


def value_place(value: PlanValue, space: str) -> Place:
    """``space`` is the memory space the step reads/writes the value in (weights exist in both)."""
    where = value.location
    if where.kind == "arena":
        return Place(where.space, "arena", where.offset, value.nbytes)
    if where.kind == "weights":
        return Place(space, "weights", where.offset, value.nbytes)
    return Place("host", "ext", where.ext, value.nbytes)


def _triple(dims: tuple[int, ...]) -> tuple[int, int, int]:
    padded = [*dims, 1, 1][:3]
    return padded[0], padded[1], padded[2]


def parse_launch(step: str, launch: KernelLaunch, arena_nbytes: int, weights_nbytes: int,
                 weights_addr: int) -> Launch:
    """One launch record -> a ``Launch`` whose weights pointers are final and arena ones offsets."""
    where = f"step {step!r} launch of {launch.kernel!r}"
    args: list[Any] = []
    slots: list[tuple[int, int]] = []
    for index, arg in enumerate(launch.args):
        if arg.kind != "ptr":
            args.append(_SCALARS[arg.kind](arg.value))
            continue
        offset = int(arg.value)
        limit = arena_nbytes if arg.base == "arena" else weights_nbytes
        if not 0 <= offset <= limit:
            raise ArtifactError(f"plan.json: {where}: {arg.base} offset {offset} outside 0..{limit}")
        if arg.base == "arena":
            slots.append((index, offset))
            args.append(np.uint64(0))
        else:
            args.append(np.uint64(weights_addr + offset))
    return Launch(step, launch.kernel, _triple(launch.grid), _triple(launch.block), launch.shared,
                  tuple(args), tuple(slots))


def _copy(step: PlanStep, values: Mapping[str, PlanValue], partition: int) -> Copy | None:
    """A Transfer (or a view on the device) as a byte copy; None for a view over the same bytes."""
    name, op = step.name, step.op_type
    if step.kind == TRANSFER:
        src_space, dst_space = step.attrs["from"], step.attrs["to"]
    elif step.kind in VIEW_OPS:
        src_space = dst_space = "cuda"
    else:
        raise ArtifactError(f"plan.json: step {name!r} ({op}) in CUDA partition {partition} has no launches")
    if (src_space, dst_space) not in _KINDS:
        raise ArtifactError(f"plan.json: step {name!r}: no copy from {src_space!r} to {dst_space!r}")
    src = value_place(values[str(step.inputs[0])], src_space)
    dst = value_place(values[step.outputs[0]], dst_space)
    if src.nbytes != dst.nbytes:
        raise ArtifactError(f"plan.json: step {name!r}: copies {src.nbytes} bytes into {dst.nbytes}")
    for place in (src, dst):
        if place.kind == "arena" and place.space not in (src_space, dst_space):
            raise ArtifactError(f"plan.json: step {name!r}: a {place.space} arena value in a "
                                f"{src_space}->{dst_space} copy")
        if place.kind == "ext" and "host" not in (src_space, dst_space):
            raise ArtifactError(f"plan.json: step {name!r}: a caller's array on the device")
    return None if src == dst else Copy(name, src, dst, src.nbytes, _KINDS[(src.space, dst.space)])


def _concat_in_place(step: PlanStep, values: Mapping[str, PlanValue]) -> bool:
    """A Concat whose inputs all sit in their slices of its output (the compiler produced each one
    there), so it launches nothing: checked from the locations, not taken on trust."""
    axis = step.attrs.get("axis")
    if step.op_type != "Concat" or step.domain not in ("", "ai.onnx") or not isinstance(axis, int) \
            or len(step.outputs) != 1 or any(name is None for name in step.inputs):
        return False  # (then "has no launches" names the step)
    out = values[step.outputs[0]]
    offset = out.location.offset
    for name in step.inputs:
        value = values[str(name)]
        if value.location.kind != "arena" or value.location.space != out.location.space or \
                out.location.kind != "arena" or value.location.offset != offset:
            return False
        offset += value.nbytes
    axis %= max(len(out.shape), 1)
    return offset == out.location.offset + out.nbytes and all(d == 1 for d in out.shape[:axis])


def parse_steps(plan: Plan, record: PlanPartition, weights_nbytes: int,
                weights_addr: int) -> list[Launch | Copy]:
    """The partition's steps as an ordered list of launches and copies (no-op views and Concats
    produced in place dropped)."""
    arena = plan.arena("cuda")
    arena_nbytes = arena.nbytes if arena is not None else 0
    program: list[Launch | Copy] = []
    for step in plan.partition_steps(record):
        if step.launches:
            program += [parse_launch(step.name, launch, arena_nbytes, weights_nbytes, weights_addr)
                        for launch in step.launches]
            continue
        if step.launches is not None and _concat_in_place(step, plan.values):
            continue
        copy = _copy(step, plan.values, record.index)
        if copy is not None:
            program.append(copy)
    return program


def uses_device_arena(op: Launch | Copy) -> bool:
    if isinstance(op, Launch):
        return bool(op.arena_slots)
    return any(p.kind == "arena" and p.space == "cuda" for p in (op.src, op.dst))


def bind(launch: Launch, arena_base: int) -> tuple[Any, ...]:
    """The launch's argument tuple with its arena pointers based at ``arena_base``."""
    if not launch.arena_slots:
        return launch.args
    args = list(launch.args)
    for index, offset in launch.arena_slots:
        args[index] = np.uint64(arena_base + offset)
    return tuple(args)
