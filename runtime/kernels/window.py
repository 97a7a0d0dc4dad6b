"""Sliding-window arithmetic of Conv, ConvTranspose and the pools, along one spatial axis.

Every output size, ``auto_pad`` split and padding extent of a windowed op is computed here and
nowhere else: by the reference kernels, by the frontend (canonical pads, the output shapes it
checks and corrects), by the providers' claims and by every kernel context (through
``compiler/providers/geometry.py``). A window of ``kernel`` taps ``dilation`` apart covers
:func:`extent` elements; output ``o`` starts at ``o * stride - begin`` in the input.

Sizes are typed :data:`Dim`: a plain ``int`` today. Dynamic shapes (a later issue) will make a
dim a symbol with a range; the functions here are written with ``+ - * //`` and comparisons only,
so they can then take symbols and build size expressions in this one place.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "Dim",
    "conv_out_size",
    "conv_transpose_out_size",
    "end_padding",
    "extent",
    "floor_mode_end",
    "inside",
    "pool_out_size",
    "reach",
    "same_pads",
    "split_pads",
    "window_counts",
]

Dim = int  # one spatial size; a symbol (with a range) once shapes may be dynamic


def extent(kernel: int, dilation: int) -> int:
    """Elements one window covers: ``kernel`` taps ``dilation`` apart."""
    return dilation * (kernel - 1) + 1


def conv_out_size(size: Dim, kernel: int, stride: int, dilation: int, begin: int, end: int) -> Dim:
    """Output length of a convolution (floor mode) along one spatial axis."""
    return (size + begin + end - extent(kernel, dilation)) // stride + 1


def pool_out_size(
    size: Dim, kernel: int, stride: int, dilation: int, begin: int, end: int, ceil_mode: int
) -> Dim:
    """Output length of a pool along one axis, as ONNX defines it.

    In ceil mode a last window that would start in the end padding is dropped: onnxruntime, the
    ONNX reference evaluator, PyTorch and ONNX's own shape inference from opset 22 agree on this
    (the shape inference of opsets before 22 keeps that window; the frontend corrects it).
    """
    span = size + begin + end - extent(kernel, dilation)
    if not ceil_mode:
        return span // stride + 1
    out = -(-span // stride) + 1
    if (out - 1) * stride >= size + begin:
        out -= 1
    return out


def floor_mode_end(kernel: int, stride: int, dilation: int, end: int) -> int:
    """The end pad with which floor mode gives ceil mode's :func:`pool_out_size` (last window
    dropped as there), whatever the input size and begin pad: what the frontend tells onnx's shape
    inference in place of a ceil-mode pool (see ``compiler/frontend/window_shapes.py``)."""
    return end + max(-1, min(stride - 1, extent(kernel, dilation) - 1 - end))


def conv_transpose_out_size(
    size: Dim, kernel: int, stride: int, dilation: int, begin: int, end: int, output_padding: int
) -> Dim:
    """Output length of a ConvTranspose along one axis: input ``i`` feeds outputs
    ``i * stride + j * dilation - begin`` (tap ``j``)."""
    return stride * (size - 1) + output_padding + extent(kernel, dilation) - begin - end


def split_pads(total: int, upper: bool) -> tuple[int, int]:
    """``total`` padding split into (begin, end); the odd element goes to the end when ``upper``
    (``auto_pad`` SAME_UPPER), to the beginning otherwise (SAME_LOWER)."""
    small, big = total // 2, total - total // 2
    return (small, big) if upper else (big, small)


def same_pads(size: Dim, kernel: int, stride: int, dilation: int, upper: bool) -> tuple[int, int]:
    """(begin, end) pads of ``auto_pad`` SAME_UPPER / SAME_LOWER: ``ceil(size / stride)`` outputs.
    At stride 1 the total is ``extent - 1`` whatever the size (a run-time size too)."""
    if stride == 1:
        return split_pads(extent(kernel, dilation) - 1, upper)
    out = -(-size // stride)
    return split_pads(max(0, (out - 1) * stride + extent(kernel, dilation) - size), upper)


def reach(out: Dim, kernel: int, stride: int, dilation: int) -> Dim:
    """Length of the padded axis that ``out`` windows address, from the first window's start."""
    return (out - 1) * stride + extent(kernel, dilation)


def end_padding(size: Dim, kernel: int, stride: int, dilation: int, begin: int, out: Dim) -> Dim:
    """End padding that makes every one of ``out`` windows fit inside the padded axis."""
    return max(0, reach(out, kernel, stride, dilation) - size - begin)


def inside(size: Dim, kernel: int, stride: int, dilation: int, begin: int, out: Dim) -> tuple[Dim, Dim]:
    """The outputs ``[lo, hi)`` whose windows lie wholly inside the input (``lo == hi`` when none)."""
    lo = min(-(-begin // stride), out)
    last = size - 1 + begin - (kernel - 1) * dilation  # the last start o * stride may take
    hi = min(last // stride + 1, out) if last >= 0 else 0
    return lo, max(lo, hi)


def window_counts(
    size: Dim, kernel: int, stride: int, dilation: int, begin: int, end: int, out: Dim, include_pad: bool
) -> list[int]:
    """Taps of each of ``out`` windows that AveragePool counts along one axis: those on real
    elements, or with ``include_pad`` those on the declared pads too (``begin``, ``end``; never on
    the extra end padding that ceil mode's last window may reach). Concrete sizes only (a count per
    window, computed with numpy), unlike the size functions above."""
    lo, hi = (-begin, size + end) if include_pad else (0, size)
    first = np.arange(out, dtype=np.int64) * stride - begin  # each window's first tap
    # taps j in [0, kernel) with lo <= first + j * dilation < hi: j from ceil((lo - first) / dilation)
    # up to ceil((hi - first) / dilation), in closed form (a million windows take milliseconds)
    low = np.maximum(0, -((first - lo) // dilation))
    high = np.minimum(kernel, -((first - hi) // dilation))
    return [int(n) for n in np.maximum(0, high - low)]
