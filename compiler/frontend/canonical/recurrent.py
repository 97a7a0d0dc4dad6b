"""Canonical forms of the recurrent ops (RNN, GRU, LSTM).

A recurrent node keeps its inputs (X, W, R, B?, sequence_lens?, initial_h?[, initial_c?, P?]) and
always produces every output (Y, Y_h[, Y_c]): an output the model leaves out gets a fresh value of
its real shape, so the kernel never has to know which ones are used. Attributes are resolved into
one form: ``direction``, ``layout``, ``hidden_size``, ``clip`` (``inf`` when absent), and one
activation per function and direction (``activations``, with ``activation_alpha`` /
``activation_beta`` aligned to it, defaults filled in as onnxruntime does).
"""

from __future__ import annotations

import math
from typing import Any

from compiler.frontend.canonical.context import CanonContext
from compiler.frontend.canonical.registry import register
from compiler.ir.graph import Node
from compiler.ir.graph import Value

__all__: list[str] = []

# Canonical activation names by lower-case name, with (uses alpha, uses beta, default alpha,
# default beta). Defaults are those of the ONNX ops of the same name (Affine: 1, 0; ScaledTanh,
# which has none, 1, 1); lists are consumed only by the functions that take the parameter.
_ACTIVATIONS: dict[str, tuple[str, bool, bool, float, float]] = {
    "relu": ("Relu", False, False, 0.0, 0.0),
    "tanh": ("Tanh", False, False, 0.0, 0.0),
    "sigmoid": ("Sigmoid", False, False, 0.0, 0.0),
    "affine": ("Affine", True, True, 1.0, 0.0),
    "leakyrelu": ("LeakyRelu", True, False, 0.01, 0.0),
    "thresholdedrelu": ("ThresholdedRelu", True, False, 1.0, 0.0),
    "scaledtanh": ("ScaledTanh", True, True, 1.0, 1.0),
    "hardsigmoid": ("HardSigmoid", True, True, 0.2, 0.5),
    "elu": ("Elu", True, False, 1.0, 0.0),
    "softsign": ("Softsign", False, False, 0.0, 0.0),
    "softplus": ("Softplus", False, False, 0.0, 0.0),
}

# Per op: (number of gates, default activations of one direction, number of outputs).
_RECURRENT: dict[str, tuple[int, list[str], int]] = {
    "RNN": (1, ["Tanh"], 2),
    "GRU": (3, ["Sigmoid", "Tanh"], 2),
    "LSTM": (4, ["Sigmoid", "Tanh", "Tanh"], 3),
}


def _activations(ctx: CanonContext, kind: str, directions: int) -> dict[str, list[Any]]:
    defaults = _RECURRENT[kind][1]
    names = [str(a) for a in ctx.attr("activations", defaults * directions)]
    if len(names) != len(defaults) * directions:
        raise ctx.error(f"activations lists {len(names)} functions, expected {len(defaults) * directions} "
                        f"({len(defaults)} per direction)")
    alphas = [float(a) for a in ctx.attr("activation_alpha", [])]
    betas = [float(b) for b in ctx.attr("activation_beta", [])]
    out: dict[str, list[Any]] = {"activations": [], "activation_alpha": [], "activation_beta": []}
    for name in names:
        entry = _ACTIVATIONS.get(name.lower())
        if entry is None:
            raise ctx.error(f"unknown activation function {name!r}")
        canonical, uses_alpha, uses_beta, alpha, beta = entry
        if uses_alpha and alphas:
            alpha = alphas.pop(0)
        if uses_beta and betas:
            beta = betas.pop(0)
        out["activations"].append(canonical)
        out["activation_alpha"].append(alpha)
        out["activation_beta"].append(beta)
    return out


def _output(ctx: CanonContext, i: int, shape: tuple[int, ...], dtype: Any) -> Value:
    """ONNX output ``i`` when the model uses it, else a fresh value of the same shape."""
    if i < len(ctx.outputs) and ctx.outputs[i].name in ctx.used:
        value = ctx.outputs[i]
        if value.shape != shape:
            raise ctx.error(f"output {i} has shape {value.shape}, expected {shape}")
        return value
    return ctx.graph.make_value(f"{ctx.name}/unused_{i}", dtype, shape)


def resolved_form(ctx: CanonContext, kind: str, x: Value, hidden: int) -> tuple[dict[str, Any], list[Value]]:
    """The canonical attributes of a recurrent node of ``kind`` with input ``x`` and ``hidden_size``
    ``hidden`` (direction, layout, clip, activations, the op's own flag) and its outputs, every one
    present (see the module docstring); DynamicQuantizeLSTM (quantize_lstm.py) shares it."""
    n_outputs = _RECURRENT[kind][2]
    assert x.shape is not None
    direction = str(ctx.attr("direction", "forward"))
    if direction not in ("forward", "reverse", "bidirectional"):
        raise ctx.error(f"unknown direction {direction!r}")
    directions = 2 if direction == "bidirectional" else 1
    layout = int(ctx.attr("layout", 0))
    if layout not in (0, 1) or len(x.shape) != 3:
        raise ctx.error(f"X must be 3-D and layout 0 or 1, got shape {x.shape}, layout {layout}")
    seq, batch = (x.shape[0], x.shape[1]) if layout == 0 else (x.shape[1], x.shape[0])
    clip = float(ctx.attr("clip", math.inf))
    if clip <= 0:
        raise ctx.error(f"clip must be positive, got {clip}")
    attrs: dict[str, Any] = {"hidden_size": hidden, "direction": direction, "layout": layout, "clip": clip,
                             **_activations(ctx, kind, directions)}
    if kind == "GRU":
        attrs["linear_before_reset"] = int(ctx.attr("linear_before_reset", 0))
    if kind == "LSTM":
        attrs["input_forget"] = int(ctx.attr("input_forget", 0))
    y_shape = (seq, directions, batch, hidden) if layout == 0 else (batch, seq, directions, hidden)
    state = (directions, batch, hidden) if layout == 0 else (batch, directions, hidden)
    outputs = [_output(ctx, 0, y_shape, x.dtype)]
    outputs += [_output(ctx, i, state, x.dtype) for i in range(1, n_outputs)]
    return attrs, outputs


@register("RNN", "GRU", "LSTM")
def _recurrent(ctx: CanonContext) -> list[Node]:
    gates = _RECURRENT[ctx.op_type][0]
    x, w, r = (list(ctx.inputs) + [None] * 3)[:3]
    assert x is not None and w is not None and r is not None
    assert x.shape is not None and w.shape is not None and r.shape is not None
    hidden = int(ctx.attr("hidden_size", r.shape[-1] if len(r.shape) == 3 else 0))
    attrs, outputs = resolved_form(ctx, ctx.op_type, x, hidden)
    directions = 2 if attrs["direction"] == "bidirectional" else 1
    if w.shape != (directions, gates * hidden, x.shape[2]) or r.shape != (directions, gates * hidden, hidden):
        raise ctx.error(f"W {w.shape} / R {r.shape} do not fit {directions} direction(s), {gates} gate(s), "
                        f"hidden_size {hidden} and input size {x.shape[2]}")
    return [ctx.node(ctx.op_type, ctx.inputs, attrs, outputs=outputs)]
