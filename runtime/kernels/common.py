"""Helpers shared by the reference kernels: optional inputs, result conformance, padding and
window slices.

Conv and the pools read their windows the same way here (the padded input, the strided slice a
kernel offset reads); their sizes come from ``runtime/kernels/window.py``. Everything takes the
array module ``xp``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from collections.abc import Sequence
from typing import Any

import numpy as np

from runtime.errors import IndexRangeError
from runtime.errors import RuntimeKernelError
from runtime.kernels.registry import OutputSpec

__all__ = ["finish", "fill_optional", "in_range_indices", "in_range_tuples", "pad_spatial", "prod",
           "window_slices"]


def fill_optional(kind: str, inputs: Sequence[Any], count: int) -> list[Any]:
    """``inputs`` followed by None up to ``count`` entries: a node may leave out its trailing
    optional inputs, and an omitted one reads as None either way."""
    if len(inputs) > count:
        raise RuntimeKernelError(f"{kind}: {len(inputs)} inputs, expected at most {count}")
    return [*inputs, *[None] * (count - len(inputs))]


def in_range_indices(xp: Any, kind: str, indices: Any, size: int, axis: int) -> Any:
    """``indices`` as int64 with negative ones counted from the end of an axis of ``size``;
    a value outside ``[-size, size)`` is an ``IndexRangeError`` naming the first such value in
    order (row-major), ``axis`` and ``size``."""
    indices = indices.astype(xp.int64)
    size = int(size)
    bad = (indices < -size) | (indices >= size)
    if indices.size and bool(xp.any(bad)):
        first = int(xp.argmax(bad.reshape(-1)))
        raise IndexRangeError(kind, int(indices.reshape(-1)[first]), axis, size)
    return xp.where(indices < 0, indices + size, indices)


def in_range_tuples(xp: Any, kind: str, indices: Any, sizes: Sequence[int], first_axis: int) -> Any:
    """``in_range_indices`` for index tuples (GatherND, ScatterND): ``indices[..., j]`` indexes
    axis ``first_axis + j`` of size ``sizes[j]``; the first offending element in row-major order
    of ``indices`` is the one named."""
    indices = indices.astype(xp.int64)
    size = xp.asarray(np.array([int(d) for d in sizes], np.int64))
    bad = (indices < -size) | (indices >= size)
    if indices.size and bool(xp.any(bad)):
        first = int(xp.argmax(bad.reshape(-1)))
        j = first % len(sizes)
        raise IndexRangeError(kind, int(indices.reshape(-1)[first]), first_axis + j, int(sizes[j]))
    return xp.where(indices < 0, indices + size, indices)


def finish(
    xp: Any, kind: str, results: Sequence[Any], outputs: list[OutputSpec], *, broadcast: bool = False
) -> list[Any]:
    """Cast each result to its expected dtype and check its shape; results come back C-contiguous.

    With ``broadcast`` (elementwise-style ops) a result is first broadcast to its output shape,
    which covers e.g. a variadic op given one small input.

    A result may still be an input itself (Identity, Reshape of a contiguous input): callers that
    reuse input memory copy results out first (see docs/ops.md, "Views and in-place").
    """
    if len(results) != len(outputs):
        raise RuntimeKernelError(f"{kind}: produced {len(results)} results, expected {len(outputs)}")
    done = []
    for i, (result, (shape, dtype)) in enumerate(zip(results, outputs, strict=True)):
        arr = xp.asarray(result)
        want = np.dtype(dtype)
        if arr.dtype != want:
            arr = arr.astype(want)
        shape = tuple(int(d) for d in shape)
        if broadcast and tuple(arr.shape) != shape:
            try:
                arr = xp.broadcast_to(arr, shape)
            except ValueError:
                pass  # reported below
        if tuple(arr.shape) != shape:
            raise RuntimeKernelError(f"{kind}: result {i} has shape {tuple(arr.shape)}, expected {shape}")
        if not arr.flags.c_contiguous:  # (ascontiguousarray would turn 0-d into 1-d)
            arr = xp.ascontiguousarray(arr)
        done.append(arr)
    return done


def pad_spatial(xp: Any, x: Any, begins: Sequence[int], ends: Sequence[int], value: float) -> Any:
    """``x`` (N, C, *spatial) padded with ``value`` by ``begins``/``ends`` along the spatial axes."""
    if not any(begins) and not any(ends):
        return x
    widths = [(0, 0), (0, 0)] + [(int(b), int(e)) for b, e in zip(begins, ends, strict=True)]
    return xp.pad(x, widths, mode="constant", constant_values=value)


def window_slices(
    kernel_shape: Sequence[int], strides: Sequence[int], dilations: Sequence[int], out_shape: Sequence[int]
) -> Iterator[tuple[slice, ...]]:
    """For each kernel offset (row-major), the index reading that offset from every window.

    Applied to a padded (N, C, *spatial) array it yields an (N, C, *out_shape) strided view.
    """
    for offsets in itertools.product(*(range(k) for k in kernel_shape)):
        yield (slice(None), slice(None)) + tuple(
            slice(o * d, o * d + s * (n - 1) + 1, s)
            for o, d, s, n in zip(offsets, dilations, strides, out_shape, strict=True)
        )


def prod(values: Sequence[int]) -> int:
    """Product of a sequence of ints (1 when empty)."""
    return math.prod(int(v) for v in values)
