"""Data-movement reference kernels: Reshape, Identity, Copy, Concat, Transpose, Gather, Slice,
Split, Pad, Cast, Expand, Tile, Shape, ConstantOfShape and Range.

Shapes, axes, pads and sizes arrive as canonical attributes (docs/ops.md), so no kernel here
reads a shape from an input tensor. Views are allowed as intermediate results; ``finish`` returns
them contiguous.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from runtime.contract import COPY
from runtime.errors import RuntimeKernelError
from runtime.errors import UnsupportedOpError
from runtime.kernels.common import finish
from runtime.kernels.common import in_range_indices
from runtime.kernels.registry import OutputSpec
from runtime.kernels.registry import register

__all__: list[str] = []


def _ints(values: Any) -> list[int]:
    return [int(v) for v in values]


@register("Reshape")
def reshape_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """Reshape to the static ``shape`` (also what Flatten, Squeeze and Unsqueeze become)."""
    return finish(xp, "Reshape", [inputs[0].reshape(_ints(attrs["shape"]))], outputs)


@register("Identity")
def identity_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """Identity: the input itself (the caller copies when the step's buffers differ)."""
    return finish(xp, "Identity", [inputs[0]], outputs)


@register(COPY)
def copy_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """Copy (onnx_aot): a fresh copy of X."""
    return finish(xp, COPY, [inputs[0].copy()], outputs)


@register("Concat")
def concat_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """Concat along ``axis``."""
    return finish(xp, "Concat", [xp.concatenate(inputs, axis=int(attrs["axis"]))], outputs)


@register("Transpose")
def transpose_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """Transpose by ``perm``."""
    return finish(xp, "Transpose", [xp.transpose(inputs[0], _ints(attrs["perm"]))], outputs)


@register("Gather")
def gather_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """Gather along ``axis``; negative indices count from the end, as ONNX allows."""
    x, indices = inputs
    axis = int(attrs["axis"])
    indices = in_range_indices(xp, "Gather", indices, x.shape[axis], axis)
    return finish(xp, "Gather", [xp.take(x, indices, axis=axis)], outputs)


@register("Slice")
def slice_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """Slice with canonical (clamped) starts / ends per axis in ``axes``.

    Clamped as ONNX defines it: for step > 0, 0 <= start, end <= dim; for step < 0,
    0 <= start <= dim - 1 and -1 <= end <= dim - 1, where end = -1 means "through index 0".
    """
    x = inputs[0]
    index = [slice(None)] * x.ndim
    for start, end, axis, step in zip(
        _ints(attrs["starts"]), _ints(attrs["ends"]), _ints(attrs["axes"]),
        _ints(attrs["steps"]), strict=True,
    ):  # fmt: skip
        dim = int(x.shape[axis])
        low, high = (0, dim) if step > 0 else (-1, dim - 1)
        if step == 0 or not (low <= start <= high and low <= end <= high):
            raise RuntimeKernelError(
                f"Slice: axis {axis} (size {dim}) has start={start}, end={end}, step={step},"
                " which is not the canonical clamped form"
            )
        index[axis] = slice(start, None if end < 0 else end, step)
    return finish(xp, "Slice", [x[tuple(index)]], outputs)


@register("Split")
def split_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """Split along ``axis`` into pieces of the sizes in ``split``."""
    x = inputs[0]
    axis = int(attrs["axis"])
    pieces = []
    start = 0
    for size in _ints(attrs["split"]):
        index = [slice(None)] * x.ndim
        index[axis] = slice(start, start + size)
        pieces.append(x[tuple(index)])
        start += size
    return finish(xp, "Split", pieces, outputs)


_PAD_MODES = frozenset({"constant", "reflect", "edge", "wrap"})  # same names in numpy / cupy pad


@register("Pad")
def pad_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """Pad by ``pads`` (begins then ends, one per axis); negative pads crop."""
    x = inputs[0]
    pads = _ints(attrs["pads"])
    mode = attrs["mode"]
    if mode not in _PAD_MODES:
        raise UnsupportedOpError(f"Pad: mode {mode!r} is not supported")
    begins, ends = pads[: x.ndim], pads[x.ndim :]
    crop = tuple(
        slice(max(0, -b), int(x.shape[i]) - max(0, -e))
        for i, (b, e) in enumerate(zip(begins, ends, strict=True))
    )
    x = x[crop]
    widths = [(max(0, b), max(0, e)) for b, e in zip(begins, ends, strict=True)]
    if mode == "constant":
        y = xp.pad(
            x, widths, mode="constant", constant_values=np.array(attrs["value"]).astype(x.dtype).item()
        )
    else:
        y = xp.pad(x, widths, mode=mode)
    return finish(xp, "Pad", [y], outputs)


@register("Cast")
def cast_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """Cast to the numpy dtype named by ``to`` (float -> int truncates toward zero)."""
    return finish(xp, "Cast", [inputs[0].astype(np.dtype(attrs["to"]))], outputs)


@register("Expand")
def expand_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """Expand (broadcast) to the output shape ``shape``."""
    y = xp.broadcast_to(inputs[0], tuple(_ints(attrs["shape"])))
    return finish(xp, "Expand", [y], outputs)


@register("Tile")
def tile_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """Tile by ``repeats`` (one per axis)."""
    return finish(xp, "Tile", [xp.tile(inputs[0], _ints(attrs["repeats"]))], outputs)


@register("Shape")
def shape_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """Shape: the int64 vector of X's dims from ``start`` to ``end`` (normalized)."""
    dims = [int(d) for d in inputs[0].shape[int(attrs["start"]) : int(attrs["end"])]]
    return finish(xp, "Shape", [xp.asarray(dims, dtype=xp.int64)], outputs)


@register("ConstantOfShape")
def constant_of_shape_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """ConstantOfShape: ``shape`` filled with ``value`` of dtype ``dtype`` (no inputs)."""
    dtype = np.dtype(attrs["dtype"])
    y = xp.full(tuple(_ints(attrs["shape"])), attrs["value"], dtype=dtype)
    return finish(xp, "ConstantOfShape", [y], outputs)


@register("Range")
def range_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """Range(start, limit, delta): max(ceil((limit - start) / delta), 0) values start + i * delta.

    Normally folded at compile time; the kernel is what the folding runs.
    """
    start, limit, delta = (xp.asarray(v).item() for v in inputs)
    count = max(math.ceil((limit - start) / delta), 0)
    dtype = np.dtype(outputs[0][1])
    y = xp.arange(count, dtype=xp.float64 if dtype.kind == "f" else xp.int64) * delta + start
    return finish(xp, "Range", [y], outputs)
