"""A BERT-style encoder in the form PyTorch exports it, built with ``onnx.helper``, seeded weights.

Issue 20's benchmark model. Post-norm layers as in Hugging Face's ``BertLayer`` exported by
``torch.onnx.export`` (opset 17): Q / K / V / output / FFN projections as ``MatMul`` + ``Add``
on 3-D activations, heads split by ``Reshape`` + ``Transpose`` (K straight to [b, h, d, s]),
``MatMul``, ``Div`` by sqrt(head), ``Add`` of the additive mask ``(1 - mask) * -10000`` built from
a bool ``attention_mask`` [batch, seq], ``Softmax``, the context's ``Transpose`` + ``Reshape``,
residual ``Add`` + ``LayerNormalization``, and the erf GELU ``x * 0.5 * (1 + erf(x / sqrt 2))``.
Weights are scaled by 1/sqrt(fan_in) so activations stay O(1).

``BERT_BASE`` and ``MINILM`` are the issue's sizes (seq 128, batch 1).
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

__all__ = ["BERT_BASE", "MINILM", "encoder_model", "encoder_feeds"]

BERT_BASE = {"layers": 12, "hidden": 768, "heads": 12, "ffn": 3072}
MINILM = {"layers": 6, "hidden": 384, "heads": 12, "ffn": 1536}


class _Builder:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.inits: list[onnx.TensorProto] = []
        self.nodes: list[onnx.NodeProto] = []

    def const(self, name: str, array: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def node(self, op: str, inputs: list[str], out: str, **attrs: object) -> str:
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"/{out}/{op}", **attrs))
        return out

    def linear(self, prefix: str, x: str, n_in: int, n_out: int) -> str:
        w = self.const(f"{prefix}.weight", (self.rng.standard_normal((n_in, n_out)) / math.sqrt(n_in))
                       .astype(np.float32))
        b = self.const(f"{prefix}.bias", (self.rng.standard_normal(n_out) * 0.02).astype(np.float32))
        return self.node("Add", [b, self.node("MatMul", [x, w], f"{prefix}.mm")], f"{prefix}.out")

    def layer_norm(self, prefix: str, x: str, dim: int) -> str:
        gamma = self.const(f"{prefix}.gamma", self.rng.uniform(0.8, 1.2, dim).astype(np.float32))
        beta = self.const(f"{prefix}.beta", self.rng.uniform(-0.1, 0.1, dim).astype(np.float32))
        return self.node("LayerNormalization", [x, gamma, beta], f"{prefix}.ln", axis=-1, epsilon=1e-12)


def _layer(g: _Builder, i: int, x: str, mask: str, hidden: int, heads: int, ffn: int) -> str:
    p = f"layer{i}"
    heads_shape, flat_shape = "heads_shape", "flat_shape"
    split = {}
    for name, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        proj = g.linear(f"{p}.{name}", x, hidden, hidden)
        split[name] = g.node("Transpose", [g.node("Reshape", [proj, heads_shape], f"{p}.{name}.heads")],
                             f"{p}.{name}.t", perm=perm)
    scores = g.node("MatMul", [split["q"], split["k"]], f"{p}.scores")
    scaled = g.node("Div", [scores, "sqrt_head"], f"{p}.scaled")
    probs = g.node("Softmax", [g.node("Add", [scaled, mask], f"{p}.masked")], f"{p}.probs", axis=-1)
    context = g.node("MatMul", [probs, split["v"]], f"{p}.context")
    merged = g.node("Reshape", [g.node("Transpose", [context], f"{p}.context.t", perm=[0, 2, 1, 3]),
                                flat_shape], f"{p}.context.flat")
    attn = g.linear(f"{p}.attn_out", merged, hidden, hidden)
    h = g.layer_norm(f"{p}.ln1", g.node("Add", [attn, x], f"{p}.res1"), hidden)
    up = g.linear(f"{p}.ffn_up", h, hidden, ffn)
    erf = g.node("Erf", [g.node("Div", [up, "sqrt2"], f"{p}.gelu.z")], f"{p}.gelu.erf")
    gelu = g.node("Mul", [g.node("Mul", [up, g.node("Add", [erf, "one"], f"{p}.gelu.plus")], f"{p}.gelu.xp"),
                          "half"], f"{p}.gelu")
    down = g.linear(f"{p}.ffn_down", gelu, ffn, hidden)
    return g.layer_norm(f"{p}.ln2", g.node("Add", [down, h], f"{p}.res2"), hidden)


def encoder_model(*, layers: int, hidden: int, heads: int, ffn: int, batch: int = 1, seq: int = 128,
                  seed: int = 0, dynamic: bool = False) -> onnx.ModelProto:
    """``layers`` post-norm encoder layers over ``hidden_states`` [batch, seq, hidden]; ``dynamic``:
    batch and seq are the dim_params ``batch`` and ``seq`` (the Reshapes keep them with 0s)."""
    if hidden % heads:
        raise ValueError(f"hidden {hidden} is not a multiple of heads {heads}")
    g = _Builder(seed)
    lead = [0, 0] if dynamic else [batch, seq]
    g.const("heads_shape", np.array([*lead, heads, hidden // heads], np.int64))
    g.const("flat_shape", np.array([*lead, hidden], np.int64))
    g.const("sqrt_head", np.array(math.sqrt(hidden // heads), np.float32))
    g.const("sqrt2", np.array(math.sqrt(2.0), np.float32))
    g.const("one", np.array(1.0, np.float32))
    g.const("half", np.array(0.5, np.float32))
    g.const("mask_axes", np.array([1, 2], np.int64))
    g.const("mask_fill", np.array(-10000.0, np.float32))
    keep = g.node("Cast", [g.node("Unsqueeze", ["attention_mask", "mask_axes"], "mask.4d")], "mask.float",
                  to=TensorProto.FLOAT)
    mask = g.node("Mul", [g.node("Sub", ["one", keep], "mask.inverted"), "mask_fill"], "mask.additive")
    x = "hidden_states"
    for i in range(layers):
        x = _layer(g, i, x, mask, hidden, heads, ffn)
    g.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="/output/Identity"))
    bs: list[int | str] = ["batch", "seq"] if dynamic else [batch, seq]
    graph = helper.make_graph(
        g.nodes, "encoder",
        [helper.make_tensor_value_info("hidden_states", TensorProto.FLOAT, [*bs, hidden]),
         helper.make_tensor_value_info("attention_mask", TensorProto.BOOL, bs)],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [*bs, hidden])],
        initializer=g.inits)
    opset = helper.make_opsetid("", 17)
    model = helper.make_model(graph, opset_imports=[opset], ir_version=8, producer_name="onnx-aot tests")
    onnx.checker.check_model(model, full_check=True)
    return model


def encoder_feeds(model: onnx.ModelProto, seed: int = 0, batch: int = 0,
                  seq: int = 0) -> dict[str, np.ndarray]:
    """Seeded normal hidden states and a mask that keeps the first 3/4 of each sequence; ``batch``
    and ``seq`` for a dynamic model (else the model's sizes)."""
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    batch, seq, hidden = batch or dims[0], seq or dims[1], dims[2]
    keep = np.arange(seq) < max(1, seq * 3 // 4)
    states = np.random.default_rng(seed).standard_normal((batch, seq, hidden)).astype(np.float32)
    return {"hidden_states": states, "attention_mask": np.repeat(keep[None, :], batch, axis=0)}
