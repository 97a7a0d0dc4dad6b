"""Fuse a residual Add and an activation into the epilogue of a Conv or Gemm.

Conv (or a FusedConv still without activation) whose output has one use:
- by an Add (or a 2-input Sum) with another tensor of the output's shape -> FusedConv with that
  tensor as its residual input Z (only when the conv has no Z yet);
- by Relu / Clip / LeakyRelu -> FusedConv with that activation;
- by exactly a Sigmoid and the Mul of the output with it (SiLU, x * sigmoid(x) as PyTorch exports
  it, either operand order) -> FusedConv with activation Silu, unless the pass was made without
  ``silu`` (a target without the vector math, CUDA).
Gemm works the same way (activation only) -> FusedGemm. Repeated on the result, so
Conv -> Add -> Relu becomes one FusedConv. Attributes follow docs/ops.md: the conv's (or
gemm's) attributes plus ``activation``, ``act_min``, ``act_max`` and ``act_alpha``, always all.
"""

from __future__ import annotations

import math
from typing import Any

from compiler.ir.graph import AOT_DOMAIN
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.passes.base import NO_ACTIVATION
from compiler.passes.base import Pass
from compiler.passes.base import PassResult
from compiler.passes.base import merged_origin
from compiler.passes.base import replace_nodes
from compiler.passes.base import rewrite_chains
from compiler.passes.base import sole_consumer
from runtime.contract import FUSED_CONV
from runtime.contract import FUSED_GEMM
from runtime.contract import op_name

__all__ = ["FuseConvActivation", "activation_attrs"]

# node kind -> the kind of fused op it becomes
_FUSED = {
    "Conv": FUSED_CONV,
    FUSED_CONV: FUSED_CONV,
    "Gemm": FUSED_GEMM,
    FUSED_GEMM: FUSED_GEMM,
}


def activation_attrs(node: Node) -> dict[str, Any] | None:
    """The epilogue attributes equivalent to activation ``node``, or None if it is not one."""
    if node.kind == "Relu":
        return {"activation": "Relu", "act_min": 0.0, "act_max": math.inf, "act_alpha": 0.0}
    if node.kind == "Clip":
        lo, hi = float(node.attrs["min"]), float(node.attrs["max"])
        return {"activation": "Clip", "act_min": lo, "act_max": hi, "act_alpha": 0.0}
    if node.kind == "LeakyRelu":
        alpha = float(node.attrs["alpha"])
        return {"activation": "LeakyRelu", "act_min": -math.inf, "act_max": math.inf, "act_alpha": alpha}
    return None


SILU: dict[str, Any] = {"activation": "Silu", "act_min": -math.inf, "act_max": math.inf, "act_alpha": 0.0}


class FuseConvActivation(Pass):
    name = "fuse_conv_activation"

    def __init__(self, silu: bool = True) -> None:
        self.silu = silu

    def run(self, graph: Graph) -> PassResult:
        return PassResult(graph, rewrite_chains(graph, self._fuse_next))

    def _fuse_next(self, graph: Graph, node: Node) -> Node | None:
        fused_op = _FUSED.get(node.kind)
        if fused_op is None or len(node.outputs) != 1:
            return None
        if node.domain == AOT_DOMAIN and node.attrs["activation"] != "":
            return None  # nothing can follow an activation inside the epilogue
        y = node.outputs[0]
        base = dict(node.attrs) if node.domain == AOT_DOMAIN else {**node.attrs, **NO_ACTIVATION}
        inputs: list[Value | None] = list(node.inputs)
        silu = _silu(graph, y) if self.silu else None
        user = sole_consumer(graph, y)
        if silu is not None:
            users, attrs = silu, {**base, **SILU}
        elif user is None or len(user.outputs) != 1:
            return None
        else:
            users = [user]
            act = activation_attrs(user) if user.input(0) is y else None
            residual = _residual(user, y) if fused_op == FUSED_CONV and node.input(3) is None else None
            if act is not None:
                attrs = {**base, **act}
            elif residual is not None:
                attrs = base
                inputs = (inputs + [None, None, None])[:3] + [residual]  # X, W, B (maybe None), Z
            else:
                return None
        while inputs and inputs[-1] is None:
            inputs.pop()
        fused = Node(
            op_name(fused_op),
            inputs,
            list(users[-1].outputs),
            attrs,
            name=node.name,
            domain=AOT_DOMAIN,
            origin=merged_origin([node, *users]),
        )
        return replace_nodes(graph, [node, *users], fused)


def _silu(graph: Graph, y: Value) -> list[Node] | None:
    """[Sigmoid, Mul] of ``y * sigmoid(y)`` (either order) when those are y's only two uses and the
    sigmoid's only use is the Mul (so nothing broadcasts: the Mul's output has y's shape)."""
    if len(y.uses) != 2 or graph.is_graph_output(y):
        return None
    sigmoid = next((use.node for use in y.uses if use.node.kind == "Sigmoid"), None)
    if sigmoid is None or len(sigmoid.outputs) != 1:
        return None
    s = sigmoid.outputs[0]
    mul = sole_consumer(graph, s)
    if mul is None or mul.kind != "Mul" or len(mul.inputs) != 2 or len(mul.outputs) != 1:
        return None
    a, b = mul.inputs
    if not ((a is y and b is s) or (a is s and b is y)):
        return None
    out = mul.outputs[0]
    return [sigmoid, mul] if out.shape == y.shape and out.dtype == y.dtype else None


def _residual(add: Node, y: Value) -> Value | None:
    """The other operand of ``y + other`` when it has y's shape and dtype (so nothing broadcasts)."""
    if add.kind not in ("Add", "Sum") or len(add.inputs) != 2:
        return None
    a, b = add.inputs
    other = b if a is y else a
    if other is None or other is y or (a is not y and b is not y):
        return None
    if other.shape != y.shape or other.dtype != y.dtype or add.outputs[0].shape != y.shape:
        return None
    return other
