"""``fold_qdq``'s per-channel lookup (docs/ops.md, "QDQ folding"): a float computation between ONE
per-tensor DequantizeLinear and QuantizeLinear ``q`` whose other operands are constant along every
axis but the channel axis (1) -- the float BatchNormalization onnxruntime's quantizer leaves after
each conv, a Mul / Add by per-channel constants, a Relu -- is, channel by channel, a function of the
8-bit code: ``onnx_aot.QChannelLookup``, a (C, 256) table computed now by the reference kernels on
the 256 dequantized codes of every channel and quantized as ``q`` does. Bit for bit what the
reference kernels compute for the float graph (as ``fold_qdq_integer.lookup`` for one table).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from compiler.ir.graph import AOT_DOMAIN
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.passes.base import merged_origin
from compiler.passes.qdq_forms import QParams
from compiler.passes.qdq_rewrite import Maker
from compiler.passes.qdq_rewrite import Rewrite
from compiler.passes.qdq_rewrite import dequantized_region
from runtime.contract import Q_CHANNEL_LOOKUP
from runtime.contract import op_name
from runtime.kernels.elementwise import ELEMENTWISE_OPS
from runtime.kernels.qoperator import lookup_table
from runtime.kernels.registry import get_kernel

__all__ = ["channel_lookup", "channel_region", "per_channel"]

_KINDS = (ELEMENTWISE_OPS - {"Where"}) | {"BatchNormalization"}


def per_channel(const: np.ndarray, rank: int) -> bool:
    """Whether ``const`` broadcasts against a rank-``rank`` tensor along axis 1 at most."""
    if const.ndim > rank:
        return False
    shape = (1,) * (rank - const.ndim) + tuple(const.shape)
    return all(d == 1 for i, d in enumerate(shape) if i != 1)


def _operands_ok(node: Node, rank: int) -> bool:
    for k, operand in enumerate(node.inputs):
        if operand is None:
            continue
        if node.kind == "BatchNormalization" and k > 0:
            if operand.const is None or operand.const.ndim != 1:
                return False
        elif operand.const is not None and not per_channel(operand.const, rank):
            return False
    return True


def _nodes(graph: Graph, y: Value) -> tuple[Value, tuple[Value, Node, QParams], dict[int, Node]] | None:
    """The nodes computing ``y`` from one DequantizeLinear output (the root), or None."""
    assert y.shape is not None
    rank = len(y.shape)

    def accepts(node: Node) -> bool:
        return node.kind in _KINDS and _operands_ok(node, rank) and not (
            node.kind == "BatchNormalization" and int(node.attrs.get("training_mode", 0)))

    return dequantized_region(graph, y, accepts)

def _evaluate(region: list[Node], root: Value, y: Value, channels: int, rank: int) -> Any:
    """The region on (channels, 256) dequantized codes (the reference kernels' arithmetic)."""
    shape = (1, channels, 256) + (1,) * (rank - 3)

    def fn(x: Any) -> Any:
        codes = np.asarray(x, np.float32).reshape(1, 1, 256, *shape[3:])
        env = {id(root): np.ascontiguousarray(np.broadcast_to(codes, shape))}
        for node in region:
            args = [env[id(v)] if id(v) in env else (None if v is None else v.const) for v in node.inputs]
            out = node.outputs[0]
            spec = [(shape, out.dtype)]
            env[id(out)] = np.asarray(get_kernel(node.kind)(np, args, dict(node.attrs), spec)[0])
        return env[id(y)].reshape(channels, 256)
    return fn


Region = tuple[Value, Value, QParams, list[Node], Callable[[Any], Any]]  # see channel_region


def channel_region(graph: Graph, y: Value) -> Region | None:
    """The per-channel float chain computing ``y`` from one DequantizeLinear: its root, the codes
    and their parameters, the chain's nodes in graph order, and the chain as a function of the
    dequantized values (per channel, axis 1)."""
    got = _nodes(graph, y)
    if got is None or y.shape is None:
        return None
    root, (codes, _, p), nodes = got
    order = {id(node): i for i, node in enumerate(graph.nodes)}
    region = sorted(nodes.values(), key=lambda n: order[id(n)])
    return root, codes, p, region, _evaluate(region, root, y, int(y.shape[1]), len(y.shape))


def channel_lookup(graph: Graph, q: Node, qp: QParams) -> Rewrite | None:
    """A per-channel computation of one DequantizeLinear's output, quantized by ``q``: a QChannelLookup."""
    y = q.inputs[0]
    if y is None or y.shape is None or len(y.shape) < 3 or y.is_symbolic or not qp.per_tensor:
        return None
    got = channel_region(graph, y)
    if got is None:
        return None
    _, codes, p, region, fn = got
    channels = int(y.shape[1])
    origin = merged_origin([*region, q])

    def build(make: Maker) -> list[Node]:
        table = lookup_table(fn, p.dtype, p.scale, p.zero, qp.scale, qp.zero, qp.dtype)
        table = np.ascontiguousarray(table, qp.dtype).reshape(channels, 256)
        const = make.const(f"{q.name}_channel_table", table)
        return [Node(op_name(Q_CHANNEL_LOOKUP), [codes, const], list(q.outputs), {}, name=region[-1].name,
                     domain=AOT_DOMAIN, origin=origin)]
    return [*region, q], build
