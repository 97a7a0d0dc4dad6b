"""Run a compiled artifact's CUDA kernels on the host, step by step, against the reference kernels.

``reverse=True`` runs blocks and threads in descending order; ``isolate=False`` leaves every
pointer in the plan's arena (see ``_Isolation`` for what isolation adds).

``HostRun(artifact_dir).run(feeds)`` walks plan.json (a dynamic one bound at the feeds' shapes)
in order with every memory space's arena and weights.bin in host memory (``HostBuffer``: guard
pages on both sides; weights read-only):

- a CUDA partition becomes the runtime's own program (``runtime.providers.cuda_program``:
  launches with their bound argument tuples, and byte copies for transfers);
- every other step (reference or C partitions) runs its reference kernel on numpy.

Each CUDA step with launches is checked on its own: its inputs are read as the earlier steps left
them, its reference kernel (``runtime.kernels``) computes the expected outputs, then

1. every arena byte that is not in a buffer already live before the step is filled with 0xff
   (NaN as float32): a kernel that reads what nobody wrote, or leaves part of its output
   unwritten, shows NaN;
2. its launches run through ``HostModule`` (a failed barrier, warp mask or memory access is a
   ``HostKernelError``);
3. its outputs are compared with the expected ones (bit-exact for kernels that only move bytes,
   else within ``RTOL`` of each element plus ``ATOL`` of the output's largest magnitude), and
   every arena byte outside its outputs and scratch must be as it was (no stray writes).

A step that fails gets the expected outputs written in, so later steps are checked on correct
inputs; ``StepCheck`` records each step's verdict, kernels and largest error.
"""

from __future__ import annotations

import ctypes
import mmap
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtime.artifact import load_artifact
from runtime.kernels import get_kernel
from runtime.plan_schema import Plan
from runtime.plan_schema import PlanStep
from runtime.plan_schema import PlanValue
from runtime.providers.cuda_program import Copy
from runtime.providers.cuda_program import Launch
from runtime.providers.cuda_program import Place
from runtime.providers.cuda_program import bind
from runtime.providers.cuda_program import parse_steps
from tests.support.cuda_host.build import HostBuffer
from tests.support.cuda_host.build import HostKernelError
from tests.support.cuda_host.build import HostModule

__all__ = ["StepCheck", "HostRun", "compare", "RTOL", "ATOL", "EXACT_KINDS"]

RTOL = 1e-4
ATOL = 1e-5
EXACT_KINDS = frozenset({"Transpose", "Concat", "Reshape", "Identity", "Flatten", "Squeeze", "Unsqueeze",
                         "onnx_aot.Copy"})
TRANSFER = "onnx_aot.Transfer"
POISON = 0xFF
PAGE = mmap.PAGESIZE


@dataclass(frozen=True)
class StepCheck:
    """The verdict on one CUDA step: its plan index, name, op and kernels, and the largest error."""

    index: int
    name: str
    op_type: str
    kernels: tuple[str, ...]
    ok: bool
    max_error: float
    detail: str  # "" when ok
    kernel_s: float = 0.0  # seconds in the host launches
    reference_s: float = 0.0  # seconds in the reference kernel
    device_error: float | None = None  # largest |host - GPU| when a DeviceMirror ran the step too

    def describe(self) -> str:
        verdict = "ok" if self.ok else f"MISMATCH: {self.detail}"
        return (f"step {self.index} {self.name!r} ({self.op_type}, kernel {', '.join(self.kernels)}): "
                f"max error {self.max_error:.3g} {verdict}")


def compare(got: np.ndarray, want: np.ndarray, exact: bool) -> tuple[float, str]:
    """The largest error of ``got`` against ``want`` and "" or what is wrong."""
    if got.shape != want.shape:
        return float("inf"), f"shape {got.shape} != {want.shape}"
    if exact or got.dtype.kind not in "fc":
        bad = got.view(np.uint8).reshape(got.shape + (-1,)) != want.view(np.uint8).reshape(want.shape + (-1,))
        if not bad.any():
            return 0.0, ""
        where = np.argwhere(bad.any(axis=-1))
        first = tuple(int(i) for i in where[0])
        err = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
        return err, f"{len(where)} element(s) differ, first at {first}: {got[first]!r} != {want[first]!r}"
    with np.errstate(all="ignore"):
        return _compare_floats(got, want)


def _compare_floats(got: np.ndarray, want: np.ndarray) -> tuple[float, str]:
    g, w = got.astype(np.float64), want.astype(np.float64)
    nan_g, nan_w = np.isnan(g), np.isnan(w)
    finite = np.isfinite(w)
    scale = float(np.max(np.abs(w[finite]))) if finite.any() else 0.0
    diff = np.where(nan_g | nan_w, 0.0, np.abs(g - w))
    diff = np.where(np.isinf(w) & (g == w), 0.0, diff)
    limit = RTOL * np.abs(np.where(finite, w, 0.0)) + ATOL * max(scale, 1.0)
    bad = (nan_g != nan_w) | (diff > limit) | (np.isinf(w) & (g != w) & ~nan_w)
    err = float(np.max(diff)) if diff.size else 0.0
    if nan_g.any() and not nan_w.any():
        err = float("nan")
    if not bad.any():
        return err, ""
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    return err, (f"{int(bad.sum())} of {bad.size} element(s) off (scale {scale:.3g}), first at {first}: "
                 f"{got[first]!r} != {want[first]!r}")


class HostRun:
    """One artifact's plan on host memory, its CUDA kernels from ``HostModule``."""

    def __init__(self, artifact_dir: str | Path, module: HostModule | None = None, *,
                 isolate: bool = True, reverse: bool = False, device: bool = False) -> None:
        self.isolate = isolate
        self.artifact = load_artifact(artifact_dir)
        self.plan: Plan = self.artifact.plan
        self.arrays: Mapping[str, np.ndarray] = {}  # a bound dynamic plan's symbolic values
        cuda = [p for p in self.plan.partitions if p.provider == "cuda"]
        if module is None and cuda:
            record = cuda[0].module
            assert record is not None
            module = HostModule((Path(artifact_dir) / record.source).read_text(), reverse=reverse)
        self.module = module
        self.mirror = None
        if device:  # the same launches on a GPU as well (tests/support/cuda_host/device.py)
            from tests.support.cuda_host.device import DeviceMirror

            self.mirror = DeviceMirror(self.artifact)

    def bind(self, feeds: Mapping[str, np.ndarray]) -> dict[str, int]:
        """A dynamic artifact's plan at the binding the feeds' shapes give (``self.plan`` becomes
        the bound plan: grids, run-time dims and arena offsets of that binding); {} for a static one."""
        plan = self.artifact.plan
        if not plan.is_dynamic:
            return {}
        sizes = {str(d): int(feeds[spec.name].shape[k]) for spec in plan.inputs
                 for k, d in enumerate(spec.shape) if type(d) is not int}
        bound = plan.bind(sizes)
        self.plan, self.arrays = bound.plan, bound.arrays
        return sizes

    def run(self, feeds: Mapping[str, np.ndarray], *, stop_at_first: bool = False) -> list[StepCheck]:
        """Every step in plan order; the checks of the CUDA steps (all, or up to the first failure).
        A dynamic plan runs at the binding the feeds' shapes give (``bind``)."""
        self.bind(feeds)
        buffers = _Memory(self.plan, self.artifact.weights, self.module, self.arrays)
        try:
            ext: dict[str, Any] = {k: np.ascontiguousarray(v) for k, v in feeds.items()}
            for out in self.plan.outputs:
                ext[out.value] = np.empty(out.spec.shape, out.spec.dtype)
            checks: list[StepCheck] = []
            for part in self.plan.partitions:
                steps = self.plan.partition_steps(part)
                if part.provider != "cuda":
                    for step in steps:
                        _reference_step(step, self.plan, buffers, ext)
                    continue
                program = parse_steps(self.plan, part, int(self.artifact.weights.size), buffers.weights_addr)
                by_step: dict[str, list[Launch | Copy]] = {}
                for op in program:
                    by_step.setdefault(op.step, []).append(op)
                for step in steps:
                    ops = by_step.get(step.name, [])
                    if step.launches:
                        checks.append(self._checked(step, ops, buffers, ext))
                        if stop_at_first and not checks[-1].ok:
                            return checks
                    else:
                        for op in ops:
                            assert isinstance(op, Copy)
                            buffers.copy(op, ext)
            self.outputs = {out.spec.name: ext[out.value].copy() for out in self.plan.outputs}
            return checks
        finally:
            buffers.free()

    def _checked(self, step: PlanStep, ops: list[Launch | Copy], mem: _Memory,
                 ext: dict[str, Any]) -> StepCheck:
        plan = self.plan
        kernels = tuple(dict.fromkeys(op.kernel for op in ops if isinstance(op, Launch)))
        inputs = [mem.view(plan.values[n], ext).copy() if n is not None else None for n in step.inputs]
        specs = [(plan.values[n].shape, plan.values[n].dtype) for n in step.outputs]
        t0 = time.perf_counter()
        try:
            with np.errstate(all="ignore"):
                expected = [np.asarray(r) for r in get_kernel(step.kind)(np, inputs, dict(step.attrs), specs)]
        except Exception as exc:  # the checker cannot judge this step
            return StepCheck(step.index, step.name, step.op_type, kernels, False, float("nan"),
                             f"reference kernel failed: {exc}")
        t1 = time.perf_counter()
        mem.poison(step.index)
        before = mem.arena("cuda").copy()
        args = [bind(op, mem.arena_addr("cuda")) for op in ops if isinstance(op, Launch)]
        iso = _Isolation.make(self.module, step, mem) if self.isolate and self.module is not None else None
        if iso is not None:
            args = iso.relocate(step, args)
        t2 = time.perf_counter()
        detail, err = "", 0.0
        try:
            for op, op_args in zip(ops, args, strict=True):
                assert isinstance(op, Launch) and self.module is not None
                self.module.launch(op.kernel, op.grid, op.block, op.shared, op_args)
        except HostKernelError as exc:
            detail, err = str(exc), float("nan")
            if iso is not None:
                detail += iso.locate(detail)
        finally:
            if iso is not None:
                detail = detail or iso.finish(mem)
        t3 = time.perf_counter()
        device_error = None
        if self.mirror is not None and not detail:
            device_error, detail = self._against_device(step, before, mem, ext)
        if not detail:
            for name, want in zip(step.outputs, expected, strict=True):
                got = mem.view(plan.values[name], ext)
                e, what = compare(got, want.astype(got.dtype).reshape(got.shape), step.kind in EXACT_KINDS)
                err = e if np.isnan(e) or e > err else err
                if what and not detail:
                    detail = f"output {name!r}: {what}"
        if not detail:
            detail = mem.stray_writes(before, step)
        if detail:
            for name, want in zip(step.outputs, expected, strict=True):
                got = mem.view(plan.values[name], ext)
                got[...] = want.astype(got.dtype).reshape(got.shape)
        return StepCheck(step.index, step.name, step.op_type, kernels, not detail, err, detail, t3 - t2,
                         t1 - t0, device_error)

    def _against_device(self, step: PlanStep, before: np.ndarray, mem: _Memory,
                        ext: dict[str, Any]) -> tuple[float, str]:
        """The largest |host - GPU| over the step's outputs, and "" or where they differ."""
        assert self.mirror is not None
        worst, detail = 0.0, ""
        for name, gpu in zip(step.outputs, self.mirror.run_step(step, before), strict=True):
            err, what = compare(mem.view(self.plan.values[name], ext), gpu, step.kind in EXACT_KINDS)
            worst = err if np.isnan(err) or err > worst else worst
            if what and not detail:
                detail = f"host and GPU differ on output {name!r}: {what}"
        return worst, detail


def _reference_step(step: PlanStep, plan: Plan, mem: _Memory, ext: dict[str, Any]) -> None:
    ins = [mem.view(plan.values[n], ext) if n is not None else None for n in step.inputs]
    if step.kind == TRANSFER:
        results = [ins[0]]
    else:
        specs = [(plan.values[n].shape, plan.values[n].dtype) for n in step.outputs]
        results = get_kernel(step.kind)(np, ins, dict(step.attrs), specs)
    for name, result in zip(step.outputs, results, strict=True):
        target = mem.view(plan.values[name], ext)
        np.copyto(target, np.asarray(result).reshape(target.shape), casting="unsafe")


class _Memory:
    """The arenas and weights of one run, in guarded host memory."""

    def __init__(self, plan: Plan, weights: np.ndarray, module: HostModule | None,
                 arrays: Mapping[str, np.ndarray]) -> None:
        self.plan = plan
        self.symbolic = arrays
        self._owned: list[HostBuffer] = []
        self.arenas: dict[str, np.ndarray] = {}
        self._addr: dict[str, int] = {}
        for arena in plan.arenas:
            space = arena.memory_space
            self.arenas[space], self._addr[space] = self._alloc(module, arena.nbytes)
        self.weights, self.weights_addr = self._alloc(module, int(weights.size))
        self.weights[: weights.size] = weights
        if self._owned:
            self._owned[-1].read_only()
        self.weights = self.weights[: weights.size]

    def _alloc(self, module: HostModule | None, nbytes: int) -> tuple[np.ndarray, int]:
        if module is None:
            array = np.zeros(max(nbytes, 1), np.uint8)
            return array, int(array.ctypes.data)
        buf = module.alloc(nbytes)
        self._owned.append(buf)
        buf.array[...] = POISON
        return buf.array, buf.address

    def free(self) -> None:
        for buf in self._owned:
            buf.free()
        self._owned.clear()

    def arena(self, space: str) -> np.ndarray:
        return self.arenas[space]

    def arena_addr(self, space: str) -> int:
        return self._addr.get(space, 0)

    def region(self, key: tuple[str, int], nbytes: int) -> np.ndarray:
        """The bytes at (kind "arena" / "weights", offset) of the device memory."""
        source = self.weights if key[0] == "weights" else self.arenas["cuda"]
        return source[key[1]:key[1] + nbytes]

    def view(self, value: PlanValue, ext: Mapping[str, Any]) -> np.ndarray:
        where = value.location
        if where.kind == "ext":
            return ext[where.ext].reshape(value.shape)
        if where.kind == "symbolic":
            return self.symbolic[value.name]
        if where.kind == "weights":
            raw = self.weights[where.offset:where.offset + value.nbytes]
        else:
            raw = self.arenas[where.space][where.offset:where.offset + value.nbytes]
        return raw.view(value.dtype).reshape(value.shape)

    def _place(self, place: Place, ext: Mapping[str, Any]) -> np.ndarray:
        if place.kind == "ext":
            return np.ascontiguousarray(ext[str(place.where)]).reshape(-1).view(np.uint8)
        offset = int(place.where)
        source = self.weights if place.kind == "weights" else self.arenas[place.space]
        return source[offset:offset + place.nbytes]

    def copy(self, op: Copy, ext: Mapping[str, Any]) -> None:
        if op.nbytes:
            dst = self._place(op.dst, ext)
            if op.dst.kind == "ext":
                ext[str(op.dst.where)].reshape(-1).view(np.uint8)[...] = self._place(op.src, ext)
            else:
                dst[...] = self._place(op.src, ext)

    def _live_before(self, index: int) -> list[tuple[int, int]]:
        return [(b.offset, b.offset + b.nbytes) for b in self.plan.buffers
                if b.arena == "cuda" and b.first_step < index <= b.last_step]

    def poison(self, index: int) -> None:
        """Fill the device arena's bytes that hold nothing live before step ``index``."""
        arena = self.arenas.get("cuda")
        if arena is None:
            return
        keep = np.zeros(arena.size, bool)
        for lo, hi in self._live_before(index):
            keep[lo:hi] = True
        arena[~keep] = POISON

    def stray_writes(self, before: np.ndarray, step: PlanStep) -> str:
        """"" or where the step changed device arena bytes outside its outputs and scratch."""
        arena = self.arenas["cuda"]
        changed = before != arena
        for name in step.outputs:
            where = self.plan.values[name].location
            if where.kind == "arena":
                changed[where.offset:where.offset + self.plan.values[name].nbytes] = False
        if step.scratch is not None:
            changed[step.scratch.offset:step.scratch.offset + step.scratch.nbytes] = False
        if not changed.any():
            return ""
        at = np.flatnonzero(changed)
        return (f"wrote {at.size} byte(s) outside its outputs and scratch (device arena bytes "
                f"{at[0]}..{at[-1]})")


class _Isolation:
    """A step's pointer arguments, each copied into its own guarded buffer that ends exactly where
    the operand ends (a read one element past it faults) over 0xff slack (a write before it shows);
    after the launches the outputs are copied back and the inputs must be unchanged."""

    def __init__(self, operands: dict[tuple[str, int], tuple[int, bool, int]],
                 buffers: dict[tuple[str, int], HostBuffer], names: dict[tuple[str, int], str]) -> None:
        self.operands = operands
        self.buffers = buffers
        self.names = names

    def locate(self, error: str) -> str:
        """For a memory fault: which operand's guard page the address is in."""
        found = re.search(r"at address (0x[0-9a-f]+)", error)
        if found is None:
            return ""
        address = int(found.group(1), 16)
        for key, buf in self.buffers.items():
            end = buf.address + self.operands[key][0]
            if end <= address < end + PAGE:
                return f" ({address - end} bytes past the end of {self.names[key]})"
            start = buf.address - buf.address % PAGE
            if start - PAGE <= address < start:
                return f" ({buf.address - address} bytes before the start of {self.names[key]})"
        return ""

    @classmethod
    def make(cls, module: HostModule, step: PlanStep, mem: _Memory) -> _Isolation | None:
        """None when a pointer is not at one of the step's operands or two operands overlap."""
        operands: dict[tuple[str, int], tuple[int, bool, int]] = {}  # key -> nbytes, written, itemsize
        names = [(n, False) for n in step.inputs if n is not None] + [(n, True) for n in step.outputs]
        described: dict[tuple[str, int], str] = {}
        for name, written in names:
            value = mem.plan.values[name]
            where = value.location
            if where.kind in ("arena", "weights"):
                role = "output" if written else "input"
                described.setdefault((where.kind, where.offset), f"{role} {name!r}")
                old = operands.get((where.kind, where.offset), (0, False, 1))
                operands[(where.kind, where.offset)] = (max(old[0], value.nbytes), old[1] or written,
                                                        max(old[2], value.dtype.itemsize))
        used = {(a.base, int(a.value)) for launch in step.launches or () for a in launch.args
                if a.kind == "ptr"}
        if not used <= set(operands):
            return None
        spans = sorted((k[0], k[1], k[1] + operands[k][0]) for k in used)
        if any(a[0] == b[0] and a[2] > b[1] for a, b in zip(spans, spans[1:], strict=False)):
            return None
        buffers: dict[tuple[str, int], HostBuffer] = {}
        for key in sorted(used):
            nbytes, _, itemsize = operands[key]
            buf = buffers[key] = module.alloc(nbytes, itemsize)
            buf.array[...] = mem.region(key, nbytes)
            ctypes.memset(buf.address - buf.address % PAGE, POISON, buf.address % PAGE)
        return cls(operands, buffers, described)

    def relocate(self, step: PlanStep, args: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        out = []
        for launch, bound in zip(step.launches or (), args, strict=True):
            moved = list(bound)
            for j, arg in enumerate(launch.args):
                if arg.kind == "ptr":
                    moved[j] = np.uint64(self.buffers[(arg.base, int(arg.value))].address)
            out.append(tuple(moved))
        return out

    def finish(self, mem: _Memory) -> str:
        """Copy the outputs back and free; "" or what the launches wrote where they must not."""
        problem = ""
        for key, buf in self.buffers.items():
            nbytes, written, _ = self.operands[key]
            region = mem.region(key, nbytes)
            slack = ctypes.string_at(buf.address - buf.address % PAGE, buf.address % PAGE)
            if slack.strip(bytes([POISON])) and not problem:
                problem = f"wrote below the start of its operand at {key[0]} offset {key[1]}"
            if written:
                region[...] = buf.array
            elif not np.array_equal(buf.array, region) and not problem:
                problem = f"wrote into its input at {key[0]} offset {key[1]}"
            buf.free()
        return problem
