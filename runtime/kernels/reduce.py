"""Reduction reference kernels: ReduceMean, ReduceSum, ReduceMax, ReduceMin, ReduceProd, ReduceL2.

``axes`` is always explicit in the canonical form (every axis when the op reduces everything),
so an empty list means no reduction at all (ONNX's noop_with_empty_axes): the kernel then copies.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runtime.kernels.common import finish
from runtime.kernels.registry import Kernel, OutputSpec, register

__all__: list[str] = []

Reduction = Callable[[Any, Any, tuple[int, ...], bool], Any]

_REDUCTIONS: dict[str, Reduction] = {
    "ReduceMean": lambda xp, x, axes, keep: xp.mean(x, axis=axes, keepdims=keep),
    "ReduceSum": lambda xp, x, axes, keep: xp.sum(x, axis=axes, keepdims=keep),
    "ReduceMax": lambda xp, x, axes, keep: xp.max(x, axis=axes, keepdims=keep),
    "ReduceMin": lambda xp, x, axes, keep: xp.min(x, axis=axes, keepdims=keep),
    "ReduceProd": lambda xp, x, axes, keep: xp.prod(x, axis=axes, keepdims=keep),
    "ReduceL2": lambda xp, x, axes, keep: xp.sqrt(xp.sum(x * x, axis=axes, keepdims=keep)),
}


def _reduce_kernel(kind: str, reduction: Reduction) -> Kernel:
    def kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
        x = inputs[0]
        axes = tuple(int(a) for a in attrs["axes"])
        y = reduction(xp, x, axes, bool(attrs["keepdims"])) if axes else x
        return finish(xp, kind, [y], outputs)

    kernel.__name__ = kernel.__qualname__ = f"reduce_{kind}"
    kernel.__doc__ = f"Reference kernel for {kind} over ``axes`` (``keepdims`` 0 or 1)."
    return kernel


for _kind, _reduction in _REDUCTIONS.items():
    register(_kind)(_reduce_kernel(_kind, _reduction))
