"""Canonical forms of the transformer ops: Attention, RotaryEmbedding, RMSNormalization, SwiGLU,
LinearAttention and CausalConvWithState (see docs/ops.md).

Attention is rewritten into its 4-D core: 3-D Q/K/V are split into heads by Reshape + Transpose
nodes, an internal KV cache (past_key / past_value) becomes Concat nodes that produce present_key /
present_value, and a 3-D output is merged back by Transpose + Reshape. The core ``Attention`` node
then sees only (batch, heads, sequence, head_size) tensors with every attribute resolved. The other
ops keep one node each, with defaults, negative axes and attribute aliases resolved.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from compiler.frontend.canonical.context import CanonContext
from compiler.frontend.canonical.context import shape_of
from compiler.frontend.canonical.registry import register
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from runtime.errors import UnsupportedOpError

__all__: list[str] = []

# softmax_precision values ONNX allows; the core computes in float32 or float64 (float32 is at
# least as precise as float16 / bfloat16, so those requests are met by computing in float32).
_SOFTMAX_PRECISION: dict[int, str] = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float32",
                      onnx.TensorProto.BFLOAT16: "float32", onnx.TensorProto.DOUBLE: "float64"}


def _dtype(value: Value | None) -> np.dtype:
    assert value is not None and value.dtype is not None
    return value.dtype


def _required_int(ctx: CanonContext, key: str) -> int:
    if key not in ctx.attrs:
        raise ctx.error(f"attribute {key} is required")
    value = int(ctx.attrs[key])
    if value <= 0:
        raise ctx.error(f"attribute {key} must be positive, got {value}")
    return value


class _Builder:
    """Makes the intermediate values and helper nodes of one multi-node canonical form."""

    def __init__(self, ctx: CanonContext) -> None:
        self.ctx = ctx
        self.nodes: list[Node] = []

    def value(self, suffix: str, dtype: np.dtype, shape: tuple[int, ...]) -> Value:
        return self.ctx.graph.make_value(f"{self.ctx.name}/{suffix}", dtype, shape)

    def add(self, op: str, inputs: list[Value | None], attrs: dict[str, object], out: Value,
            suffix: str) -> Value:
        name = self.ctx.graph.unique_name(f"{self.ctx.name}/{suffix}")
        self.nodes.append(self.ctx.node(op, inputs, attrs, outputs=[out], name=name))
        return out

    def split_heads(self, x: Value | None, heads: int, suffix: str) -> Value:
        """(B, S, heads * D) -> (B, heads, S, D)."""
        b, s, hidden = shape_of(x)
        if hidden % heads:
            raise self.ctx.error(f"{suffix}: hidden size {hidden} is not a multiple of {heads} heads")
        d = hidden // heads
        split = self.add("Reshape", [x], {"shape": [b, s, heads, d]},
                         self.value(f"{suffix}_split", _dtype(x), (b, s, heads, d)), f"{suffix}_split")
        return self.add("Transpose", [split], {"perm": [0, 2, 1, 3]},
                        self.value(f"{suffix}_heads", _dtype(x), (b, heads, s, d)), f"{suffix}_heads")


# -- Attention ------------------------------------------------------------------------------
@register("Attention")
def _attention(ctx: CanonContext) -> list[Node]:
    q, k, v, mask, past_key, past_value, nonpad = (list(ctx.inputs) + [None] * 7)[:7]
    assert q is not None and k is not None and v is not None
    rank = ctx.rank(0)
    if rank not in (3, 4) or ctx.rank(1) != rank or ctx.rank(2) != rank:
        raise ctx.error("Q, K and V must all be 3-D or all 4-D")
    if (past_key is None) != (past_value is None):
        raise ctx.error("past_key and past_value must be given together")
    if nonpad is not None and past_key is not None:
        raise ctx.error("nonpad_kv_seqlen cannot be combined with past_key / past_value")
    build = _Builder(ctx)
    if rank == 3:
        q_heads, kv_heads = _required_int(ctx, "q_num_heads"), _required_int(ctx, "kv_num_heads")
        q = build.split_heads(q, q_heads, "Q")
        k = build.split_heads(k, kv_heads, "K")
        v = build.split_heads(v, kv_heads, "V")
    (batch, q_heads, q_len, _), kv_heads = shape_of(q), shape_of(k)[1]
    if shape_of(v)[1] != kv_heads or q_heads % kv_heads:
        raise ctx.error(f"{q_heads} query heads cannot share {kv_heads} key / {shape_of(v)[1]} value heads")
    past_length = 0 if past_key is None else shape_of(past_key)[2]
    k = _cache(build, past_key, k, 1, "present_key")
    v = _cache(build, past_value, v, 2, "present_value")
    y = ctx.outputs[0]
    core_y = y if rank == 4 else build.value("Y_heads", _dtype(y), (batch, q_heads, q_len, shape_of(v)[3]))
    outputs = [core_y]
    if len(ctx.outputs) > 3 and ctx.outputs[3].name in ctx.used:
        outputs.append(ctx.outputs[3])
    build.nodes.append(ctx.node("Attention", [q, k, v, mask, nonpad],
                                _attention_attrs(ctx, q, past_length), outputs=outputs))
    if rank == 3:
        merged = build.value("Y_merge", _dtype(y), (batch, q_len, q_heads, shape_of(v)[3]))
        build.add("Transpose", [core_y], {"perm": [0, 2, 1, 3]}, merged, "Y_merge")
        build.add("Reshape", [merged], {"shape": list(shape_of(y))}, y, "Y")
    return build.nodes


def _cache(build: _Builder, past: Value | None, new: Value, slot: int, what: str) -> Value:
    """The keys (or values) attention reads, ``past`` ++ ``new``; also ONNX output ``slot`` if used."""
    ctx = build.ctx
    out = ctx.outputs[slot] if len(ctx.outputs) > slot and ctx.outputs[slot].name in ctx.used else None
    if past is None:
        if out is not None:
            build.add("Identity", [new], {}, out, what)
        return new
    b, h, p, d = shape_of(past)
    if out is None:
        out = build.value(what, _dtype(new), (b, h, p + shape_of(new)[2], d))
    return build.add("Concat", [past, new], {"axis": 2}, out, what)


def _attention_attrs(ctx: CanonContext, q: Value, past_length: int) -> dict[str, object]:
    mode = int(ctx.attr("qk_matmul_output_mode", 0))
    if mode not in (0, 1, 2, 3):
        raise ctx.error(f"qk_matmul_output_mode must be 0..3, got {mode}")
    windows = {}
    for key in ("left_window_size", "right_window_size"):
        windows[key] = int(ctx.attr(key, -1))
        if windows[key] < -1:
            raise ctx.error(f"{key} must be -1 or non-negative, got {windows[key]}")
    compute = "float64" if _dtype(q) == np.float64 else "float32"
    if "softmax_precision" in ctx.attrs:
        precision = int(ctx.attrs["softmax_precision"])
        if precision not in _SOFTMAX_PRECISION:
            raise UnsupportedOpError(f"{ctx.describe()}: softmax_precision {precision} is not supported")
        if _SOFTMAX_PRECISION[precision] == "float64":
            compute = "float64"
    scale = float(ctx.attrs["scale"]) if "scale" in ctx.attrs else 1.0 / math.sqrt(shape_of(q)[3])
    return {"scale": scale, "is_causal": int(ctx.attr("is_causal", 0)),
            "softcap": float(ctx.attr("softcap", 0.0)), "qk_matmul_output_mode": mode,
            "past_length": past_length, **windows, "compute_dtype": compute}


# -- single-node ops ------------------------------------------------------------------------
@register("RMSNormalization")
def _rms_normalization(ctx: CanonContext) -> list[Node]:
    stash = int(ctx.attr("stash_type", onnx.TensorProto.FLOAT))
    if stash not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE):
        raise UnsupportedOpError(f"{ctx.describe()}: stash_type {stash} is not supported")
    return [ctx.node("RMSNormalization", ctx.inputs[:2], {
        "axis": ctx.axis(int(ctx.attr("axis", -1)), ctx.rank()),
        "epsilon": float(ctx.attr("epsilon", 1e-5)),
        "compute_dtype": "float64" if stash == onnx.TensorProto.DOUBLE else "float32"})]


@register("RotaryEmbedding")
def _rotary_embedding(ctx: CanonContext) -> list[Node]:
    shape = shape_of(ctx.inputs[0])
    if len(shape) == 4:
        heads = shape[1]
    elif len(shape) == 3:
        heads = _required_int(ctx, "num_heads")
    else:
        raise ctx.error(f"input must be 3-D or 4-D, got rank {len(shape)}")
    head_size = shape[-1] if len(shape) == 4 else shape[-1] // heads
    if len(shape) == 3 and shape[-1] % heads:
        raise ctx.error(f"hidden size {shape[-1]} is not a multiple of num_heads {heads}")
    dim = int(ctx.attr("rotary_embedding_dim", 0)) or head_size
    if dim % 2 or dim > head_size:
        raise ctx.error(f"rotary_embedding_dim {dim} must be even and at most head_size {head_size}")
    half = shape_of(ctx.inputs[1])[-1]
    if half != dim // 2:
        raise ctx.error(f"cos_cache's last dim {half} is not rotary_embedding_dim / 2 = {dim // 2}")
    return [ctx.node("RotaryEmbedding", ctx.inputs[:4], {
        "num_heads": heads, "rotary_embedding_dim": dim, "interleaved": int(ctx.attr("interleaved", 0))})]


@register("SwiGLU")
def _swiglu(ctx: CanonContext) -> list[Node]:
    if shape_of(ctx.inputs[0]) != shape_of(ctx.inputs[1]):
        raise ctx.error("A and B must have the same shape")
    return [ctx.node("SwiGLU", ctx.inputs[:2], {"alpha": float(ctx.attr("alpha", 1.0))})]


@register("CausalConvWithState")
def _causal_conv_with_state(ctx: CanonContext) -> list[Node]:
    activation = str(ctx.attr("activation", "none"))
    if activation not in ("none", "silu", "swish"):
        raise ctx.error(f"activation must be 'none', 'silu' or 'swish', got {activation!r}")
    x_shape, w_shape = shape_of(ctx.inputs[0]), shape_of(ctx.inputs[1])
    if len(x_shape) != 3 or len(w_shape) != 3 or w_shape[:2] != (x_shape[1], 1):
        raise ctx.error(f"input {x_shape} / weight {w_shape} are not (B, C, L) / (C, 1, k)")
    bias, past = (list(ctx.inputs) + [None] * 4)[2:4]
    if bias is not None and shape_of(bias) != (x_shape[1],):
        raise ctx.error(f"bias {shape_of(bias)} is not ({x_shape[1]},)")
    if past is not None and shape_of(past) != (x_shape[0], x_shape[1], w_shape[2] - 1):
        raise ctx.error(f"past_state {shape_of(past)} is not {(x_shape[0], x_shape[1], w_shape[2] - 1)}")
    outputs = ctx.outputs[:2] if len(ctx.outputs) > 1 and ctx.outputs[1].name in ctx.used else ctx.outputs[:1]
    return [ctx.node("CausalConvWithState", ctx.inputs[:4],
                     {"activation": "silu" if activation == "swish" else activation}, outputs=outputs)]


_UPDATE_RULES = {"linear": (False, False), "gated": (True, False), "delta": (False, True),
                 "gated_delta": (True, True)}


@register("LinearAttention")
def _linear_attention(ctx: CanonContext) -> list[Node]:
    rule = str(ctx.attr("update_rule", "gated_delta"))
    if rule not in _UPDATE_RULES:
        raise ctx.error(f"update_rule must be one of {sorted(_UPDATE_RULES)}, got {rule!r}")
    q_heads, kv_heads = _required_int(ctx, "q_num_heads"), _required_int(ctx, "kv_num_heads")
    if q_heads % kv_heads:
        raise ctx.error(f"q_num_heads {q_heads} is not a multiple of kv_num_heads {kv_heads}")
    inputs = (list(ctx.inputs) + [None] * 6)[:6]
    gated, delta = _UPDATE_RULES[rule]
    for slot, what, needed in ((4, "decay", gated), (5, "beta", delta)):
        if needed != (inputs[slot] is not None):
            raise ctx.error(f"update_rule {rule!r} {'requires' if needed else 'forbids'} the {what} input")
    if any(ctx.rank(i) != 3 for i in range(3)):
        raise ctx.error("query, key and value must be 3-D (B, T, H*D)")
    _check_linear_attention_shapes(ctx, inputs, q_heads, kv_heads)
    d_k = shape_of(inputs[0])[2] // q_heads
    scale = float(ctx.attr("scale", 0.0))
    if scale == 0.0:  # the spec's "derive it" value
        scale = 1.0 / math.sqrt(d_k)
    outputs = ctx.outputs[:2] if len(ctx.outputs) > 1 and ctx.outputs[1].name in ctx.used else ctx.outputs[:1]
    return [ctx.node("LinearAttention", inputs, {
        "q_num_heads": q_heads, "kv_num_heads": kv_heads, "scale": scale, "update_rule": rule},
        outputs=outputs)]


def _check_linear_attention_shapes(ctx: CanonContext, inputs: list[Value | None], q_heads: int,
                                   kv_heads: int) -> None:
    (b, t, q_hidden), (_, _, k_hidden), (_, _, v_hidden) = (shape_of(x) for x in inputs[:3])
    if (q_hidden % q_heads or k_hidden % kv_heads or v_hidden % kv_heads
            or q_hidden // q_heads != k_hidden // kv_heads):
        raise ctx.error(f"query / key / value widths {q_hidden} / {k_hidden} / {v_hidden} do not split into "
                        f"{q_heads} / {kv_heads} heads of one key size")
    d_k, d_v = k_hidden // kv_heads, v_hidden // kv_heads
    expected = {3: ((b, kv_heads, d_k, d_v),), 4: ((b, t, kv_heads), (b, t, kv_heads * d_k)),
                5: ((b, t, kv_heads), (b, t, 1))}
    for slot, shapes in expected.items():
        if inputs[slot] is not None and shape_of(inputs[slot]) not in shapes:
            raise ctx.error(f"input {slot} has shape {shape_of(inputs[slot])}, "
                            f"expected one of {list(shapes)}")
