"""The reference provider, run side: executes a partition's steps with the numpy kernels.

Each step reads its inputs as views into the arena, weights.bin or the caller's arrays, calls the
registered kernel from ``runtime/kernels`` and copies the results into its outputs' memory (so an
output planned over a dying input is safe: the kernel has finished reading before the copy).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from collections.abc import Mapping
from contextlib import nullcontext
from typing import Any

import numpy as np

from runtime.blas import single_threaded_blas
from runtime.contract import TRANSFER
from runtime.errors import ArtifactError
from runtime.errors import IndexRangeError
from runtime.errors import InputError
from runtime.errors import RuntimeKernelError
from runtime.kernels import get_kernel
from runtime.kernels.control import check_control_attrs
from runtime.memory import memory_space
from runtime.plan_schema import Plan
from runtime.plan_schema import PlanPartition
from runtime.plan_schema import PlanSchedule
from runtime.run_path import value_view

__all__ = ["ReferencePartition"]


class ReferencePartition:
    """One reference partition, prepared once at load, running in its memory space's ``xp``."""

    def __init__(self, plan: Plan | PlanSchedule, record: PlanPartition, weights: dict[str, Any],
                 beside_c: bool = False, check_shapes: bool = False) -> None:
        values = plan.values
        # a bound dynamic plan: a kernel's result of another shape is a shape the model cannot take
        self._check_shapes = check_shapes
        self.space = memory_space(record.memory_space)
        self.xp = self.space.xp
        # numpy's BLAS on one thread while C kernels' threads share the cores (runtime/blas.py)
        self._blas = single_threaded_blas if beside_c and self.xp is np else nullcontext
        local_weights = weights[self.space.name]
        self.steps = []
        for step in plan.partition_steps(record):
            kind = step.kind
            ins = [value_view(values[n], local_weights) if n is not None else None for n in step.inputs]
            outs = [value_view(values[n], local_weights) for n in step.outputs]
            specs = [(values[n].shape, values[n].dtype) for n in step.outputs]
            if kind == TRANSFER:
                kernel = self._transfer(step.attrs)
            else:
                try:
                    kernel = get_kernel(kind)
                    check_control_attrs(kind, step.attrs, len(step.inputs), "attributes")
                except Exception as exc:
                    raise ArtifactError(f"plan.json step {step.name!r}: {exc}") from None
            self.steps.append((step.name, kind, kernel, step.attrs, ins, outs, specs))

    @staticmethod
    def _transfer(attrs: Mapping[str, Any]) -> Callable[..., list[Any]]:
        src, dst = memory_space(attrs["from"]), memory_space(attrs["to"])

        def move(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: Any) -> list[Any]:
            return [dst.from_host(src.to_host(inputs[0]))]

        return move

    def run(self, arenas: dict[str, Any], ext: dict[str, np.ndarray],
            timings: np.ndarray | None = None) -> None:
        """Run every step; with ``timings`` (float64, one per step) store each step's wall time
        (for a device space, after synchronizing the device so the time is the kernel's)."""
        with self._blas():
            self._run(arenas, ext, timings)

    def _run(self, arenas: dict[str, Any], ext: dict[str, np.ndarray], timings: np.ndarray | None) -> None:
        xp = self.xp
        sync = _synchronizer(xp) if timings is not None else None
        for local, (name, kind, kernel, attrs, ins, outs, specs) in enumerate(self.steps):
            if timings is not None:
                t0 = time.perf_counter()
            args = [v(arenas, ext) if v is not None else None for v in ins]
            try:
                results = kernel(xp, args, attrs, specs)
            except IndexRangeError as exc:  # the feed's fault, not the kernel's: say which node
                raise exc.at(f"node {name!r} ({kind})") from None
            except Exception as exc:
                raise RuntimeKernelError(f"step {name!r} ({kind}) failed: {exc}") from exc
            if self._check_shapes:
                _check_results(name, kind, results, specs)
            for view, result in zip(outs, results, strict=True):
                target = view(arenas, ext)
                if isinstance(target, np.ndarray):
                    np.copyto(target, np.asarray(result), casting="unsafe")
                else:
                    target[...] = result
            if timings is not None:
                if sync is not None:
                    sync()
                timings[local] = time.perf_counter() - t0


def _check_results(name: str, kind: str, results: list[Any], specs: list[Any]) -> None:
    for k, (result, (shape, _)) in enumerate(zip(results, specs, strict=True)):
        got = tuple(np.shape(result))
        if got != tuple(shape):
            raise InputError(f"step {name!r} ({kind}): output {k} has shape {list(got)} at these input "
                             f"shapes, the plan expects {list(shape)}: the model cannot take these shapes")


def _synchronizer(xp: Any) -> Callable[[], None] | None:
    if xp is np:
        return None
    cuda = getattr(xp, "cuda", None)
    if cuda is None:
        return None
    return lambda: cuda.get_current_stream().synchronize()
