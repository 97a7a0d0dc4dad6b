"""The control runner: a control step compiled into nested schedules (plan.json ``schedules``).

An ``onnx_aot.If`` runs the schedule of the branch its condition picks; a ``Loop`` / ``Scan`` runs
its body once per iteration. A schedule is a list of partitions loaded like the model's (C entries
of the model's library, reference partitions, control partitions of its own), called with the
step's *region* (its scratch in the outer arena) as their arena, and with their inputs and outputs
(``ext``) bound to where the outer plan put the step's operands, or to the region's slots (the
iteration number, the condition the body returns, carried values, non-contiguous slices).
See compiler/nested.py for the layout. Everything is prepared at load; per iteration a loop only
rebinds what changes (the carried buffers swap, scan slices move) and calls the partitions.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from runtime.address import data_address
from runtime.errors import ArtifactError
from runtime.errors import RuntimeKernelError
from runtime.plan_schema import PlanPartition
from runtime.plan_schema import PlanSchedule
from runtime.plan_schema import PlanStep
from runtime.plan_schema import PlanValue

__all__ = ["ControlPartition", "Loader"]

# (plan or schedule, partition record) -> (runner, loaded partition): the session's loader
Loader = Callable[[Any, PlanPartition], tuple[str, Any]]
View = Callable[[dict[str, Any], dict[str, Any]], Any]
_COUNTS = {"If": 2, "Loop": 1, "Scan": 1}


def _viewer(value: PlanValue, weights: np.ndarray) -> View:
    dtype, shape, nbytes, where = value.dtype, value.shape, value.nbytes, value.location
    off, name = where.offset, where.ext
    if where.kind == "arena":
        return lambda arenas, ext: arenas["host"][off:off + nbytes].view(dtype).reshape(shape)
    if where.kind == "weights":
        const = weights[off:off + nbytes].view(dtype).reshape(shape)
        return lambda arenas, ext: const
    return lambda arenas, ext: ext[name].reshape(shape)


class _Body:
    """One nested schedule, loaded: its partitions and the names it binds."""

    def __init__(self, schedule: PlanSchedule, load: Loader, weights_addr: int) -> None:
        self.parts = [load(schedule, record) for record in schedule.partitions]
        self.c_slots = [len(part.ext) for kind, part in self.parts if kind == "c"]
        self.weights_addr = weights_addr
        self.inputs = schedule.inputs
        self.outputs = schedule.outputs
        self.specs = {name: (schedule.values[name].dtype, schedule.values[name].shape)
                      for name in (*schedule.inputs, *schedule.outputs)}
        self.by_input = {int(ref[1:]): name for ref, name in zip(schedule.refs, schedule.inputs, strict=True)
                         if ref[0] == "i"}
        self.by_arg = {int(ref[1:]): name for ref, name in zip(schedule.refs, schedule.inputs, strict=True)
                       if ref[0] == "a"}
        self.arena_nbytes = schedule.arena_nbytes

    def bind(self, ins: list[Any]) -> tuple[dict[str, Any], dict[str, int]]:
        """The arrays and addresses of the inputs bound to the step's inputs."""
        arrays = {name: ins[k] for k, name in self.by_input.items()}
        return arrays, {name: data_address(a) for name, a in arrays.items()}

    def pointers(self) -> list[Any]:
        """Fresh pointer arrays for the C partitions (one set per execution: runs may overlap)."""
        return [(ctypes.c_void_p * max(n, 1))() for n in self.c_slots]

    def run(self, arenas: dict[str, Any], region_addr: int, arrays: dict[str, Any], addrs: dict[str, int],
            pointers: list[Any]) -> None:
        """Call the partitions: C entries with the region's address, the others with ``arenas``
        (the region as the host arena)."""
        c = 0
        for kind, part in self.parts:
            if kind == "c":
                slots = pointers[c]
                c += 1
                for slot, name in enumerate(part.ext):
                    slots[slot] = addrs[name]
                part.entry(slots, region_addr, self.weights_addr, None)
            else:
                part.run(arenas, arrays)


def _slot(region: np.ndarray, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return region[offset:offset + nbytes].view(dtype).reshape(shape)


class _Step:
    """One control step: its operands' views, its bodies and its region."""

    def __init__(self, step: PlanStep, values: Any, load: Loader, weights: np.ndarray,
                 weights_addr: int) -> None:
        schedules = step.schedules or ()
        if step.op_type not in _COUNTS or len(schedules) != _COUNTS[step.op_type]:
            raise ArtifactError(f"plan.json step {step.name!r}: {len(schedules)} schedule(s) for a "
                                f"{step.op_type} control step")
        self.name, self.op_type, self.attrs = step.name, step.op_type, step.attrs
        self.ins = [_viewer(values[n], weights) if n is not None else None for n in step.inputs]
        self.outs = [_viewer(values[n], weights) for n in step.outputs]
        self.bodies = [_Body(s, load, weights_addr) for s in schedules]
        self.offset = step.scratch.offset if step.scratch is not None else 0
        self.nbytes = step.scratch.nbytes if step.scratch is not None else 0
        if max(b.arena_nbytes for b in self.bodies) > self.nbytes:
            raise ArtifactError(f"plan.json step {step.name!r}: its schedules need more than its "
                                f"{self.nbytes} bytes of scratch")
        self.run = {"If": self._if, "Loop": self._loop, "Scan": self._scan}[step.op_type]

    def _operands(self, arenas: dict[str, Any], ext: dict[str, Any]) -> tuple[list[Any], list[Any]]:
        return ([v(arenas, ext) if v is not None else None for v in self.ins],
                [v(arenas, ext) for v in self.outs])

    def _region(self, arenas: dict[str, Any]) -> tuple[np.ndarray, int]:
        region = arenas["host"][self.offset:self.offset + self.nbytes]
        return region, data_address(region)

    def _inner(self, region: np.ndarray) -> dict[str, Any]:
        return {"host": region}

    def _if(self, arenas: dict[str, Any], ext: dict[str, Any]) -> None:
        ins, outs = self._operands(arenas, ext)
        body = self.bodies[0 if bool(ins[0].reshape(-1)[0]) else 1]
        arrays, addrs = body.bind(ins)
        for name, out in zip(body.outputs, outs, strict=True):
            arrays[name], addrs[name] = out, data_address(out)
        region, addr = self._region(arenas)
        body.run(self._inner(region), addr, arrays, addrs, body.pointers())

    def _loop(self, arenas: dict[str, Any], ext: dict[str, Any]) -> None:
        ins, outs = self._operands(arenas, ext)
        body, attrs = self.bodies[0], self.attrs
        n = int(attrs["n_carried"])
        trips = None if ins[0] is None else int(ins[0].reshape(-1)[0])
        running = True if ins[1] is None else bool(ins[1].reshape(-1)[0])
        region, addr = self._region(arenas)
        arrays, addrs = body.bind(ins)
        iteration = None
        if attrs["iteration"] is not None:
            iteration = _slot(region, attrs["iteration"], *body.specs[body.by_arg[0]])
            arrays[body.by_arg[0]], addrs[body.by_arg[0]] = iteration, addr + attrs["iteration"]
        cond = _slot(region, attrs["cond"], *body.specs[body.outputs[0]])
        arrays[body.outputs[0]], addrs[body.outputs[0]] = cond, addr + attrs["cond"]
        flag = cond.reshape(-1)
        carried = _Carried(region, addr, attrs["carried"], ins[2:2 + n], body, 2, 1)
        elements = [_Elements(out, 0, 0, body.outputs[1 + n + k]) for k, out in enumerate(outs[n:])]
        pointers, inner = body.pointers(), self._inner(region)
        i = 0
        while running and (trips is None or i < trips):
            if iteration is not None:
                iteration[...] = i
            carried.bind(arrays, addrs)
            for e in elements:
                e.bind(i, arrays, addrs, self.name)
            body.run(inner, addr, arrays, addrs, pointers)
            running = bool(flag[0])
            carried.swap()
            i += 1
        carried.finish(outs[:n])
        for e in elements:
            e.check(i, self.name)

    def _scan(self, arenas: dict[str, Any], ext: dict[str, Any]) -> None:
        ins, outs = self._operands(arenas, ext)
        body, attrs = self.bodies[0], self.attrs
        n, length = int(attrs["n_states"]), int(attrs["length"])
        region, addr = self._region(arenas)
        arrays, addrs = body.bind(ins)
        states = _Carried(region, addr, attrs["states"], ins[:n], body, 0, 0)
        xs = ins[n:n + len(attrs["in_axes"])]
        slices = [_Slices(x, axis, d, body.by_arg.get(n + k), region, addr, off, body)
                  for k, (x, axis, d, off) in enumerate(
                      zip(xs, attrs["in_axes"], attrs["in_dirs"], attrs["slices"], strict=True))]
        elements = [_Elements(out, axis, d, body.outputs[n + k], region, addr, off)
                    for k, (out, axis, d, off) in enumerate(
                        zip(outs[n:], attrs["out_axes"], attrs["out_dirs"], attrs["elements"], strict=True))]
        pointers, inner = body.pointers(), self._inner(region)
        for t in range(length):
            states.bind(arrays, addrs)
            for s in slices:
                s.bind(t, length, arrays, addrs)
            for e in elements:
                e.bind(t, arrays, addrs, self.name)
            body.run(inner, addr, arrays, addrs, pointers)
            for e in elements:
                e.store(t)
            states.swap()
        states.finish(outs[:n])


class _Carried:
    """Carried values (states) in two buffers each: a body reads one and writes the other."""

    def __init__(self, region: np.ndarray, addr: int, offsets: list[list[int]], initial: list[Any],
                 body: _Body, first_arg: int, first_out: int) -> None:
        self.names = [(body.by_arg.get(first_arg + k), body.outputs[first_out + k])
                      for k in range(len(initial))]
        self.bufs = []
        for (a, b), value, (_, out) in zip(offsets, initial, self.names, strict=True):
            dtype, shape = body.specs[out]
            pair = (_slot(region, a, dtype, shape), _slot(region, b, dtype, shape))
            np.copyto(pair[0], value)
            self.bufs.append((pair, (addr + a, addr + b)))
        self.cur = 0

    def bind(self, arrays: dict[str, Any], addrs: dict[str, int]) -> None:
        cur, nxt = self.cur, 1 - self.cur
        for (name_in, name_out), (pair, where) in zip(self.names, self.bufs, strict=True):
            if name_in is not None:
                arrays[name_in], addrs[name_in] = pair[cur], where[cur]
            arrays[name_out], addrs[name_out] = pair[nxt], where[nxt]

    def swap(self) -> None:
        self.cur = 1 - self.cur

    def finish(self, outs: list[Any]) -> None:
        for out, (pair, _) in zip(outs, self.bufs, strict=True):
            np.copyto(out, pair[self.cur])


class _Slices:
    """A Scan input's slice per iteration: a view where it is contiguous, else a copy in the region."""

    def __init__(self, x: Any, axis: int, reverse: int, name: str | None, region: np.ndarray, addr: int,
                 offset: int | None, body: _Body) -> None:
        self.name, self.reverse = name, bool(reverse)
        self.moved = np.moveaxis(x, axis, 0)
        self.copy = None
        if name is not None and offset is not None:
            self.copy, self.addr = _slot(region, offset, *body.specs[name]), addr + offset

    def bind(self, t: int, length: int, arrays: dict[str, Any], addrs: dict[str, int]) -> None:
        if self.name is None:
            return
        view = self.moved[length - 1 - t if self.reverse else t]
        if self.copy is None:
            arrays[self.name], addrs[self.name] = view, data_address(view)
        else:
            np.copyto(self.copy, view)
            arrays[self.name], addrs[self.name] = self.copy, self.addr


class _Elements:
    """A scan output's element per iteration: written in place where contiguous, else into the
    region and copied out after the iteration."""

    def __init__(self, out: Any, axis: int, reverse: int, name: str, region: np.ndarray | None = None,
                 addr: int = 0, offset: int | None = None) -> None:
        self.moved, self.reverse, self.name = np.moveaxis(out, axis, 0), bool(reverse), name
        self.length = self.moved.shape[0]
        self.copy = None
        if offset is not None and region is not None:
            self.copy, self.addr = _slot(region, offset, out.dtype, self.moved.shape[1:]), addr + offset

    def _index(self, t: int) -> int:
        return self.length - 1 - t if self.reverse else t

    def bind(self, t: int, arrays: dict[str, Any], addrs: dict[str, int], step: str) -> None:
        if t >= self.length:
            raise RuntimeKernelError(f"step {step!r} (Loop): more iterations than the {self.length} its "
                                     f"scan outputs were compiled for")
        if self.copy is None:
            view = self.moved[self._index(t)]
            arrays[self.name], addrs[self.name] = view, data_address(view)
        else:
            arrays[self.name], addrs[self.name] = self.copy, self.addr

    def store(self, t: int) -> None:
        if self.copy is not None:
            self.moved[self._index(t)] = self.copy

    def check(self, ran: int, step: str) -> None:
        if ran != self.length:
            raise RuntimeKernelError(f"step {step!r} (Loop): ran {ran} iterations, but its scan outputs "
                                     f"were compiled for {self.length}")


class ControlPartition:
    """A partition of compiled control steps, prepared once at load."""

    def __init__(self, plan: Any, record: PlanPartition, load: Loader, weights: np.ndarray,
                 weights_addr: int) -> None:
        self.steps = [_Step(step, plan.values, load, weights, weights_addr)
                      for step in plan.partition_steps(record)]

    def run(self, arenas: dict[str, Any], ext: dict[str, Any], timings: np.ndarray | None = None) -> None:
        for local, step in enumerate(self.steps):
            t0 = time.perf_counter()
            try:
                step.run(arenas, ext)
            except RuntimeKernelError:
                raise
            except Exception as exc:
                raise RuntimeKernelError(f"step {step.name!r} ({step.op_type}) failed: {exc}") from exc
            if timings is not None:
                timings[local] = time.perf_counter() - t0
