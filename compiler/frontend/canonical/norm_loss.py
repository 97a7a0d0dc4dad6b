"""Canonical forms of the losses and normalizations: NegativeLogLikelihoodLoss,
SoftmaxCrossEntropyLoss, LayerNormalization, BatchNormalization, GroupNormalization,
InstanceNormalization, and MaxUnpool (see docs/ops.md).

SoftmaxCrossEntropyLoss becomes LogSoftmax (axis 1) + NegativeLogLikelihoodLoss, the op's own
function body. InstanceNormalization becomes GroupNormalization with one group per channel, so one
kernel serves both. BatchNormalization in training mode becomes
``onnx_aot.BatchNormTraining`` (batch statistics and updated running statistics), so nothing that
handles the inference form can mistake it for one. Optional statistics outputs that the model does
not use are given fresh values when a later output is used (ONNX may leave them unnamed).
"""

from __future__ import annotations

import numpy as np

from compiler.frontend.canonical.context import CanonContext
from compiler.frontend.canonical.context import shape_of
from compiler.frontend.canonical.registry import register
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from runtime.contract import AOT_DOMAIN
from runtime.contract import BATCH_NORM_TRAINING
from runtime.contract import op_name
from runtime.errors import UnsupportedOpError
from runtime.kernels.window import conv_transpose_out_size

__all__: list[str] = []

_REDUCTIONS = ("none", "sum", "mean")


def _dtype(value: Value | None) -> np.dtype:
    assert value is not None and value.dtype is not None
    return value.dtype


def _stat_outputs(ctx: CanonContext, first: int,
                  specs: list[tuple[np.dtype, tuple[int, ...]]]) -> list[Value]:
    """Outputs ``first``.. up to the last one the model uses; unused ones in between get fresh values.

    ``specs`` gives (dtype, shape) of each optional output from ``first`` on.
    """
    used = [i for i in range(first, len(ctx.outputs)) if ctx.outputs[i].name in ctx.used]
    if not used:
        return []
    values = []
    for i in range(first, used[-1] + 1):
        if i in used:
            values.append(ctx.outputs[i])
        else:
            dtype, shape = specs[i - first]
            values.append(ctx.graph.make_value(f"{ctx.name}/unused_{i}", dtype, shape))
    return values


# -- losses ----------------------------------------------------------------------------------
def _loss_attrs(ctx: CanonContext) -> dict[str, object]:
    reduction = str(ctx.attr("reduction", "mean"))
    if reduction not in _REDUCTIONS:
        raise ctx.error(f"reduction {reduction!r} is not one of {', '.join(_REDUCTIONS)}")
    if ctx.rank() < 2:
        raise ctx.error(f"input needs rank >= 2 (N, C, ...), got shape {shape_of(ctx.inputs[0])}")
    ignore = int(ctx.attrs["ignore_index"]) if "ignore_index" in ctx.attrs else None
    return {"reduction": reduction, "ignore_index": ignore}


@register("NegativeLogLikelihoodLoss")
def _nll_loss(ctx: CanonContext) -> list[Node]:
    return [ctx.node("NegativeLogLikelihoodLoss", ctx.inputs[:3], _loss_attrs(ctx), outputs=ctx.outputs[:1])]


@register("SoftmaxCrossEntropyLoss")
def _softmax_cross_entropy(ctx: CanonContext) -> list[Node]:
    attrs = _loss_attrs(ctx)
    x = ctx.inputs[0]
    log_prob = _stat_outputs(ctx, 1, [(_dtype(x), shape_of(x))])
    if not log_prob:
        log_prob = [ctx.graph.make_value(f"{ctx.name}/log_prob", _dtype(x), shape_of(x))]
    return [
        ctx.node("LogSoftmax", [x], {"axis": 1}, outputs=log_prob,
                 name=ctx.graph.unique_name(ctx.name + "/log_softmax")),
        ctx.node("NegativeLogLikelihoodLoss", [log_prob[0], *ctx.inputs[1:3]], attrs,
                 outputs=ctx.outputs[:1]),
    ]


# -- normalizations --------------------------------------------------------------------------
@register("LayerNormalization")
def _layernorm(ctx: CanonContext) -> list[Node]:
    rank = ctx.rank()
    axis = ctx.axis(int(ctx.attr("axis", -1)), rank)
    stat = (np.dtype(np.float32), shape_of(ctx.inputs[0])[:axis] + (1,) * (rank - axis))
    stats = _stat_outputs(ctx, 1, [stat, stat])
    return [ctx.node("LayerNormalization", ctx.inputs[:3],
                     {"axis": axis, "epsilon": float(ctx.attr("epsilon", 1e-5))},
                     outputs=ctx.outputs[:1] + stats)]


@register("BatchNormalization")
def _batchnorm(ctx: CanonContext) -> list[Node]:
    epsilon = float(ctx.attr("epsilon", 1e-5))
    if ctx.opset < 9 and not int(ctx.attr("spatial", 1)):
        raise UnsupportedOpError(f"{ctx.describe()}: spatial=0 (per-element statistics) is not supported")
    training = ctx.opset >= 14 and bool(int(ctx.attr("training_mode", 0)))
    if not training:
        if any(v.name in ctx.used for v in ctx.outputs[1:]):
            raise UnsupportedOpError(f"{ctx.describe()}: the training outputs (running and saved mean / "
                                     "variance) are only supported with training_mode=1 (opset 14+)")
        return [ctx.node("BatchNormalization", ctx.inputs[:5], {"epsilon": epsilon}, outputs=ctx.outputs[:1])]
    running = _stat_outputs(ctx, 1, [(_dtype(v), shape_of(v)) for v in ctx.inputs[3:5]])
    return [ctx.node(op_name(BATCH_NORM_TRAINING), ctx.inputs[:5],
                     {"epsilon": epsilon, "momentum": float(ctx.attr("momentum", 0.9))},
                     outputs=ctx.outputs[:1] + running, domain=AOT_DOMAIN)]


@register("GroupNormalization")
def _group_norm(ctx: CanonContext) -> list[Node]:
    x, scale, bias = ctx.inputs[:3]
    shape = shape_of(x)
    if len(shape) < 2:
        raise ctx.error(f"input needs rank >= 2 (N, C, ...), got shape {shape}")
    if "num_groups" not in ctx.attrs:
        raise ctx.error("num_groups is required")
    groups, channels = int(ctx.attrs["num_groups"]), shape[1]
    if groups <= 0 or channels % groups:
        raise ctx.error(f"num_groups {groups} does not divide the {channels} channels")
    for value in (scale, bias):  # per channel (opset 21; the checker rejects opset 18's per-group form)
        if shape_of(value) != (channels,):
            raise ctx.error(f"scale / bias have shape {shape_of(value)}, expected ({channels},)")
    return [ctx.node("GroupNormalization", [x, scale, bias],
                     {"num_groups": groups, "epsilon": float(ctx.attr("epsilon", 1e-5))})]


@register("InstanceNormalization")
def _instance_norm(ctx: CanonContext) -> list[Node]:
    shape = shape_of(ctx.inputs[0])
    if len(shape) < 3:
        raise ctx.error(f"input needs rank >= 3 (N, C, spatial...), got shape {shape}")
    return [ctx.node("GroupNormalization", ctx.inputs[:3],
                     {"num_groups": shape[1], "epsilon": float(ctx.attr("epsilon", 1e-5))})]


# -- MaxUnpool -------------------------------------------------------------------------------
@register("MaxUnpool")
def _max_unpool(ctx: CanonContext) -> list[Node]:
    shape = shape_of(ctx.inputs[0])
    if len(shape) < 3:
        raise ctx.error(f"input needs rank >= 3 (N, C, spatial...), got shape {shape}")
    if "kernel_shape" not in ctx.attrs:
        raise ctx.error("kernel_shape is required")
    n = len(shape) - 2
    kernel = [int(k) for k in ctx.attrs["kernel_shape"]]
    strides = [int(s) for s in ctx.attr("strides", [1] * n)]
    pads = [int(p) for p in ctx.attr("pads", [0] * (2 * n))]
    if len(kernel) != n or len(strides) != n or len(pads) != 2 * n:
        raise ctx.error("kernel_shape/strides/pads do not match the input's spatial rank")
    unpooled = list(shape[:2]) + [conv_transpose_out_size(shape[2 + i], kernel[i], strides[i], 1, pads[i],
                                                          pads[i + n], 0) for i in range(n)]
    out = shape_of(ctx.outputs[0])
    if len(out) != len(unpooled) or any(o < u for o, u in zip(out, unpooled, strict=True)):
        raise UnsupportedOpError(f"{ctx.describe()}: output_shape {list(out)} smaller than the unpooled "
                                 f"shape {unpooled} is not supported")
    return [ctx.node("MaxUnpool", ctx.inputs[:2], {"unpooled_shape": unpooled})]
