"""Reduction reference kernels: the Reduce* family, ArgMax and ArgMin.

``axes`` is always explicit in the canonical form (every axis when the op reduces everything),
so an empty list means no reduction at all (ONNX's noop_with_empty_axes): the kernel then copies.

A reduction over an empty set of values gives the reduction's identity, as ONNX specifies: 0 for
the sums and norms, 1 for ReduceProd, -inf for ReduceLogSum / ReduceLogSumExp, and for
ReduceMax / ReduceMin the lowest / highest value of the type (-inf / +inf for floats, the integer
limits, False / True for bool). ReduceMean of an empty set is NaN (0 / 0).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from runtime.kernels.common import finish
from runtime.kernels.registry import Kernel
from runtime.kernels.registry import OutputSpec
from runtime.kernels.registry import register

__all__: list[str] = []

Reduction = Callable[[Any, Any, tuple[int, ...], bool], Any]


def _log_sum_exp(xp: Any, x: Any, axes: tuple[int, ...], keep: bool) -> Any:
    """log(sum(exp(x))) shifted by the maximum so large inputs do not overflow."""
    top = xp.max(x, axis=axes, keepdims=True)
    top = xp.where(xp.isfinite(top), top, 0)
    y = xp.log(xp.sum(xp.exp(x - top), axis=axes, keepdims=True)) + top
    return y if keep else xp.squeeze(y, axis=axes)


_REDUCTIONS: dict[str, Reduction] = {
    "ReduceMean": lambda xp, x, axes, keep: xp.mean(x, axis=axes, keepdims=keep),
    "ReduceSum": lambda xp, x, axes, keep: xp.sum(x, axis=axes, keepdims=keep),
    "ReduceMax": lambda xp, x, axes, keep: xp.max(x, axis=axes, keepdims=keep),
    "ReduceMin": lambda xp, x, axes, keep: xp.min(x, axis=axes, keepdims=keep),
    "ReduceProd": lambda xp, x, axes, keep: xp.prod(x, axis=axes, keepdims=keep),
    "ReduceL1": lambda xp, x, axes, keep: xp.sum(xp.abs(x), axis=axes, keepdims=keep),
    "ReduceL2": lambda xp, x, axes, keep: xp.sqrt(xp.sum(x * x, axis=axes, keepdims=keep)),
    "ReduceSumSquare": lambda xp, x, axes, keep: xp.sum(x * x, axis=axes, keepdims=keep),
    "ReduceLogSum": lambda xp, x, axes, keep: xp.log(xp.sum(x, axis=axes, keepdims=keep)),
    "ReduceLogSumExp": _log_sum_exp,
}


def _lowest(dtype: np.dtype) -> Any:
    if dtype.kind == "f":
        return -np.inf
    return False if dtype.kind == "b" else np.iinfo(dtype).min


def _highest(dtype: np.dtype) -> Any:
    if dtype.kind == "f":
        return np.inf
    return True if dtype.kind == "b" else np.iinfo(dtype).max


# The value of each reduction over an empty set, for the output's dtype.
_EMPTY: dict[str, Callable[[np.dtype], Any]] = {
    "ReduceMean": lambda dtype: np.nan if dtype.kind == "f" else 0,
    "ReduceMax": _lowest,
    "ReduceMin": _highest,
    "ReduceProd": lambda dtype: 1,
    "ReduceLogSum": _lowest,
    "ReduceLogSumExp": _lowest,
}


def _reduce_kernel(kind: str, reduction: Reduction) -> Kernel:
    empty = _EMPTY.get(kind, lambda dtype: 0)

    def kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
        x = inputs[0]
        axes = tuple(int(a) for a in attrs["axes"])
        if not axes:
            y = x
        elif any(int(x.shape[a]) == 0 for a in axes):
            shape, dtype = outputs[0]
            y = xp.full(tuple(shape), empty(np.dtype(dtype)), dtype=np.dtype(dtype))
        else:
            y = reduction(xp, x, axes, bool(attrs["keepdims"]))
        return finish(xp, kind, [y], outputs)

    kernel.__name__ = kernel.__qualname__ = f"reduce_{kind}"
    kernel.__doc__ = f"Reference kernel for {kind} over ``axes`` (``keepdims`` 0 or 1)."
    return kernel


for _kind, _reduction in _REDUCTIONS.items():
    register(_kind)(_reduce_kernel(_kind, _reduction))


def _arg_kernel(kind: str, pick: Callable[[Any, Any, int], Any]) -> Kernel:
    def kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
        x = inputs[0]
        axis = int(attrs["axis"])
        if int(attrs["select_last_index"]):
            y = int(x.shape[axis]) - 1 - pick(xp, xp.flip(x, axis), axis)
        else:
            y = pick(xp, x, axis)
        if int(attrs["keepdims"]):
            y = xp.expand_dims(y, axis)
        return finish(xp, kind, [y], outputs)

    kernel.__name__ = kernel.__qualname__ = f"arg_{kind}"
    kernel.__doc__ = (f"Reference kernel for {kind} along ``axis`` (int64 indices; ties give the first "
                      "index, or the last with ``select_last_index``).")
    return kernel


register("ArgMax")(_arg_kernel("ArgMax", lambda xp, x, axis: xp.argmax(x, axis=axis)))
register("ArgMin")(_arg_kernel("ArgMin", lambda xp, x, axis: xp.argmin(x, axis=axis)))
