"""The CUDA execution provider, run side: the "cuda" memory space and CUDA partitions, on cupy.

cupy is imported lazily, on first use: ``memory_space("cuda")`` imports this module and makes a
``CudaSpace`` (through the factory ``runtime/__init__.py`` registers), so a CPU-only deployment
never needs cupy, and using the space without cupy or without a device raises ``ArtifactError``
with the install hint.

A ``CudaPartition`` is prepared once at load (a dynamic plan's once per binding, from the bound
plan: its launches' grids, run-time dims and arena offsets evaluated by ``runtime/binding.py``; the
module is loaded once per artifact): the module (cubin, PTX or NVRTC: the choice in
``cuda_module.py``, the loading in ``cuda_load.py``) is loaded, every launch of every step is
parsed (``cuda_program.py``) into a kernel handle and an argument template whose weights pointers
are resolved and whose arena pointers are offsets. A run
binds the templates to the run context's device arena (once per arena address, then cached) and
launches them in plan order on the caller's current cupy stream, so reference kernels running on
cupy in the same space stay ordered with them. Transfer steps copy bytes with ``cudaMemcpyAsync``
between the caller's numpy arrays / the host arena / weights and the device arena; a copy to the
host synchronizes before the host reads it.

CUDA graphs: ``CudaPartition(..., capture=True)`` captures each maximal run of launches (the
copies between them involve pageable host memory and the caller's arrays, so they stay eager) on a
private stream the first time it runs with a given device arena, and replays the graphs on later
runs with that arena; the private stream is ordered after and before the caller's stream with
events. ``Session(path, cuda_graph=True)`` only has to pass ``capture=cuda_graph`` when it builds
its CUDA partitions; its pooled run contexts keep their arenas, so each context captures once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from runtime.artifact import Artifact
from runtime.errors import ArtifactError
from runtime.errors import RuntimeKernelError
from runtime.plan_schema import CudaModule
from runtime.plan_schema import Plan
from runtime.plan_schema import PlanPartition
from runtime.providers.cuda_load import LoadedModule
from runtime.providers.cuda_load import load_module
from runtime.providers.cuda_program import D2H
from runtime.providers.cuda_program import Copy
from runtime.providers.cuda_program import Launch
from runtime.providers.cuda_program import Place
from runtime.providers.cuda_program import bind
from runtime.providers.cuda_program import parse_steps
from runtime.providers.cuda_program import uses_device_arena

__all__ = ["INSTALL_HINT", "CudaSpace", "CudaPartition", "cupy_or_error", "cuda_available"]

INSTALL_HINT = "this artifact needs CUDA: install onnx-aot[cuda] (cupy-cuda12x) or [cuda13]"

MEMCPY_DEFAULT = 4  # cudaMemcpyDefault
_MAX_BOUND = 16  # run contexts whose bound arguments / graphs are kept per partition

_CUPY: Any = None
_LOCK = threading.Lock()


def cupy_or_error() -> Any:
    """The cupy module, once a CUDA device is known to be usable; else ``ArtifactError``."""
    global _CUPY
    if _CUPY is not None:
        return _CUPY
    with _LOCK:
        if _CUPY is None:
            try:
                import cupy  # type: ignore[import-not-found]
            except Exception as exc:  # ImportError, or a broken CUDA library underneath
                raise ArtifactError(f"{INSTALL_HINT} (cupy is not importable: {exc})") from None
            try:
                count = int(cupy.cuda.runtime.getDeviceCount())
            except Exception as exc:
                raise ArtifactError(f"{INSTALL_HINT} (no usable CUDA device: {exc})") from None
            if count < 1:
                raise ArtifactError(f"{INSTALL_HINT} (no CUDA device is visible)")
            _CUPY = cupy
    return _CUPY


def cuda_available() -> bool:
    try:
        cupy_or_error()
    except ArtifactError:
        return False
    return True


class CudaSpace:
    """Device memory through cupy: one allocation per arena, weights.bin uploaded once."""

    name = "cuda"

    @property
    def xp(self) -> Any:
        return cupy_or_error()

    @xp.setter
    def xp(self, module: Any) -> None:  # the MemorySpace protocol declares xp a plain attribute
        raise AttributeError("the cuda space's array module is always cupy")

    def check(self) -> None:
        """Raise ``ArtifactError`` with the install hint when cupy or a device is missing."""
        cupy_or_error()

    def allocate(self, nbytes: int, alignment: int) -> Any:
        cp = cupy_or_error()
        alignment = max(int(alignment), 1)
        # cupy's pool already aligns to 256+ bytes; the slack makes any alignment safe regardless
        raw = cp.empty(nbytes + alignment, dtype=cp.uint8)
        start = (-int(raw.data.ptr)) % alignment
        return raw[start:start + nbytes]

    def upload(self, weights: np.ndarray) -> Any:
        cp = cupy_or_error()
        return cp.asarray(np.ascontiguousarray(weights).view(np.uint8).reshape(-1))

    def from_host(self, array: np.ndarray) -> Any:
        return cupy_or_error().asarray(array)

    def to_host(self, array: Any) -> np.ndarray:
        if isinstance(array, np.ndarray):
            return array
        return cupy_or_error().asnumpy(array)



def _module(cp: Any, artifact: Artifact, module: CudaModule, names: list[str]) -> LoadedModule:
    """``load_module``; for a dynamic plan once per artifact, module and kernel set (its partitions
    are made again at each new binding, with the same kernels)."""
    if not artifact.plan.is_dynamic:
        return load_module(cp, artifact, module, names)
    cache: dict[Any, LoadedModule] = vars(artifact).setdefault("_cuda_modules", {})
    key = (module.source, tuple(names))
    with _LOCK:
        loaded = cache.get(key)
    if loaded is None:
        loaded = load_module(cp, artifact, module, names)
        with _LOCK:
            loaded = cache.setdefault(key, loaded)
    return loaded


# -- the partition --------------------------------------------------------------------------------
class CudaPartition:
    """One CUDA partition, prepared once at load; ``run(arenas, ext)`` launches it.

    ``capture=True`` replays the partition's launches as CUDA graphs (see the module docstring).
    ``module_source`` says which binary was loaded: "cubin", "ptx" or "nvrtc".
    """

    def __init__(self, artifact: Artifact, record: PlanPartition, device_weights: Any, *,
                 capture: bool = False, plan: Plan | None = None) -> None:
        self._cp = cp = cupy_or_error()
        self.index = record.index
        self.capture = capture
        self._weights = device_weights  # keeps the device copy alive while graphs point into it
        self._host_weights = artifact.weights
        self._host_weights_addr = int(artifact.weights.ctypes.data) if artifact.weights.size else 0
        weights_addr = int(device_weights.data.ptr) if int(device_weights.size) else 0
        plan = plan if plan is not None else artifact.plan  # a dynamic plan's: bound at one binding
        self.program = parse_steps(plan, record, int(artifact.weights.size), weights_addr)
        steps = plan.partition_steps(record)
        self._step_local = {step.name: local for local, step in enumerate(steps)}
        self._uses_arena = any(uses_device_arena(op) for op in self.program)
        names = sorted({op.kernel for op in self.program if isinstance(op, Launch)})
        assert record.module is not None  # the schema requires a CUDA partition's module
        self.module: LoadedModule = _module(cp, artifact, record.module, names)
        self.module_source = self.module.source
        functions = self.module.functions
        for op in self.program:
            if isinstance(op, Launch):
                threads = op.block[0] * op.block[1] * op.block[2]
                limit = int(functions[op.kernel].max_threads_per_block)
                if threads > limit:
                    raise ArtifactError(f"plan.json: step {op.step!r}: kernel {op.kernel!r} launched with "
                                        f"{threads} threads per block; it allows {limit}")
        for name in names:
            shared = max(op.shared for op in self.program if isinstance(op, Launch) and op.kernel == name)
            if shared > 48 * 1024:
                functions[name].max_dynamic_shared_size_bytes = shared
        self._functions: list[Any] = [functions[op.kernel] if isinstance(op, Launch) else None
                                      for op in self.program]
        self._bound: dict[int, list[tuple[Any, ...] | None]] = {}
        self._graphs: dict[int, list[Any]] = {}
        self._segments = self._split()
        self._stream: Any = cp.cuda.Stream(non_blocking=True) if capture else None
        self._lock = threading.Lock()

    def _split(self) -> list[tuple[str, list[int]]]:
        """Maximal runs of launches ("graph", indices) and single copies ("copy", [index])."""
        segments: list[tuple[str, list[int]]] = []
        for i, op in enumerate(self.program):
            if isinstance(op, Launch):
                if segments and segments[-1][0] == "graph":
                    segments[-1][1].append(i)
                else:
                    segments.append(("graph", [i]))
            else:
                segments.append(("copy", [i]))
        return segments

    @property
    def graphs_captured(self) -> int:
        return len(self._graphs)

    # -- running ------------------------------------------------------------------------------
    def _arguments(self, base: int) -> list[tuple[Any, ...] | None]:
        bound = self._bound.get(base)
        if bound is None:
            bound = [bind(op, base) if isinstance(op, Launch) else None for op in self.program]
            with self._lock:
                if len(self._bound) >= _MAX_BOUND:
                    self._bound.pop(next(iter(self._bound)))
                self._bound[base] = bound
        return bound

    def _address(self, place: Place, arenas: dict[str, Any], ext: dict[str, np.ndarray]) -> int:
        if place.kind == "ext":
            array = ext[str(place.where)]
            if int(array.nbytes) != place.nbytes or not array.flags.c_contiguous:
                raise RuntimeKernelError(f"value {place.where!r}: expected a contiguous array "
                                         f"of {place.nbytes} bytes")
            if isinstance(array, np.ndarray):
                return int(array.ctypes.data)
            if isinstance(array, self._cp.ndarray):  # a device array bound with IOBinding
                return int(array.data.ptr)
            raise RuntimeKernelError(f"value {place.where!r}: expected a numpy or cupy array")
        offset = int(place.where)
        if place.kind == "weights":
            if place.space == "cuda":
                return int(self._weights.data.ptr) + offset
            return self._host_weights_addr + offset
        arena = arenas[place.space]
        return (int(arena.ctypes.data) if place.space == "host" else int(arena.data.ptr)) + offset

    def _copy(self, op: Copy, arenas: dict[str, Any], ext: dict[str, np.ndarray], stream: Any) -> None:
        if op.nbytes == 0:
            return
        src, dst = self._address(op.src, arenas, ext), self._address(op.dst, arenas, ext)
        kind = op.kind
        if (op.src.kind == "ext" and not isinstance(ext[str(op.src.where)], np.ndarray)) or \
                (op.dst.kind == "ext" and not isinstance(ext[str(op.dst.where)], np.ndarray)):
            kind = MEMCPY_DEFAULT  # a caller's device array: the driver infers the direction (UVA)
        self._cp.cuda.runtime.memcpyAsync(dst, src, op.nbytes, kind, stream.ptr)
        if op.kind == D2H:
            stream.synchronize()  # the host may read it as soon as this partition returns

    def run(self, arenas: dict[str, Any], ext: dict[str, np.ndarray],
            timings: np.ndarray | None = None) -> None:
        """Launch the partition; with ``timings`` (float64, one per step) run eagerly (no graph
        replay) with an event pair around each launch or copy and store each step's device time."""
        base = int(arenas["cuda"].data.ptr) if self._uses_arena else 0
        args = self._arguments(base)
        if timings is not None:
            self._run_timed(args, arenas, ext, timings)
            return
        if self.capture:
            self._replay(base, args, arenas, ext)
            return
        self._run_eager(args, arenas, ext, self._cp.cuda.get_current_stream())

    def _run_eager(self, args: list[tuple[Any, ...] | None], arenas: dict[str, Any],
                   ext: dict[str, np.ndarray], stream: Any,
                   after: Callable[[int], None] | None = None) -> None:
        """Launch or copy each op in order on ``stream``, calling ``after(i)`` behind op ``i``."""
        i = 0
        try:
            for i, op in enumerate(self.program):
                if isinstance(op, Launch):
                    self._functions[i](op.grid, op.block, args[i], shared_mem=op.shared)
                else:
                    self._copy(op, arenas, ext, stream)
                if after is not None:
                    after(i)
        except Exception as exc:
            raise self._failure(i, exc) from exc

    def _run_timed(self, args: list[tuple[Any, ...] | None], arenas: dict[str, Any],
                   ext: dict[str, np.ndarray], timings: np.ndarray) -> None:
        cp = self._cp
        stream = cp.cuda.get_current_stream()
        events = [cp.cuda.Event() for _ in range(len(self.program) + 1)]
        events[0].record(stream)
        self._run_eager(args, arenas, ext, stream, lambda i: events[i + 1].record(stream))
        events[-1].synchronize()
        for i, op in enumerate(self.program):
            local = self._step_local.get(op.step)
            if local is not None and local < len(timings):
                timings[local] += cp.cuda.get_elapsed_time(events[i], events[i + 1]) / 1000.0

    def _failure(self, i: int, exc: Exception) -> RuntimeKernelError:
        op = self.program[i]
        what = f"kernel {op.kernel!r}" if isinstance(op, Launch) else "copy"
        return RuntimeKernelError(f"CUDA partition {self.index}: step {op.step!r} ({what}) failed: {exc}")

    def _replay(self, base: int, args: list[tuple[Any, ...] | None], arenas: dict[str, Any],
                ext: dict[str, np.ndarray]) -> None:
        stream = self._stream
        with self._lock:
            graphs = self._graphs.get(base)
            if graphs is None:
                graphs = self._capture(args)
                if len(self._graphs) >= _MAX_BOUND:
                    self._graphs.pop(next(iter(self._graphs)))
                self._graphs[base] = graphs
        caller = self._cp.cuda.get_current_stream()
        stream.wait_event(caller.record())
        index = 0
        try:
            for (kind, indices), graph in zip(self._segments, graphs, strict=True):
                index = indices[0]
                if kind == "graph":
                    graph.launch(stream=stream)
                else:
                    self._copy(self.program[index], arenas, ext, stream)  # type: ignore[arg-type]
        except Exception as exc:
            raise self._failure(index, exc) from exc
        caller.wait_event(stream.record())

    def _capture(self, args: list[tuple[Any, ...] | None]) -> list[Any]:
        stream = self._stream
        graphs: list[Any] = []
        with stream:
            for kind, indices in self._segments:
                if kind != "graph":
                    graphs.append(None)
                    continue
                stream.begin_capture()
                i = indices[0]
                try:
                    for i in indices:
                        op = self.program[i]
                        assert isinstance(op, Launch)
                        self._functions[i](op.grid, op.block, args[i], shared_mem=op.shared)
                except Exception as exc:
                    try:
                        stream.end_capture()
                    except Exception:
                        pass  # the capture is already invalid; the launch error is the one to report
                    raise self._failure(i, exc) from exc
                graphs.append(stream.end_capture())
        return graphs

    def __repr__(self) -> str:
        return (f"CudaPartition({self.index}, {len(self.program)} ops, module={self.module_source}, "
                f"capture={self.capture})")
