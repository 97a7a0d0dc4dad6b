"""Reference kernels for the non-elementwise math ops: BitCast, CumSum / CumProd, Trilu, Det,
Einsum, Hardmax, LpNormalization and MeanVarianceNormalization (canonical forms: docs/ops.md).

The elementwise math ops (trigonometry, Mod, BitShift, bitwise ops, ...) live in
``runtime.kernels.elementwise``. Float16 inputs of ops that accumulate (Det, Einsum, the
normalizations) are computed in float32 and rounded once, by ``finish``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from runtime.errors import RuntimeKernelError
from runtime.kernels.common import finish
from runtime.kernels.registry import OutputSpec
from runtime.kernels.registry import register

__all__: list[str] = []

_MVN_EPSILON = 1e-9  # added to the standard deviation by ONNX's function body


def _wide(xp: Any, x: Any) -> Any:
    return x.astype(xp.float32) if x.dtype == xp.float16 else x


def _along(axis: int, rank: int, index: slice) -> tuple[slice, ...]:
    """An index applying ``index`` on ``axis`` and taking everything elsewhere."""
    return (slice(None),) * axis + (index,) + (slice(None),) * (rank - axis - 1)


@register("BitCast")
def bitcast_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """The input's bytes reinterpreted as ``to`` (a numpy dtype name of the same size)."""
    return finish(xp, "BitCast", [inputs[0].view(np.dtype(attrs["to"]))], outputs)


def _scan(xp: Any, kind: str, x: Any, attrs: dict[str, Any]) -> Any:
    axis = int(attrs["axis"])
    if attrs["reverse"]:
        x = xp.flip(x, axis)
    scan = xp.cumsum if kind == "CumSum" else xp.cumprod
    y = scan(x, axis=axis, dtype=x.dtype)
    if attrs["exclusive"] and x.shape[axis] > 0:
        # Shift by one along the axis: the first element becomes the identity (0 or 1).
        first = [1 if d == axis else n for d, n in enumerate(x.shape)]
        fill = xp.zeros if kind == "CumSum" else xp.ones
        y = xp.concatenate([fill(first, dtype=x.dtype), y[_along(axis, x.ndim, slice(0, -1))]], axis=axis)
    if attrs["reverse"]:
        y = xp.flip(y, axis)
    return y


@register("CumSum")
def cumsum_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """Running sum along ``axis`` (``exclusive``, ``reverse``: 0 or 1), in the input's dtype."""
    return finish(xp, "CumSum", [_scan(xp, "CumSum", inputs[0], attrs)], outputs)


@register("CumProd")
def cumprod_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """Running product along ``axis`` (``exclusive``, ``reverse``: 0 or 1), in the input's dtype."""
    return finish(xp, "CumProd", [_scan(xp, "CumProd", inputs[0], attrs)], outputs)


@register("Trilu")
def trilu_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """Keep the upper (``upper``=1: column - row >= k) or lower (column - row <= k) triangle."""
    x = inputs[0]
    rows, cols = x.shape[-2:]
    offset = xp.arange(cols)[None, :] - xp.arange(rows)[:, None]
    k = int(attrs["k"])
    keep = offset >= k if attrs["upper"] else offset <= k
    return finish(xp, "Trilu", [xp.where(keep, x, xp.zeros_like(x))], outputs)


@register("Det")
def det_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """Determinants of the [*, M, M] input's matrices (shape [*])."""
    return finish(xp, "Det", [xp.linalg.det(_wide(xp, inputs[0]))], outputs)


@register("Einsum")
def einsum_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """numpy's einsum of the inputs with ``equation`` (spaces removed)."""
    try:
        y = xp.einsum(attrs["equation"], *(_wide(xp, x) for x in inputs))
    except ValueError as exc:
        raise RuntimeKernelError(f"Einsum: equation {attrs['equation']!r}: {exc}") from None
    return finish(xp, "Einsum", [y], outputs)


@register("Hardmax")
def hardmax_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """1 at the first maximum along ``axis``, 0 elsewhere."""
    x = inputs[0]
    axis = int(attrs["axis"])
    if x.size == 0:
        return finish(xp, "Hardmax", [xp.zeros_like(x)], outputs)
    positions = xp.arange(x.shape[axis]).reshape([-1 if d == axis else 1 for d in range(x.ndim)])
    y = positions == xp.expand_dims(xp.argmax(x, axis=axis), axis)
    return finish(xp, "Hardmax", [y], outputs)


@register("LpNormalization")
def lp_normalization_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """x / ||x||_p along ``axis`` (``p`` 1 or 2); 0 where the norm is 0."""
    x = _wide(xp, inputs[0])
    axis = int(attrs["axis"])
    if attrs["p"] == 1:
        norm = xp.sum(xp.abs(x), axis=axis, keepdims=True)
    else:
        norm = xp.sqrt(xp.sum(x * x, axis=axis, keepdims=True))
    zero = norm == 0
    y = xp.where(zero, xp.zeros_like(x), x / xp.where(zero, xp.ones_like(norm), norm))
    return finish(xp, "LpNormalization", [y], outputs)


@register("MeanVarianceNormalization")
def mvn_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """(x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9) over ``axes``, as ONNX's function body."""
    x = _wide(xp, inputs[0])
    axes = tuple(int(a) for a in attrs["axes"])
    mean = xp.mean(x, axis=axes, keepdims=True)
    variance = xp.maximum(xp.mean(x * x, axis=axes, keepdims=True) - mean * mean, 0)
    y = (x - mean) / (xp.sqrt(variance) + _MVN_EPSILON)
    return finish(xp, "MeanVarianceNormalization", [y], outputs)
