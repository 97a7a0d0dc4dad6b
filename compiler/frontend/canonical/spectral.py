"""Canonical forms of the signal ops: DFT, STFT, the windows and MelWeightMatrix (see docs/ops.md).

Their lengths, axes and steps are compile-time inputs (COMPILE_TIME_INPUTS) and become
attributes. DFT keeps only its signal, with ``axis`` normalized (never the last, complex axis),
``length`` resolved (the default for an inverse one-sided DFT is ``2 * (n - 1)``), ``inverse`` and
``onesided``. STFT keeps the signal and the optional window. The generators (windows,
MelWeightMatrix) take no inputs: every value they need is an attribute, and the output's element
type is the output value's dtype.
"""

from __future__ import annotations

from typing import Any

from compiler.frontend.canonical.context import CanonContext
from compiler.frontend.canonical.registry import register
from compiler.ir.graph import Node

__all__: list[str] = []


def _scalar(ctx: CanonContext, i: int, what: str) -> Any | None:
    """The single value of constant input ``i`` (None when omitted)."""
    value = ctx.const_input(i, what)
    if value is None:
        return None
    if value.size != 1:
        raise ctx.error(f"input {i} ({what}) must be a scalar, got shape {value.shape}")
    return value.reshape(-1)[0].item()


def _flag(ctx: CanonContext, key: str, default: int) -> int:
    value = int(ctx.attr(key, default))
    if value not in (0, 1):
        raise ctx.error(f"{key} must be 0 or 1, got {value}")
    return value


@register("DFT")
def _dft(ctx: CanonContext) -> list[Node]:
    x = ctx.inputs[0]
    assert x is not None and x.shape is not None
    rank = len(x.shape)
    if rank < 2 or x.shape[-1] not in (1, 2):
        raise ctx.error(f"input must end in a dimension of 1 (real) or 2 (complex), got shape {x.shape}")
    if ctx.opset >= 20:
        axis_in = _scalar(ctx, 2, "axis") if len(ctx.inputs) > 2 else None
        axis = int(axis_in) if axis_in is not None else -2
    else:
        axis = int(ctx.attr("axis", 1))
    axis = ctx.axis(axis, rank)
    if axis == rank - 1:
        raise ctx.error("the last axis holds the real and imaginary parts; it cannot be transformed")
    inverse, onesided = _flag(ctx, "inverse", 0), _flag(ctx, "onesided", 0)
    length_in = _scalar(ctx, 1, "dft_length") if len(ctx.inputs) > 1 else None
    if length_in is not None:
        length = int(length_in)
    else:
        length = 2 * (x.shape[axis] - 1) if inverse and onesided else x.shape[axis]
    if length < 1:
        raise ctx.error(f"dft_length must be positive, got {length}")
    attrs = {"axis": axis, "length": length, "inverse": inverse, "onesided": onesided}
    return [ctx.node("DFT", ctx.inputs[:1], attrs)]


@register("STFT")
def _stft(ctx: CanonContext) -> list[Node]:
    signal = ctx.inputs[0]
    window = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    assert signal is not None and signal.shape is not None
    if len(signal.shape) != 3 or signal.shape[2] not in (1, 2):
        raise ctx.error(f"signal must have shape (batch, length, 1 or 2), got {signal.shape}")
    step = _scalar(ctx, 1, "frame_step")
    length_in = _scalar(ctx, 3, "frame_length") if len(ctx.inputs) > 3 else None
    if window is not None:
        assert window.shape is not None
        if len(window.shape) != 1 or (length_in is not None and window.shape[0] != int(length_in)):
            raise ctx.error(f"window of shape {window.shape} does not match frame_length {length_in}")
        length = int(window.shape[0])
    else:
        length = int(length_in) if length_in is not None else signal.shape[1]
    if step is None or int(step) < 1 or not 1 <= length <= signal.shape[1]:
        raise ctx.error(f"frame_step {step} / frame_length {length} do not fit a signal of length "
                        f"{signal.shape[1]}")
    attrs = {"frame_step": int(step), "frame_length": length, "onesided": _flag(ctx, "onesided", 1)}
    return [ctx.node("STFT", [signal, window], attrs)]


@register("HannWindow", "HammingWindow", "BlackmanWindow")
def _window(ctx: CanonContext) -> list[Node]:
    size = _scalar(ctx, 0, "size")
    if size is None or int(size) < 0:
        raise ctx.error(f"size must be a non-negative scalar, got {size}")
    return [ctx.node(ctx.op_type, [], {"size": int(size), "periodic": _flag(ctx, "periodic", 1)})]


@register("MelWeightMatrix")
def _mel_weight_matrix(ctx: CanonContext) -> list[Node]:
    names = ("num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz", "upper_edge_hertz")
    values = [_scalar(ctx, i, name) for i, name in enumerate(names)]
    if any(v is None for v in values):
        raise ctx.error("all five inputs are required")
    bins, dft_length, rate, low, high = values
    assert bins is not None and dft_length is not None and rate is not None
    assert low is not None and high is not None
    if int(bins) < 1 or int(dft_length) < 1 or int(rate) < 1 or not 0 <= float(low) <= float(high):
        raise ctx.error(f"invalid mel bins {bins}, dft_length {dft_length}, sample_rate {rate} "
                        f"or edges {low}..{high} Hz")
    attrs = {"num_mel_bins": int(bins), "dft_length": int(dft_length), "sample_rate": int(rate),
             "lower_edge_hertz": float(low), "upper_edge_hertz": float(high)}
    return [ctx.node("MelWeightMatrix", [], attrs)]

