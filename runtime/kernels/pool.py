"""Pooling reference kernels: MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool.

Windows are read one kernel offset at a time as strided views of the padded input (see
``common.window_slices``) and folded with maximum or addition. Output sizes follow ONNX's
ceil_mode rule (a last window starting in the end padding is dropped). AveragePool divides by a
per-position count built from one 1-D mask per axis: the real elements (count_include_pad=0) or
the real elements plus the declared pads (count_include_pad=1); the extra end padding that ceil
mode needs never counts.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from runtime.kernels.common import end_padding, finish, pad_spatial, pool_out_size, window_slices
from runtime.kernels.registry import OutputSpec, register

__all__ = ["average_pool", "max_pool"]


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


def _window_counts(
    size: int,
    begin: int,
    end: int,
    declared_end: int,
    kernel: int,
    stride: int,
    dilation: int,
    out: int,
    include_pad: bool,
) -> Any:
    """How many counted elements each of ``out`` windows covers along one axis (numpy array).

    ``end`` is the padding actually applied (declared plus ceil-mode extra); only the declared
    padding counts, and only when ``include_pad``.
    """
    mask = np.zeros(begin + size + end, dtype=np.int64)
    mask[0 if include_pad else begin : begin + size + (declared_end if include_pad else 0)] = 1
    return sum(mask[j * dilation : j * dilation + stride * (out - 1) + 1 : stride] for j in range(kernel))


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
        along = _window_counts(
            int(x.shape[2 + axis]), begins[axis], ends[axis], declared_ends[axis],
            kernel_shape[axis], strides[axis], dilations[axis], out_shape[axis], include_pad,
        )  # fmt: skip
        count = np.multiply.outer(count, along)
    divisor = xp.asarray(np.maximum(count, 1).astype(x.dtype))
    return total / divisor


@register("MaxPool")
def max_pool_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """MaxPool: X -> Y (the Indices output is not produced)."""
    return finish(xp, "MaxPool", [max_pool(xp, inputs[0], attrs)], outputs)


@register("AveragePool")
def average_pool_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """AveragePool: X -> Y."""
    return finish(xp, "AveragePool", [average_pool(xp, inputs[0], attrs)], outputs)


@register("GlobalAveragePool")
def global_average_pool_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """GlobalAveragePool: mean over every spatial axis, kept as size 1."""
    x = inputs[0]
    axes = tuple(range(2, x.ndim))
    return finish(xp, "GlobalAveragePool", [xp.mean(x, axis=axes, keepdims=True)], outputs)


@register("GlobalMaxPool")
def global_max_pool_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """GlobalMaxPool: maximum over every spatial axis, kept as size 1."""
    x = inputs[0]
    axes = tuple(range(2, x.ndim))
    return finish(xp, "GlobalMaxPool", [xp.max(x, axis=axes, keepdims=True)], outputs)
