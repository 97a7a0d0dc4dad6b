"""The reference provider, run side: executes a partition's steps with the numpy kernels.

Each step reads its inputs as views into the arena, weights.bin or the caller's arrays, calls the
registered kernel from ``runtime/kernels`` and copies the results into its outputs' memory (so an
output planned over a dying input is safe: the kernel has finished reading before the copy).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from runtime.errors import ArtifactError, RuntimeKernelError
from runtime.kernels import get_kernel

__all__ = ["ReferencePartition"]

View = Callable[[np.ndarray, dict[str, np.ndarray]], np.ndarray]


def _viewer(record: dict[str, Any], weights: np.ndarray) -> View:
    dtype = np.dtype(record["dtype"])
    shape = tuple(record["shape"])
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    kind = record["location"][0]
    if kind == "arena":
        off = int(record["location"][1])
        return lambda arena, ext: arena[off:off + nbytes].view(dtype).reshape(shape)
    if kind == "weights":
        off = int(record["location"][1])
        const = weights[off:off + nbytes].view(dtype).reshape(shape)
        return lambda arena, ext: const
    if kind == "ext":
        name = record["location"][1]
        return lambda arena, ext: ext[name].reshape(shape)
    raise ArtifactError(f"plan.json: unknown value location {record['location']!r}")


class ReferencePartition:
    """One reference partition, prepared once at load."""

    def __init__(self, plan: dict[str, Any], record: dict[str, Any], weights: np.ndarray) -> None:
        values = plan["values"]
        self.steps = []
        for step in plan["steps"][record["first_step"]:record["last_step"] + 1]:
            kind = step["op_type"] if step["domain"] in ("", "ai.onnx") else \
                f"{step['domain']}.{step['op_type']}"
            try:
                kernel = get_kernel(kind)
            except Exception as exc:
                raise ArtifactError(f"plan.json step {step['name']!r}: {exc}") from None
            ins = [_viewer(values[n], weights) if n is not None else None for n in step["inputs"]]
            outs = [_viewer(values[n], weights) for n in step["outputs"]]
            specs = [(tuple(values[n]["shape"]), np.dtype(values[n]["dtype"])) for n in step["outputs"]]
            self.steps.append((step["name"], kind, kernel, step["attrs"], ins, outs, specs))

    def run(self, arena: np.ndarray, ext: dict[str, np.ndarray]) -> None:
        for name, kind, kernel, attrs, ins, outs, specs in self.steps:
            args = [v(arena, ext) if v is not None else None for v in ins]
            try:
                results = kernel(np, args, attrs, specs)
            except Exception as exc:
                raise RuntimeKernelError(f"step {name!r} ({kind}) failed: {exc}") from exc
            for view, result in zip(outs, results, strict=True):
                np.copyto(view(arena, ext), result, casting="unsafe")
