"""Fuse the 8-bit lookups after an integer conv into the conv's requantizing store (a C lowering).

The QDQ files onnxruntime's quantizer writes from a float model keep a BatchNormalization (or Mul /
Add by per-channel constants) between QuantizeLinear and DequantizeLinear after every conv;
``fold_qdq`` makes each such chain a QChannelLookup (or a QLookup), and the QOperator files' QBinary
by a per-channel constant is one too. Here, on the packed graph:

- a QBinary one of whose operands is a constant along every axis but 1 becomes a QChannelLookup
  (its results on the 256 codes of every channel, by its reference kernel: the same bits);
- a lookup whose input is another lookup's only use becomes one table, ``second[c, first[c, b]]``;
- a lookup whose input is a requantizing ``PackedQConv``'s only use becomes the conv's ``Lut``: the
  conv's store maps each code through the channel's row (one step instead of two, same bits).
"""

from __future__ import annotations

import numpy as np

from compiler.ir.graph import AOT_DOMAIN
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.passes.base import Pass
from compiler.passes.base import PassResult
from compiler.passes.base import add_constant
from compiler.passes.base import merged_origin
from compiler.passes.base import replace_nodes
from compiler.passes.base import sole_consumer
from compiler.passes.fold_qdq_channel import per_channel
from runtime.contract import PACKED_QCONV
from runtime.contract import Q_BINARY
from runtime.contract import Q_CHANNEL_LOOKUP
from runtime.contract import Q_LOOKUP
from runtime.contract import op_name
from runtime.kernels.registry import get_kernel

__all__ = ["FuseQConvLookup"]

_LOOKUPS = (Q_LOOKUP, Q_CHANNEL_LOOKUP)
_EIGHT_BIT = (np.dtype(np.int8), np.dtype(np.uint8))


def _rows(node: Node, channels: int) -> np.ndarray | None:
    """A lookup's table as (channels, 256) rows, or None when its table is not constant."""
    table = node.input(1)
    if table is None or table.const is None:
        return None
    if node.kind == Q_LOOKUP:
        return np.ascontiguousarray(np.broadcast_to(table.const.reshape(1, 256), (channels, 256)))
    return table.const.reshape(channels, 256)


def _binary_rows(node: Node) -> tuple[Value, np.ndarray] | None:
    """A QBinary by a per-channel constant: its varying operand and the (C, 256) rows of its
    results, or None."""
    y = node.outputs[0]
    if y.shape is None or y.is_symbolic or len(y.shape) < 3 or y.dtype not in _EIGHT_BIT:
        return None
    a, b = node.input(0), node.input(3)
    if a is None or b is None or any(v is None or v.const is None for k, v in enumerate(node.inputs)
                                     if k not in (0, 3) and v is not None):
        return None
    vary, fixed = (a, b) if b.const is not None else (b, a)
    if vary.const is not None or fixed.const is None or vary.shape != y.shape or vary.dtype != y.dtype:
        return None
    if not per_channel(fixed.const, len(y.shape)):
        return None
    c = int(y.shape[1])
    shape = (1, c, 256) + (1,) * (len(y.shape) - 3)
    codes = np.arange(256, dtype=np.uint8).view(y.dtype).reshape(1, 1, 256, *shape[3:])
    codes = np.broadcast_to(codes, shape)
    args = [v.const if v is not None and v.const is not None else None for v in node.inputs]
    args[0 if vary is a else 3] = np.ascontiguousarray(codes)
    out = get_kernel(Q_BINARY)(np, args, dict(node.attrs), [(shape, y.dtype)])[0]
    return vary, np.ascontiguousarray(np.asarray(out).reshape(c, 256))


def _lookup(graph: Graph, x: Value, rows: np.ndarray, old: list[Node], name: str) -> Node:
    table = add_constant(graph, f"{name}_channel_table", np.ascontiguousarray(rows))
    return Node(op_name(Q_CHANNEL_LOOKUP), [x, table], list(old[-1].outputs), {}, name=name,
                domain=AOT_DOMAIN, origin=merged_origin(old))


def _replace(graph: Graph, old: list[Node], new: Node) -> None:
    replace_nodes(graph, old, new, at=old[-1])


def _fuse_one(graph: Graph, node: Node) -> bool:
    """One rewrite at ``node`` (a lookup or a QBinary); True when it changed the graph."""
    x, y = node.input(0), node.outputs[0]
    if x is None or y.shape is None or len(y.shape) < 3 or x.producer is None:
        return False
    channels = int(y.shape[1])
    if node.kind == Q_BINARY:
        found = _binary_rows(node)
        if found is None:
            return False
        _replace(graph, [node], _lookup(graph, found[0], found[1], [node], node.name))
        return True
    rows, src = _rows(node, channels), x.producer
    if rows is None or sole_consumer(graph, x) is not node:
        return False
    first, codes = (_rows(src, channels), src.input(0)) if src.kind in _LOOKUPS else (None, None)
    if first is not None and codes is not None:
        composed = np.take_along_axis(rows, first.view(np.uint8).astype(np.int64), axis=1)
        _replace(graph, [src, node], _lookup(graph, codes, composed, [src, node], node.name))
        return True
    if src.kind == PACKED_QCONV and src.input(4) is not None:
        lut = src.input(5)
        if lut is not None:  # a lookup already in the store: the composition
            assert lut.const is not None
            first = lut.const[: channels * 256].reshape(channels, 256)
            rows = np.take_along_axis(rows, first.view(np.uint8).astype(np.int64), axis=1)
        padded = np.concatenate([rows.reshape(-1), np.zeros(4, rows.dtype)])  # the C store reads 4 bytes
        lut = add_constant(graph, f"{src.name}_lut", padded)
        conv = Node(src.op_type, [*src.inputs[:5], lut], [y],
                    src.attrs, name=src.name, domain=src.domain, origin=merged_origin([src, node]))
        _replace(graph, [src, node], conv)
        return True
    return False


class FuseQConvLookup(Pass):
    name = "fuse_qconv_lookup"

    def run(self, graph: Graph) -> PassResult:
        modified, changed = False, True
        while changed:  # a chain of lookups composes from its end, then goes into the conv
            changed = False
            for node in list(graph):
                if node.graph is graph and node.kind in (*_LOOKUPS, Q_BINARY) and _fuse_one(graph, node):
                    changed = modified = True
        if modified:
            graph.prune_constants()
        return PassResult(graph, modified)
