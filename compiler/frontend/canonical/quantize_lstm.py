"""Canonical form of onnxruntime's ``com.microsoft.DynamicQuantizeLSTM`` (what ``quantize_dynamic``
writes for an LSTM): one ``onnx_aot.QLSTM`` with the LSTM's canonical attributes
(compiler/frontend/canonical/recurrent.py) and its twelve inputs as the file has them::

    X, W (dirs, input, 4H), R (dirs, H, 4H), B?, sequence_lens?, initial_h?, initial_c?, P?,
    W_scale, W_zero_point, R_scale, R_zero_point   (scales / zero points (dirs) or (dirs, 4H))

W and R are int8 or uint8, stored transposed against the LSTM's (onnxruntime's quantizer writes
them so). Zero points must be constants of W's / R's type and, as onnxruntime requires, all zero
for int8 per-channel weights and one value for uint8 per-channel ones. ``zero_finished`` records
whether the model uses Y: onnxruntime then feeds the step after a batch entry's last one a zero row
for that entry (the zeroed Y), which changes the range the step's H is quantized over (reference:
runtime/kernels/qrecurrent.py). Layout 0 only (the quantizer drops ``layout``; onnxruntime runs 0).
"""

from __future__ import annotations

import numpy as np

from compiler.frontend.canonical.context import CanonContext
from compiler.frontend.canonical.recurrent import resolved_form
from compiler.frontend.canonical.registry import register
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from runtime.contract import AOT_DOMAIN
from runtime.contract import Q_LSTM
from runtime.contract import op_name

__all__: list[str] = []

_INT8 = (np.dtype(np.int8), np.dtype(np.uint8))


def _weight(ctx: CanonContext, inputs: list[Value | None], i: int, what: str, shape: tuple[int, ...]) -> None:
    """Checks input ``i`` (W: 1, R: 2): 8-bit, of ``shape``, and its scale and zero point (8 / 9 for
    W, 10 / 11 for R)."""
    value = inputs[i]
    if value is None or value.dtype not in _INT8 or value.shape != shape:
        got = None if value is None else (value.dtype, value.shape)
        raise ctx.error(f"{what} must be int8 or uint8 of shape {shape} (directions, rows, 4 * hidden_size), "
                        f"got {got}")
    scale_i = 8 if i == 1 else 10
    scale, zero = inputs[scale_i], inputs[scale_i + 1]
    sizes = ((shape[0],), (shape[0], shape[2]))
    if scale is None or scale.dtype != np.float32 or scale.shape not in sizes:
        raise ctx.error(f"{what}_scale must be float32 of shape {sizes[0]} or {sizes[1]}")
    if zero is None or zero.dtype != value.dtype or zero.shape not in sizes:
        raise ctx.error(f"{what}_zero_point must be {value.dtype} of shape {sizes[0]} or {sizes[1]}")
    points = ctx.const_input(scale_i + 1, f"{what}_zero_point")
    assert points is not None
    if len(points.shape) == 2 and value.dtype == np.int8 and np.any(points != 0):
        raise ctx.error(f"{what}_zero_point must be all zero for per-channel int8 weights "
                        "(as onnxruntime requires)")
    if len(points.shape) == 2 and np.any(points != points.reshape(-1)[0]):
        raise ctx.error(f"{what}_zero_point must be one value for per-channel uint8 weights "
                        "(as onnxruntime requires)")


@register("com.microsoft.DynamicQuantizeLSTM")
def _dynamic_quantize_lstm(ctx: CanonContext) -> list[Node]:
    inputs: list[Value | None] = (list(ctx.inputs) + [None] * 12)[:12]
    x, r = inputs[0], inputs[2]
    if x is None or x.dtype != np.float32 or x.shape is None or len(x.shape) != 3:
        raise ctx.error(f"X must be float32 and 3-D, got {None if x is None else (x.dtype, x.shape)}")
    if r is None or r.shape is None or len(r.shape) != 3:
        raise ctx.error("R must be 3-D (directions, hidden_size, 4 * hidden_size)")
    if int(ctx.attr("layout", 0)) != 0:
        raise ctx.error("layout must be 0 (onnxruntime runs DynamicQuantizeLSTM on layout 0 only)")
    hidden = int(ctx.attr("hidden_size", r.shape[1]))
    attrs, outputs = resolved_form(ctx, "LSTM", x, hidden)
    dirs = 2 if attrs["direction"] == "bidirectional" else 1
    _weight(ctx, inputs, 1, "W", (dirs, x.shape[2], 4 * hidden))
    _weight(ctx, inputs, 2, "R", (dirs, hidden, 4 * hidden))
    attrs["zero_finished"] = int(outputs[0] is ctx.outputs[0] if ctx.outputs else False)
    attrs["packed"] = 0  # compiler/passes/pack_qlstm_weights.py packs them for the C target
    return [ctx.node(op_name(Q_LSTM), inputs, attrs, outputs=outputs, domain=AOT_DOMAIN)]
