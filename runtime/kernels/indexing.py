"""Indexing reference kernels: GatherElements, GatherND, ScatterElements, ScatterND,
TensorScatter, OneHot, TopK, EyeLike, ReverseSequence and Col2Im (canonical forms in docs/ops.md).

Indices may be negative (counting from the end of their axis) wherever ONNX allows it; an index
outside its axis is an ``IndexRangeError`` (an ``InputError``) naming the first such value, the
axis and its size. Scatters apply updates in index order, so duplicate indices give the same
result on numpy and cupy (the last write wins for reduction "none").
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import numpy as np

from runtime.errors import RuntimeKernelError
from runtime.kernels.common import fill_optional
from runtime.kernels.common import finish
from runtime.kernels.common import in_range_indices
from runtime.kernels.common import in_range_tuples
from runtime.kernels.common import prod
from runtime.kernels.common import window_slices
from runtime.kernels.registry import OutputSpec
from runtime.kernels.registry import register
from runtime.kernels.window import conv_out_size

__all__: list[str] = []

# How a scatter combines the value already there with an update.
_COMBINE: dict[str, Callable[[Any, Any, Any], Any]] = {
    "none": lambda xp, old, new: new,
    "add": lambda xp, old, new: old + new,
    "mul": lambda xp, old, new: old * new,
    "max": lambda xp, old, new: xp.maximum(old, new),
    "min": lambda xp, old, new: xp.minimum(old, new),
}


def _scatter_rows(xp: Any, kind: str, out: Any, rows: Any, updates: Any, reduction: str) -> None:
    """out[rows[i]] = combine(out[rows[i]], updates[i]) for every i, in order, duplicates included.

    Writes go in rounds: round r takes each row's r-th occurrence, so no round repeats a row.
    """
    if reduction not in _COMBINE:
        raise RuntimeKernelError(f"{kind}: unknown reduction {reduction!r}")
    combine = _COMBINE[reduction]
    if not rows.size:
        return
    order = xp.argsort(rows, kind="stable")
    ordered = rows[order]
    occurrence = xp.empty_like(rows)
    occurrence[order] = xp.arange(rows.size) - xp.searchsorted(ordered, ordered, side="left")
    for r in range(int(occurrence.max()) + 1):
        pick = xp.nonzero(occurrence == r)[0]
        at = rows[pick]
        out[at] = combine(xp, out[at], updates[pick])


@register("GatherElements")
def gather_elements_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """GatherElements along ``axis``: out[i][j][k] = data[index[i][j][k]][j][k] (axis 0)."""
    data, indices = inputs
    axis = int(attrs["axis"])
    indices = in_range_indices(xp, "GatherElements", indices, data.shape[axis], axis)
    return finish(xp, "GatherElements", [xp.take_along_axis(data, indices, axis=axis)], outputs)


@register("GatherND")
def gather_nd_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """GatherND with ``batch_dims`` leading batch axes shared by data and indices."""
    data, indices = inputs
    b = int(attrs["batch_dims"])
    k = int(indices.shape[-1])
    batch = prod(data.shape[:b])
    flat_data = data.reshape((batch, *data.shape[b:]))
    count = prod(indices.shape[b:-1])
    flat_idx = indices.reshape((batch, count, k))
    flat_idx = in_range_tuples(xp, "GatherND", flat_idx, data.shape[b:b + k], b)
    coords = [flat_idx[..., j] for j in range(k)]
    batch_index = xp.broadcast_to(xp.arange(batch)[:, None], (batch, count))
    where = (batch_index, *coords)
    result = flat_data[where]
    return finish(xp, "GatherND", [result.reshape(outputs[0][0])], outputs)


@register("ScatterElements")
def scatter_elements_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """ScatterElements along ``axis`` with ``reduction`` none / add / mul / max / min."""
    data, indices, updates = inputs
    axis = int(attrs["axis"])
    coords = list(xp.indices(indices.shape))
    coords[axis] = in_range_indices(xp, "ScatterElements", indices, data.shape[axis], axis)
    rows = xp.ravel_multi_index(tuple(c.reshape(-1) for c in coords), data.shape)
    out = data.copy().reshape(-1)
    _scatter_rows(xp, "ScatterElements", out, rows, updates.reshape(-1), str(attrs["reduction"]))
    return finish(xp, "ScatterElements", [out.reshape(data.shape)], outputs)


@register("ScatterND")
def scatter_nd_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """ScatterND: each index tuple (the last axis of indices) addresses one slice of data."""
    data, indices, updates = inputs
    k = int(indices.shape[-1])
    flat_idx = indices.reshape((prod(indices.shape[:-1]), k))
    flat_idx = in_range_tuples(xp, "ScatterND", flat_idx, data.shape[:k], 0)
    rows = xp.zeros(flat_idx.shape[0], dtype=xp.int64)
    for j in range(k):
        rows = rows * int(data.shape[j]) + flat_idx[:, j]
    out = data.copy().reshape((prod(data.shape[:k]), *data.shape[k:]))
    slices = updates.reshape((flat_idx.shape[0], *data.shape[k:]))
    _scatter_rows(xp, "ScatterND", out, rows, slices, str(attrs["reduction"]))
    return finish(xp, "ScatterND", [out.reshape(data.shape)], outputs)


@register("TensorScatter")
def tensor_scatter_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """TensorScatter: write ``update`` into the cache along ``axis`` at each batch's write index."""
    past, update, write = fill_optional("TensorScatter", inputs, 3)
    if write is None:
        write = xp.zeros(past.shape[0], xp.int64)
    axis = int(attrs["axis"])
    capacity, length = int(past.shape[axis]), int(update.shape[axis])
    out = past.copy()
    lead = (slice(None),) * (axis - 1)
    for b, start in enumerate(write.reshape(-1).tolist()):
        positions = int(start) + xp.arange(length)
        if attrs["mode"] == "circular":
            positions = positions % capacity
        elif int(start) < 0 or int(start) + length > capacity:
            raise RuntimeKernelError(f"TensorScatter: writing {length} entries at {start} overflows the "
                                     f"cache of length {capacity} (batch {b})")
        where = (*lead, positions)
        out[b][where] = update[b]
    return finish(xp, "TensorScatter", [out], outputs)


@register("OneHot")
def one_hot_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """OneHot: ``depth`` values inserted at ``axis``; values = [off, on]; out-of-range rows are off."""
    indices, values = inputs
    depth, axis = int(attrs["depth"]), int(attrs["axis"])
    wrapped = xp.where(indices < 0, indices + depth, indices)
    targets = xp.arange(depth).reshape((depth,) + (1,) * (indices.ndim - axis))
    hot = xp.expand_dims(wrapped, axis) == targets
    flat = values.reshape(-1)
    return finish(xp, "OneHot", [xp.where(hot, flat[1], flat[0])], outputs)


@register("TopK")
def top_k_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """TopK: the ``k`` largest (or smallest) along ``axis``, sorted; ties keep the lower index first."""
    x = inputs[0]
    axis, k = int(attrs["axis"]), int(attrs["k"])
    if int(attrs["largest"]):
        # A stable ascending sort of the reversed axis, read backwards: descending, ties by index.
        n = int(x.shape[axis])
        order = n - 1 - xp.flip(xp.argsort(xp.flip(x, axis), axis=axis, kind="stable"), axis)
    else:
        order = xp.argsort(x, axis=axis, kind="stable")
    index = [slice(None)] * x.ndim
    index[axis] = slice(0, k)
    top = order[tuple(index)]
    return finish(xp, "TopK", [xp.take_along_axis(x, top, axis=axis), top], outputs)


@register("EyeLike")
def eye_like_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """EyeLike: ones on diagonal ``k`` of a ``shape`` matrix of ``dtype`` (no inputs)."""
    rows, cols = (int(d) for d in attrs["shape"])
    y = xp.eye(rows, cols, k=int(attrs["k"]), dtype=np.dtype(attrs["dtype"]))
    return finish(xp, "EyeLike", [y], outputs)


@register("ReverseSequence")
def reverse_sequence_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """ReverseSequence: reverse the first sequence_lens[b] steps along ``time_axis`` of each batch b."""
    x, lens = inputs
    batch_axis, time_axis = int(attrs["batch_axis"]), int(attrs["time_axis"])
    steps = int(x.shape[time_axis])
    lens = lens.astype(xp.int64).reshape(-1)
    if lens.size and bool(xp.any((lens < 0) | (lens > steps))):
        raise RuntimeKernelError(f"ReverseSequence: a sequence length is outside [0, {steps}]")
    t = xp.arange(steps)[:, None]  # (time, batch)
    source = xp.where(t < lens[None, :], lens[None, :] - 1 - t, t)
    if batch_axis < time_axis:
        source = source.T
    source = xp.broadcast_to(source.reshape(source.shape + (1,) * (x.ndim - 2)), x.shape)
    return finish(xp, "ReverseSequence", [xp.take_along_axis(x, source, axis=time_axis)], outputs)


def _block_counts(image: Sequence[int], block: Sequence[int], strides: Sequence[int],
                  dilations: Sequence[int], pads: Sequence[int]) -> list[int]:
    n = len(image)
    return [conv_out_size(image[i], block[i], strides[i], dilations[i], pads[i], pads[i + n])
            for i in range(n)]


@register("Col2Im")
def col2im_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """Col2Im: sum the (N, C * prod(block), L) columns back into an (N, C, *image_shape) image."""
    x = inputs[0]
    image = [int(v) for v in attrs["image_shape"]]
    block = [int(v) for v in attrs["block_shape"]]
    strides = [int(v) for v in attrs["strides"]]
    dilations = [int(v) for v in attrs["dilations"]]
    pads = [int(v) for v in attrs["pads"]]
    n = len(image)
    counts = _block_counts(image, block, strides, dilations, pads)
    batch, channels = int(x.shape[0]), int(x.shape[1]) // prod(block)
    cols = x.reshape((batch, channels, *block, *counts))
    padded = xp.zeros((batch, channels, *(image[i] + pads[i] + pads[i + n] for i in range(n))), x.dtype)
    offsets = itertools.product(*(range(k) for k in block))
    for offset, window in zip(offsets, window_slices(block, strides, dilations, counts), strict=True):
        column = (slice(None), slice(None), *offset)
        padded[window] += cols[column]
    crop = (slice(None), slice(None), *(slice(pads[i], pads[i] + image[i]) for i in range(n)))
    return finish(xp, "Col2Im", [padded[crop]], outputs)
