"""A QBinary of codes and a lookup of the same codes -> one QLookup (a C lowering).

onnxruntime's QDQ quantizer writes an erf GELU, ``x * (1 + erf(x / sqrt 2)) * 0.5``, with every
intermediate quantized: ``fold_qdq`` makes the ``1 + erf(x / sqrt 2)`` region a lookup of x's codes
(a QLookup, or a QChannelLookup whose rows are all one table), then a QBinary Mul of x's codes by
those codes, then a QLookup for the ``* 0.5``. The QBinary's result is a function of x's byte
alone, so it is a 256-entry table: entry b is QBinary's reference result for the operands b and
``table[b]`` (runtime/kernels/qoperator.py: ``binary_codes``, the same arithmetic, the same bits).
A lookup that is its only use composes with it (``second[first[b]]``): one step for the GELU. It
runs after ``fuse_qconv_lookup`` (which makes the QBinary by a constant a lookup). Taken
where the QBinary's scales and zero points are constant scalars and the lookup's table is constant.
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
from compiler.passes.base import rewrite_each
from compiler.passes.base import sole_consumer
from runtime.contract import Q_BINARY
from runtime.contract import Q_CHANNEL_LOOKUP
from runtime.contract import Q_LOOKUP
from runtime.contract import op_name
from runtime.kernels.qoperator import binary_codes

__all__ = ["ComposeQBinary", "lookup_table"]

_EIGHT_BIT = (np.dtype(np.int8), np.dtype(np.uint8))


def lookup_table(node: Node | None) -> np.ndarray | None:
    """A lookup's one 256-entry table (a QChannelLookup's when all its rows are equal), or None."""
    if node is None or node.kind not in (Q_LOOKUP, Q_CHANNEL_LOOKUP):
        return None
    table = node.input(1)
    if table is None or table.const is None or table.const.size % 256:
        return None
    rows = table.const.reshape(-1, 256)
    return rows[0] if np.all(rows == rows[:1]) else None


def _params(node: Node) -> list[np.ndarray | None] | None:
    """The QBinary's scales and zero points as constants (None for an omitted zero point)."""
    out: list[np.ndarray | None] = []
    for k in (1, 2, 4, 5, 6, 7):
        v = node.input(k)
        if v is not None and (v.const is None or v.const.size != 1):
            return None
        out.append(None if v is None else v.const)
    return out if out[0] is not None and out[2] is not None and out[4] is not None else None


def _compose(graph: Graph, node: Node) -> bool:
    a, b, y = node.input(0), node.input(3), node.outputs[0]
    if a is None or b is None or a.dtype not in _EIGHT_BIT or y.dtype not in _EIGHT_BIT or a.shape != y.shape:
        return False
    found = [(k, v) for k, v in ((0, a), (1, b))
             if lookup_table(v.producer) is not None and v.producer.input(0) is (b, a)[k]]  # type: ignore[union-attr]
    params = _params(node)
    if not found or params is None or b.dtype != a.dtype or b.shape != y.shape:
        return False
    side, looked = found[0]
    lookup = looked.producer
    assert lookup is not None
    table = lookup_table(lookup)
    assert table is not None
    codes = np.arange(256, dtype=np.uint8).view(a.dtype)
    pair = (table, codes) if side == 0 else (codes, table)
    result = binary_codes(str(node.attrs["op"]), pair[0], pair[1], params, y.dtype)
    x: Value = (b, a)[side]
    old = [lookup, node] if sole_consumer(graph, looked) is node else [node]
    after = sole_consumer(graph, y)
    second = lookup_table(after)
    if after is not None and second is not None and after.outputs[0].shape == y.shape:
        result, y = second[result.view(np.uint8)], after.outputs[0]  # the lookup after it, composed
        old.append(after)
    new = Node(op_name(Q_LOOKUP), [x, add_constant(graph, f"{node.name}_table", result.astype(y.dtype))],
               [y], {}, name=node.name, domain=AOT_DOMAIN, origin=merged_origin(old))
    replace_nodes(graph, old, new)
    return True


class ComposeQBinary(Pass):
    name = "compose_qbinary"

    def run(self, graph: Graph) -> PassResult:
        modified = rewrite_each(graph, (Q_BINARY,), _compose)
        if modified:
            graph.prune_constants()
        return PassResult(graph, modified)
