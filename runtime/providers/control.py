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

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from runtime.address import data_address
from runtime.errors import ArtifactError
from runtime.errors import IndexRangeError
from runtime.errors import RuntimeKernelError
from runtime.plan_schema import PlanPartition
from runtime.plan_schema import PlanSchedule
from runtime.plan_schema import PlanStep
from runtime.plan_schema import PlanValue
from runtime.plan_symbols import DYN_EXT
from runtime.run_path import Memory
from runtime.run_path import run_all
from runtime.run_path import value_view

__all__ = ["ControlPartition", "Loader"]

# (plan or schedule, partition record) -> (runner, loaded partition): the session's loader
Loader = Callable[[Any, PlanPartition], tuple[str, Any]]
Address = Callable[[int, dict[str, Any]], int]  # (host arena's address, ext) -> a value's address
_COUNTS = {"If": 2, "Loop": 1, "Scan": 1}


def _addresser(value: PlanValue, weights_addr: int) -> Address:
    where = value.location
    off, name = where.offset, where.ext
    if where.kind == "arena":
        return lambda base, ext: base + off
    if where.kind == "weights":
        return lambda base, ext: weights_addr + off
    if where.kind == "symbolic":
        held = np.array(where.elements, value.dtype).reshape(value.shape)
        return lambda base, ext: data_address(held)
    return lambda base, ext: data_address(ext[name])


class _Body:
    """One nested schedule, loaded: its partitions and the names it binds."""

    def __init__(self, schedule: PlanSchedule, load: Loader) -> None:
        self.parts = [load(schedule, record) for record in schedule.partitions]
        self.c_parts = [part for kind, part in self.parts if kind == "c"]
        self.slots: dict[str, list[tuple[int, int]]] = {}  # name -> its (C partition's index, slot)s
        for part in self.c_parts:
            for slot, name in enumerate(part.ext):
                self.slots.setdefault(name, []).append((part.index, slot))
        self.needs_arrays = any(kind != "c" for kind, _ in self.parts)  # reference / control parts
        self.outputs = schedule.outputs
        self.specs = {name: (schedule.values[name].dtype, schedule.values[name].shape)
                      for name in (*schedule.inputs, *schedule.outputs)}
        refs = list(zip(schedule.refs, schedule.inputs, strict=True))
        self.by_input = {int(ref[1:]): name for ref, name in refs if ref[0] == "i"}
        self.by_arg = {int(ref[1:]): name for ref, name in refs if ref[0] == "a"}
        self.arena_nbytes = schedule.arena_nbytes

    def sources(self, ins: list[Address | None],
                outs: list[Address]) -> list[tuple[int, int, Address]] | None:
        """For a body of C partitions only, bound to the step's operands (an If's branch): where
        each pointer slot's address comes from; None for any other body."""
        if self.needs_arrays:
            return None
        by_name: dict[str, Address | None] = {name: ins[k] for k, name in self.by_input.items()}
        by_name.update(zip(self.outputs, outs, strict=True))
        by_name[DYN_EXT] = lambda base, ext: data_address(ext[DYN_EXT])  # (a body of symbolic shapes)
        found = []
        for part in self.c_parts:
            for slot, name in enumerate(part.ext):
                address = by_name.get(name)
                if address is None:
                    raise ArtifactError(f"a partition reads {name!r}, which the schedule does not bind")
                found.append((part.index, slot, address))
        return found

    def memory(self, arenas: dict[str, Any], region_addr: int) -> Memory:
        """Memory for one execution: ``arenas`` (the region as the host arena) and fresh pointer
        arrays, which the caller fills (once per execution; per iteration only where a place moves)."""
        pointers = {part.index: part.pointer_array() for part in self.c_parts}
        return Memory(arenas, region_addr, pointers, fill=False)




Place = tuple[Any, int]  # an array and its address


class _Bindings:
    """Where a body's inputs and outputs are during one execution of its step: fixed places,
    places that alternate with the iteration's parity (the two buffers of a carried value), and
    places that move every iteration (scan slices and elements, ``source.at(t)``). The C entries'
    pointer arrays are filled once per parity; an iteration rewrites only the moving slots."""

    def __init__(self, body: _Body, ins: list[Any], ext: dict[str, Any]) -> None:
        self.body = body
        self.places: list[dict[str, Place]] = [{}, {}]  # by parity
        self.moving: list[tuple[str, Any]] = []
        for k, name in body.by_input.items():
            self.fix(name, ins[k])
        if DYN_EXT in body.slots:  # C kernels of a body of symbolic shapes read the binding
            self.fix(DYN_EXT, ext[DYN_EXT])

    def fix(self, name: str, array: Any, addr: int | None = None) -> None:
        place = (array, data_address(array) if addr is None else addr)
        self.places[0][name] = self.places[1][name] = place

    def alternate(self, name: str, even: Place, odd: Place) -> None:
        self.places[0][name], self.places[1][name] = even, odd

    def move(self, name: str, source: Any) -> None:
        self.moving.append((name, source))

    def ready(self, region: _Region, parities: int = 2) -> None:
        """Fill the pointer arrays of ``parities`` parities (fresh ones per execution: runs may
        overlap); the arrays by name only where a partition other than C reads them."""
        body = self.body
        places = self.places[:parities]
        self.arrays = [{name: place[0] for name, place in p.items()} if body.needs_arrays else {}
                       for p in places]
        self.memories = []
        for p in places:
            memory = body.memory(region.arenas, region.addr)
            for name, place in p.items():
                for index, slot in body.slots.get(name, ()):
                    memory.pointers[index][slot] = place[1]
            self.memories.append(memory)
        self.moves = [(name, source, body.slots.get(name, [])) for name, source in self.moving]
        self.parts = body.parts

    def run(self, t: int, parity: int) -> None:
        memory, arrays = self.memories[parity], self.arrays[parity]
        pointers = memory.pointers
        for name, source, slots in self.moves:
            array, addr = source.at(t)
            arrays[name] = array
            for index, slot in slots:
                pointers[index][slot] = addr
        for _, part in self.parts:  # (run_all, inlined: once per iteration)
            part.run(memory, arrays)
        for _, source in self.moving:
            source.done(t)


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
        self.ins = [value_view(values[n], weights) if n is not None else None for n in step.inputs]
        self.outs = [value_view(values[n], weights) for n in step.outputs]
        self.bodies = [_Body(s, load) for s in schedules]
        self.offset = step.scratch.offset if step.scratch is not None else 0
        self.nbytes = step.scratch.nbytes if step.scratch is not None else 0
        if max(b.arena_nbytes for b in self.bodies) > self.nbytes:
            raise ArtifactError(f"plan.json step {step.name!r}: its schedules need more than its "
                                f"{self.nbytes} bytes of scratch")
        self.run = {"If": self._if, "Loop": self._loop, "Scan": self._scan}[step.op_type]
        # an If whose branch has only C partitions binds its pointers straight from the plan's
        # locations, into pointer arrays kept per thread (a run never re-enters its own step)
        ins = [_addresser(values[n], weights_addr) if n is not None else None for n in step.inputs]
        outs = [_addresser(values[n], weights_addr) for n in step.outputs]
        try:
            self.direct = [b.sources(ins, outs) if step.op_type == "If" else None for b in self.bodies]
        except ArtifactError as exc:
            raise ArtifactError(f"plan.json step {step.name!r}: {exc}") from None
        self.local = threading.local()
        try:
            _check_slots(step.op_type, step.attrs, self.bodies[0], self.nbytes)
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"plan.json step {step.name!r}: its slots in the region: {exc}") from None

    def _enter(self, arenas: dict[str, Any], ext: dict[str, Any]) -> tuple[list[Any], list[Any], _Region]:
        """The step's inputs and outputs (views) and its region."""
        ins = [v(arenas, ext) if v is not None else None for v in self.ins]
        outs = [v(arenas, ext) for v in self.outs]
        return ins, outs, _Region(arenas["host"][self.offset:self.offset + self.nbytes])

    def _if(self, arenas: dict[str, Any], ext: dict[str, Any]) -> None:
        cond = self.ins[0]
        assert cond is not None
        take = 0 if bool(cond(arenas, ext).reshape(-1)[0]) else 1
        direct = self.direct[take]
        if direct is None:
            self._if_bound(arenas, ext, take)
            return
        memories = getattr(self.local, "memories", None)
        if memories is None:  # (the branch's C partitions read no arena but the region)
            memories = self.local.memories = [b.memory({}, 0) for b in self.bodies]
        memory = memories[take]
        base = data_address(arenas["host"])
        pointers = memory.pointers
        for index, slot, address in direct:
            pointers[index][slot] = address(base, ext)
        memory.arena_addr = base + self.offset
        run_all(self.bodies[take].parts, memory, {})

    def _if_bound(self, arenas: dict[str, Any], ext: dict[str, Any], take: int) -> None:
        ins, outs, region = self._enter(arenas, ext)
        body = self.bodies[take]
        bound = _Bindings(body, ins, ext)
        for name, out in zip(body.outputs, outs, strict=True):
            bound.fix(name, out)
        bound.ready(region, 1)
        bound.run(0, 0)

    def _loop(self, arenas: dict[str, Any], ext: dict[str, Any]) -> None:
        ins, outs, region = self._enter(arenas, ext)
        body, attrs = self.bodies[0], self.attrs
        n = int(attrs["n_carried"])
        trips = None if ins[0] is None else int(ins[0].reshape(-1)[0])
        running = True if ins[1] is None else bool(ins[1].reshape(-1)[0])
        bound = _Bindings(body, ins, ext)
        iteration = None
        if attrs["iteration"] is not None:
            bound.fix(body.by_arg[0], *region.slot(attrs["iteration"], body.specs[body.by_arg[0]]))
            iteration = region.array[attrs["iteration"]:attrs["iteration"] + 8].view(np.int64)
        cond = region.slot(attrs["cond"], body.specs[body.outputs[0]])
        bound.fix(body.outputs[0], *cond)
        flag = cond[0].reshape(-1)
        carried = _Carried(region, attrs["carried"], ins[2:2 + n], body, 2, 1, bound)
        elements = [_Elements(out, 0, 0) for out in outs[n:]]
        for k, e in enumerate(elements):
            bound.move(body.outputs[1 + n + k], e)
        bound.ready(region)
        i = 0
        while running and (trips is None or i < trips):
            if iteration is not None:
                iteration[0] = i
            bound.run(i, i & 1)
            running = bool(flag[0])
            i += 1
        carried.finish(outs[:n], i & 1)
        for e in elements:
            e.check(i)

    def _scan(self, arenas: dict[str, Any], ext: dict[str, Any]) -> None:
        ins, outs, region = self._enter(arenas, ext)
        body, attrs = self.bodies[0], self.attrs
        n, length = int(attrs["n_states"]), int(attrs["length"])
        bound = _Bindings(body, ins, ext)
        states = _Carried(region, attrs["states"], ins[:n], body, 0, 0, bound)
        xs = ins[n:n + len(attrs["in_axes"])]
        for k, (x, axis, reverse, off) in enumerate(
                zip(xs, attrs["in_axes"], attrs["in_dirs"], attrs["slices"], strict=True)):
            name = body.by_arg.get(n + k)
            if name is not None:
                copy = region.slot(off, body.specs[name]) if off is not None else None
                bound.move(name, _Slices(x, axis, reverse, length, copy))
        for k, (out, axis, reverse, off) in enumerate(
                zip(outs[n:], attrs["out_axes"], attrs["out_dirs"], attrs["elements"], strict=True)):
            name = body.outputs[n + k]
            bound.move(name, _Elements(out, axis, reverse, region.slot(off, body.specs[name])
                                       if off is not None else None))
        bound.ready(region)
        for t in range(length):
            bound.run(t, t & 1)
        states.finish(outs[:n], length & 1)


def _check_slots(op_type: str, attrs: Any, body: _Body, nbytes: int) -> None:
    """ValueError (or KeyError / TypeError) unless a loop step's slots lie in its region."""
    if op_type == "If":
        return
    slots: list[tuple[Any, str | None]] = []  # (offset, the name whose spec sizes it)
    if op_type == "Loop":
        n = attrs["n_carried"]
        slots += [(attrs["iteration"], body.by_arg.get(0)), (attrs["cond"], body.outputs[0])]
        slots += [(off, body.outputs[1 + k]) for k in range(n) for off in attrs["carried"][k]]
    else:
        n = attrs["n_states"]
        slots += [(off, body.outputs[k]) for k in range(n) for off in attrs["states"][k]]
        slots += [(off, body.by_arg.get(n + k)) for k, off in enumerate(attrs["slices"])]
        slots += [(off, body.outputs[n + k]) for k, off in enumerate(attrs["elements"])]
    for offset, name in slots:
        if offset is None or name is None:
            continue
        dtype, shape = body.specs[name]
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if not isinstance(offset, int) or offset < 0 or offset + size > nbytes:
            raise ValueError(f"{name!r} at {offset!r} does not fit the {nbytes} bytes")


class _Region:
    """A control step's scratch region: the bodies' arena, then the step's slots."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array
        self.addr = data_address(array)
        self.arenas = {"host": array}

    def slot(self, offset: int, spec: tuple[np.dtype, tuple[int, ...]]) -> Place:
        return _slot(self.array, offset, *spec), self.addr + offset


class _Carried:
    """Carried values (states) in two buffers each: in an iteration of parity p the body reads
    buffer p and writes the other, so after i iterations the values are in buffer i % 2."""

    def __init__(self, region: _Region, offsets: list[list[int]], initial: list[Any], body: _Body,
                 first_arg: int, first_out: int, bound: _Bindings) -> None:
        self.pairs = []
        for k, ((a, b), value) in enumerate(zip(offsets, initial, strict=True)):
            name_in, name_out = body.by_arg.get(first_arg + k), body.outputs[first_out + k]
            pair = (region.slot(a, body.specs[name_out]), region.slot(b, body.specs[name_out]))
            np.copyto(pair[0][0], value)
            if name_in is not None:
                bound.alternate(name_in, pair[0], pair[1])
            bound.alternate(name_out, pair[1], pair[0])
            self.pairs.append(pair)

    def finish(self, outs: list[Any], parity: int) -> None:
        for out, pair in zip(outs, self.pairs, strict=True):
            np.copyto(out, pair[parity][0])


class _Slices:
    """A Scan input's slice per iteration: a view where it is contiguous (axis 0), else a copy
    into its slot in the region."""

    def __init__(self, x: Any, axis: int, reverse: int, length: int, copy: Place | None) -> None:
        self.moved, self.reverse, self.copy = np.moveaxis(x, axis, 0), bool(reverse), copy
        self.length = length

    def at(self, t: int) -> Place:
        view = self.moved[self.length - 1 - t if self.reverse else t]
        if self.copy is None:
            return view, data_address(view)
        np.copyto(self.copy[0], view)
        return self.copy

    def done(self, t: int) -> None:
        pass


class _Elements:
    """A scan output's element per iteration: written in place where contiguous (axis 0), else
    into its slot in the region and copied out after the iteration."""

    def __init__(self, out: Any, axis: int, reverse: int, copy: Place | None = None) -> None:
        self.moved, self.reverse, self.copy = np.moveaxis(out, axis, 0), bool(reverse), copy
        self.length = self.moved.shape[0]

    def _index(self, t: int) -> int:
        return self.length - 1 - t if self.reverse else t

    def at(self, t: int) -> Place:
        if t >= self.length:
            raise RuntimeKernelError(f"more iterations than the {self.length} its scan outputs were "
                                     f"compiled for")
        if self.copy is not None:
            return self.copy
        view = self.moved[self._index(t)]
        return view, data_address(view)

    def done(self, t: int) -> None:
        if self.copy is not None:
            self.moved[self._index(t)] = self.copy[0]

    def check(self, ran: int) -> None:
        if ran != self.length:
            raise RuntimeKernelError(f"ran {ran} iterations, but its scan outputs were compiled for "
                                     f"{self.length}")


class ControlPartition:
    """A partition of compiled control steps, prepared once at load."""

    def __init__(self, plan: Any, record: PlanPartition, load: Loader, weights: np.ndarray,
                 weights_addr: int) -> None:
        self.steps = [_Step(step, plan.values, load, weights, weights_addr)
                      for step in plan.partition_steps(record)]

    def run(self, arenas: dict[str, Any], ext: dict[str, Any], timings: np.ndarray | None = None) -> None:
        for local, step in enumerate(self.steps):
            t0 = time.perf_counter() if timings is not None else 0.0
            try:
                step.run(arenas, ext)
            except IndexRangeError:  # a body's node, already named
                raise
            except Exception as exc:
                raise RuntimeKernelError(f"step {step.name!r} ({step.op_type}) failed: {exc}") from exc
            if timings is not None:
                timings[local] = time.perf_counter() - t0
