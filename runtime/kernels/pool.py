"""Pooling reference kernels: MaxPool (with its Indices output), AveragePool, LpPool,
GlobalAveragePool, GlobalMaxPool, and MaxUnpool.

Windows are read one kernel offset at a time as strided views of the padded input (see
``common.window_slices``) and folded with maximum or addition. MaxPool's indices are folded the
same way from a padded array of flat input positions (-1 in the padding): the first maximum in
window order wins, as in ONNX's reference. Output sizes follow ONNX's
ceil_mode rule (a last window starting in the end padding is dropped; sizes from
``runtime/kernels/window.py``). AveragePool divides by the outer product of per-axis counts
(``window_counts``): the real elements (count_include_pad=0) or the real elements plus the
declared pads (count_include_pad=1); the extra end padding that ceil mode needs never counts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from runtime.errors import RuntimeKernelError
from runtime.kernels.common import finish
from runtime.kernels.common import pad_spatial
from runtime.kernels.common import prod
from runtime.kernels.common import window_slices
from runtime.kernels.registry import Kernel
from runtime.kernels.registry import OutputSpec
from runtime.kernels.registry import register
from runtime.kernels.window import end_padding
from runtime.kernels.window import pool_out_size
from runtime.kernels.window import window_counts

__all__ = ["average_pool", "lp_pool", "max_pool", "max_pool_with_indices"]


def _geometry(
    x: Any, attrs: dict[str, Any], dilations: list[int]
) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    """kernel_shape, strides, begin pads, end pads (with ceil-mode extra) and output shape."""
    kernel_shape = [int(k) for k in attrs["kernel_shape"]]
    strides = [int(s) for s in attrs["strides"]]
    pads = [int(p) for p in attrs["pads"]]
    nd = len(kernel_shape)
    begins, ends = pads[:nd], pads[nd:]
    sizes = [int(s) for s in x.shape[2:]]
    ceil_mode = int(attrs["ceil_mode"])
    out_shape, total_ends = [], []
    for i in range(nd):
        geometry = (sizes[i], kernel_shape[i], strides[i], dilations[i], begins[i])
        out = pool_out_size(*geometry, ends[i], ceil_mode)
        out_shape.append(out)
        total_ends.append(max(ends[i], end_padding(*geometry, out)))
    return kernel_shape, strides, begins, total_ends, out_shape


def max_pool(xp: Any, x: Any, attrs: dict[str, Any]) -> Any:
    """ONNX MaxPool (the Y output) of ``x`` (N, C, *spatial)."""
    dilations = [int(d) for d in attrs["dilations"]]
    kernel_shape, strides, begins, ends, out_shape = _geometry(x, attrs, dilations)
    lowest = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    padded = pad_spatial(xp, x, begins, ends, lowest)
    y = None
    for index in window_slices(kernel_shape, strides, dilations, out_shape):
        y = padded[index].copy() if y is None else xp.maximum(y, padded[index], out=y)
    return y


def _flat_positions(shape: tuple[int, ...], storage_order: int) -> np.ndarray:
    """Each element's flat index in an (N, C, *spatial) tensor, as MaxPool's Indices count it.

    With ``storage_order`` 1 the spatial axes are counted column-major (the first one fastest).
    """
    plane = prod(shape[2:])
    spatial = np.arange(plane, dtype=np.int64)
    if storage_order:
        spatial = spatial.reshape(shape[2:][::-1]).transpose()
    planes = np.arange(prod(shape[:2]), dtype=np.int64).reshape(shape[:2] + (1,) * (len(shape) - 2))
    return planes * plane + spatial.reshape(shape[2:])


def max_pool_with_indices(xp: Any, x: Any, attrs: dict[str, Any]) -> tuple[Any, Any]:
    """ONNX MaxPool's Y and Indices (int64 flat input positions) of ``x`` (N, C, *spatial)."""
    dilations = [int(d) for d in attrs["dilations"]]
    kernel_shape, strides, begins, ends, out_shape = _geometry(x, attrs, dilations)
    lowest = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    padded = pad_spatial(xp, x, begins, ends, lowest)
    positions = xp.asarray(_flat_positions(tuple(int(d) for d in x.shape), int(attrs["storage_order"])))
    padded_positions = pad_spatial(xp, positions, begins, ends, -1)
    y = indices = None
    for index in window_slices(kernel_shape, strides, dilations, out_shape):
        value, position = padded[index], padded_positions[index]
        if y is None or indices is None:
            y, indices = value.copy(), position.copy()
            continue
        # A real element beats padding even when it equals the padding value.
        better = (value > y) | ((indices < 0) & (position >= 0))
        y = xp.where(better, value, y)
        indices = xp.where(better, position, indices)
    return y, indices


def lp_pool(xp: Any, x: Any, attrs: dict[str, Any]) -> Any:
    """ONNX LpPool of ``x`` (N, C, *spatial): (sum of |x|^p over each window)^(1/p), zero padding."""
    dilations = [int(d) for d in attrs["dilations"]]
    kernel_shape, strides, begins, ends, out_shape = _geometry(x, attrs, dilations)
    p = attrs["p"]
    padded = pad_spatial(xp, xp.abs(x) ** p, begins, ends, 0)
    total = None
    for index in window_slices(kernel_shape, strides, dilations, out_shape):
        total = padded[index].copy() if total is None else xp.add(total, padded[index], out=total)
    return total ** (1.0 / p)


def average_pool(xp: Any, x: Any, attrs: dict[str, Any]) -> Any:
    """ONNX AveragePool of ``x`` (N, C, *spatial)."""
    nd = len(attrs["kernel_shape"])
    # Not part of the canonical form; accepted when present (opset 19 added it to AveragePool).
    dilations = [int(d) for d in attrs.get("dilations", [1] * nd)]
    kernel_shape, strides, begins, ends, out_shape = _geometry(x, attrs, dilations)
    padded = pad_spatial(xp, x, begins, ends, 0)
    total = None
    for index in window_slices(kernel_shape, strides, dilations, out_shape):
        total = padded[index].copy() if total is None else xp.add(total, padded[index], out=total)
    include_pad = bool(attrs["count_include_pad"])
    declared_ends = [int(p) for p in attrs["pads"]][nd:]
    count = np.ones((), dtype=np.int64)
    for axis in range(nd):
        along = window_counts(int(x.shape[2 + axis]), kernel_shape[axis], strides[axis], dilations[axis],
                              begins[axis], declared_ends[axis], out_shape[axis], include_pad)  # fmt: skip
        count = np.multiply.outer(count, np.array(along, dtype=np.int64))
    divisor = xp.asarray(np.maximum(count, 1).astype(x.dtype))
    return total / divisor


@register("MaxPool")
def max_pool_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """MaxPool: X -> Y, and Indices when the node has that output."""
    if len(outputs) == 2:
        return finish(xp, "MaxPool", list(max_pool_with_indices(xp, inputs[0], attrs)), outputs)
    return finish(xp, "MaxPool", [max_pool(xp, inputs[0], attrs)], outputs)


@register("AveragePool")
def average_pool_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """AveragePool: X -> Y."""
    return finish(xp, "AveragePool", [average_pool(xp, inputs[0], attrs)], outputs)


@register("LpPool")
def lp_pool_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """LpPool: X -> Y."""
    return finish(xp, "LpPool", [lp_pool(xp, inputs[0], attrs)], outputs)


@register("MaxUnpool")
def max_unpool_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """MaxUnpool(X, I): each X value written at its flat index I into zeros of ``unpooled_shape``;
    that tensor then fills the leading corner of the (possibly larger) output, zeros elsewhere, as
    ONNX's reference and conformance cases define output_shape."""
    x, indices = inputs
    unpooled = tuple(int(d) for d in attrs["unpooled_shape"])
    size = prod(unpooled)
    flat_indices = indices.reshape(-1)
    if bool(xp.any((flat_indices < 0) | (flat_indices >= size))):
        raise RuntimeKernelError(f"MaxUnpool: an index is outside [0, {size})")
    flat = xp.zeros(size, dtype=x.dtype)
    flat[flat_indices] = x.reshape(-1)
    shape, dtype = outputs[0]
    y = xp.zeros(tuple(int(d) for d in shape), dtype=dtype)
    y[tuple(slice(0, d) for d in unpooled)] = flat.reshape(unpooled)
    return finish(xp, "MaxUnpool", [y], outputs)


def _global_pool_kernel(kind: str, reduce: Callable[[Any, Any, tuple[int, ...]], Any]) -> Kernel:
    """The kernel of ``kind``: ``reduce(xp, x, axes)`` over every spatial axis of X, each kept as size 1."""

    def kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
        x = inputs[0]
        return finish(xp, kind, [reduce(xp, x, tuple(range(2, x.ndim)))], outputs)

    return kernel


# GlobalAveragePool: the mean of every spatial axis; GlobalMaxPool: the maximum.
register("GlobalAveragePool")(
    _global_pool_kernel("GlobalAveragePool", lambda xp, x, axes: xp.mean(x, axis=axes, keepdims=True))
)
register("GlobalMaxPool")(
    _global_pool_kernel("GlobalMaxPool", lambda xp, x, axes: xp.max(x, axis=axes, keepdims=True))
)
