"""Fold BatchNormalization, and channel-wise Mul / Add / Sub by constants, into a preceding Conv.

Conv(X, W, B) followed by y * s + t per output channel (BatchNormalization with constant
parameters: s = scale / sqrt(var + eps), t = bias - mean * s; or a Mul / Add / Sub whose other
operand is a constant that varies along the channel axis only) is Conv(X, W * s, B * s + t). The
new weights are computed in float64 and stored in the weights' dtype. The Conv needs constant
weights (and bias), and its output must have that one use and not be a graph output. DenseNet
and Inception-v2 follow BatchNormalization by such Mul and Add nodes; they fold one after another.
"""

from __future__ import annotations

import numpy as np

from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.passes.base import Pass
from compiler.passes.base import PassResult
from compiler.passes.base import add_constant
from compiler.passes.base import merged_origin
from compiler.passes.base import replace_nodes
from compiler.passes.base import rewrite_chains
from compiler.passes.base import sole_consumer

__all__ = ["FuseConvBatchNorm", "per_channel"]


def per_channel(array: np.ndarray, out_shape: tuple[int, ...]) -> np.ndarray | None:
    """``array`` as a float64 vector over axis 1 of ``out_shape``, if it only varies along it.

    Accepts any shape that broadcasts to (1, C, 1, ...) without growing: [C, 1, 1], [1, C, 1, 1],
    a scalar, [1], ... Returns None for anything else.
    """
    rank = len(out_shape)
    if rank < 2 or array.ndim > rank:
        return None
    shape = (1,) * (rank - array.ndim) + tuple(array.shape)
    if any(d != 1 for i, d in enumerate(shape) if i != 1) or shape[1] not in (1, out_shape[1]):
        return None
    return np.broadcast_to(array.astype(np.float64).reshape(-1), (out_shape[1],))


class FuseConvBatchNorm(Pass):
    name = "fuse_conv_batchnorm"

    def run(self, graph: Graph) -> PassResult:
        modified = rewrite_chains(graph, self._fold_next, lambda node: node.kind == "Conv")
        if modified:
            graph.prune_constants()
        return PassResult(graph, modified)

    def _fold_next(self, graph: Graph, conv: Node) -> Node | None:
        """Fold the conv's one consumer into it when that is an affine per-channel op."""
        w, b = conv.input(1), conv.input(2)
        if len(conv.outputs) != 1 or w is None or w.const is None or w.dtype is None or w.dtype.kind != "f":
            return None
        if b is not None and b.const is None:
            return None
        y = conv.outputs[0]
        user = sole_consumer(graph, y)
        if user is None or len(user.outputs) != 1 or y.shape is None or len(y.shape) < 2:
            return None
        if user.outputs[0].shape != y.shape or user.outputs[0].dtype != y.dtype:
            return None
        channels = int(w.const.shape[0])
        if y.shape[1] != channels:
            return None
        if user.kind == "BatchNormalization":
            affine = _batchnorm(user, y, channels)
        else:
            affine = _channelwise(user, y)
        if affine is None:
            return None
        scale, shift = affine
        bias = np.zeros(channels) if b is None or b.const is None else b.const.astype(np.float64).reshape(-1)
        new_w = w.const.astype(np.float64) * scale.reshape((-1,) + (1,) * (w.const.ndim - 1))
        new_b = bias * scale + shift
        w_const = add_constant(graph, w.name, new_w.astype(w.dtype))
        assert w_const.const is not None
        graph.narrowing.carry_if_same(w.const, w_const.const)  # a folded bias only: still narrow
        b_const = add_constant(graph, b.name if b is not None else f"{conv.name}_bias", new_b.astype(w.dtype))
        fused = Node(
            conv.op_type,
            [conv.input(0), w_const, b_const],
            list(user.outputs),
            conv.attrs,
            name=conv.name,
            domain=conv.domain,
            origin=merged_origin([conv, user]),
        )
        return replace_nodes(graph, [conv, user], fused)


def _batchnorm(bn: Node, y: Value, channels: int) -> tuple[np.ndarray, np.ndarray] | None:
    params = [bn.input(i) for i in range(1, 5)]
    if bn.input(0) is not y or len(bn.inputs) != 5:
        return None
    arrays = []
    for p in params:
        if p is None or p.const is None or p.const.size != channels:
            return None
        arrays.append(p.const.astype(np.float64).reshape(-1))
    gamma, beta, mean, var = arrays
    scale = gamma / np.sqrt(var + float(bn.attrs["epsilon"]))
    return scale, beta - mean * scale


def _channelwise(op: Node, y: Value) -> tuple[np.ndarray, np.ndarray] | None:
    if op.kind not in ("Mul", "Add", "Sub") or len(op.inputs) != 2:
        return None
    if op.input(0) is y:
        other = op.input(1)
    elif op.kind != "Sub":
        other = op.input(0)
    else:
        return None  # c - y would negate the weights; not worth a special case
    if other is None or other is y or other.const is None or other.dtype is None or other.dtype.kind != "f":
        return None
    assert y.shape is not None
    vector = per_channel(other.const, y.shape)
    if vector is None:
        return None
    ones, zeros = np.ones_like(vector), np.zeros_like(vector)
    if op.kind == "Mul":
        return vector, zeros
    return ones, (vector if op.kind == "Add" else -vector)
