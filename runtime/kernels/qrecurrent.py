"""Reference kernel of ``onnx_aot.QLSTM``, onnxruntime's int8 LSTM (canonical form:
compiler/frontend/canonical/quantize_lstm.py), following onnxruntime's CPU kernel (one direction at
a time, ``UniDirectionalLstm`` with 8-bit weights):

- the input projection of every step at once: X's rows of the first ``max(sequence_lens)`` steps
  quantized to uint8 as one tensor (DynamicQuantizeLinear's scale and zero point over them), an
  exact integer product with W, then ``float(acc) · (x_scale · W_scale)`` (per tensor or per
  column) — no bias yet;
- per step, H (batch, hidden) quantized the same way as one tensor, its integer product with R
  scaled by ``h_scale · R_scale`` and added to the projection, then Wb + Rb (summed once) and the
  LSTM cell of runtime/kernels/recurrent.py. H is the held state, except that with
  ``zero_finished`` an entry past its length reads as zeros from the second step after its last
  (onnxruntime's zeroed Y row).

onnxruntime run with more than one intra-op thread splits the batch (above 4 entries, or from 2
with hidden ≤ 256) and quantizes each part's H on its own, so its result depends on its thread
count; this kernel is what it computes on one thread.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from runtime.contract import Q_LSTM
from runtime.kernels.common import fill_optional
from runtime.kernels.common import finish
from runtime.kernels.qgemm import unpack_qb
from runtime.kernels.quantize import dynamic_quantize_kernel
from runtime.kernels.recurrent import Direction
from runtime.kernels.recurrent import WeightsFor
from runtime.kernels.recurrent import lstm_cell_for
from runtime.kernels.recurrent import run_directions
from runtime.kernels.registry import OutputSpec
from runtime.kernels.registry import register

__all__: list[str] = []


def quantized_product(xp: Any, a: Any, b: Any, b_scale: Any, b_zero: Any) -> Any:
    """``a`` (rows, k) float32 quantized as one tensor times the 8-bit ``b`` (k, n), in float32:
    ``float(Σ (qa - za)(b - zb)) · (a_scale · b_scale)``; ``b_scale`` one value or one per column."""
    rows = a.shape[0]
    specs = [(a.shape, np.uint8), ((), np.float32), ((), np.uint8)]
    q, scale, zero = dynamic_quantize_kernel(xp, [a], {}, specs)
    centered = q.astype(np.float64) - float(zero)
    acc = xp.matmul(centered, b.astype(np.float64) - float(b_zero))  # exact: |acc| < 2^53
    factor = (scale * b_scale.astype(np.float32)).astype(np.float32)
    return (acc.astype(np.float32) * factor).astype(np.float32).reshape(rows, b.shape[1])


class _QuantizedDirection(Direction):
    """One direction's 8-bit weights, its quantized input projection and step product."""

    def __init__(self, xp: Any, x: Any, weights: list[Any], d: int, lengths: Any,
                 zero_finished: bool) -> None:
        w, r, b, w_scale, w_zero, r_scale, r_zero = weights
        seq, batch, size = x.shape
        width = int(w.shape[2])  # 4 * hidden
        self.r, self.lengths, self.zero_finished = r[d], lengths, zero_finished
        self.r_scale = r_scale[d]
        self.r_zero = r_zero[d].reshape(-1)[0]  # one value per direction (checked at import)
        bias = b[d].astype(np.float32) if b is not None else xp.zeros(2 * width, np.float32)
        self.rb = (bias[:width] + bias[width:]).astype(np.float32)
        steps = int(lengths.max()) if lengths.size else 0
        self.x_proj = xp.zeros((seq, batch, width), np.float32)
        if steps and batch and size:
            rows = x[:steps].reshape(steps * batch, size)
            proj = quantized_product(xp, rows, w[d], w_scale[d], w_zero[d].reshape(-1)[0])
            self.x_proj[:steps] = proj.reshape(steps, batch, width)

    def recurrent(self, xp: Any, h: Any, t: int) -> Any:
        if self.zero_finished and t > 0:
            h = xp.where((t - 1 < self.lengths)[:, None], h, 0).astype(np.float32)
        if h.size == 0:
            return xp.zeros((h.shape[0], self.r.shape[1]), np.float32)
        return quantized_product(xp, h, self.r, self.r_scale, self.r_zero)


def _weights_for(weights: list[Any], zero_finished: bool) -> WeightsFor:
    def make(xp: Any, x: Any, d: int, lengths: Any) -> Direction:
        return _QuantizedDirection(xp, x, weights, d, lengths, zero_finished)

    return make


@register(Q_LSTM)
def dynamic_quantize_lstm_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any],
                                 outputs: list[OutputSpec]) -> list[Any]:
    """DynamicQuantizeLSTM: X, W, R, B?, sequence_lens?, initial_h?, initial_c?, P?, W_scale, W_zero,
    R_scale, R_zero[, W_sum, R_sum] -> Y, Y_h, Y_c (gates i, o, f, c), as onnxruntime computes it on
    one thread; ``packed`` W / R are unpacked first (the sums are the C kernel's)."""
    x, w, r, b, lens, h0, c0, p, *quantization = fill_optional(Q_LSTM, inputs, 14)
    w_scale, w_zero, r_scale, r_zero = quantization[:4]
    if int(attrs["packed"]):
        hidden, size = int(attrs["hidden_size"]), int(x.shape[2])
        w = xp.stack([unpack_qb(m, size, 4 * hidden, w_zero.dtype.name) for m in w])
        r = xp.stack([unpack_qb(m, hidden, 4 * hidden, r_zero.dtype.name) for m in r])
    peepholes = p.astype(np.float32) if p is not None else None
    cell = lstm_cell_for(peepholes, bool(attrs["input_forget"]))
    make = _weights_for([w, r, b, w_scale, w_zero, r_scale, r_zero], bool(attrs["zero_finished"]))
    lstm = [x, w, r, b, lens, h0, c0, p]
    return finish(xp, Q_LSTM,
                  run_directions(xp, Q_LSTM, lstm, attrs, 3, cell, True, make), outputs)
