"""Canonical forms of the indexing ops: gathers and scatters, OneHot, TopK, EyeLike,
ReverseSequence, TensorScatter, Col2Im, and the rearrangements that become existing kinds
(SpaceToDepth / DepthToSpace -> Reshape + Transpose + Reshape, CenterCropPad -> Slice + Pad).

Ops whose output shape depends on input values (Compress, NonZero, Unique, NonMaxSuppression)
cannot be compiled ahead of time; their canonicalizers say so with an UnsupportedOpError.
See docs/ops.md.
"""

from __future__ import annotations

import math

from compiler.frontend.canonical.context import CanonContext
from compiler.frontend.canonical.context import flat_ints
from compiler.frontend.canonical.context import shape_of
from compiler.frontend.canonical.registry import register
from compiler.ir.graph import Node
from runtime.errors import UnsupportedOpError
from runtime.kernels.window import conv_out_size
from runtime.symbolic import bounds
from runtime.symbolic import is_symbolic
from runtime.symbolic import min_

__all__ = ["DATA_DEPENDENT_OPS"]

# ONNX ops whose output shapes depend on input values: no static shape, so no AOT compile.
DATA_DEPENDENT_OPS = ("Compress", "NonZero", "Unique", "NonMaxSuppression")

_REDUCTIONS = ("none", "add", "mul", "max", "min")


def _reduction(ctx: CanonContext) -> str:
    reduction = str(ctx.attr("reduction", "none"))
    if reduction not in _REDUCTIONS:
        raise ctx.error(f"unknown reduction {reduction!r} (expected one of {', '.join(_REDUCTIONS)})")
    return reduction


# -- gathers and scatters ---------------------------------------------------------------------
@register("GatherElements")
def _gather_elements(ctx: CanonContext) -> list[Node]:
    axis = ctx.axis(int(ctx.attr("axis", 0)), ctx.rank())
    return [ctx.node("GatherElements", ctx.inputs[:2], {"axis": axis})]


@register("GatherND")
def _gather_nd(ctx: CanonContext) -> list[Node]:
    batch_dims = int(ctx.attr("batch_dims", 0))
    k = shape_of(ctx.inputs[1])[-1] if ctx.rank(1) else 0
    if not 0 <= batch_dims < min(ctx.rank(0), ctx.rank(1)) or batch_dims + k > ctx.rank(0):
        raise ctx.error(f"batch_dims {batch_dims} with index length {k} does not fit data of rank "
                        f"{ctx.rank(0)} and indices of rank {ctx.rank(1)}")
    return [ctx.node("GatherND", ctx.inputs[:2], {"batch_dims": batch_dims})]


@register("ScatterElements", "Scatter")
def _scatter_elements(ctx: CanonContext) -> list[Node]:
    # Scatter (opsets 9-10) is ScatterElements without a reduction.
    axis = ctx.axis(int(ctx.attr("axis", 0)), ctx.rank())
    return [ctx.node("ScatterElements", ctx.inputs[:3], {"axis": axis, "reduction": _reduction(ctx)})]


@register("ScatterND")
def _scatter_nd(ctx: CanonContext) -> list[Node]:
    k = shape_of(ctx.inputs[1])[-1] if ctx.rank(1) else -1
    if not 0 <= k <= ctx.rank(0):
        raise ctx.error(f"indices of shape {shape_of(ctx.inputs[1])} do not index data of rank {ctx.rank(0)}")
    return [ctx.node("ScatterND", ctx.inputs[:3], {"reduction": _reduction(ctx)})]


@register("TensorScatter")
def _tensor_scatter(ctx: CanonContext) -> list[Node]:
    axis = ctx.axis(int(ctx.attr("axis", -2)), ctx.rank())
    if axis == 0:
        raise ctx.error("axis 0 is the batch axis; the sequence axis must come after it")
    mode = str(ctx.attr("mode", "linear"))
    if mode not in ("linear", "circular"):
        raise ctx.error(f"unknown mode {mode!r} (expected 'linear' or 'circular')")
    return [ctx.node("TensorScatter", ctx.inputs[:3], {"axis": axis, "mode": mode})]


# -- value-producing ops ----------------------------------------------------------------------
@register("OneHot")
def _one_hot(ctx: CanonContext) -> list[Node]:
    depth_c = ctx.const_input(1, "depth")
    assert depth_c is not None  # a required input
    if depth_c.size != 1:
        raise ctx.error(f"depth must hold one value, got shape {depth_c.shape}")
    depth = int(depth_c.reshape(-1)[0])
    if depth < 1:
        raise ctx.error(f"depth must be positive, got {depth}")
    axis = ctx.axis(int(ctx.attr("axis", -1)), ctx.rank() + 1)
    return [ctx.node("OneHot", [ctx.inputs[0], ctx.inputs[2]], {"axis": axis, "depth": depth})]


@register("TopK")
def _top_k(ctx: CanonContext) -> list[Node]:
    rank = ctx.rank()
    axis = ctx.axis(int(ctx.attr("axis", -1)), rank)
    if ctx.opset < 10:
        if "k" not in ctx.attrs:
            raise ctx.error("k is required")
        k = int(ctx.attrs["k"])
    else:
        k_c = ctx.const_input(1, "k")
        assert k_c is not None  # a required input
        if k_c.size != 1:
            raise ctx.error(f"k must hold one value, got shape {k_c.shape}")
        k = int(k_c.reshape(-1)[0])
    size = shape_of(ctx.inputs[0])[axis]
    if is_symbolic(size):
        lo, hi = bounds(size, ctx.graph.symbols)
        if not 0 <= k <= hi:
            raise ctx.error(f"k = {k} is out of range for axis {axis} of size {size} (at most {hi})")
        if k > lo:  # the sizes below k are ones the model cannot take: checked at the binding
            ctx.graph.assumptions.append((ctx.name, min_(size, k), k))
    elif not 0 <= k <= size:
        raise ctx.error(f"k = {k} is out of range for axis {axis} of size {size}")
    attrs = {"axis": axis, "k": k, "largest": int(ctx.attr("largest", 1)),
             "sorted": int(ctx.attr("sorted", 1))}
    return [ctx.node("TopK", ctx.inputs[:1], attrs, outputs=ctx.outputs[:2])]


@register("EyeLike")
def _eye_like(ctx: CanonContext) -> list[Node]:
    # Only the input's shape matters: the node keeps no inputs.
    shape = shape_of(ctx.inputs[0])
    if len(shape) != 2:
        raise ctx.error(f"the input must be 2-D, got shape {shape}")
    out = ctx.outputs[0]
    assert out.dtype is not None  # the dtype attribute's type, or the input's (checked at import)
    return [ctx.node("EyeLike", [], {"shape": list(shape), "k": int(ctx.attr("k", 0)),
                                     "dtype": out.dtype.name})]


@register("ReverseSequence")
def _reverse_sequence(ctx: CanonContext) -> list[Node]:
    rank = ctx.rank()
    if rank < 2:
        raise ctx.error(f"the input must have rank >= 2, got {rank}")
    batch_axis = int(ctx.attr("batch_axis", 1))
    time_axis = int(ctx.attr("time_axis", 0))
    if {batch_axis, time_axis} != {0, 1}:
        raise ctx.error(f"batch_axis / time_axis must be 0 and 1 (in either order), got "
                        f"{batch_axis} / {time_axis}")
    return [ctx.node("ReverseSequence", ctx.inputs[:2], {"batch_axis": batch_axis, "time_axis": time_axis})]


@register("Col2Im")
def _col2im(ctx: CanonContext) -> list[Node]:
    image = flat_ints(ctx.const_input(1, "image_shape"))
    block = flat_ints(ctx.const_input(2, "block_shape"))
    n = len(image)
    strides = flat_ints(ctx.attr("strides", [1] * n))
    dilations = flat_ints(ctx.attr("dilations", [1] * n))
    pads = flat_ints(ctx.attr("pads", [0] * (2 * n)))
    if not n or len(block) != n or len(strides) != n or len(dilations) != n or len(pads) != 2 * n:
        raise ctx.error("image_shape, block_shape, strides, dilations and pads disagree on the "
                        "number of spatial axes")
    if min(block + strides + dilations) < 1:
        raise ctx.error(f"block_shape {block}, strides {strides} and dilations {dilations} must be positive")
    x = shape_of(ctx.inputs[0])
    blocks = [conv_out_size(size, kk, s, d, pads[i], pads[i + n])
              for i, (size, kk, s, d) in enumerate(zip(image, block, strides, dilations, strict=True))]
    if len(x) != 3 or x[1] % math.prod(block) or x[2] != math.prod(blocks) or min(blocks) < 1:
        raise ctx.error(f"input of shape {x} does not hold blocks {block} sliding over image {image} "
                        f"({blocks} positions)")
    attrs = {"image_shape": image, "block_shape": block, "strides": strides, "dilations": dilations,
             "pads": pads}
    return [ctx.node("Col2Im", ctx.inputs[:1], attrs)]


# -- rearrangements into existing kinds --------------------------------------------------------
def _rearrange(ctx: CanonContext, split: tuple[int, ...], perm: list[int]) -> list[Node]:
    """Reshape to ``split``, transpose by ``perm``, reshape to the output's shape."""
    x = ctx.inputs[0]
    assert x is not None
    g = ctx.graph
    permuted = tuple(split[p] for p in perm)
    v_split = g.make_value(ctx.name + "/split", x.dtype, split)
    v_perm = g.make_value(ctx.name + "/permuted", x.dtype, permuted)
    return [
        ctx.node("Reshape", [x], {"shape": list(split)}, outputs=[v_split],
                 name=g.unique_name(ctx.name + "/split")),
        ctx.node("Transpose", [v_split], {"perm": perm}, outputs=[v_perm],
                 name=g.unique_name(ctx.name + "/transpose")),
        ctx.node("Reshape", [v_perm], {"shape": list(shape_of(ctx.outputs[0]))}),
    ]


def _block_geometry(ctx: CanonContext) -> tuple[int, str, tuple[int, int, int, int]]:
    shape = shape_of(ctx.inputs[0])
    if len(shape) != 4:
        raise ctx.error(f"the input must be 4-D (N, C, H, W), got shape {shape}")
    if "blocksize" not in ctx.attrs or int(ctx.attrs["blocksize"]) < 1:
        raise ctx.error("blocksize (a positive int) is required")
    mode = str(ctx.attr("mode", "DCR"))
    if mode not in ("DCR", "CRD"):
        raise ctx.error(f"unknown mode {mode!r} (expected 'DCR' or 'CRD')")
    b, c, h, w = shape
    return int(ctx.attrs["blocksize"]), mode, (b, c, h, w)


@register("SpaceToDepth")
def _space_to_depth(ctx: CanonContext) -> list[Node]:
    bs, mode, (b, c, h, w) = _block_geometry(ctx)
    if h % bs or w % bs:
        raise ctx.error(f"spatial size {h}x{w} is not a multiple of blocksize {bs}")
    perm = [0, 3, 5, 1, 2, 4] if mode == "DCR" else [0, 1, 3, 5, 2, 4]
    return _rearrange(ctx, (b, c, h // bs, bs, w // bs, bs), perm)


@register("DepthToSpace")
def _depth_to_space(ctx: CanonContext) -> list[Node]:
    bs, mode, (b, c, h, w) = _block_geometry(ctx)
    if c % (bs * bs):
        raise ctx.error(f"{c} channels are not a multiple of blocksize^2 = {bs * bs}")
    if mode == "DCR":
        return _rearrange(ctx, (b, bs, bs, c // (bs * bs), h, w), [0, 3, 4, 1, 5, 2])
    return _rearrange(ctx, (b, c // (bs * bs), bs, bs, h, w), [0, 1, 4, 2, 5, 3])


@register("CenterCropPad")
def _center_crop_pad(ctx: CanonContext) -> list[Node]:
    x = ctx.inputs[0]
    assert x is not None
    shape = shape_of(x)
    rank = len(shape)
    target = flat_ints(ctx.const_input(1, "shape"))
    axes = [ctx.axis(int(a), rank) for a in ctx.attr("axes", range(rank))]
    if len(axes) != len(target) or len(set(axes)) != len(axes):
        raise ctx.error(f"shape has {len(target)} values for axes {axes}")
    if any(t < 0 for t in target):
        raise ctx.error(f"negative target shape {target}")
    starts, ends, crop_axes = [], [], []
    pads = [0] * (2 * rank)
    cropped = list(shape)
    for a, t in zip(axes, target, strict=True):
        dim = shape[a]
        if t < dim:  # the window starts rounded down
            crop_axes.append(a)
            starts.append((dim - t) // 2)
            ends.append((dim - t) // 2 + t)
            cropped[a] = t
        elif t > dim:  # the odd extra pixel goes to the end
            pads[a] = (t - dim) // 2
            pads[a + rank] = t - dim - (t - dim) // 2
    nodes: list[Node] = []
    source = x
    if crop_axes:
        out = ctx.outputs[0] if not any(pads) else ctx.graph.make_value(ctx.name + "/crop", x.dtype,
                                                                           tuple(cropped))
        nodes.append(ctx.node("Slice", [x], {"starts": starts, "ends": ends, "axes": crop_axes,
                                             "steps": [1] * len(crop_axes)}, outputs=[out],
                              name=ctx.graph.unique_name(ctx.name + "/crop") if any(pads) else None))
        source = out
    if any(pads):
        nodes.append(ctx.node("Pad", [source], {"pads": pads, "mode": "constant", "value": 0.0}))
    return nodes or [ctx.node("Identity", [x], {})]


# -- ops that cannot have static shapes --------------------------------------------------------
@register(*DATA_DEPENDENT_OPS)
def _data_dependent(ctx: CanonContext) -> list[Node]:
    raise UnsupportedOpError(f"{ctx.describe()}: the output shape depends on input values, which "
                             "ahead-of-time compilation cannot know", [(ctx.name, ctx.op_type)])
