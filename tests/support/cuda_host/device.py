"""The same steps on a real GPU, to check the host execution itself (needs cupy and a device).

``DeviceMirror(artifact)`` loads the artifact's CUDA module the way the runtime does
(``runtime.providers.cuda_load.load_module``: cubin, PTX or NVRTC) and keeps a device arena and a
device copy of weights.bin. For each CUDA step the host runner checks, ``run_step`` uploads the
device arena exactly as the host launches found it (after the poison), runs the step's launches on
the GPU with the runtime's own argument tuples, and returns the step's outputs as the GPU wrote
them; ``HostRun(..., device=mirror)`` then compares them with the host's outputs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from runtime.artifact import Artifact
from runtime.plan_schema import PlanStep
from runtime.providers.cuda_load import load_module
from runtime.providers.cuda_program import Launch
from runtime.providers.cuda_program import bind
from runtime.providers.cuda_program import parse_steps

__all__ = ["DeviceMirror", "gpu_available"]


def gpu_available() -> bool:
    try:
        import cupy  # type: ignore[import-not-found]

        return int(cupy.cuda.runtime.getDeviceCount()) > 0
    except Exception:
        return False


class DeviceMirror:
    """One artifact's CUDA launches on the GPU, step by step."""

    def __init__(self, artifact: Artifact) -> None:
        import cupy as cp

        self.cp = cp
        plan = artifact.plan
        arena = plan.arena("cuda")
        self.arena = cp.zeros(max(arena.nbytes if arena is not None else 0, 1), cp.uint8)
        self.weights = cp.asarray(np.ascontiguousarray(artifact.weights).reshape(-1))
        weights_addr = int(self.weights.data.ptr) if int(self.weights.size) else 0
        self.program: dict[str, list[Launch]] = {}
        names: set[str] = set()
        for part in plan.partitions:
            if part.provider != "cuda":
                continue
            for op in parse_steps(plan, part, int(artifact.weights.size), weights_addr):
                if isinstance(op, Launch):
                    self.program.setdefault(op.step, []).append(op)
                    names.add(op.kernel)
            assert part.module is not None
            self.module = load_module(cp, artifact, part.module, sorted(names))
        self.plan = plan

    def run_step(self, step: PlanStep, arena_before: np.ndarray) -> list[np.ndarray]:
        """The step's outputs as the GPU computes them from ``arena_before`` (host bytes)."""
        cp = self.cp
        self.arena.set(arena_before)
        base = int(self.arena.data.ptr)
        for op in self.program.get(step.name, []):
            kernel: Any = self.module.functions[op.kernel]
            kernel(op.grid, op.block, bind(op, base), shared_mem=op.shared)
        cp.cuda.get_current_stream().synchronize()
        host = self.arena.get()
        outs = []
        for name in step.outputs:
            value = self.plan.values[name]
            where = value.location
            outs.append(host[where.offset:where.offset + value.nbytes].view(value.dtype).reshape(value.shape))
        return outs
