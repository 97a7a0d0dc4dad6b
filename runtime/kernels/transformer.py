"""Reference kernels of the transformer ops (see runtime/kernels/__init__.py for the contract).

Attention here is the canonical 4-D core (compiler/frontend/canonical/transformer.py splits and
merges heads and concatenates the KV cache around it); FlexAttention (domain ai.onnx.preview) has no
canonicalizer and reads its ONNX attributes. Everything computes in float32 (float64 for double
inputs or where the canonical ``compute_dtype`` says so) and casts to the output types at the end.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from runtime.errors import RuntimeKernelError
from runtime.errors import UnsupportedOpError
from runtime.kernels.common import fill_optional
from runtime.kernels.common import finish
from runtime.kernels.registry import OutputSpec
from runtime.kernels.registry import register

__all__: list[str] = []

# ONNX TensorProto codes a FlexAttention softmax_precision may name -> the dtype computed in
# (float16 / bfloat16 requests are met by computing in float32, which is at least as precise).
_FLEX_SOFTMAX_DTYPES = {1: "float32", 10: "float32", 16: "float32", 11: "float64"}


def _compute_dtype(*arrays: Any) -> np.dtype:
    """float64 when any input is double, float32 otherwise."""
    wide = any(a is not None and a.dtype == np.float64 for a in arrays)
    return np.dtype(np.float64 if wide else np.float32)


def _sigmoid(xp: Any, x: Any) -> Any:
    """Overflow-free logistic function."""
    return 0.5 * (1.0 + xp.tanh(0.5 * x))


def _rounded_sqrt_scale(scale: float, dtype: np.dtype) -> float:
    """sqrt(scale) rounded to the inputs' type, as ONNX's function bodies compute it."""
    return float(np.asarray(math.sqrt(scale), dtype=dtype))


def _masked_softmax(xp: Any, x: Any, dead_rows: Any) -> Any:
    """Softmax over the last axis; rows of ``-inf`` and ``dead_rows`` (or None) become zero rows."""
    top = xp.max(x, axis=-1, keepdims=True)
    top = xp.where(top == -np.inf, 0, top)
    e = xp.exp(x - top)
    total = xp.sum(e, axis=-1, keepdims=True)
    probs = e / xp.where(total == 0, 1, total)
    return probs if dead_rows is None else xp.where(dead_rows, 0, probs)


# -- Attention ------------------------------------------------------------------------------
def _structural_bias(xp: Any, attrs: dict[str, Any], nonpad: Any, q_len: int, kv_len: int,
                     dtype: np.dtype) -> Any:
    """The causal / sliding-window / padding bias (0 or -inf), or None when none applies.

    Positions are offset-aligned: query ``i`` sits at ``i + offset``, where offset is the cached
    length before the query block (``past_length``, or ``nonpad_kv_seqlen - q_len`` per batch).
    """
    causal = int(attrs["is_causal"])
    left, right = int(attrs["left_window_size"]), int(attrs["right_window_size"])
    if not causal and left < 0 and right < 0 and nonpad is None:
        return None
    i = xp.arange(q_len).reshape(q_len, 1)
    j = xp.arange(kv_len).reshape(1, kv_len)
    if nonpad is not None:
        lengths = nonpad.astype(np.int64).reshape(-1, 1, 1, 1)
        position = i + (lengths - q_len)
    else:
        position = i + int(attrs["past_length"])
    allowed = xp.ones_like(position - j, dtype=bool)
    if causal:
        allowed &= j <= position
    if left >= 0:
        allowed &= position - j <= left
    if right >= 0:
        allowed &= j - position <= right
    if nonpad is not None:
        allowed &= j < lengths
    return xp.where(allowed, dtype.type(0), dtype.type(-np.inf))


def _mask_bias(xp: Any, mask: Any, kv_len: int, dtype: np.dtype) -> Any:
    """attn_mask as an additive bias, its last axis padded with -inf up to ``kv_len``."""
    if mask.dtype == np.bool_:
        bias = xp.where(mask, dtype.type(0), dtype.type(-np.inf))
    else:
        bias = mask.astype(dtype)
    short = kv_len - bias.shape[-1]
    if short < 0:
        raise RuntimeKernelError(f"Attention: attn_mask has {bias.shape[-1]} keys, more than {kv_len}")
    if short:
        pad = xp.full(bias.shape[:-1] + (short,), -np.inf, dtype=dtype)
        bias = xp.concatenate([bias, pad], axis=-1)
    return bias


@register("Attention")
def attention_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """Scaled dot-product attention on (B, H, S, D) tensors with masks, softcap and GQA.

    Outputs Y and, when present, the qk_matmul_output selected by ``qk_matmul_output_mode``. A query
    row whose bias disallows every key yields zeros in Y and in the mode-3 probabilities.
    """
    q, k, v, mask, nonpad = fill_optional("Attention", inputs, 5)
    compute = np.dtype(attrs["compute_dtype"])
    root = _rounded_sqrt_scale(float(attrs["scale"]), q.dtype)
    group = q.shape[1] // k.shape[1]
    keys = k.astype(compute) * root
    values = v.astype(compute)
    if group > 1:
        keys, values = xp.repeat(keys, group, axis=1), xp.repeat(values, group, axis=1)
    raw = xp.matmul(q.astype(compute) * root, xp.swapaxes(keys, -1, -2))
    softcap = float(attrs["softcap"])
    capped = softcap * xp.tanh(raw / softcap) if softcap > 0 else raw
    q_len, kv_len = raw.shape[-2], raw.shape[-1]
    bias = _structural_bias(xp, attrs, nonpad, q_len, kv_len, compute)
    if mask is not None:
        masked = _mask_bias(xp, mask, kv_len, compute)
        bias = masked if bias is None else masked + bias
    scores = capped if bias is None else capped + bias
    dead = None if bias is None else xp.max(bias, axis=-1, keepdims=True) == -np.inf
    probs = _masked_softmax(xp, scores, dead)
    results = [xp.matmul(probs, values)]
    if len(outputs) > 1:
        results.append((raw, capped, scores, probs)[int(attrs["qk_matmul_output_mode"])])
    return finish(xp, "Attention", results, outputs, broadcast=True)


@register("ai.onnx.preview.FlexAttention")
def flex_attention_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """FlexAttention without score_mod / prob_mod subgraphs: softmax(Q K^T * scale) V with GQA.

    The op has no canonical form (non-ONNX domains keep their attributes), so the defaults are
    resolved here: scale 1/sqrt(head_size), softmax in float32 (float64 for double inputs). A node
    with subgraphs never gets here: graph attributes cannot be stored in plan.json.
    """
    q, k, v = inputs[:3]
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4 or k.shape[1] != v.shape[1] or q.shape[1] % k.shape[1]:
        raise RuntimeKernelError(f"FlexAttention: bad shapes Q {q.shape}, K {k.shape}, V {v.shape}")
    compute = _compute_dtype(q)
    if "softmax_precision" in attrs:
        precision = int(attrs["softmax_precision"])
        name = _FLEX_SOFTMAX_DTYPES.get(precision)
        if name is None:
            raise UnsupportedOpError(f"FlexAttention: softmax_precision {precision} is not supported")
        compute = np.dtype(name) if name == "float64" else compute
    scale = float(attrs["scale"]) if "scale" in attrs else 1.0 / math.sqrt(q.shape[3])
    root = _rounded_sqrt_scale(float(np.float32(scale)), q.dtype)
    group = q.shape[1] // k.shape[1]
    keys, values = k.astype(compute) * root, v.astype(compute)
    if group > 1:
        keys, values = xp.repeat(keys, group, axis=1), xp.repeat(values, group, axis=1)
    scores = xp.matmul(q.astype(compute) * root, xp.swapaxes(keys, -1, -2))
    return finish(xp, "FlexAttention", [xp.matmul(_masked_softmax(xp, scores, None), values)], outputs)


# -- single-node ops ------------------------------------------------------------------------
@register("RMSNormalization")
def rms_normalization_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """X / sqrt(mean(X^2 over [axis, rank)) + epsilon), in ``compute_dtype``, cast back, times Scale."""
    x, scale = inputs[:2]
    wide = x.astype(np.dtype(attrs["compute_dtype"]))
    axes = tuple(range(int(attrs["axis"]), x.ndim))
    mean_square = xp.mean(wide * wide, axis=axes, keepdims=True)
    normalized = (wide / xp.sqrt(mean_square + float(attrs["epsilon"]))).astype(x.dtype)
    return finish(xp, "RMSNormalization", [normalized * scale], outputs)


@register("RotaryEmbedding")
def rotary_embedding_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """Rotate the first ``rotary_embedding_dim`` features of every head by the cached angles.

    X is (B, H, S, D) or (B, S, H*D); the caches are (max_position, dim/2) indexed by position_ids,
    or (B, S, dim/2) without them. Halves (x[:d/2], x[d/2:]) or interleaved pairs are rotated.
    """
    x, cos, sin, positions = fill_optional("RotaryEmbedding", inputs, 4)
    heads, dim = int(attrs["num_heads"]), int(attrs["rotary_embedding_dim"])
    compute = _compute_dtype(x)
    if x.ndim == 4:
        seq = xp.swapaxes(x, 1, 2).astype(compute)
    else:
        seq = x.reshape(x.shape[0], x.shape[1], heads, -1).astype(compute)
    if positions is not None:
        if positions.size and (int(positions.min()) < 0 or int(positions.max()) >= cos.shape[0]):
            raise RuntimeKernelError(f"RotaryEmbedding: position_ids out of range [0, {cos.shape[0]})")
        cos, sin = cos[positions], sin[positions]
    cos, sin = cos.astype(compute)[:, :, None, :], sin.astype(compute)[:, :, None, :]
    rotate = seq[..., :dim]
    if int(attrs["interleaved"]):
        x1, x2 = rotate[..., 0::2], rotate[..., 1::2]
    else:
        x1, x2 = rotate[..., : dim // 2], rotate[..., dim // 2 :]
    real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
    if int(attrs["interleaved"]):
        rotated = xp.stack([real, imag], axis=-1).reshape(rotate.shape)
    else:
        rotated = xp.concatenate([real, imag], axis=-1)
    result = xp.concatenate([rotated, seq[..., dim:]], axis=-1)
    result = xp.swapaxes(result, 1, 2) if x.ndim == 4 else result.reshape(x.shape)
    return finish(xp, "RotaryEmbedding", [result], outputs)


@register("SwiGLU")
def swiglu_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """A * sigmoid(alpha * A) * B."""
    compute = _compute_dtype(inputs[0])
    a, b = inputs[0].astype(compute), inputs[1].astype(compute)
    return finish(xp, "SwiGLU", [a * _sigmoid(xp, float(attrs["alpha"]) * a) * b], outputs)


@register("CausalConvWithState")
def causal_conv_with_state_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """Depthwise causal conv1d of (B, C, L) with weight (C, 1, k), left-padded by past_state.

    Outputs the (optionally SiLU-activated) convolution and, when present, the last k-1 positions of
    the padded sequence (the carry state for the next call).
    """
    x, weight, bias, past = fill_optional("CausalConvWithState", inputs, 4)
    batch, channels, length = x.shape
    taps = weight.shape[2]
    if past is None:
        past = xp.zeros((batch, channels, taps - 1), dtype=x.dtype)
    padded = xp.concatenate([past.astype(x.dtype), x], axis=2)
    compute = _compute_dtype(x)
    wide = padded.astype(compute)
    kernel = weight.astype(compute)[:, 0, :]
    out = xp.zeros((batch, channels, length), dtype=compute)
    for tap in range(taps):
        out += kernel[None, :, tap, None] * wide[:, :, tap : tap + length]
    if bias is not None:
        out += bias.astype(compute)[None, :, None]
    if attrs["activation"] == "silu":
        out = out * _sigmoid(xp, out)
    results = [out, padded[:, :, padded.shape[2] - (taps - 1) :]][: len(outputs)]
    return finish(xp, "CausalConvWithState", results, outputs)


def _heads(x: Any, heads: int) -> Any:
    """(B, T, heads * D) -> (B, heads, T, D)."""
    b, t, hidden = x.shape
    return x.reshape(b, t, heads, hidden // heads).transpose(0, 2, 1, 3)


@register("LinearAttention")
def linear_attention_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """The linear-attention recurrence, one token at a time, with GQA by repeating the state.

    State S (B, H_kv, d_k, d_v) starts at past_state (or zeros); per token: gated rules decay S by
    exp(decay), delta rules replace v by beta * (v - S^T k), then S += k v^T and o = scale * q^T S.
    """
    query, key, value, past, decay, beta = fill_optional("LinearAttention", inputs, 6)
    q_heads, kv_heads = int(attrs["q_num_heads"]), int(attrs["kv_num_heads"])
    b, steps, _ = query.shape
    f32 = np.dtype(np.float32)
    q4 = _heads(query, q_heads).astype(f32)
    k4, v4 = _heads(key, kv_heads).astype(f32), _heads(value, kv_heads).astype(f32)
    d_k, d_v = k4.shape[3], v4.shape[3]
    # decay (B, T, H_kv) or (B, T, H_kv * d_k) -> (B, H_kv, T, 1 or d_k); beta (B, T, H_kv or 1) alike
    decay4 = None if decay is None else _heads(decay, kv_heads).astype(f32)
    beta4 = None if beta is None else _heads(beta, beta.shape[2]).astype(f32)
    state = xp.zeros((b, kv_heads, d_k, d_v), dtype=f32) if past is None else past.astype(f32)
    group = q_heads // kv_heads
    scale = float(attrs["scale"])
    out = xp.zeros((b, q_heads, steps, d_v), dtype=f32)
    for t in range(steps):
        k_t, v_t = k4[:, :, t, :], v4[:, :, t, :]
        if decay4 is not None:
            state = state * xp.exp(decay4[:, :, t, :])[..., None]
        if beta4 is not None:
            v_t = beta4[:, :, t, :] * (v_t - xp.einsum("bhdm,bhd->bhm", state, k_t))
        state = state + k_t[..., :, None] * v_t[..., None, :]
        shared = state if group == 1 else xp.repeat(state, group, axis=1)
        out[:, :, t, :] = scale * xp.einsum("bhd,bhdm->bhm", q4[:, :, t, :], shared)
    results = [out.transpose(0, 2, 1, 3).reshape(b, steps, q_heads * d_v), state][: len(outputs)]
    return finish(xp, "LinearAttention", results, outputs)
