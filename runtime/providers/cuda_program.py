"""A CUDA partition's steps as a program: kernel launches and byte copies, parsed from plan.json.

Pure numpy, no cupy: ``parse_steps`` turns a partition's steps into ``Launch`` records (kernel
name, grid, block, dynamic shared memory, and an argument tuple of numpy scalars whose weights
pointers are final and whose arena pointers are offsets, bound per arena by ``bind``) and
``Copy`` records (a Transfer between host and device, or a view copy whose bytes moved), dropping
views that share their input's bytes. Every record is checked here, so a bad plan fails at load
naming the step, never at launch time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.errors import ArtifactError

__all__ = ["H2H", "H2D", "D2H", "D2D", "VIEW_OPS", "Place", "Launch", "Copy", "value_place",
           "parse_launch", "parse_steps", "bind", "uses_device_arena"]

# cudaMemcpyKind (CUDA runtime ABI constants)
H2H, H2D, D2H, D2D = 0, 1, 2, 3
_KINDS = {("host", "host"): H2H, ("host", "cuda"): H2D, ("cuda", "host"): D2H, ("cuda", "cuda"): D2D}
VIEW_OPS = frozenset({"Reshape", "Identity", "Flatten", "Squeeze", "Unsqueeze"})
_SCALARS = {"i32": np.int32, "i64": np.int64, "f32": np.float32, "f64": np.float64}


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


def _value_nbytes(record: dict[str, Any]) -> int:
    return int(np.prod(record["shape"], dtype=np.int64)) * np.dtype(record["dtype"]).itemsize


def value_place(record: dict[str, Any], space: str, what: str) -> Place:
    """``space`` is the memory space the step reads/writes the value in (weights exist in both)."""
    location = record["location"]
    kind = location[0]
    nbytes = _value_nbytes(record)
    if kind == "arena":
        arena_space = location[2] if len(location) > 2 else "host"
        return Place(arena_space, "arena", int(location[1]), nbytes)
    if kind == "weights":
        return Place(space, "weights", int(location[1]), nbytes)
    if kind == "ext":
        return Place("host", "ext", str(location[1]), nbytes)
    raise ArtifactError(f"plan.json: {what}: unknown value location {location!r}")


def _triple(value: Any, what: str) -> tuple[int, int, int]:
    if not isinstance(value, list) or not 1 <= len(value) <= 3 or \
            not all(isinstance(v, int) and v >= 1 for v in value):
        raise ArtifactError(f"plan.json: {what} must be 1-3 positive integers, got {value!r}")
    padded = [*value, 1, 1][:3]
    return padded[0], padded[1], padded[2]


def parse_launch(step: str, launch: dict[str, Any], arena_nbytes: int, weights_nbytes: int,
                 weights_addr: int) -> Launch:
    """One launch record -> a ``Launch`` whose weights pointers are final and arena ones offsets."""
    where = f"step {step!r} launch of {launch.get('kernel')!r}"
    kernel = launch.get("kernel")
    if not isinstance(kernel, str) or not kernel:
        raise ArtifactError(f"plan.json: step {step!r}: a launch names no kernel")
    args: list[Any] = []
    slots: list[tuple[int, int]] = []
    for index, arg in enumerate(launch["args"]):
        if not isinstance(arg, list) or not arg:
            raise ArtifactError(f"plan.json: {where}: bad argument {arg!r}")
        if arg[0] == "ptr":
            if len(arg) != 3 or arg[1] not in ("arena", "weights") or not isinstance(arg[2], int):
                raise ArtifactError(f"plan.json: {where}: bad pointer argument {arg!r}")
            limit = arena_nbytes if arg[1] == "arena" else weights_nbytes
            if not 0 <= arg[2] <= limit:
                raise ArtifactError(f"plan.json: {where}: {arg[1]} offset {arg[2]} outside 0..{limit}")
            if arg[1] == "arena":
                slots.append((index, arg[2]))
                args.append(np.uint64(0))
            else:
                args.append(np.uint64(weights_addr + arg[2]))
        elif arg[0] in _SCALARS and len(arg) == 2:
            args.append(_SCALARS[arg[0]](arg[1]))
        else:
            raise ArtifactError(f"plan.json: {where}: unknown argument kind {arg!r}")
    shared = launch.get("shared", 0)
    if not isinstance(shared, int) or shared < 0:
        raise ArtifactError(f"plan.json: {where}: bad shared memory size {shared!r}")
    return Launch(step, kernel, _triple(launch["grid"], f"{where} grid"),
                  _triple(launch["block"], f"{where} block"), shared, tuple(args), tuple(slots))


def parse_steps(plan: dict[str, Any], record: dict[str, Any], weights_nbytes: int,
                weights_addr: int) -> list[Launch | Copy]:
    """The partition's steps as an ordered list of launches and copies (no-op views dropped)."""
    values = plan["values"]
    arena_nbytes = sum(int(a["nbytes"]) for a in plan["arenas"] if a["memory_space"] == "cuda")
    program: list[Launch | Copy] = []
    for step in plan["steps"][record["first_step"]:record["last_step"] + 1]:
        name, op = step["name"], step["op_type"]
        launches = step.get("launches") or []
        if launches:
            program += [parse_launch(name, launch, arena_nbytes, weights_nbytes, weights_addr)
                        for launch in launches]
            continue
        if op == "Transfer" and step["domain"] == "onnx_aot":
            src_space, dst_space = step["attrs"]["from"], step["attrs"]["to"]
        elif op in VIEW_OPS and step["domain"] in ("", "ai.onnx"):
            src_space = dst_space = "cuda"
        else:
            raise ArtifactError(f"plan.json: step {name!r} ({op}) in CUDA partition "
                                f"{record['index']} has no launches")
        if (src_space, dst_space) not in _KINDS:
            raise ArtifactError(f"plan.json: step {name!r}: no copy from {src_space!r} to {dst_space!r}")
        src = value_place(values[step["inputs"][0]], src_space, f"step {name!r} input")
        dst = value_place(values[step["outputs"][0]], dst_space, f"step {name!r} output")
        if src.nbytes != dst.nbytes:
            raise ArtifactError(f"plan.json: step {name!r}: copies {src.nbytes} bytes into {dst.nbytes}")
        for place in (src, dst):
            if place.kind == "arena" and place.space not in (src_space, dst_space):
                raise ArtifactError(f"plan.json: step {name!r}: a {place.space} arena value in a "
                                    f"{src_space}->{dst_space} copy")
            if place.kind == "ext" and "host" not in (src_space, dst_space):
                raise ArtifactError(f"plan.json: step {name!r}: a caller's array on the device")
        if src == dst:
            continue  # a view over the same bytes
        program.append(Copy(name, src, dst, src.nbytes, _KINDS[(src.space, dst.space)]))
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
