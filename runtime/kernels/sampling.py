"""Reference kernels of the ops that sample their input at computed positions: DeformConv and
RoiAlign (canonical forms in compiler/frontend/canonical/sampling.py).

DeformConv gathers, for every kernel tap and output position, the input interpolated
(multi-)linearly at the tap's offset position -- a corner outside the input counts as zero, as in
GridSample with zero padding and aligned corners -- scales it by the mask and then contracts the
columns with the weights exactly as Conv's im2col does. RoiAlign follows onnxruntime's algorithm
(the ONNX reference copies it), including its "max" mode, which takes the largest weighted corner.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from runtime.errors import RuntimeKernelError
from runtime.kernels.common import fill_optional
from runtime.kernels.common import finish
from runtime.kernels.common import prod
from runtime.kernels.registry import OutputSpec
from runtime.kernels.registry import register

__all__: list[str] = []


def _grid(xp: Any, ranges: list[Any]) -> Any:
    """(len(ranges), prod of lengths): every combination of the ranges' values, row-major."""
    mesh = xp.meshgrid(*ranges, indexing="ij")
    return xp.stack([m.reshape(-1) for m in mesh])


def _positions(xp: Any, offset: Any, attrs: dict[str, Any], out_shape: tuple[int, ...]) -> Any:
    """Sampling coordinates (nd, N, offset_groups, taps, pixels): window start + tap + offset."""
    kernel = [int(k) for k in attrs["kernel_shape"]]
    nd = len(kernel)
    taps = _grid(xp, [xp.arange(k) * int(d) for k, d in zip(kernel, attrs["dilations"], strict=True)])
    starts = _grid(xp, [xp.arange(o) * int(s) - int(p)
                        for o, s, p in zip(out_shape, attrs["strides"], attrs["pads"][:nd], strict=True)])
    n = int(offset.shape[0])
    offset = offset.reshape(n, int(attrs["offset_group"]), prod(kernel), nd, prod(out_shape))
    base = taps[:, :, None] + starts[:, None, :]  # (nd, taps, pixels)
    return base[:, None, None].astype(np.float64) + xp.moveaxis(offset.astype(np.float64), 3, 0)


def _sample(xp: Any, x: Any, pos: Any, groups: int) -> Any:
    """``x`` (N, C, *spatial) interpolated at ``pos`` -> (N, groups, C / groups, taps, pixels)."""
    n, c, spatial = int(x.shape[0]), int(x.shape[1]), [int(s) for s in x.shape[2:]]
    flat = x.reshape(n, groups, c // groups, prod(spatial))
    _, _, _, taps, pixels = pos.shape
    low = xp.floor(pos)
    total = xp.zeros((n, groups, c // groups, taps * pixels), np.float64)
    for corner in itertools.product((0, 1), repeat=len(spatial)):
        weight = xp.ones(pos.shape[1:], np.float64)
        index = xp.zeros(pos.shape[1:], np.int64)
        for d, bit in enumerate(corner):
            at = low[d] + bit
            weight = weight * (1 - xp.abs(pos[d] - at)) * ((at >= 0) & (at <= spatial[d] - 1))
            index = index * spatial[d] + xp.clip(at, 0, spatial[d] - 1).astype(np.int64)
        picked = xp.take_along_axis(
            flat, xp.broadcast_to(index.reshape(n, groups, 1, -1), total.shape), axis=3)
        total = total + weight.reshape(n, groups, 1, -1) * picked
    return total.reshape(n, groups, c // groups, taps, pixels)


@register("DeformConv")
def deform_conv_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any],
                       outputs: list[OutputSpec]) -> list[Any]:
    """DeformConv: X, W, offset, B?, mask? -> Y (N, M, *out)."""
    x, w, offset, bias, mask = fill_optional("DeformConv", inputs, 5)
    n, c, m = int(x.shape[0]), int(x.shape[1]), int(w.shape[0])
    out_shape = tuple(int(s) for s in offset.shape[2:])
    pixels, taps, groups = prod(out_shape), prod(attrs["kernel_shape"]), int(attrs["group"])
    offset_groups = int(attrs["offset_group"])
    cols = _sample(xp, x, _positions(xp, offset, attrs, out_shape), offset_groups)
    if mask is not None:
        cols = cols * mask.reshape(n, offset_groups, 1, taps, pixels)
    per = (c // groups) * taps
    weights = w.astype(np.float64).reshape(1, groups, m // groups, per)
    y = xp.matmul(weights, cols.reshape(n, groups, per, pixels))
    y = y.reshape(n, m, *out_shape)
    if bias is not None:
        y = y + bias.reshape(1, m, *([1] * len(out_shape)))
    return finish(xp, "DeformConv", [y], outputs)


def _axis_samples(xp: Any, start: float, size: float, bins: int, grid: int, limit: int) -> tuple[Any, ...]:
    """Sample points of one ROI axis: (low index, high index, low weight, high weight), (bins, grid).

    Points beyond [-1, limit] get zero weights; the rest are clamped into the input as onnxruntime does.
    """
    bin_size = size / bins
    at = (start + xp.arange(bins)[:, None] * bin_size
          + (xp.arange(grid)[None, :] + 0.5) * bin_size / grid)
    inside = (at >= -1.0) & (at <= limit)
    at = xp.maximum(at, 0.0)
    low = xp.floor(at).astype(np.int64)
    edge = low >= limit - 1
    low = xp.where(edge, limit - 1, low)
    high = xp.where(edge, limit - 1, low + 1)
    frac = xp.where(edge, 0.0, at - low)
    return low, high, (1 - frac) * inside, frac * inside


def _roi(xp: Any, image: Any, roi: Any, attrs: dict[str, Any]) -> Any:
    """One ROI of ``image`` (C, H, W) pooled to (C, output_height, output_width)."""
    height, width = int(image.shape[1]), int(image.shape[2])
    out_h, out_w = int(attrs["output_height"]), int(attrs["output_width"])
    shift = 0.5 if attrs["coordinate_transformation_mode"] == "half_pixel" else 0.0
    x0, y0, x1, y1 = (float(v) * float(attrs["spatial_scale"]) - shift for v in roi)
    roi_w, roi_h = x1 - x0, y1 - y0
    if not shift:  # malformed ROIs are forced to 1x1 in the old mode
        roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
    ratio = int(attrs["sampling_ratio"])
    grid_h = ratio if ratio > 0 else max(int(math.ceil(roi_h / out_h)), 0)
    grid_w = ratio if ratio > 0 else max(int(math.ceil(roi_w / out_w)), 0)
    if grid_h == 0 or grid_w == 0:
        return xp.zeros((image.shape[0], out_h, out_w), np.float64)
    ylo, yhi, wylo, wyhi = _axis_samples(xp, y0, roi_h, out_h, grid_h, height)
    xlo, xhi, wxlo, wxhi = _axis_samples(xp, x0, roi_w, out_w, grid_w, width)
    corners = []  # each (C, out_h, grid_h, out_w, grid_w)
    for rows, wy in ((ylo, wylo), (yhi, wyhi)):
        for cols, wx in ((xlo, wxlo), (xhi, wxhi)):
            values = image[:, rows[:, :, None, None], cols[None, None, :, :]]
            corners.append(values * (wy[:, :, None, None] * wx[None, None, :, :]))
    if attrs["mode"] == "avg":
        return sum(corners).sum(axis=(2, 4)) / max(grid_h * grid_w, 1)
    best = corners[0]
    for corner in corners[1:]:
        best = xp.maximum(best, corner)
    return best.max(axis=(2, 4))


@register("RoiAlign")
def roi_align_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any],
                     outputs: list[OutputSpec]) -> list[Any]:
    """RoiAlign: X (N, C, H, W), rois (R, 4) as x1, y1, x2, y2, batch_indices (R,) -> Y (R, C, oh, ow)."""
    x, rois, batch = inputs
    images = int(x.shape[0])
    pooled = []
    for roi, b in zip(rois.tolist(), batch.reshape(-1).tolist(), strict=True):  # (tolist: host values)
        if not 0 <= int(b) < images:
            raise RuntimeKernelError(f"RoiAlign: batch index {b} out of range for {images} image(s)")
        pooled.append(_roi(xp, x[int(b)].astype(np.float64), roi, attrs))
    shape = (0, int(x.shape[1]), int(attrs["output_height"]), int(attrs["output_width"]))
    y = xp.stack(pooled) if pooled else xp.zeros(shape, np.float64)
    return finish(xp, "RoiAlign", [y], outputs)
