"""Reference kernels of the recurrent ops: RNN, GRU and LSTM (canonical forms in
compiler/frontend/canonical/recurrent.py).

Every direction runs the same forward loop over time. A reverse direction first reverses each
batch entry within its own ``sequence_lens`` length (and reverses its outputs back), which is what
onnxruntime does; steps past an entry's length leave its state unchanged and write zeros to Y. An
entry of length 0 ends with zero states. The input projection X·Wᵀ is one matmul for all steps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from runtime.errors import RuntimeKernelError
from runtime.kernels.common import fill_optional
from runtime.kernels.common import finish
from runtime.kernels.registry import OutputSpec
from runtime.kernels.registry import register

__all__ = ["Direction", "WeightsFor", "activation", "lstm_cell_for", "run_directions"]


def _sigmoid(xp: Any, x: Any) -> Any:
    return 0.5 * (1.0 + xp.tanh(0.5 * x))  # no overflow for large |x|


def activation(xp: Any, name: str, alpha: float, beta: float, x: Any) -> Any:
    """The recurrent activation function ``name`` (canonical spelling) applied to ``x``."""
    if name == "Tanh":
        return xp.tanh(x)
    if name == "Sigmoid":
        return _sigmoid(xp, x)
    if name == "Relu":
        return xp.maximum(x, 0)
    if name == "Affine":
        return alpha * x + beta
    if name == "LeakyRelu":
        return xp.where(x >= 0, x, alpha * x)
    if name == "ThresholdedRelu":
        return xp.where(x > alpha, x, 0)
    if name == "ScaledTanh":
        return alpha * xp.tanh(beta * x)
    if name == "HardSigmoid":
        return xp.clip(alpha * x + beta, 0, 1)
    if name == "Elu":
        return xp.where(x >= 0, x, alpha * xp.expm1(xp.minimum(x, 0)))
    if name == "Softsign":
        return x / (1 + xp.abs(x))
    if name == "Softplus":
        return xp.logaddexp(0, x)
    raise RuntimeKernelError(f"unknown recurrent activation {name!r}")


Act = Callable[[Any], Any]


def _functions(xp: Any, attrs: dict[str, Any], direction: int, count: int) -> list[Act]:
    """The ``count`` activation functions of one direction, each clipping its input first."""
    clip = float(attrs["clip"])
    funcs: list[Act] = []
    for k in range(direction * count, (direction + 1) * count):
        name = str(attrs["activations"][k])
        alpha, beta = float(attrs["activation_alpha"][k]), float(attrs["activation_beta"][k])

        def func(x: Any, name: str = name, alpha: float = alpha, beta: float = beta) -> Any:
            if np.isfinite(clip):
                x = xp.clip(x, -clip, clip)
            return activation(xp, name, alpha, beta, x)

        funcs.append(func)
    return funcs


def _reverse_within(xp: Any, a: Any, lengths: Any) -> Any:
    """``a`` (seq, batch, ...) with each batch entry's first ``lengths[b]`` steps reversed."""
    steps = xp.arange(a.shape[0])[:, None]
    index = xp.where(steps < lengths[None, :], lengths[None, :] - 1 - steps, steps)
    index = xp.broadcast_to(index.reshape(index.shape + (1,) * (a.ndim - 2)), a.shape)
    return xp.take_along_axis(a, index, axis=0)


class Direction:
    """The weights of one direction of one recurrent node and its input projection (time-major);
    ``recurrent`` is a step's product H·Rᵀ (the LSTM cell asks it, so that DynamicQuantizeLSTM,
    runtime/kernels/qrecurrent.py, can put its integer product there)."""

    def __init__(self, xp: Any, x: Any, w: Any, r: Any, b: Any | None, d: int) -> None:
        dtype = x.dtype
        width = int(w.shape[1])  # gates * hidden
        self.r_t = r[d].astype(dtype).T
        bias = b[d].astype(dtype) if b is not None else xp.zeros(2 * width, dtype)
        self.rb = bias[width:]
        seq, batch, size = x.shape
        # X·Wᵀ + Wb for every step at once: (seq, batch, gates * hidden)
        self.x_proj = (xp.matmul(x.reshape(seq * batch, size), w[d].astype(dtype).T)
                       + bias[:width]).reshape(seq, batch, width)

    def recurrent(self, xp: Any, h: Any, t: int) -> Any:
        """Step ``t``'s product of the state ``h`` (batch, hidden) with Rᵀ."""
        return xp.matmul(h, self.r_t)


# weights_for(xp, x (time-major, reversed for a reverse direction), direction, lengths) -> Direction
WeightsFor = Callable[[Any, Any, int, Any], Direction]


def run_directions(xp: Any, kind: str, inputs: list[Any], attrs: dict[str, Any], n_funcs: int,
                   cell: Callable[..., tuple[Any, Any]], with_cell: bool,
                   weights_for: WeightsFor | None = None) -> list[Any]:
    """Run every direction; returns Y (seq, dirs, batch, hidden), Y_h[, Y_c] (dirs, batch, hidden).
    ``weights_for`` makes each direction's weights (default: the float ``Direction`` of W, R, B)."""
    x, w, r, b, lens_in, h0, c0 = fill_optional(kind, inputs, 8)[:7]
    dtype = np.result_type(x.dtype, np.float32)
    hidden = int(attrs["hidden_size"])
    layout = int(attrs["layout"])
    if layout == 1:
        x = xp.swapaxes(x, 0, 1)
        h0 = xp.swapaxes(h0, 0, 1) if h0 is not None else None
        c0 = xp.swapaxes(c0, 0, 1) if c0 is not None else None
    seq, batch = int(x.shape[0]), int(x.shape[1])
    x = x.astype(dtype)
    lengths = (xp.full(batch, seq, np.int64) if lens_in is None
               else xp.clip(lens_in.astype(np.int64).reshape(batch), 0, seq))
    dirs = 2 if attrs["direction"] == "bidirectional" else 1
    ys, hs, cs = [], [], []
    for d in range(dirs):
        reverse = attrs["direction"] == "reverse" or d == 1
        xd = _reverse_within(xp, x, lengths) if reverse else x
        weights = (Direction(xp, xd, w, r, b, d) if weights_for is None
                   else weights_for(xp, xd, d, lengths))
        funcs = _functions(xp, attrs, d, n_funcs)
        h = h0[d].astype(dtype) if h0 is not None else xp.zeros((batch, hidden), dtype)
        c = c0[d].astype(dtype) if c0 is not None else xp.zeros((batch, hidden), dtype)
        y = xp.zeros((seq, batch, hidden), dtype)
        for t in range(seq):
            h_new, c_new = cell(xp, weights, funcs, t, h, c, d)
            active = (t < lengths)[:, None]
            h = xp.where(active, h_new, h)
            c = xp.where(active, c_new, c) if with_cell else c
            y[t] = xp.where(active, h_new, 0)
        empty = (lengths == 0)[:, None]
        ys.append(_reverse_within(xp, y, lengths) if reverse else y)
        hs.append(xp.where(empty, 0, h))
        cs.append(xp.where(empty, 0, c))
    results = [xp.stack(ys, axis=1), xp.stack(hs, axis=0)] + ([xp.stack(cs, axis=0)] if with_cell else [])
    if layout == 1:
        results = [xp.transpose(results[0], (2, 0, 1, 3))] + [xp.swapaxes(s, 0, 1) for s in results[1:]]
    return results


def _rnn_cell(xp: Any, wt: Direction, funcs: list[Act], t: int, h: Any, c: Any, d: int) -> tuple[Any, Any]:
    return funcs[0](wt.x_proj[t] + xp.matmul(h, wt.r_t) + wt.rb), c


def _gru_cell_for(linear_before_reset: bool) -> Callable[..., tuple[Any, Any]]:
    def cell(xp: Any, wt: Direction, funcs: list[Act], t: int, h: Any, c: Any, d: int) -> tuple[Any, Any]:
        n = h.shape[1]
        xz, xr, xh = wt.x_proj[t][:, :n], wt.x_proj[t][:, n:2 * n], wt.x_proj[t][:, 2 * n:]
        rz, rr, rh = wt.r_t[:, :n], wt.r_t[:, n:2 * n], wt.r_t[:, 2 * n:]
        z = funcs[0](xz + xp.matmul(h, rz) + wt.rb[:n])
        r = funcs[0](xr + xp.matmul(h, rr) + wt.rb[n:2 * n])
        if linear_before_reset:
            candidate = funcs[1](xh + r * (xp.matmul(h, rh) + wt.rb[2 * n:]))
        else:
            candidate = funcs[1](xh + xp.matmul(r * h, rh) + wt.rb[2 * n:])
        return (1 - z) * candidate + z * h, c

    return cell


def lstm_cell_for(peepholes: Any, input_forget: bool) -> Callable[..., tuple[Any, Any]]:
    def cell(xp: Any, wt: Direction, funcs: list[Act], t: int, h: Any, c: Any, d: int) -> tuple[Any, Any]:
        n = h.shape[1]
        g = wt.x_proj[t] + wt.recurrent(xp, h, t) + wt.rb
        p_i, p_o, p_f = ((peepholes[d, :n], peepholes[d, n:2 * n], peepholes[d, 2 * n:])
                         if peepholes is not None else (0, 0, 0))
        i = funcs[0](g[:, :n] + p_i * c)
        f = 1 - i if input_forget else funcs[0](g[:, 2 * n:3 * n] + p_f * c)
        c_new = f * c + i * funcs[1](g[:, 3 * n:])
        o = funcs[0](g[:, n:2 * n] + p_o * c_new)
        return o * funcs[2](c_new), c_new

    return cell


@register("RNN")
def rnn_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """RNN: X, W, R, B?, sequence_lens?, initial_h? -> Y, Y_h."""
    return finish(xp, "RNN", run_directions(xp, "RNN", inputs, attrs, 1, _rnn_cell, False), outputs)


@register("GRU")
def gru_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """GRU: X, W, R, B?, sequence_lens?, initial_h? -> Y, Y_h (gates z, r, h)."""
    cell = _gru_cell_for(bool(attrs["linear_before_reset"]))
    return finish(xp, "GRU", run_directions(xp, "GRU", inputs, attrs, 2, cell, False), outputs)


@register("LSTM")
def lstm_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """LSTM: X, W, R, B?, sequence_lens?, initial_h?, initial_c?, P? -> Y, Y_h, Y_c (gates i, o, f, c)."""
    dtype = np.result_type(inputs[0].dtype, np.float32)
    peepholes = fill_optional("LSTM", inputs, 8)[7]
    if peepholes is not None:
        peepholes = peepholes.astype(dtype)
    cell = lstm_cell_for(peepholes, bool(attrs["input_forget"]))
    return finish(xp, "LSTM", run_directions(xp, "LSTM", inputs, attrs, 3, cell, True), outputs)

