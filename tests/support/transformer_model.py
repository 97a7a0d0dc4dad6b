"""A small pre-norm transformer block built with ``onnx.helper``, with seeded weights.

The CUDA provider's own test model (issue 3): LayerNormalization, MatMul + Add projections,
multi-head attention (Reshape, Transpose, MatMul, a scale Mul, Softmax), a residual Add, and a
feed-forward MLP with Gelu -- the opset-20 ``Gelu`` op, or (``erf=True``) the Erf form
``0.5 * x * (1 + erf(x / sqrt(2)))`` that older exporters emit. Weights are scaled by
1/sqrt(fan_in) so activations stay O(1) and float32 comparisons stay meaningful.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

__all__ = ["transformer_model", "transformer_input"]


def transformer_model(*, batch: int = 2, seq: int = 128, dim: int = 256, heads: int = 4,
                      ffn: int = 1024, erf: bool = False, seed: int = 0) -> onnx.ModelProto:
    """One transformer block: ``y = r + FFN(LN(r))`` with ``r = x + Attention(LN(x))``."""
    if dim % heads:
        raise ValueError(f"dim {dim} is not a multiple of heads {heads}")
    head = dim // heads
    rng = np.random.default_rng(seed)
    inits: list[onnx.TensorProto] = []

    def weight(name: str, shape: tuple[int, ...], scale: float) -> str:
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def const(name: str, array: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(array, name))
        return name

    def linear(prefix: str, x: str, n_in: int, n_out: int, out: str) -> list[onnx.NodeProto]:
        w = weight(f"{prefix}.weight", (n_in, n_out), 1.0 / math.sqrt(n_in))
        b = weight(f"{prefix}.bias", (n_out,), 0.02)
        return [helper.make_node("MatMul", [x, w], [f"{prefix}.mm"], name=f"{prefix}.matmul"),
                helper.make_node("Add", [f"{prefix}.mm", b], [out], name=f"{prefix}.add")]

    def layer_norm(prefix: str, x: str, out: str) -> onnx.NodeProto:
        gamma = const(f"{prefix}.gamma", rng.uniform(0.8, 1.2, dim).astype(np.float32))
        beta = const(f"{prefix}.beta", rng.uniform(-0.1, 0.1, dim).astype(np.float32))
        return helper.make_node("LayerNormalization", [x, gamma, beta], [out], axis=-1,
                                epsilon=1e-5, name=f"{prefix}.layernorm")

    heads_shape = const("heads_shape", np.array([batch, seq, heads, head], np.int64))
    model_shape = const("model_shape", np.array([batch, seq, dim], np.int64))
    scale = const("attn.scale", np.array(1.0 / math.sqrt(head), np.float32))
    nodes = [layer_norm("ln1", "x", "h1")]
    for name in ("q", "k", "v"):
        nodes += linear(f"attn.{name}", "h1", dim, dim, f"{name}")
        nodes.append(helper.make_node("Reshape", [name, heads_shape], [f"{name}.heads"],
                                      name=f"{name}.reshape"))
    nodes += [
        helper.make_node("Transpose", ["q.heads"], ["qt"], perm=[0, 2, 1, 3], name="q.transpose"),
        helper.make_node("Transpose", ["k.heads"], ["kt"], perm=[0, 2, 3, 1], name="k.transpose"),
        helper.make_node("Transpose", ["v.heads"], ["vt"], perm=[0, 2, 1, 3], name="v.transpose"),
        helper.make_node("MatMul", ["qt", "kt"], ["scores"], name="attn.scores"),
        helper.make_node("Mul", ["scores", scale], ["scaled"], name="attn.scale_mul"),
        helper.make_node("Softmax", ["scaled"], ["probs"], axis=-1, name="attn.softmax"),
        helper.make_node("MatMul", ["probs", "vt"], ["context"], name="attn.context"),
        helper.make_node("Transpose", ["context"], ["context.t"], perm=[0, 2, 1, 3],
                         name="context.transpose"),
        helper.make_node("Reshape", ["context.t", model_shape], ["context.flat"], name="context.reshape"),
    ]
    nodes += linear("attn.out", "context.flat", dim, dim, "attn")
    nodes.append(helper.make_node("Add", ["x", "attn"], ["r1"], name="residual1"))
    nodes.append(layer_norm("ln2", "r1", "h2"))
    nodes += linear("ffn.up", "h2", dim, ffn, "up")
    if erf:
        inv_sqrt2 = const("gelu.inv_sqrt2", np.array(1.0 / math.sqrt(2.0), np.float32))
        one = const("gelu.one", np.array(1.0, np.float32))
        half = const("gelu.half", np.array(0.5, np.float32))
        nodes += [
            helper.make_node("Mul", ["up", inv_sqrt2], ["gelu.z"], name="gelu.div"),
            helper.make_node("Erf", ["gelu.z"], ["gelu.erf"], name="gelu.erf"),
            helper.make_node("Add", ["gelu.erf", one], ["gelu.plus"], name="gelu.add"),
            helper.make_node("Mul", ["up", "gelu.plus"], ["gelu.prod"], name="gelu.mul"),
            helper.make_node("Mul", ["gelu.prod", half], ["act"], name="gelu.half_mul"),
        ]
    else:
        nodes.append(helper.make_node("Gelu", ["up"], ["act"], name="ffn.gelu"))
    nodes += linear("ffn.down", "act", ffn, dim, "down")
    nodes.append(helper.make_node("Add", ["r1", "down"], ["y"], name="residual2"))
    graph = helper.make_graph(
        nodes, "transformer_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, dim])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, seq, dim])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=9,
                              producer_name="onnx-aot tests")
    onnx.checker.check_model(model, full_check=True)
    return model


def transformer_input(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded standard-normal feeds for the block's input ``x``."""
    dims = tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim)
    return {"x": np.random.default_rng(seed).standard_normal(dims).astype(np.float32)}
