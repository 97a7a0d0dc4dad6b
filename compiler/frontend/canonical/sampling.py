"""Canonical forms of the ops that sample their input at computed positions: DeformConv and
RoiAlign (see docs/ops.md).

DeformConv gets Conv's attributes (kernel_shape, strides, pads, dilations, group) plus
``offset_group``. RoiAlign gets every attribute with its default, ``mode`` and
``coordinate_transformation_mode`` checked (before opset 16 the latter is always
"output_half_pixel", the old behaviour).
"""

from __future__ import annotations

import math

from compiler.frontend.canonical.context import CanonContext
from compiler.frontend.canonical.conv import conv_attrs
from compiler.frontend.canonical.conv import spatial_dims
from compiler.frontend.canonical.conv import window_attrs
from compiler.frontend.canonical.registry import register
from compiler.ir.graph import Node
from runtime.kernels.window import conv_out_size

__all__: list[str] = []


def _ints(ctx: CanonContext, key: str, default: list[int], n: int) -> list[int]:
    values = [int(v) for v in ctx.attr(key, default)]
    if len(values) != n:
        raise ctx.error(f"{key} has {len(values)} values, expected {n}")
    return values


@register("DeformConv")
def _deform_conv(ctx: CanonContext) -> list[Node]:
    x, w, offset = ctx.inputs[0], ctx.inputs[1], ctx.inputs[2]
    assert x is not None and x.shape is not None and w is not None and w.shape is not None
    assert offset is not None and offset.shape is not None
    spatial = spatial_dims(ctx)
    n = len(spatial)
    kernel, strides, dilations = window_attrs(ctx, n, w.shape[2:])
    pads = _ints(ctx, "pads", [0] * (2 * n), 2 * n)
    groups, offset_groups = int(ctx.attr("group", 1)), int(ctx.attr("offset_group", 1))
    channels = x.shape[1]
    if (groups < 1 or offset_groups < 1 or channels % groups or channels % offset_groups
            or w.shape[1] * groups != channels or w.shape[0] % groups):
        raise ctx.error(f"X {x.shape} and W {w.shape} do not fit group {groups}, "
                        f"offset_group {offset_groups}")
    taps = math.prod(kernel)
    out = tuple(conv_out_size(size, kernel[d], strides[d], dilations[d], pads[d], pads[d + n])
                for d, size in enumerate(spatial))
    want = (x.shape[0], offset_groups * taps * n, *out)
    if offset.shape != want:
        raise ctx.error(f"offset has shape {offset.shape}, expected {want}")
    mask = ctx.inputs[4] if len(ctx.inputs) > 4 else None
    if mask is not None and mask.shape != (x.shape[0], offset_groups * taps, *out):
        raise ctx.error(f"mask has shape {mask.shape}, expected {(x.shape[0], offset_groups * taps, *out)}")
    attrs = conv_attrs(kernel, strides, pads, dilations, groups, offset_group=offset_groups)
    return [ctx.node("DeformConv", ctx.inputs[:5], attrs)]


@register("RoiAlign")
def _roi_align(ctx: CanonContext) -> list[Node]:
    if ctx.rank(0) != 4:
        raise ctx.error("X must be 4-D (N, C, H, W)")
    mode = str(ctx.attr("mode", "avg")).lower()
    if mode not in ("avg", "max"):
        raise ctx.error(f"mode must be 'avg' or 'max', got {mode!r}")
    transform = str(ctx.attr("coordinate_transformation_mode", "half_pixel" if ctx.opset >= 16
                             else "output_half_pixel"))
    if transform not in ("half_pixel", "output_half_pixel"):
        raise ctx.error(f"unknown coordinate_transformation_mode {transform!r}")
    height, width = int(ctx.attr("output_height", 1)), int(ctx.attr("output_width", 1))
    ratio = int(ctx.attr("sampling_ratio", 0))
    if height < 1 or width < 1 or ratio < 0:
        raise ctx.error("output_height / output_width must be positive and sampling_ratio non-negative")
    attrs = {"mode": mode, "coordinate_transformation_mode": transform, "output_height": height,
             "output_width": width, "sampling_ratio": ratio,
             "spatial_scale": float(ctx.attr("spatial_scale", 1.0))}
    return [ctx.node("RoiAlign", ctx.inputs[:3], attrs)]
