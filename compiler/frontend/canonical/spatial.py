"""Canonical forms of the spatial ops: Resize (and Upsample), ConvTranspose, GridSample, AffineGrid.

Resize keeps one input, X: ``roi``, ``scales`` and ``sizes`` (compile-time constants), ``axes`` and
``keep_aspect_ratio_policy`` are resolved into per-axis ``scales`` and ``roi`` over every axis, and
the output sizes are the output's static shape. Over symbolic dims a scale that depends on the
symbols (``sizes`` not a whole multiple or fraction of the input) is 0.0, and ``sizes`` (every
axis) and ``keep_aspect_ratio_policy`` stay attributes for the kernel to divide at run time.
Upsample and opset-10 Resize become the same form
with asymmetric coordinates and nearest_mode "simple" (onnxruntime's reading of those ops: floor,
or ceil along an axis that shrinks). ConvTranspose gets explicit begin/end pads from
``auto_pad`` / ``output_shape``; GridSample's opset-16 mode names become the opset-20 ones;
AffineGrid's ``size`` input becomes an attribute. See docs/ops.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from compiler.frontend.canonical.context import CanonContext
from compiler.frontend.canonical.context import flat_ints
from compiler.frontend.canonical.conv import conv_attrs
from compiler.frontend.canonical.conv import window_attrs
from compiler.frontend.canonical.registry import register
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from runtime.errors import UnsupportedOpError
from runtime.kernels.window import conv_transpose_out_size
from runtime.kernels.window import split_pads
from runtime.symbolic import is_symbolic

__all__: list[str] = []

_RESIZE_MODES = {"nearest": "nearest", "linear": "linear", "bilinear": "linear", "cubic": "cubic"}
_COORDINATE_MODES = frozenset({"half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                               "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize"})
_NEAREST_MODES = frozenset({"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"})
_GRID_MODES = {"nearest": "nearest", "linear": "linear", "bilinear": "linear", "cubic": "cubic",
               "bicubic": "cubic"}
_GRID_PADDING = frozenset({"zeros", "border", "reflection"})
_WHOLE_MAX = 32  # symbolic Resize sizes up to this multiple (or fraction) of the input fold to a scale


def _shape(value: Value | None) -> tuple[int, ...]:
    assert value is not None and value.shape is not None
    return tuple(d if is_symbolic(d) else int(d) for d in value.shape)  # (a dynamic dim stays symbolic)


def _floats(values: Any) -> list[float]:
    return [float(v) for v in np.asarray(values).reshape(-1)]


def _optional(ctx: CanonContext, i: int, what: str) -> np.ndarray | None:
    """Constant input ``i``, or None when it is omitted or an empty tensor (both mean absent)."""
    value = ctx.const_input(i, what)
    return None if value is None or value.size == 0 else value


# -- Resize / Upsample ---------------------------------------------------------------------------
def _choice(ctx: CanonContext, key: str, default: str, allowed: frozenset[str] | dict[str, str]) -> str:
    value = str(ctx.attr(key, default))
    if value not in allowed:
        raise UnsupportedOpError(f"{ctx.describe()}: {key} {value!r} is not supported")
    return allowed[value] if isinstance(allowed, dict) else value


def _resize_axes(ctx: CanonContext, rank: int) -> list[int]:
    axes = [ctx.axis(int(a), rank) for a in ctx.attr("axes", list(range(rank)))]
    if len(set(axes)) != len(axes):
        raise ctx.error(f"axes {axes} repeat an axis")
    return axes


def _given_sizes(values: Any) -> list[Any]:
    """``sizes`` as ints, or expressions of the symbols where it is a symbolic constant."""
    return [v if is_symbolic(v) else int(v) for v in np.asarray(values).reshape(-1)]


def _known_scale(size: Any, in_size: Any) -> float | None:
    """``size / in_size`` where it does not depend on the symbols (equal dims, or one a whole
    multiple of the other: ``2*h`` from ``h``); None where only a run knows it."""
    if not is_symbolic(size) and not is_symbolic(in_size):
        return size / in_size
    if size == in_size:
        return 1.0
    for k in range(2, _WHOLE_MAX + 1):
        if size == in_size * k:
            return float(k)
        if in_size == size * k:
            return 1.0 / k  # (equal to size / in_size in float64 at every binding: one rounding)
    return None


def _scales_and_sizes(ctx: CanonContext, in_shape: tuple[Any, ...], out_shape: tuple[Any, ...],
                      axes: list[int], scales_in: np.ndarray | None,
                      sizes_in: np.ndarray | None) -> tuple[list[float], list[Any] | None]:
    """Per-axis scales (every axis) from ``scales`` or ``sizes``; checks the output shape. Where a
    scale depends on the symbols it is 0.0 and the requested sizes (every axis) come back too:
    the kernel takes those axes' scales from the run's shapes (``sizes`` / input, ONNX's rule)."""
    rank = len(in_shape)
    if (scales_in is None) == (sizes_in is None):
        raise ctx.error("exactly one of scales and sizes must be given")
    given = scales_in if scales_in is not None else sizes_in
    assert given is not None
    if given.size != len(axes):
        raise ctx.error(f"{'scales' if scales_in is not None else 'sizes'} has {given.size} values "
                        f"for {len(axes)} axes")
    scales = [1.0] * rank
    if scales_in is not None:
        for a, s in zip(axes, _floats(scales_in), strict=True):
            if not s > 0:
                raise ctx.error(f"scale {s} for axis {a} is not positive")
            scales[a] = s
        return scales, None
    sizes = list(in_shape)
    for a, s in zip(axes, _given_sizes(sizes_in), strict=True):
        if not is_symbolic(s) and s <= 0:
            raise ctx.error(f"size {s} for axis {a} is not positive")
        sizes[a] = s
    policy = _choice(ctx, "keep_aspect_ratio_policy", "stretch",
                     frozenset({"stretch", "not_larger", "not_smaller"}))
    known = [_known_scale(sizes[a], in_shape[a]) for a in axes]
    symbolic = any(is_symbolic(sizes[a]) or is_symbolic(in_shape[a]) for a in axes)
    if any(k is None for k in known) or (policy != "stretch" and symbolic):
        for a, k in zip(axes, known, strict=True):  # (with a policy every axis's scale is the run's)
            scales[a] = k if k is not None and policy == "stretch" else 0.0
        return scales, sizes
    for a, k in zip(axes, known, strict=True):
        assert k is not None
        scales[a] = k
    if policy != "stretch":
        pick = min if policy == "not_larger" else max
        scale = pick(scales[a] for a in axes)
        for a in axes:
            scales[a] = scale
            sizes[a] = int(scale * in_shape[a] + 0.5)
    if tuple(sizes) != out_shape:
        raise ctx.error(f"output shape {out_shape} does not match the requested sizes {tuple(sizes)}")
    return scales, None


def _resize_roi(ctx: CanonContext, rank: int, axes: list[int], roi_in: np.ndarray | None) -> list[float]:
    roi = [0.0] * rank + [1.0] * rank
    if roi_in is None:
        return roi
    values = _floats(roi_in)
    if len(values) != 2 * len(axes):
        raise ctx.error(f"roi has {len(values)} values, expected {2 * len(axes)}")
    for k, a in enumerate(axes):
        roi[a] = values[k]
        roi[rank + a] = values[len(axes) + k]
    return roi


def _resize_node(ctx: CanonContext, mode: str, coordinate_mode: str, nearest_mode: str,
                 scales: list[float], roi: list[float], sizes: list[Any] | None = None) -> Node:
    attrs = {
        "mode": mode,
        "coordinate_transformation_mode": coordinate_mode,
        "nearest_mode": nearest_mode,
        "cubic_coeff_a": float(ctx.attr("cubic_coeff_a", -0.75)),
        "exclude_outside": int(ctx.attr("exclude_outside", 0)),
        "extrapolation_value": float(ctx.attr("extrapolation_value", 0.0)),
        "antialias": int(ctx.attr("antialias", 0)) if mode != "nearest" else 0,
        "scales": scales,
        "roi": roi,
    }
    if sizes is not None:  # scales 0.0 are the run's: sizes / input (docs/ops.md)
        attrs["sizes"] = sizes
        attrs["keep_aspect_ratio_policy"] = str(ctx.attr("keep_aspect_ratio_policy", "stretch"))
    return ctx.node("Resize", ctx.inputs[:1], attrs)


@register("Resize")
def _resize(ctx: CanonContext) -> list[Node]:
    in_shape, out_shape = _shape(ctx.inputs[0]), _shape(ctx.outputs[0])
    rank = len(in_shape)
    mode = _choice(ctx, "mode", "nearest", _RESIZE_MODES)
    if ctx.opset < 11:  # X, scales; Upsample's semantics
        scales, _ = _scales_and_sizes(ctx, in_shape, out_shape, list(range(rank)),
                                      ctx.const_input(1, "scales"), None)
        return [_resize_node(ctx, mode, "asymmetric", "simple", scales, [0.0] * rank + [1.0] * rank)]
    axes = _resize_axes(ctx, rank)
    coordinate_mode = _choice(ctx, "coordinate_transformation_mode", "half_pixel", _COORDINATE_MODES)
    nearest_mode = _choice(ctx, "nearest_mode", "round_prefer_floor", _NEAREST_MODES)
    scales_in = _optional(ctx, 2, "scales") if len(ctx.inputs) > 2 else None
    sizes_in = _optional(ctx, 3, "sizes") if len(ctx.inputs) > 3 else None
    scales, sizes = _scales_and_sizes(ctx, in_shape, out_shape, axes, scales_in, sizes_in)
    roi_in = _optional(ctx, 1, "roi") if coordinate_mode == "tf_crop_and_resize" else None
    if coordinate_mode == "tf_crop_and_resize" and roi_in is None:
        raise ctx.error("tf_crop_and_resize needs the roi input")
    roi = _resize_roi(ctx, rank, axes, roi_in)
    return [_resize_node(ctx, mode, coordinate_mode, nearest_mode, scales, roi, sizes)]


@register("Upsample")
def _upsample(ctx: CanonContext) -> list[Node]:
    in_shape, out_shape = _shape(ctx.inputs[0]), _shape(ctx.outputs[0])
    mode = _choice(ctx, "mode", "nearest", _RESIZE_MODES)
    if mode == "cubic":
        raise UnsupportedOpError(f"{ctx.describe()}: mode 'cubic' is not an Upsample mode")
    raw = ctx.attr("scales", None) if ctx.opset < 9 else ctx.const_input(1, "scales")
    if raw is None:
        raise ctx.error("scales is required")
    rank = len(in_shape)
    scales, _ = _scales_and_sizes(ctx, in_shape, out_shape, list(range(rank)), np.asarray(raw, np.float64),
                                  None)
    return [_resize_node(ctx, mode, "asymmetric", "simple", scales, [0.0] * rank + [1.0] * rank)]


# -- ConvTranspose ------------------------------------------------------------------------------
def _convtranspose_pads(ctx: CanonContext, spatial: tuple[int, ...], kernel: list[int], strides: list[int],
                        dilations: list[int], output_padding: list[int]) -> list[int]:
    n = len(spatial)
    auto_pad = str(ctx.attr("auto_pad", "NOTSET"))
    if auto_pad not in ("NOTSET", "", "VALID", "SAME_UPPER", "SAME_LOWER"):
        raise ctx.error(f"unknown auto_pad {auto_pad!r}")
    target = [int(v) for v in ctx.attr("output_shape", [])]
    if not target and auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        target = [size * s for size, s in zip(spatial, strides, strict=True)]
    if not target:
        pads = [int(p) for p in ctx.attr("pads", [0] * (2 * n))] if auto_pad != "VALID" else [0] * (2 * n)
        if len(pads) != 2 * n or any(p < 0 for p in pads):
            raise ctx.error(f"pads {pads} are not {2 * n} values >= 0")
        return pads
    if len(target) == n + 2:  # some exporters include N and C
        target = target[2:]
    if len(target) != n:
        raise ctx.error(f"output_shape {target} does not have {n} spatial dims")
    split = [split_pads(conv_transpose_out_size(size, k, s, d, 0, 0, op) - out, auto_pad == "SAME_UPPER")
             for size, k, s, d, op, out in zip(spatial, kernel, strides, dilations, output_padding, target,
                                               strict=True)]  # fmt: skip
    return [b for b, _ in split] + [e for _, e in split]


@register("ConvTranspose")
def _conv_transpose(ctx: CanonContext) -> list[Node]:
    x_shape, w_shape, y_shape = _shape(ctx.inputs[0]), _shape(ctx.inputs[1]), _shape(ctx.outputs[0])
    if len(x_shape) < 3 or len(w_shape) != len(x_shape):
        raise ctx.error(f"X {x_shape} and W {w_shape} must both have rank >= 3 and equal ranks")
    spatial = x_shape[2:]
    n = len(spatial)
    kernel, strides, dilations = window_attrs(ctx, n, w_shape[2:])
    output_padding = [int(p) for p in ctx.attr("output_padding", [0] * n)]
    group = int(ctx.attr("group", 1))
    if len(output_padding) != n:
        raise ctx.error(f"output_padding has {len(output_padding)} values, expected {n} (the spatial rank)")
    if kernel != list(w_shape[2:]) or group < 1 or x_shape[1] != w_shape[0] or x_shape[1] % group:
        raise ctx.error(f"W {w_shape}, kernel_shape {kernel} and group {group} do not fit X {x_shape}")
    if min(strides) < 1 or min(dilations) < 1:
        raise ctx.error(f"strides {strides} and dilations {dilations} must be >= 1")
    pads = _convtranspose_pads(ctx, spatial, kernel, strides, dilations, output_padding)
    want = tuple(conv_transpose_out_size(size, k, s, d, b, e, op) for size, k, s, d, op, b, e in
                 zip(spatial, kernel, strides, dilations, output_padding, pads[:n], pads[n:], strict=True))
    if y_shape[2:] != want or y_shape[:2] != (x_shape[0], w_shape[1] * group):
        raise ctx.error(f"output shape {y_shape} does not match the attributes (spatial {want})")
    attrs = conv_attrs(kernel, strides, pads, dilations, group, output_padding=output_padding)
    return [ctx.node("ConvTranspose", ctx.inputs[:3], attrs)]


# -- GridSample / AffineGrid --------------------------------------------------------------------
@register("GridSample")
def _grid_sample(ctx: CanonContext) -> list[Node]:
    x_shape, grid_shape = _shape(ctx.inputs[0]), _shape(ctx.inputs[1])
    nd = len(x_shape) - 2
    if nd < 1 or len(grid_shape) != nd + 2 or grid_shape[-1] != nd or grid_shape[0] != x_shape[0]:
        raise ctx.error(f"grid {grid_shape} does not fit X {x_shape}")
    mode = _choice(ctx, "mode", "bilinear" if ctx.opset < 20 else "linear", _GRID_MODES)
    padding_mode = _choice(ctx, "padding_mode", "zeros", _GRID_PADDING)
    if mode == "cubic" and nd != 2:
        raise UnsupportedOpError(f"{ctx.describe()}: cubic mode needs 4-D X, got {x_shape}")
    attrs = {"mode": mode, "padding_mode": padding_mode, "align_corners": int(ctx.attr("align_corners", 0))}
    return [ctx.node("GridSample", ctx.inputs[:2], attrs)]


@register("AffineGrid")
def _affine_grid(ctx: CanonContext) -> list[Node]:
    theta_shape = _shape(ctx.inputs[0])
    size = flat_ints(ctx.const_input(1, "size"))
    nd = len(size) - 2
    if nd not in (2, 3) or theta_shape != (size[0], nd, nd + 1) or min(size) < 1:
        raise ctx.error(f"size {size} does not fit theta {theta_shape}")
    return [ctx.node("AffineGrid", ctx.inputs[:1],
                     {"size": size, "align_corners": int(ctx.attr("align_corners", 0))})]
