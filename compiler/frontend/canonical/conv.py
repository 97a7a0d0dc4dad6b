"""Canonical forms of convolution, pooling and LRN: explicit kernel_shape, strides, dilations and
begin/end pads (``auto_pad`` resolved against the input's spatial size), every attribute with its
default. ``resolve_pads`` and ``spatial_dims`` serve the other convolutions too (the quantized ones,
DeformConv), so they all agree. See docs/ops.md.
"""

from __future__ import annotations

from typing import Any

from compiler.frontend.canonical.context import CanonContext, ints
from compiler.frontend.canonical.registry import register
from compiler.ir.graph import Node

__all__ = ["resolve_pads", "spatial_dims"]


def resolve_pads(ctx: CanonContext, spatial: tuple[int, ...], kernel: list[int],
                  strides: list[int], dilations: list[int]) -> list[int]:
    n = len(spatial)
    auto_pad = str(ctx.attr("auto_pad", "NOTSET"))
    if auto_pad in ("NOTSET", ""):
        pads = ints(ctx.attr("pads", [0] * (2 * n)))
        if len(pads) != 2 * n:
            raise ctx.error(f"pads has {len(pads)} values, expected {2 * n}")
        if any(p < 0 for p in pads):
            raise ctx.error(f"negative pads {pads}")
        return pads
    if auto_pad == "VALID":
        return [0] * (2 * n)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begins, ends = [], []
        for size, k, s, d in zip(spatial, kernel, strides, dilations, strict=True):
            out = -(-size // s)
            total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
            small, big = total // 2, total - total // 2
            begins.append(small if auto_pad == "SAME_UPPER" else big)
            ends.append(big if auto_pad == "SAME_UPPER" else small)
        return begins + ends
    raise ctx.error(f"unknown auto_pad {auto_pad!r}")


def spatial_dims(ctx: CanonContext) -> tuple[int, ...]:
    x = ctx.inputs[0]
    assert x is not None and x.shape is not None
    if len(x.shape) < 3:
        raise ctx.error(f"input needs rank >= 3 (N, C, spatial...), got shape {x.shape}")
    return x.shape[2:]


@register("Conv")
def _conv(ctx: CanonContext) -> list[Node]:
    w = ctx.inputs[1]
    assert w is not None and w.shape is not None
    spatial = spatial_dims(ctx)
    n = len(spatial)
    kernel = ints(ctx.attr("kernel_shape", w.shape[2:]))
    strides = ints(ctx.attr("strides", [1] * n))
    dilations = ints(ctx.attr("dilations", [1] * n))
    if len(kernel) != n or len(strides) != n or len(dilations) != n:
        raise ctx.error("kernel_shape/strides/dilations do not match the input's spatial rank")
    pads = resolve_pads(ctx, spatial, kernel, strides, dilations)
    attrs = {"kernel_shape": kernel, "strides": strides, "pads": pads, "dilations": dilations,
             "group": int(ctx.attr("group", 1))}
    return [ctx.node("Conv", ctx.inputs[:3], attrs)]


@register("MaxPool", "AveragePool", "LpPool")
def _pool(ctx: CanonContext) -> list[Node]:
    spatial = spatial_dims(ctx)
    n = len(spatial)
    if "kernel_shape" not in ctx.attrs:
        raise ctx.error("kernel_shape is required")
    kernel = ints(ctx.attrs["kernel_shape"])
    strides = ints(ctx.attr("strides", [1] * n))
    dilations = ints(ctx.attr("dilations", [1] * n))
    pads = resolve_pads(ctx, spatial, kernel, strides, dilations)
    attrs: dict[str, Any] = {"kernel_shape": kernel, "strides": strides, "pads": pads,
                             "ceil_mode": int(ctx.attr("ceil_mode", 0))}
    if ctx.op_type == "MaxPool":
        attrs["dilations"] = dilations
        attrs["storage_order"] = int(ctx.attr("storage_order", 0))
    elif ctx.op_type == "AveragePool":
        attrs["count_include_pad"] = int(ctx.attr("count_include_pad", 0))
        attrs["dilations"] = dilations
    else:
        attrs["p"] = int(ctx.attr("p", 2))
        attrs["dilations"] = dilations
    # MaxPool's optional Indices output is kept only when the model uses it.
    keep = 2 if ctx.op_type == "MaxPool" and any(v.name in ctx.used for v in ctx.outputs[1:2]) else 1
    return [ctx.node(ctx.op_type, ctx.inputs[:1], attrs, outputs=ctx.outputs[:keep])]


@register("LRN")
def _lrn(ctx: CanonContext) -> list[Node]:
    if "size" not in ctx.attrs:
        raise ctx.error("size is required")
    return [ctx.node("LRN", ctx.inputs, {"alpha": float(ctx.attr("alpha", 1e-4)),
                                         "beta": float(ctx.attr("beta", 0.75)),
                                         "bias": float(ctx.attr("bias", 1.0)),
                                         "size": int(ctx.attrs["size"])})]
