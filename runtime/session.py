"""``Session``: load a compiled artifact and run it.

Load verifies the manifest, maps weights.bin, loads the kernel libraries and prepares every
partition's call once. A run checks the feeds (names, dtypes, shapes) before any kernel runs,
takes the bound plan it runs (``runtime/run_path.py``'s ``Bound``), allocates the outputs of
its shapes, takes a run context (an arena per memory space, sized for that bound plan) and calls
each partition in order, every runner through the same ``part.run(memory, ext, timings)``.

A static plan's bound plan is made once, at load. A dynamic plan (symbols with ranges;
docs/dynamic-shapes.md) has one per binding: ``runtime/dynamic.py`` reads the binding off the
feeds' shapes and takes its bound plan from a small cache (binding the plan and loading its
partitions at a new binding); an ``--opt-shape`` binding runs its static variant's session.

Where the arena comes from: by default from a small pool, so concurrent runs never share scratch
memory (a pooled context's arenas grow to the largest binding run in it); with ``arena=`` /
``arenas=`` from memory the caller owns; with ``shared_arena=`` from a ``SharedArena`` several
sessions run in one after another. Sessions on caller-owned or shared memory have one fixed run
context (checked against each binding's sizes) and run one call at a time
(``ConcurrentRunError`` otherwise). ``io_binding()`` / ``run_with_iobinding`` run on arrays bound
once; ``profile=True`` records every step's wall time (``end_profiling()`` writes Chrome-trace
JSON).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

import numpy as np

from runtime.artifact import Artifact
from runtime.artifact import load_artifact
from runtime.caller_memory import ExclusiveUse
from runtime.caller_memory import arena_for_space
from runtime.dynamic import DynamicRuns
from runtime.dynamic import Variants
from runtime.errors import ArtifactError
from runtime.errors import InputError
from runtime.io_binding import IOBinding
from runtime.io_binding import SessionIO
from runtime.memory import memory_space
from runtime.plan_schema import Plan
from runtime.plan_schema import PlanPartition
from runtime.plan_schema import PlanSchedule
from runtime.plan_schema import TensorSpec
from runtime.plan_symbols import DYN_EXT
from runtime.run_path import Bound
from runtime.run_path import CPartition
from runtime.run_path import RunContext
from runtime.run_path import bound_of
from runtime.run_path import run_all
from runtime.threads import ThreadChoice
from runtime.threads import available_cpus

if TYPE_CHECKING:
    from runtime.profiling import Profiler
    from runtime.selftest import VerifyReport
    from runtime.shared_arena import SharedArena

__all__ = ["Session"]


class Session:
    """A loaded artifact, ready to run.

    ``threads`` fixes how many threads the C kernels' runs use (of the process's one worker pool,
    shared by every session); by default each run uses all the CPUs the process may run on or
    one, whichever this session's recent runs measured faster (runtime/threads.py);
    ``verify_weights`` hashes weights.bin fully at load instead of checking its size;
    ``arena`` (a writable host buffer: bytearray, numpy array) or ``arenas`` ({"host": buf,
    "cuda": cupy memory}) makes every run use memory the caller owns; ``shared_arena`` runs in a
    ``SharedArena`` shared with other sessions (see docs/deploy.md);
    ``profile`` records each step's wall time for ``end_profiling()``;
    for CUDA artifacts: ``device_id`` (the GPU to load on and run on), ``memory_limit`` (bytes of
    device memory this session may use for weights and arenas, checked against the plan before
    anything is allocated; concurrent runs wait for an arena rather than exceed it) and
    ``cuda_graph`` (capture each CUDA partition's launches on its first run and replay them).
    ``cpu_build`` is the C build this CPU runs (``runtime.cpu_builds.CpuBuild``: the preferred
    one, or a portable one with a ``CpuFallbackWarning``); ``rebuild`` compiles that build's
    shipped source for this CPU (``-march=native``) into a cache outside the artifact and runs
    that library instead (``runtime/rebuild.py``; needs a C compiler).
    """

    def __init__(self, path: str | os.PathLike[str], *, threads: int | None = None,
                 verify_weights: bool = False, cuda_graph: bool = False, arena: Any = None,
                 arenas: Mapping[str, Any] | None = None, shared_arena: SharedArena | None = None,
                 profile: bool = False, device_id: int | None = None,
                 memory_limit: int | None = None, rebuild: bool = False) -> None:
        self.path = Path(path)
        self.cuda_graph = cuda_graph
        self._artifact: Artifact = load_artifact(self.path, verify_weights=verify_weights)
        if rebuild and self._artifact.cpu_build is not None:
            from runtime.rebuild import rebuild_library

            self._artifact.cpu_build = rebuild_library(self.path, self._artifact.manifest,
                                                       self._artifact.cpu_build)
        self.cpu_build = self._artifact.cpu_build
        plan = self._artifact.plan
        self.plan: Plan = plan
        self.inputs: list[TensorSpec] = list(plan.inputs)
        self.outputs: list[TensorSpec] = list(plan.output_specs)
        self._dyn: DynamicRuns | None = None  # a dynamic plan's bindings (runtime/dynamic.py)
        if plan.is_dynamic:
            self._dyn = DynamicRuns(plan, str(self.path),
                                    lambda bound, record: self._load_partition(record, bound))
            self.inputs, self.outputs = list(self._dyn.inputs), list(self._dyn.outputs)
        self._names = [s.name for s in self.outputs]
        # --opt-shape variants: static artifacts run at exactly their binding (runtime/dynamic.py)
        self._variants: Variants | None = None if self._dyn is None else Variants(
            self.path, self._artifact.manifest, self._dyn,
            lambda variant: Session(variant, threads=threads, verify_weights=verify_weights, rebuild=rebuild))
        self._arenas: dict[str, tuple[int, int]] = {}
        for arena_record in plan.arenas:
            space = memory_space(arena_record.memory_space)  # ArtifactError when not available
            self._arenas[space.name] = (arena_record.nbytes, max(64, arena_record.alignment))
        spaces = set(self._arenas) | {p.memory_space for p in plan.partitions}
        self._device: Any = None
        self._slots: threading.BoundedSemaphore | None = None
        self._check_device_options(spaces, device_id, memory_limit, caller_memory=bool(
            arena is not None or arenas is not None or shared_arena is not None))
        if self._device is not None:
            with self._device:
                self._load(threads)
        else:
            self._load(threads)
        self.io = SessionIO(str(self.path), tuple(self.inputs), tuple(self.outputs),
                            tuple(o.value for o in plan.outputs), _values_only_on(plan, "cuda"))
        self._pool: list[RunContext] = []
        self._lock = threading.Lock()
        # caller-owned or shared memory: one fixed context, one run at a time
        self._fixed: RunContext | None = None
        self._guard: ExclusiveUse | None = None
        self._setup_caller_memory(arena, arenas, shared_arena)
        self._profiler: Profiler | None = None
        if profile:
            self._start_profiling()

    # -- loading -----------------------------------------------------------------------------
    def _load(self, threads: int | None) -> None:
        plan = self.plan
        self.threads = threads if threads is not None else available_cpus()
        if self.threads < 1:
            raise InputError(f"threads must be >= 1, got {self.threads}")
        # threads not given: each run's count chosen from measured run times (runtime/threads.py)
        self._adaptive = threads is None and any(p.runner in ("c", "control") for p in plan.partitions)
        self._threads_now = self.threads
        weights = self._artifact.weights
        self._weights = {"host": weights}
        for record in plan.partitions:
            if record.memory_space not in self._weights:
                self._weights[record.memory_space] = memory_space(record.memory_space).upload(weights)
        # kernels get a valid address even when there are no constants
        self._no_weights = np.zeros(64, np.uint8)
        self._weights_addr = weights.ctypes.data if weights.size else self._no_weights.ctypes.data
        self._libraries: dict[str, Any] = {}
        # a static plan: the one bound plan, made here (a dynamic one's: per binding, runtime/dynamic.py)
        self._partitions: list[tuple[str, Any]] = []
        self._static: Bound | None = None
        if self._dyn is None:
            self._partitions += [self._load_partition(record) for record in plan.partitions]
            self._static = bound_of(plan, self._partitions)

    def _check_device_options(self, spaces: set[str], device_id: int | None, memory_limit: int | None,
                              caller_memory: bool) -> None:
        if device_id is None and memory_limit is None:
            return
        if "cuda" not in spaces:
            option = "device_id" if device_id is not None else "memory_limit"
            raise InputError(f"{option} applies to CUDA artifacts; {self.path} runs on the host only")
        if memory_limit is not None:
            arena = self._arenas.get("cuda", (0, 64))[0]
            weights = int(self._artifact.weights.size)
            if int(memory_limit) < weights + arena:
                raise InputError(
                    f"memory_limit {int(memory_limit)} bytes: {self.path} needs {weights + arena} bytes of "
                    f"device memory ({weights} for the weights + {arena} for one run's arena)")
            if arena and not caller_memory:
                self._slots = threading.BoundedSemaphore(max(1, (int(memory_limit) - weights) // arena))
        if device_id is not None:
            from runtime.providers.cuda import cupy_or_error

            cp = cupy_or_error()
            count = int(cp.cuda.runtime.getDeviceCount())
            if not 0 <= int(device_id) < count:
                raise InputError(f"device_id {device_id}: this machine has {count} CUDA device(s)")
            self._device = cp.cuda.Device(int(device_id))

    def _load_partition(self, record: PlanPartition,
                        plan: Plan | PlanSchedule | None = None) -> tuple[str, Any]:
        """Load one partition of the plan, or of a nested ``PlanSchedule`` inside it."""
        runner = record.runner
        owner = plan if plan is not None else self.plan
        if runner == "reference":
            from runtime.providers.reference import ReferencePartition

            beside_c = any(p.runner in ("c", "control") for p in self.plan.partitions)
            return ("reference", ReferencePartition(owner, record, self._weights, beside_c,
                                                    check_shapes=self._dyn is not None))
        if runner == "control":
            from runtime.providers.control import ControlPartition

            return ("control", ControlPartition(owner, record, lambda p, r: self._load_partition(r, p),
                                                self._artifact.weights, self._weights_addr))
        if runner == "c":
            from runtime.providers.c import CLibrary

            rel = record.library
            assert rel is not None  # the schema requires a C partition's library
            if rel not in self._artifact.manifest["files"]:
                raise ArtifactError(f"{self.path / rel}: library not listed in the manifest")
            if rel not in self._libraries:
                self._libraries[rel] = CLibrary(self._artifact.library_file(rel))
                self._libraries[rel].set_threads(self._threads_now)
            steps = tuple(f"node {s.name!r} ({s.kind})" for s in owner.partition_steps(record))
            return ("c", CPartition(self._libraries[rel].entry(record.entry, steps), record.ext, record.index,
                                    self._weights_addr))
        if runner == "cuda":
            from runtime.providers.cuda import CudaPartition

            bound = plan if isinstance(plan, Plan) else None  # a dynamic plan's, at one binding
            return ("cuda", CudaPartition(self._artifact, record, self._weights["cuda"],
                                          capture=self.cuda_graph, plan=bound))
        raise ArtifactError(f"{self.path / 'plan.json'}: partitions[{record.index}].runner {runner!r} "
                            f"is not a provider this runtime has")

    def _setup_caller_memory(self, arena: Any, arenas: Mapping[str, Any] | None,
                             shared_arena: SharedArena | None) -> None:
        given = [n for n, v in (("arena", arena), ("arenas", arenas), ("shared_arena", shared_arena))
                 if v is not None]
        if not given:
            return
        if len(given) > 1:
            raise InputError(f"pass only one of arena=, arenas= and shared_arena= (got {', '.join(given)})")
        views: dict[str, Any] = {}
        if shared_arena is not None:
            for space, (nbytes, alignment) in self._arenas.items():
                views[space] = shared_arena.view(space, nbytes, alignment, f"{self.path}")
            self._guard = shared_arena.guard
        else:
            if arena is not None:
                if set(self._arenas) - {"host"}:
                    raise InputError(f"arena=: {self.path} has arenas in "
                                     f"{', '.join(sorted(self._arenas))}; pass arenas={{space: buffer}}")
                arenas = {"host": arena}
            assert arenas is not None
            extra = sorted(set(arenas) - set(self._arenas))
            if extra:
                raise InputError(f"arenas=: the plan has no {', '.join(map(repr, extra))} arena "
                                 f"(its arenas: {', '.join(sorted(self._arenas)) or 'none'})")
            for space, (nbytes, alignment) in self._arenas.items():
                if space not in arenas:
                    if nbytes:
                        raise InputError(f"arenas=: missing the {space!r} arena ({nbytes} bytes, "
                                         f"{alignment}-byte aligned)")
                    views[space] = memory_space(space).allocate(0, alignment)
                    continue
                views[space] = arena_for_space(space, arenas[space], nbytes if self._dyn is None else None,
                                               alignment, f"{self.path}: {space!r} arena")
            self._guard = ExclusiveUse(f"the caller-owned arena of {self.path}")
        self._fixed = RunContext(views)
        self._fixed.sized = self._static  # checked above; a dynamic plan's: per binding, by _execute

    # -- running -----------------------------------------------------------------------------
    def _check_feeds(self, feeds: dict[str, Any]) -> dict[str, np.ndarray]:
        if not isinstance(feeds, dict):
            raise InputError(f"feeds must be a dict of input name -> array, got {type(feeds).__name__}")
        expected = {s.name for s in self.inputs}
        extra = sorted(set(feeds) - expected)
        if extra:
            raise InputError(f"unknown input(s) {', '.join(map(repr, extra))}; the model's inputs are "
                             f"{', '.join(repr(s.name) for s in self.inputs)}")
        arrays: dict[str, np.ndarray] = {}
        for spec in self.inputs:
            if spec.name not in feeds:
                raise InputError(f"missing input {spec.name!r} ({spec.dtype}, shape {spec.shape})")
            value = feeds[spec.name]
            if not isinstance(value, np.ndarray):
                value = np.asarray(value)
            if value.dtype != spec.dtype:
                raise InputError(f"input {spec.name!r}: dtype {value.dtype}, expected {spec.dtype}")
            if value.shape != spec.shape:
                raise InputError(f"input {spec.name!r}: shape {value.shape}, expected {spec.shape}")
            if not value.flags.c_contiguous or not value.flags.aligned:
                value = np.array(value, order="C", copy=True)
            arrays[spec.name] = value
        return arrays

    def _acquire(self) -> RunContext:
        if self._slots is not None:
            self._slots.acquire()
        with self._lock:
            if self._pool:
                return self._pool.pop()
        return RunContext()  # its arenas allocated by _execute, at the first bound plan it runs

    def _release(self, ctx: RunContext) -> None:
        with self._lock:
            if len(self._pool) < 4:
                self._pool.append(ctx)
        if self._slots is not None:
            self._slots.release()

    def _execute(self, bound: Bound, ext: dict[str, Any]) -> None:
        """Run ``bound``'s partitions on ``ext`` (value name -> the caller's array) in a run context
        whose arenas hold ``bound``'s: a pooled one (its arenas grown to the largest binding run in
        it), or the caller-owned / shared one (checked against a dynamic plan's binding)."""
        guard = self._guard
        if guard is None:
            ctx = self._acquire()
            try:
                if ctx.sized is not bound:
                    ctx.fit(bound)
                self._go(bound, ctx, ext)
            finally:
                self._release(ctx)
            return
        fixed = self._fixed
        assert fixed is not None
        if fixed.sized is not bound:
            self._check_fixed(fixed, bound)
        guard.enter()
        try:
            self._go(bound, fixed, ext)
        finally:
            guard.exit()

    def _check_fixed(self, fixed: RunContext, bound: Bound) -> None:
        for space, (nbytes, _) in bound.arenas.items():
            have = fixed[space].size
            if have < nbytes:
                raise InputError(f"{self.path}: the {space!r} arena given to this session has {have} "
                                 f"bytes; the run at {bound.text} needs {nbytes} (give at least the "
                                 f"plan's {self._arenas[space][0]} bytes: its size at the max shapes)")
        fixed.sized = bound

    def _go(self, bound: Bound, ctx: RunContext, ext: dict[str, Any]) -> None:
        """Call ``bound``'s partitions: with adaptive threads on the count chosen for this run (and
        timed), on the session's device, profiled while profiling."""
        ext[DYN_EXT] = bound.dyn  # the binding a dynamic plan's C partitions read (runtime/binding.py)
        choice = None
        if self._adaptive:
            choice = bound.choice
            if choice is None:  # each binding's own (its run times are its own), starting from the
                choice = bound.choice = ThreadChoice(self.threads, self._threads_now)  # last one's count
            n = choice.choose()
            self._use_threads(n)
            t0 = time.perf_counter()
        if self._device is None and self._profiler is None:
            for _, part in bound.partitions:
                part.run(ctx, ext)
        elif self._device is None:
            self._profiled(bound.partitions, ctx, ext)
        else:
            with self._device:
                self._profiled(bound.partitions, ctx, ext)
        if choice is not None:
            choice.record(n, time.perf_counter() - t0)

    def _use_threads(self, n: int) -> None:
        if n != self._threads_now:
            for library in self._libraries.values():
                library.set_threads(n)
            self._threads_now = n

    def run(self, output_names: list[str] | str | None, feeds: dict[str, Any]) -> list[np.ndarray]:
        """Run once; return the requested outputs (all when ``output_names`` is None) in order.

        A single name given as a str (``run("probs", feeds)``) is taken as ``["probs"]``.
        """
        if output_names is not None:
            output_names = self._output_names(output_names)
        if self._static is not None:
            arrays, bound = self._check_feeds(feeds), self._static
        else:
            arrays, found = self._bind(feeds)
            if isinstance(found, list):  # an --opt-shape variant's results
                return self._select(found, output_names)
            bound = found
        results = [np.empty(shape, dtype) for shape, dtype in bound.outputs]
        ext: dict[str, Any] = dict(arrays)
        ext.update(zip(self.io.output_values, results, strict=False))  # (as long; strict: +0.1 us)
        self._execute(bound, ext)
        return self._select(results, output_names)

    def _output_names(self, output_names: list[str] | str) -> list[str]:
        if isinstance(output_names, str):
            output_names = [output_names]
        unknown = [n for n in output_names if n not in self._names]
        if unknown:
            raise InputError(f"unknown output(s) {', '.join(map(repr, unknown))}; the model's "
                             f"outputs are {', '.join(map(repr, self._names))}")
        return output_names

    def _select(self, results: list[np.ndarray], output_names: list[str] | None) -> list[np.ndarray]:
        if output_names is None:
            return results
        return [results[self._names.index(n)] for n in output_names]

    def _bind(self, feeds: dict[str, Any]) -> tuple[dict[str, np.ndarray], Bound | list[np.ndarray]]:
        """A dynamic plan's feeds, checked, and the bound plan of their binding -- or, where an
        ``--opt-shape`` variant has that binding, the results of the variant's run."""
        dyn = self._dyn
        assert dyn is not None
        arrays = dyn.check_feeds(feeds)
        shapes = {name: a.shape for name, a in arrays.items()}
        if self._variants and self._guard is None and self._profiler is None:
            key = dyn.key(shapes, arrays)
            variant = self._variants.session(key)  # an --opt-shape binding: its static artifact
            if variant is not None:
                return arrays, variant.run(None, arrays)
            return arrays, dyn.bound(shapes, key)
        return arrays, dyn.bound(shapes, feeds=arrays)

    # -- I/O binding ---------------------------------------------------------------------------
    def io_binding(self) -> IOBinding:
        """A new ``IOBinding``: bind input and output arrays once, then ``run_with_iobinding``."""
        return IOBinding(self.io)

    def run_with_iobinding(self, binding: IOBinding) -> None:
        """Run on the bound arrays: kernels read the bound inputs and write the bound outputs in
        place (an output not bound is allocated by the binding once; ``binding.get_outputs()``)."""
        if self._static is not None:
            self._execute(self._static, binding._ext_for(self.io))
            return
        assert self._dyn is not None
        inputs = binding._input_arrays(self.io)
        bound = self._dyn.bound({name: a.shape for name, a in inputs.items()}, feeds=inputs)
        self._execute(bound, binding._ext_for(self.io, [shape for shape, _ in bound.outputs]))

    # -- profiling -----------------------------------------------------------------------------
    def _start_profiling(self) -> None:
        from runtime.profiling import Profiler

        self._profiler = Profiler(self.plan, self.path)

    def _profiled(self, partitions: list[tuple[str, Any]], ctx: RunContext, ext: dict[str, Any]) -> None:
        profiler = self._profiler
        if profiler is None:  # not profiling (or end_profiling() ran concurrently)
            run_all(partitions, ctx, ext)
            return
        record = profiler.begin_run()
        for index, (_, part) in enumerate(partitions):
            timings = profiler.timings(index)
            start = profiler.now()
            part.run(ctx, ext, timings)
            record.partition(index, start, timings)
        profiler.end_run(record)

    def end_profiling(self, path: str | os.PathLike[str] | None = None) -> str:
        """Stop profiling and write the Chrome-trace JSON (to ``path``, or a file named after the
        model and the time in the current folder); returns the file's path."""
        profiler = self._profiler
        if profiler is None:
            raise InputError("this session is not profiling (create it with profile=True)")
        self._profiler = None
        return str(profiler.write(path))

    def verify(self, *, raise_on_mismatch: bool = True) -> VerifyReport:
        """Rerun the artifact's golden self-test cases here (``runtime.selftest``); returns a
        ``VerifyReport``, raising ``SelfTestError`` on a mismatch unless told not to."""
        from runtime.selftest import run_golden_cases

        return run_golden_cases(self.path, self._artifact.manifest, self.run,
                                raise_on_mismatch=raise_on_mismatch)

    def __repr__(self) -> str:
        return f"Session({str(self.path)!r}, inputs={self.inputs}, outputs={self.outputs})"


def _values_only_on(plan: Plan, runner: str) -> frozenset[str]:
    """Graph inputs/outputs (ext values) that only partitions run by ``runner`` touch."""
    runners: dict[str, set[str]] = {}
    for record in plan.partitions:
        for step in plan.partition_steps(record):
            for name in (*step.inputs, *step.outputs):
                if name is not None and plan.values[name].location.kind == "ext":
                    runners.setdefault(name, set()).add(record.runner)
    return frozenset(name for name, who in runners.items() if who == {runner})
