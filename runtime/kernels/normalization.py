"""Normalization and softmax reference kernels: BatchNormalization (inference form and
onnx_aot.BatchNormTraining), LRN, LayerNormalization, GroupNormalization (InstanceNormalization's
form too), Softmax and LogSoftmax.

The statistics of the normalizations are taken in at least float32 (float16 inputs are widened,
ONNX's default stash_type). Float32 stays float32 except LRN, whose window sum and power are taken
in float64 (the power of a sum of squares loses digits in float32) and cast back. The softmaxes
subtract the maximum along the axis first, so large inputs never overflow.
"""

from __future__ import annotations

from typing import Any

from runtime.contract import BATCH_NORM_TRAINING
from runtime.kernels.common import fill_optional
from runtime.kernels.common import finish
from runtime.kernels.registry import OutputSpec
from runtime.kernels.registry import register

__all__ = ["log_softmax", "softmax"]


def _channel_shape(x: Any) -> tuple[int, ...]:
    """Shape that broadcasts a per-channel (axis 1) vector against ``x``."""
    return (1, int(x.shape[1])) + (1,) * (x.ndim - 2)


@register("BatchNormalization")
def batch_normalization_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """BatchNormalization (inference): (X - mean) / sqrt(var + epsilon) * scale + B."""
    x, scale, bias, mean, var = inputs
    shape = _channel_shape(x)
    factor = (scale / xp.sqrt(var + attrs["epsilon"])).reshape(shape)
    y = (x - mean.reshape(shape)) * factor + bias.reshape(shape)
    return finish(xp, "BatchNormalization", [y], outputs)


def _widened(xp: Any, x: Any) -> Any:
    """``x`` in at least float32, the precision the normalizations' statistics are taken in."""
    return x.astype(xp.float32) if x.dtype.kind == "f" and x.dtype.itemsize < 4 else x


@register(BATCH_NORM_TRAINING)
def batch_norm_training_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """BatchNormalization with training_mode=1: Y normalized by the batch's own mean and (biased)
    variance over every axis but 1, and the running statistics
    ``input_mean * momentum + batch_mean * (1 - momentum)`` (the same for the variance)."""
    x, scale, bias, mean, var = inputs
    work = _widened(xp, x)
    axes = (0,) + tuple(range(2, x.ndim))
    batch_mean = xp.mean(work, axis=axes)
    batch_var = xp.var(work, axis=axes)
    shape = _channel_shape(x)
    factor = (scale / xp.sqrt(batch_var + attrs["epsilon"])).reshape(shape)
    y = (work - batch_mean.reshape(shape)) * factor + bias.reshape(shape)
    momentum = attrs["momentum"]
    running_mean = mean * momentum + batch_mean * (1 - momentum)
    running_var = var * momentum + batch_var * (1 - momentum)
    return finish(xp, BATCH_NORM_TRAINING, [y, running_mean, running_var][: len(outputs)], outputs)


@register("GroupNormalization")
def group_normalization_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """GroupNormalization: channels split into ``num_groups`` groups, each (sample, group) normalized
    over its channels and spatial positions, then a per-channel scale and bias."""
    x, scale, bias = inputs
    n, groups = int(x.shape[0]), int(attrs["num_groups"])
    grouped = _widened(xp, x).reshape(n, groups, -1)
    mean = xp.mean(grouped, axis=2, keepdims=True)
    centered = grouped - mean
    variance = xp.mean(centered * centered, axis=2, keepdims=True)
    normalized = (centered / xp.sqrt(variance + attrs["epsilon"])).reshape(x.shape)
    shape = _channel_shape(x)
    y = normalized * scale.reshape(shape) + bias.reshape(shape)
    return finish(xp, "GroupNormalization", [y], outputs)


@register("LRN")
def lrn_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """LRN: X / (bias + alpha / size * sum of X^2 over a window of ``size`` channels) ^ beta.

    The window around channel c is [c - floor((size-1)/2), c + ceil((size-1)/2)], clipped.
    """
    x = inputs[0]
    size = int(attrs["size"])
    channels = int(x.shape[1])
    wide = x.astype(xp.float64)
    squares = wide * wide
    before = (size - 1) // 2
    after = size - 1 - before
    widths = [(0, 0), (before, after)] + [(0, 0)] * (x.ndim - 2)
    padded = xp.pad(squares, widths, mode="constant", constant_values=0)
    window = padded[:, 0:channels].copy()
    for j in range(1, size):
        window += padded[:, j : j + channels]
    denominator = (attrs["bias"] + attrs["alpha"] / size * window) ** attrs["beta"]
    return finish(xp, "LRN", [wide / denominator], outputs)


def softmax(xp: Any, x: Any, axis: int) -> Any:
    """Numerically stable softmax along ``axis``."""
    e = xp.exp(x - xp.max(x, axis=axis, keepdims=True))
    return e / xp.sum(e, axis=axis, keepdims=True)


def log_softmax(xp: Any, x: Any, axis: int) -> Any:
    """Numerically stable log-softmax along ``axis``."""
    shifted = x - xp.max(x, axis=axis, keepdims=True)
    return shifted - xp.log(xp.sum(xp.exp(shifted), axis=axis, keepdims=True))


@register("Softmax")
def softmax_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """Softmax along the one axis ``axis`` (opset-13 meaning)."""
    return finish(xp, "Softmax", [softmax(xp, inputs[0], int(attrs["axis"]))], outputs)


@register("LogSoftmax")
def log_softmax_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """LogSoftmax along the one axis ``axis`` (opset-13 meaning)."""
    return finish(xp, "LogSoftmax", [log_softmax(xp, inputs[0], int(attrs["axis"]))], outputs)


@register("LayerNormalization")
def layer_normalization_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """LayerNormalization over axes [axis, rank): Y, and Mean / InvStdDev when asked for.

    The optional second and third outputs have the input's shape with the normalized axes kept
    as size 1, as ONNX defines them.
    """
    x, scale, bias = fill_optional("LayerNormalization", inputs, 3)
    axes = tuple(range(int(attrs["axis"]), x.ndim))
    work = _widened(xp, x)
    mean = xp.mean(work, axis=axes, keepdims=True)
    centered = work - mean
    variance = xp.mean(centered * centered, axis=axes, keepdims=True)
    inv_std = 1 / xp.sqrt(variance + attrs["epsilon"])
    y = centered * inv_std * scale
    if bias is not None:
        y = y + bias
    return finish(xp, "LayerNormalization", [y, mean, inv_std][: len(outputs)], outputs)
