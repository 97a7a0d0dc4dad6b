"""Multi-head attention as exported from PyTorch -> one ``onnx_aot.MultiHeadAttention`` step.

The exporters write attention over heads split by a Reshape to (batch, seq, heads, head size):

    Qt = Transpose(Q, [0, 2, 1, 3]); Kt = Transpose(K, [0, 2, 3, 1]); Vt = Transpose(V, [0, 2, 1, 3])
    P = Softmax(MatMul(Qt, Kt) * scale + mask, axis -1)        (the scale a Div or Mul by a constant)
    Y = Transpose(MatMul(P, Vt), [0, 2, 1, 3])

or, from torch's scaled_dot_product_attention, Kt as Transpose(Transpose(K, [0, 2, 1, 3]), [0, 1, 3,
2]) and Qt, Kt each multiplied by sqrt(scale) before the MatMul.

Eight steps, the scores written and read three times and four tensors transposed in memory. The
fused op reads Q, K and V where the projections wrote them and writes Y in place of the last
Transpose (the C kernel: ``compiler/providers/c/attention.py``). The scale and the mask may be
plain Div / Mul / Add nodes or a FusedElementwise of them (elementwise fusion ran before this
lowering); the mask is any float32 tensor broadcasting to the scores. Every intermediate must have
that one use, and the keys at most ``MAX_KEYS`` (the C kernel's bound). A lowering for the C
target (``compiler.passes.lowerings_for``), from level 2; in a dynamic graph too, where batch and
the sequence lengths may be expressions of the symbols (the C kernel takes them at run time).
"""

from __future__ import annotations

import numpy as np

from compiler.ir.graph import AOT_DOMAIN
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.passes.base import Pass
from compiler.passes.base import PassResult
from compiler.passes.base import merged_origin
from compiler.passes.base import replace_nodes
from compiler.passes.base import sole_consumer
from compiler.providers.c.attention import MAX_KEYS
from runtime.contract import FUSED_ELEMENTWISE
from runtime.contract import MULTI_HEAD_ATTENTION
from runtime.contract import op_name
from runtime.symbolic import bounds

__all__ = ["FuseAttention"]

_SPLIT = [0, 2, 1, 3]  # (batch, seq, heads, d) <-> (batch, heads, seq, d)
_KEYS = [0, 2, 3, 1]  # (batch, seq, heads, d) -> (batch, heads, d, seq)
_PROLOGUE = ("Div", "Mul", "Add", FUSED_ELEMENTWISE)
_Heads = tuple[list[Node], float, Value]  # nodes to replace, the factor they apply, the split heads


def _heads(graph: Graph, value: Value | None, reader: Node, key: bool) -> _Heads | None:
    """The nodes that make ``value`` for ``reader`` alone out of split heads (batch, seq, heads, d),
    the factor they scale it by and those heads: a Transpose to (batch, heads, seq, d) -- for the
    keys to (batch, heads, d, seq), or that as two Transposes -- and optionally a Mul by a constant
    after it (torch's scaled_dot_product_attention scales Q and K^T by sqrt(scale) each)."""
    nodes: list[Node] = []
    factor = 1.0
    node = value.producer if value is not None else None
    if node is not None and node.kind == "Mul" and sole_consumer(graph, node.outputs[0]) is reader:
        a, b = node.inputs
        c, other = (_scalar(b), a) if _scalar(b) is not None else (_scalar(a), b)
        if c is None or other is None:
            return None
        nodes, factor, reader, node = [node], c, node, other.producer
    if node is None or node.kind != "Transpose" or sole_consumer(graph, node.outputs[0]) is not reader:
        return None
    perm = list(node.attrs.get("perm", []))
    below = node.input(0)
    inner = below.producer if below is not None else None
    if key and perm == [0, 1, 3, 2] and inner is not None and inner.kind == "Transpose":
        if list(inner.attrs.get("perm", [])) != _SPLIT or sole_consumer(graph, inner.outputs[0]) is not node:
            return None
        nodes, node = [*nodes, node], inner
    elif perm != (_KEYS if key else _SPLIT):
        return None
    source = node.input(0)
    return ([*nodes, node], factor, source) if source is not None else None


def _scalar(value: Value | None) -> float | None:
    if value is None or value.const is None or value.const.size != 1 or value.dtype != np.float32:
        return None
    return float(value.const.reshape(()))


def _step(op: str, args: list[Value | None], scores: Value) -> tuple[float, Value | None] | None:
    """One prologue instruction on the scores: (a factor, None) or (1, the added mask)."""
    if len(args) != 2 or scores not in args:
        return None
    other = args[1] if args[0] is scores else args[0]
    if op in ("Mul", "Div") and other is not scores:
        c = _scalar(other)
        if c is None or (op == "Div" and (args[1] is scores or c == 0.0)):
            return None
        return (1.0 / c if op == "Div" else c), None
    if op == "Add" and other is not None and other is not scores and other.dtype == np.float32:
        return 1.0, other
    return None


def _prologue(nodes: list[Node], scores: Value) -> tuple[float, Value | None] | None:
    """The scale and mask of softmax(scores * scale + mask), from the nodes between MatMul and
    Softmax (in order): plain Div / Mul / Add, or one FusedElementwise of them."""
    steps: list[tuple[str, list[Value | None], Value]] = []
    current = scores
    for node in nodes:
        if node.kind == FUSED_ELEMENTWISE:
            results: list[Value] = []
            for ins in node.attrs["program"]:
                refs = [node.inputs[int(r[1:])] if r[0] == "i" else results[int(r[1:])] for r in ins["args"]]
                results.append(Value(f"t{len(results)}", np.dtype(np.float32), None))
                steps.append((str(ins["op"]), refs, current))
                if current not in refs:
                    return None
                current = results[-1]
        else:
            steps.append((node.kind, list(node.inputs), current))
        current = node.outputs[0]
    scale, mask = 1.0, None
    for op, args, operand in steps:
        step = _step(op, args, operand)
        if step is None or (mask is not None and (step[1] is not None or step[0] != 1.0)):
            return None  # one mask, and no scale after it
        scale, mask = scale * step[0], step[1] if step[1] is not None else mask
    return scale, mask


class FuseAttention(Pass):
    name = "fuse_attention"

    def run(self, graph: Graph) -> PassResult:
        modified = False
        for node in list(graph):
            if node.kind == "MatMul" and node.graph is graph and self._fuse(graph, node):
                modified = True
        return PassResult(graph, modified)

    def _fuse(self, graph: Graph, scores_mm: Node) -> bool:
        scores = scores_mm.outputs[0]
        q = _heads(graph, scores_mm.input(0), scores_mm, key=False)
        k = _heads(graph, scores_mm.input(1), scores_mm, key=True)
        if q is None or k is None or scores.shape is None:
            return False
        between: list[Node] = []
        node = sole_consumer(graph, scores)
        while node is not None and node.kind in _PROLOGUE and len(between) < 3:
            between.append(node)
            node = sole_consumer(graph, node.outputs[0])
        softmax = node
        if softmax is None or softmax.kind != "Softmax" or softmax.attrs.get("axis") not in (-1, 3):
            return False
        if any(n.outputs[0].shape != scores.shape for n in [*between, softmax]):
            return False
        context_mm = sole_consumer(graph, softmax.outputs[0])
        if context_mm is None or context_mm.kind != "MatMul" or context_mm.input(0) is not softmax.outputs[0]:
            return False
        prologue = _prologue(between, scores)
        v = _heads(graph, context_mm.input(1), context_mm, key=False)
        y = sole_consumer(graph, context_mm.outputs[0])
        if prologue is None or v is None or v[1] != 1.0 or y is None or y.kind != "Transpose":
            return False
        heads = (q[2], k[2], v[2], y.outputs[0])
        if list(y.attrs.get("perm", [])) != _SPLIT or not _shapes_ok(*heads, graph.symbols):
            return False
        scale, mask = prologue
        old = [*q[0], *k[0], *v[0], scores_mm, *between, softmax, context_mm, y]
        fused = Node(op_name(MULTI_HEAD_ATTENTION), [q[2], k[2], v[2], *([mask] if mask else [])],
                     list(y.outputs), {"scale": q[1] * k[1] * scale}, name=softmax.name, domain=AOT_DOMAIN,
                     origin=merged_origin(old))
        replace_nodes(graph, old, fused)
        return True


def _shapes_ok(q: Value, k: Value, v: Value, y: Value, ranges: dict[str, tuple[int, int]]) -> bool:
    """Float32 (batch, seq, heads, d) tensors that agree on batch, heads and d; heads and d static,
    batch and the lengths static or expressions of the symbols (keys at most MAX_KEYS over their
    ``ranges``)."""
    shapes = [q.shape, k.shape, v.shape, y.shape]
    if any(s is None or len(s) != 4 or not all(isinstance(x, int) for x in s[2:]) for s in shapes):
        return False
    if any(val.dtype != np.float32 for val in (q, k, v, y)):
        return False
    (b, sq, h, d), (kb, sk, kh, kd), (vb, vs, vh, dv) = shapes[0], shapes[1], shapes[2]  # type: ignore[misc]
    agree = (kb, kh, kd) == (b, h, d) and (vb, vs, vh) == (b, sk, h)
    agree = agree and tuple(shapes[3] or ()) == (b, sq, h, dv)
    return agree and bounds(sk, ranges)[1] <= MAX_KEYS
