"""Reference kernels of the spatial ops: Resize, ConvTranspose, GridSample, AffineGrid.

Resize is separable: :func:`resize_taps` turns one axis's canonical attributes into a table of
(input index, weight) taps per output index, the same table the C provider compiles into its
kernel, and the kernel applies the tables one axis at a time in float64, as ONNX's reference does.
ConvTranspose is one batched matmul (W^T X per group) followed by a col2im scatter-add of strided
slices. GridSample gathers every tap combination of the separable nearest / linear / cubic filter
at once; AffineGrid multiplies theta with the base grid.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.errors import RuntimeKernelError
from runtime.kernels.common import fill_optional
from runtime.kernels.common import finish
from runtime.kernels.common import prod
from runtime.kernels.registry import OutputSpec
from runtime.kernels.registry import register
from runtime.kernels.window import reach

__all__ = ["ResizeTaps", "resize_taps"]


# -- Resize -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ResizeTaps:
    """One axis of a Resize: output ``o`` is ``sum_t weights[o, t] * x[index[o, t]]``, or the
    extrapolation value where ``outside[o]`` (tf_crop_and_resize only; None otherwise)."""

    in_size: int
    index: np.ndarray  # (out, taps) int64, clamped to [0, in_size)
    weights: np.ndarray  # (out, taps) float64
    outside: np.ndarray | None  # (out,) bool

    @property
    def is_identity(self) -> bool:
        n = self.index.shape[0]
        return (n == self.in_size and self.index.shape[1] == 1 and self.outside is None
                and bool(np.all(self.index[:, 0] == np.arange(n))) and bool(np.all(self.weights == 1.0)))


def _source_coordinates(mode: str, out_size: int, in_size: int, scale: float, lo: float,
                        hi: float) -> np.ndarray:
    """Each output index's coordinate in the input (ONNX's coordinate_transformation_mode)."""
    y = np.arange(out_size, dtype=np.float64)
    width = scale * in_size  # ONNX uses the unrounded output length
    if mode == "align_corners":
        return np.zeros(out_size) if width == 1 else y * (in_size - 1) / (width - 1)
    if mode == "asymmetric":
        return y / scale
    if mode == "tf_half_pixel_for_nn":
        return (y + 0.5) / scale
    if mode == "tf_crop_and_resize":
        if width == 1:
            return np.full(out_size, (hi - lo) * (in_size - 1) / 2 + lo * (in_size - 1))
        return y * (hi - lo) * (in_size - 1) / (width - 1) + lo * (in_size - 1)
    if mode == "pytorch_half_pixel":
        return np.full(out_size, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = in_size / 2 * (1 - out_size / width)
        return offset + (y + 0.5) / scale - 0.5
    raise RuntimeKernelError(f"Resize: unknown coordinate_transformation_mode {mode!r}")


def _nearest_index(x: np.ndarray, nearest_mode: str, scale: float) -> np.ndarray:
    floor = np.floor(x)
    ratio = x - floor
    if nearest_mode == "simple":  # onnxruntime's Upsample / Resize-10: ceil when downscaling
        nearest_mode = "ceil" if scale < 1 else "floor"
    up = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5,
          "floor": np.zeros(x.shape, bool), "ceil": ratio > 0}[nearest_mode]
    return (floor + up).astype(np.int64)


def _cubic(d: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel at distances ``d``."""
    d = np.abs(d)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def _filter_weights(ratio: np.ndarray, attrs: dict[str, Any], scale: float) -> np.ndarray:
    """(out, 2 * half) weights of the taps at offsets 1 - half .. half from floor(x), where
    ``ratio`` = x - floor(x); antialiasing stretches the filter by 1 / scale when downscaling."""
    linear = attrs["mode"] == "linear"
    antialias = bool(int(attrs["antialias"]))
    stretch = min(scale, 1.0) if antialias else 1.0
    half = math.ceil((1 if linear else 2) / stretch)  # the filter's support, in input pixels
    offsets = np.arange(1 - half, 1 + half, dtype=np.float64)
    d = (offsets[None, :] - ratio[:, None]) * stretch
    w = np.clip(1 - np.abs(d), 0, 1) if linear else _cubic(d, float(attrs["cubic_coeff_a"]))
    return w / w.sum(axis=1, keepdims=True) if antialias else w


def resize_taps(in_size: int, out_size: int, scale: float, lo: float, hi: float,
                attrs: dict[str, Any]) -> ResizeTaps:
    """The taps of one axis resized from ``in_size`` to ``out_size`` (canonical Resize attrs)."""
    coordinate_mode = str(attrs["coordinate_transformation_mode"])
    crops = coordinate_mode == "tf_crop_and_resize" and not (math.isclose(lo, 0.0) and math.isclose(hi, 1.0))
    if out_size == in_size and math.isclose(scale, 1.0) and not crops:
        return ResizeTaps(in_size, np.arange(out_size, dtype=np.int64)[:, None], np.ones((out_size, 1)), None)
    x = _source_coordinates(coordinate_mode, out_size, in_size, scale, lo, hi)
    outside = ((x < 0) | (x > in_size - 1)) if coordinate_mode == "tf_crop_and_resize" else None
    if attrs["mode"] == "nearest":
        index = np.clip(_nearest_index(x, str(attrs["nearest_mode"]), scale), 0, in_size - 1)[:, None]
        return ResizeTaps(in_size, index, np.ones((out_size, 1)), outside)
    floor = np.floor(x)
    exact = x == floor
    # ONNX prefers the pixel left of x: at an integer x the taps are those of ratio 1 from x - 1.
    base = np.where(exact, floor - 1, floor).astype(np.int64)
    ratio = np.where(exact, 1.0, x - floor)
    weights = _filter_weights(ratio, attrs, scale)
    half = weights.shape[1] // 2
    index = base[:, None] + np.arange(1 - half, 1 + half, dtype=np.int64)[None, :]
    if int(attrs["exclude_outside"]):
        weights = np.where((index < 0) | (index >= in_size), 0.0, weights)
        total = weights.sum(axis=1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    return ResizeTaps(in_size, np.clip(index, 0, in_size - 1), weights, outside)


def _scales_from_sizes(in_shape: tuple[int, ...], out_shape: tuple[int, ...], scales: list[float],
                       attrs: dict[str, Any]) -> list[float]:
    """A Resize by ``sizes`` over run-time dims: each axis whose scale is 0.0 takes ONNX's
    ``sizes / input`` (float64, as a static import does), the keep_aspect_ratio_policy's min / max
    over those axes where it is not "stretch"; the output must be the sizes that gives."""
    sizes = [int(v) for v in attrs["sizes"]]
    axes = [a for a, s in enumerate(scales) if s == 0.0]
    if len(sizes) != len(in_shape) or any(in_shape[a] == 0 for a in axes):
        raise RuntimeKernelError(f"Resize: sizes {sizes} do not fit the input {in_shape}")
    scales = list(scales)
    for a in axes:
        scales[a] = sizes[a] / in_shape[a]
    policy = str(attrs.get("keep_aspect_ratio_policy", "stretch"))
    if policy != "stretch" and axes:
        scale = (min if policy == "not_larger" else max)(scales[a] for a in axes)
        for a in axes:
            scales[a] = scale
            sizes[a] = int(scale * in_shape[a] + 0.5)
    if tuple(sizes) != tuple(out_shape):
        raise RuntimeKernelError(f"Resize: output {tuple(out_shape)} is not the requested sizes "
                                 f"{tuple(sizes)} of input {tuple(in_shape)}")
    return scales


def resize_plan(in_shape: tuple[int, ...], out_shape: tuple[int, ...],
                attrs: dict[str, Any]) -> list[ResizeTaps]:
    """The taps of every axis (identity taps for axes that keep their size and scale 1)."""
    rank = len(in_shape)
    scales, roi = [float(s) for s in attrs["scales"]], [float(r) for r in attrs["roi"]]
    if len(scales) != rank or len(roi) != 2 * rank or len(out_shape) != rank:
        raise RuntimeKernelError(f"Resize: scales {scales} / roi {roi} do not match rank {rank}")
    if "sizes" in attrs:
        scales = _scales_from_sizes(in_shape, out_shape, scales, attrs)
    return [resize_taps(in_shape[a], out_shape[a], scales[a], roi[a], roi[rank + a], attrs)
            for a in range(rank)]


def _resize_axis(xp: Any, data: Any, axis: int, taps: ResizeTaps, extrapolation: float) -> Any:
    n_out, n_taps = taps.index.shape
    gathered = xp.take(data, xp.asarray(taps.index.reshape(-1)), axis=axis)
    if n_taps == 1 and bool(np.all(taps.weights == 1.0)):
        result = gathered  # nearest: a pure gather keeps the dtype exact
    else:
        shape = data.shape[:axis] + (n_out, n_taps) + data.shape[axis + 1:]
        weights = taps.weights.reshape((1,) * axis + (n_out, n_taps) + (1,) * (data.ndim - axis - 1))
        result = (gathered.reshape(shape).astype(xp.float64) * xp.asarray(weights)).sum(axis=axis + 1)
    if taps.outside is not None and taps.outside.any():
        mask = xp.asarray(taps.outside.reshape((1,) * axis + (n_out,) + (1,) * (data.ndim - axis - 1)))
        result = xp.where(mask, extrapolation, result.astype(xp.float64))  # saturated at the end
    return result


@register("Resize")
def resize_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """Resize: X -> Y (canonical form: every axis's scale and roi are attributes)."""
    x = inputs[0]
    out_shape, dtype = outputs[0]
    result = x
    for axis, taps in enumerate(resize_plan(tuple(x.shape), tuple(out_shape), attrs)):
        if not taps.is_identity:
            result = _resize_axis(xp, result, axis, taps, float(attrs["extrapolation_value"]))
    want = np.dtype(dtype)
    if want.kind in "iu" and result.dtype.kind == "f":  # ONNX saturates: round half to even, clip
        info = np.iinfo(want.name)
        result = xp.clip(xp.rint(result), info.min, info.max)
    return finish(xp, "Resize", [result], outputs)


# -- ConvTranspose ------------------------------------------------------------------------------
_ALL2 = (slice(None), slice(None))  # every image and channel


@register("ConvTranspose")
def conv_transpose_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any],
                          outputs: list[OutputSpec]) -> list[Any]:
    """ConvTranspose: X, W, B? -> Y; output o gets x[i] * w[k] where o = i*stride + k*dilation - pad."""
    x, w, b = fill_optional("ConvTranspose", inputs, 3)
    kernel = [int(k) for k in attrs["kernel_shape"]]
    strides, dilations = [int(s) for s in attrs["strides"]], [int(d) for d in attrs["dilations"]]
    group, nd = int(attrs["group"]), len(kernel)
    begins = [int(p) for p in attrs["pads"][:nd]]
    n, c, spatial = int(x.shape[0]), int(x.shape[1]), [int(s) for s in x.shape[2:]]
    out_shape = tuple(int(d) for d in outputs[0][0])
    cg, mg = c // group, int(w.shape[1])
    if c % group or int(w.shape[0]) != c or list(w.shape[2:]) != kernel:
        raise RuntimeKernelError(f"ConvTranspose: X {tuple(x.shape)}, W {tuple(w.shape)}, group={group}")
    wt = w.reshape(group, cg, mg * prod(kernel)).transpose(0, 2, 1)
    cols = xp.matmul(wt, x.reshape(n, group, cg, prod(spatial)))  # (n, group, mg * taps, pixels)
    cols = cols.reshape(n, group * mg, *kernel, *spatial)
    # Scatter into a buffer holding every written position and the whole output window.
    shift = [max(0, -p) for p in begins]
    full = [max(reach(i, k, s, d), p + o) + sh for k, d, s, i, p, o, sh in
            zip(kernel, dilations, strides, spatial, begins, out_shape[2:], shift, strict=True)]
    acc_dtype = xp.float64 if x.dtype == xp.float64 else xp.float32
    buf = xp.zeros((n, group * mg, *full), dtype=acc_dtype)
    for offsets in itertools.product(*(range(k) for k in kernel)):
        window = tuple(slice(o * d + sh, o * d + sh + s * (i - 1) + 1, s) for o, d, s, i, sh in
                       zip(offsets, dilations, strides, spatial, shift, strict=True))
        buf[_ALL2 + window] += cols[_ALL2 + offsets]
    crop = tuple(slice(p + sh, p + sh + o) for p, sh, o in zip(begins, shift, out_shape[2:], strict=True))
    y = buf[_ALL2 + crop]
    if b is not None:
        y = y + b.reshape(1, -1, *([1] * nd))
    return finish(xp, "ConvTranspose", [y], outputs)


# -- GridSample ---------------------------------------------------------------------------------
def _reflect(x: Any, lo: float, hi: float, xp: Any) -> Any:
    """Reflect ``x`` at the borders ``lo``/``hi`` until it lies inside (PyTorch's reflection)."""
    span = hi - lo
    if span <= 0:
        return xp.full_like(x, lo)
    below = x < lo
    dx = xp.where(below, lo - x, x - hi)
    flips = xp.trunc(dx / span)
    r = dx - flips * span
    even = (flips % 2) == 0
    inside_lo, inside_hi = lo + r, hi - r
    reflected = xp.where(below, xp.where(even, inside_lo, inside_hi), xp.where(even, inside_hi, inside_lo))
    return xp.where((x < lo) | (x > hi), reflected, x)


def _grid_taps(xp: Any, coord: Any, size: int, attrs: dict[str, Any]) -> list[tuple[Any, Any, Any]]:
    """For one spatial axis: per tap (clamped index, weight, valid) arrays shaped like ``coord``."""
    align = int(attrs["align_corners"])
    padding, mode = str(attrs["padding_mode"]), str(attrs["mode"])
    x = (coord + 1) / 2 * (size - 1) if align else ((coord + 1) * size - 1) / 2
    if mode == "nearest":
        x = xp.rint(x)
    lo, hi = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
    if padding == "border":
        x = xp.where((x < lo) | (x > hi), xp.clip(x, 0, size - 1), x)
    elif padding == "reflection":
        x = _reflect(x, lo, hi, xp)
    if mode == "nearest":
        starts, weights = [xp.trunc(x)], [xp.ones_like(x)]
    else:
        base = xp.floor(x)
        t = x - base
        if mode == "linear":
            starts, weights = [base, base + 1], [1 - t, t]
        else:
            starts = [base - 1, base, base + 1, base + 2]
            weights = [_cubic(t + 1, -0.75), _cubic(t, -0.75), _cubic(1 - t, -0.75), _cubic(2 - t, -0.75)]
    taps = []
    for index, weight in zip(starts, weights, strict=True):
        if padding == "reflection":
            index = xp.trunc(_reflect(index, lo, hi, xp))
        valid = (index >= 0) & (index <= size - 1)
        clamped = xp.clip(index, 0, size - 1).astype(xp.int64)
        taps.append((clamped, weight, valid if padding == "zeros" else xp.ones_like(valid)))
    return taps


@register("GridSample")
def grid_sample_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any],
                       outputs: list[OutputSpec]) -> list[Any]:
    """GridSample: X (N, C, *spatial), grid (N, *out, nd) -> Y (N, C, *out)."""
    x, grid = inputs
    nd = x.ndim - 2
    if grid.ndim != nd + 2 or int(grid.shape[-1]) != nd or int(grid.shape[0]) != int(x.shape[0]):
        raise RuntimeKernelError(f"GridSample: grid {tuple(grid.shape)} does not fit X {tuple(x.shape)}")
    ctype = np.result_type(grid.dtype, np.float32)
    g = grid.astype(ctype)
    # The grid's last axis lists coordinates innermost first (x for W, y for H, ...).
    axes = [_grid_taps(xp, g[..., nd - 1 - i], int(x.shape[2 + i]), attrs) for i in range(nd)]
    xt = xp.moveaxis(x, 1, -1)  # (N, *spatial, C)
    batch = xp.arange(int(x.shape[0])).reshape((-1,) + (1,) * nd)
    acc = xp.zeros(tuple(grid.shape[:-1]) + (int(x.shape[1]),), dtype=ctype)
    for combo in itertools.product(*axes):
        weight = xp.ones(grid.shape[:-1], dtype=ctype)
        for _, w, valid in combo:
            weight = weight * xp.where(valid, w, 0)
        acc = acc + xt[(batch,) + tuple(index for index, _, _ in combo)] * weight[..., None]
    return finish(xp, "GridSample", [xp.moveaxis(acc, -1, 1)], outputs)


# -- AffineGrid ---------------------------------------------------------------------------------
@register("AffineGrid")
def affine_grid_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any],
                       outputs: list[OutputSpec]) -> list[Any]:
    """AffineGrid: theta (N, nd, nd+1) -> grid (N, *size[2:], nd) with (x, y[, z]) coordinates."""
    theta = inputs[0]
    spatial = [int(s) for s in attrs["size"][2:]]
    nd = len(spatial)
    if tuple(theta.shape[1:]) != (nd, nd + 1):
        raise RuntimeKernelError(f"AffineGrid: theta {tuple(theta.shape)} does not fit size {attrs['size']}")
    if int(attrs["align_corners"]):  # a single sample sits at 0, as in PyTorch and onnxruntime
        lines = [np.linspace(-1.0, 1.0, s) if s > 1 else np.zeros(1) for s in spatial]
    else:
        lines = [(2 * np.arange(s) + 1) / s - 1 for s in spatial]
    mesh = np.meshgrid(*lines, indexing="ij")  # D?, H, W order
    base = np.stack([*mesh[::-1], np.ones(mesh[0].shape)], axis=-1).reshape(-1, nd + 1)
    grid = xp.matmul(xp.asarray(base, dtype=xp.float64), xp.moveaxis(theta.astype(xp.float64), 1, 2))
    return finish(xp, "AffineGrid", [grid.reshape(int(theta.shape[0]), *spatial, nd)], outputs)
