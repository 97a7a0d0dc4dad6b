"""``Session``: load a compiled artifact and run it.

Load verifies the manifest, maps weights.bin, loads the kernel libraries and prepares every
partition's call once. A run checks the feeds (names, dtypes, shapes) before any kernel runs,
allocates the outputs, takes a run context (an arena plus the partitions' pointer arrays) from a
small pool so concurrent runs never share scratch memory, and calls each partition in order.
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtime.artifact import Artifact, load_artifact
from runtime.errors import ArtifactError, InputError
from runtime.memory import memory_space

__all__ = ["Session", "TensorSpec"]


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]


def _spec(record: dict[str, Any]) -> TensorSpec:
    return TensorSpec(record["name"], np.dtype(record["dtype"]), tuple(int(d) for d in record["shape"]))


class _CPartition:
    def __init__(self, entry: Any, ext: list[str]) -> None:
        self.entry = entry
        self.ext = ext


class _RunContext:
    """Per-run memory: one arena per memory space and one pointer array per C partition."""

    def __init__(self, arenas: dict[str, tuple[int, int]], c_parts: list[tuple[int, int]]) -> None:
        self.arenas = {space: memory_space(space).allocate(nbytes, alignment)
                       for space, (nbytes, alignment) in arenas.items()}
        host = self.arenas.get("host")
        self._keep = np.zeros(64, np.uint8)  # a valid address when the host arena is empty
        self.arena_addr = host.ctypes.data if host is not None and host.size else self._keep.ctypes.data
        self.ext_arrays = {index: (ctypes.c_void_p * max(n, 1))() for index, n in c_parts}


class Session:
    """A loaded artifact, ready to run.

    ``threads`` sets the C kernels' OpenMP thread count (default: all cores);
    ``verify_weights`` hashes weights.bin fully at load instead of checking its size;
    ``cuda_graph`` captures each CUDA partition's launches on its first run and replays them.
    """

    def __init__(self, path: str | os.PathLike[str], *, threads: int | None = None,
                 verify_weights: bool = False, cuda_graph: bool = False) -> None:
        self.path = Path(path)
        self.cuda_graph = cuda_graph
        self._artifact: Artifact = load_artifact(self.path, verify_weights=verify_weights)
        plan = self._artifact.plan
        self.plan = plan
        self.inputs = [_spec(r) for r in plan["inputs"]]
        self.outputs = [_spec(r) for r in plan["outputs"]]
        self._output_values = [r["value"] for r in plan["outputs"]]
        self._arenas: dict[str, tuple[int, int]] = {}
        for arena in plan["arenas"]:
            space = memory_space(arena["memory_space"])  # ArtifactError when not available
            self._arenas[space.name] = (int(arena["nbytes"]), max(64, int(arena["alignment"])))
        weights = self._artifact.weights
        self._weights = {"host": weights}
        for record in plan["partitions"]:
            name = record.get("memory_space", "host")
            if name not in self._weights:
                self._weights[name] = memory_space(name).upload(weights)
        # kernels get a valid address even when there are no constants
        self._no_weights = np.zeros(64, np.uint8)
        self._weights_addr = weights.ctypes.data if weights.size else self._no_weights.ctypes.data
        self._libraries: dict[str, Any] = {}
        self._partitions: list[tuple[str, Any]] = []
        for record in plan["partitions"]:
            self._partitions.append(self._load_partition(record, weights))
        self.threads = threads if threads is not None else (os.cpu_count() or 1)
        if self.threads < 1:
            raise InputError(f"threads must be >= 1, got {self.threads}")
        for library in self._libraries.values():
            library.set_threads(self.threads)
        self._c_parts = [(i, len(p.ext)) for i, (kind, p) in enumerate(self._partitions) if kind == "c"]
        self._pool: list[_RunContext] = []
        self._lock = threading.Lock()

    # -- loading -----------------------------------------------------------------------------
    def _load_partition(self, record: dict[str, Any], weights: np.ndarray) -> tuple[str, Any]:
        provider = record.get("runner", record["provider"])
        if provider == "reference":
            from runtime.providers.reference import ReferencePartition

            return ("reference", ReferencePartition(self._artifact.plan, record, self._weights))
        if provider == "c":
            from runtime.providers.c import CLibrary

            rel = record.get("library")
            if not rel:
                raise ArtifactError(
                    f"{self.path / 'plan.json'}: C partition {record['index']} names no library")
            if rel not in self._artifact.manifest["files"]:
                raise ArtifactError(f"{self.path / rel}: library not listed in the manifest")
            if rel not in self._libraries:
                self._libraries[rel] = CLibrary(self._artifact.file(rel))
            entry = self._libraries[rel].entry(record["entry"])
            return ("c", _CPartition(entry, list(record["ext"])))
        if provider == "cuda":
            from runtime.providers.cuda import CudaPartition

            return ("cuda", CudaPartition(self._artifact, record, self._weights["cuda"],
                                          capture=self.cuda_graph))
        raise ArtifactError(f"{self.path / 'plan.json'}: unknown provider {provider!r}")

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

    def _acquire(self) -> _RunContext:
        with self._lock:
            if self._pool:
                return self._pool.pop()
        return _RunContext(self._arenas, self._c_parts)

    def _release(self, ctx: _RunContext) -> None:
        with self._lock:
            if len(self._pool) < 4:
                self._pool.append(ctx)

    def run(self, output_names: list[str] | None, feeds: dict[str, Any]) -> list[np.ndarray]:
        """Run once; return the requested outputs (all when ``output_names`` is None) in order."""
        names = [s.name for s in self.outputs]
        if output_names is not None:
            unknown = [n for n in output_names if n not in names]
            if unknown:
                raise InputError(f"unknown output(s) {', '.join(map(repr, unknown))}; the model's "
                                 f"outputs are {', '.join(map(repr, names))}")
        arrays = self._check_feeds(feeds)
        results = [np.empty(s.shape, s.dtype) for s in self.outputs]
        ext: dict[str, np.ndarray] = dict(arrays)
        for value_name, array in zip(self._output_values, results, strict=True):
            ext[value_name] = array
        ctx = self._acquire()
        try:
            for index, (kind, part) in enumerate(self._partitions):
                if kind == "c":
                    pointers = ctx.ext_arrays[index]
                    for slot, name in enumerate(part.ext):
                        pointers[slot] = ext[name].ctypes.data
                    part.entry(pointers, ctx.arena_addr, self._weights_addr, 0)
                else:
                    part.run(ctx.arenas, ext)
        finally:
            self._release(ctx)
        if output_names is None:
            return results
        return [results[names.index(n)] for n in output_names]

    def __repr__(self) -> str:
        return f"Session({str(self.path)!r}, inputs={self.inputs}, outputs={self.outputs})"
