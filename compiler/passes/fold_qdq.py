"""Fold QDQ patterns into the integer ops of ONNX (docs/ops.md, "QDQ folding").

A QDQ file runs every quantized op as DequantizeLinear -> float op -> QuantizeLinear. Each rewrite
here starts at a QuantizeLinear ``q`` (int8 / uint8, float32 scale) whose float input has that one
use, and replaces the float op (and ``q``) by integer steps when that is exact:

- **DequantizeLinear -> QuantizeLinear** with the same scale and zero point: the codes themselves
  (``(n * s) / s`` rounds back to ``n`` for every code ``n``);
- **data movement** (``MOVEMENT``: Reshape, Transpose, Slice, Gather, MaxPool, nearest Resize,
  Concat, ...) between DequantizeLinear(s) and ``q`` of one per-tensor quantization: the op moves
  the codes instead of the reals (MaxPool: dequantization is increasing, so the max commutes);
- **QuantizeLinear sunk through data movement**: ``q`` of one per-tensor quantization after a
  one-input movement (``SINKABLE``) of a float value used only there becomes the movement of
  ``q``'s codes of that value (quantization is elementwise, and increasing for MaxPool), and the new
  QuantizeLinear is folded in turn -- ShuffleNet's DequantizeLinear -> BatchNormalization -> Relu ->
  Reshape -> Transpose -> Reshape (the channel shuffle) -> QuantizeLinear of a QOperator file becomes
  the per-channel lookup and the shuffle on 8-bit codes;
- **Conv** of DequantizeLinear(x) by a weight folded from DequantizeLinear (per tensor or per
  output channel) with a bias exactly representable at ``x_scale * w_scale`` -> QLinearConv;
- **MatMul** of DequantizeLinear(a) by a quantized weight (per tensor or per column) or by another
  DequantizeLinear, and **Gemm** (transA 0; transB by transposing the codes, alpha into the weight
  scale) -> QLinearMatMul; a Gemm with a bias -> MatMulInteger + a float epilogue (Cast, Mul by
  ``a_scale * b_scale``, Add of the bias) before ``q``;
- a **Relu / Clip** between the op and ``q``: QuantizeLinear is monotone, so the clamp moves into
  the quantized domain (``Q(0)`` is the zero point); it disappears where it clamps nothing there,
  else a QLookup clamping the codes follows.
- **elementwise ops** between DequantizeLinear and ``q`` (a Relu, Sigmoid, GELU, Add, Mul, pools,
  Softmax, a Concat of other quantizations): the integer ops of ``fold_qdq_integer.py``; with
  per-channel constants (a BatchNormalization, Mul / Add by a [C, 1, 1] constant) a
  QChannelLookup (``fold_qdq_channel.py``); an Add of two such chains (a residual Add after a
  float BatchNormalization) a QTableAdd (``fold_qdq_residual.py``).

A rewrite happens only where ``claims`` (the target provider's ``supports``) takes every new node:
on the C target that keeps the float form until the integer kernels exist, so folding never makes
a model slower. Without ``claims`` (tests, the reference path) every exact pattern folds. Anything
that does not match stays as it was: correct, only slower.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence

import numpy as np

import compiler.passes.fold_qdq_integer as integer
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.passes.base import Pass
from compiler.passes.base import PassResult
from compiler.passes.base import bypass
from compiler.passes.base import merged_origin
from compiler.passes.base import replace_nodes
from compiler.passes.base import sole_consumer
from compiler.passes.fold_qdq_channel import channel_lookup
from compiler.passes.fold_qdq_residual import table_add
from compiler.passes.fuse_matmul_add import per_column
from compiler.passes.qdq_forms import QParams
from compiler.passes.qdq_forms import dq_params
from compiler.passes.qdq_forms import integer_bias
from compiler.passes.qdq_forms import q_params
from compiler.passes.qdq_forms import weight_codes
from compiler.passes.qdq_rewrite import Build
from compiler.passes.qdq_rewrite import MakeOp
from compiler.passes.qdq_rewrite import Maker
from compiler.passes.qdq_rewrite import Operand
from compiler.passes.qdq_rewrite import Rewrite
from compiler.passes.qdq_rewrite import activation_chain
from compiler.passes.qdq_rewrite import activation_input
from compiler.passes.qdq_rewrite import activation_operand
from compiler.passes.qdq_rewrite import dq_scale_zero
from compiler.passes.qdq_rewrite import operand_inputs
from compiler.passes.qdq_rewrite import with_clamp

__all__ = ["FoldQdq", "MOVEMENT"]

# Ops that only move, pick or repeat elements (MaxPool: the largest of them): exact on the codes.
MOVEMENT = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Slice", "Gather",
                      "MaxPool", "Resize", "Concat", "Expand", "Tile", "DepthToSpace", "SpaceToDepth",
                      "Identity"})

# Movement with one float data input (input 0; any other input is an index, shape or parameter):
# QuantizeLinear moves before it exactly.
SINKABLE = MOVEMENT - {"Concat", "Identity"}
MAX_SWEEPS = 64


class FoldQdq(Pass):
    name = "fold_qdq"

    def __init__(self, claims: Callable[[Node], bool] | None = None) -> None:
        self.claims = claims

    def run(self, graph: Graph) -> PassResult:
        # sweeps until one changes nothing: a fold may free the next (a QOperator residual stream's
        # QTableAdd of block k+1 leaves block k's Relu output to its QuantizeLinear alone)
        modified = False
        for _ in range(MAX_SWEEPS):
            swept = False
            for node in graph:
                if node.graph is graph and node.kind == "QuantizeLinear" and self._fold(graph, node):
                    swept = True
            modified = modified or swept
            if not swept:
                break
        if modified:
            graph.prune_constants()
        return PassResult(graph, modified)

    def _fold(self, graph: Graph, q: Node) -> bool:
        qp, y = q_params(q), q.input(0)
        if qp is None or y is None or y.producer is None or sole_consumer(graph, y) is not q:
            return False
        src = y.producer
        if src.kind == "DequantizeLinear" and _cancel(graph, q, qp):
            return True
        # the candidates in order of preference: the first one the provider claims is taken
        for candidate in _candidates(src):
            rewrite = candidate(graph, q, qp)
            if rewrite is not None and self._apply(graph, *rewrite):
                return True
        sunk = _sink(graph, src, q, qp)
        if sunk is not None and self._apply(graph, *sunk):
            moved = q.outputs[0].producer
            assert moved is not None and moved.inputs[0] is not None and moved.inputs[0].producer is not None
            self._fold(graph, moved.inputs[0].producer)
            return True
        return False

    def _apply(self, graph: Graph, old: Sequence[Node], build: Build) -> bool:
        if self.claims is not None and not all(self.claims(node) for node in build(Maker(None))):
            return False
        new = build(Maker(graph))
        last = old[-1]
        for node in new[:-1]:
            graph.add_node(node, before=last)
        replace_nodes(graph, old, new[-1], at=last)
        return True


Candidate = Callable[[Graph, Node, QParams], Rewrite | None]


def _candidates(src: Node) -> list[Candidate]:
    """The rewrites that may apply where ``src`` makes ``q``'s float input."""
    if src.kind in MOVEMENT:
        found: list[Candidate] = [lambda g, q, qp: _movement(src, q, qp)]
        return found + ([lambda g, q, qp: integer.concat(src, q, qp)] if src.kind == "Concat" else [])
    if src.kind in ("AveragePool", "GlobalAveragePool"):
        return [lambda g, q, qp: integer.pool(src, q, qp)]
    if src.kind == "Softmax":
        return [lambda g, q, qp: integer.softmax(src, q, qp)]
    return [_linear, integer.lookup, channel_lookup, integer.binary, table_add]


def _cancel(graph: Graph, q: Node, qp: QParams) -> bool:
    """DequantizeLinear -> QuantizeLinear of the same parameters: the codes."""
    dq = q.input(0).producer  # type: ignore[union-attr]
    p = dq_params(dq)
    if dq is None or p is None or not p.same(qp) or graph.is_graph_output(q.outputs[0]):
        return False
    bypass(graph, q, [dq.inputs[0]])  # type: ignore[list-item]
    return True


def _movement(move: Node, q: Node, qp: QParams) -> Rewrite | None:
    """Data movement between DequantizeLinear(s) and ``q`` of one per-tensor quantization."""
    if len(move.outputs) != 1 or not qp.per_tensor:
        return None
    if move.kind == "Resize" and move.attrs.get("mode") != "nearest":
        return None
    inputs: list[Value | None] = []
    for value in move.inputs:
        if value is None or value.dtype is None or value.dtype.kind != "f":
            inputs.append(value)
            continue
        p = dq_params(value.producer)
        if p is None or not p.same(qp):
            return None
        inputs.append(value.producer.inputs[0])  # type: ignore[union-attr]
    if all(a is b for a, b in zip(inputs, move.inputs, strict=True)):
        return None

    def build(make: Maker) -> list[Node]:
        return [Node(move.op_type, inputs, list(q.outputs), move.attrs, name=move.name, domain=move.domain,
                     origin=merged_origin([move, q]))]
    return [move, q], build


def _sink(graph: Graph, move: Node, q: Node, qp: QParams) -> Rewrite | None:
    """``q`` after a SINKABLE movement of a float value used only there: the movement of the codes."""
    x = move.input(0)
    if move.kind not in SINKABLE or not qp.per_tensor or len(move.outputs) != 1 or x is None:
        return None
    if x.dtype != np.float32 or x.producer is None or sole_consumer(graph, x) is not move:
        return None
    if move.kind == "Resize" and move.attrs.get("mode") != "nearest":
        return None
    origin = merged_origin([move, q])
    dtype = q.outputs[0].dtype
    assert dtype is not None

    def build(make: Maker) -> list[Node]:
        codes = make.value(f"{x.name}_quantized", dtype, x.shape)
        return [Node(q.op_type, [x, *q.inputs[1:]], [codes], q.attrs, name=f"{q.name}_{move.name}",
                     domain=q.domain, origin=origin),
                Node(move.op_type, [codes, *move.inputs[1:]], list(q.outputs), move.attrs, name=move.name,
                     domain=move.domain, origin=origin)]
    return [move, q], build


def _linear(graph: Graph, q: Node, qp: QParams) -> Rewrite | None:
    """Conv / MatMul / Gemm (+ Relu / Clip) between DequantizeLinear inputs and ``q``."""
    found = activation_chain(graph, q, qp) if qp.per_tensor else None
    if found is None:
        return None
    old, op, clamp = found
    if op.kind == "Conv":
        make_op = _qlinear_conv(graph, op, q)
    elif op.kind in ("MatMul", "Gemm"):
        make_op = _qlinear_matmul(graph, op, q)
        if make_op is None and op.kind == "Gemm":
            return _gemm_epilogue(graph, op)
    else:
        return None
    if make_op is None:
        return None
    return old, with_clamp(op, q, clamp, make_op, merged_origin(old))


def _qlinear_conv(graph: Graph, conv: Node, q: Node) -> MakeOp | None:
    x = activation_input(conv.input(0))
    w = weight_codes(graph, conv.input(1), 0)
    if x is None or w is None or len(conv.inputs) > 3:
        return None
    (xq, xdq, xp), (codes, wp) = x, w
    channels = int(codes.shape[0])
    bias_scale = np.broadcast_to(xp.scale * wp.scale, (channels,)).astype(np.float32)
    b = conv.input(2)
    bias = None if b is None else (integer_bias(b.const, bias_scale) if b.const is not None else None)
    if b is not None and bias is None:
        return None
    qp = q_params(q)
    assert qp is not None

    def make_op(make: Maker, y: Value, origin: list[str]) -> Node:
        inputs = [xq, *dq_scale_zero(make, xdq, xp, xq.name),
                  make.const(f"{conv.name}_w_codes", codes), make.const(f"{conv.name}_w_scale", wp.scale),
                  make.const(f"{conv.name}_w_zero_point", wp.zero), *dq_scale_zero(make, q, qp, y.name)]
        if bias is not None:
            inputs.append(make.const(f"{conv.name}_b_codes", bias))
        attrs = {k: conv.attrs[k] for k in ("kernel_shape", "strides", "pads", "dilations", "group")}
        return Node("QLinearConv", inputs, [y], attrs, name=conv.name, origin=origin)
    return make_op


def _matmul_b(graph: Graph, op: Node) -> Operand | None:
    """B of a MatMul / Gemm as codes: a DequantizeLinear's input, or a constant quantized per
    tensor or per column (a Gemm's transB transposes it, its alpha scales the weight scale)."""
    b = op.input(1)
    if op.kind == "MatMul" and b is not None and b.const is None:
        return activation_operand(b)
    trans = op.kind == "Gemm" and int(op.attrs["transB"])
    rank = b.const.ndim if b is not None and b.const is not None else 0
    w = weight_codes(graph, b, 0 if trans else rank - 1) if rank else None
    if w is None or (not w[1].per_tensor and rank != 2):
        return None
    codes, p = w
    if trans:
        codes, p = np.ascontiguousarray(codes.T), QParams(p.scale, p.zero, 1, p.dtype)
    alpha = float(op.attrs["alpha"]) if op.kind == "Gemm" else 1.0
    if alpha != 1.0:
        if not alpha > 0:
            return None
        p = QParams((p.scale * np.float32(alpha)).astype(np.float32), p.zero, p.axis, p.dtype)
    return codes, p, None


def _qlinear_matmul(graph: Graph, op: Node, q: Node) -> MakeOp | None:
    a = activation_input(op.input(0))
    if a is None or (op.kind == "Gemm" and (int(op.attrs["transA"]) or op.input(2) is not None)):
        return None
    b = _matmul_b(graph, op)
    if b is None:
        return None
    aq, adq, ap = a
    qp = q_params(q)
    assert qp is not None

    def make_op(make: Maker, y: Value, origin: list[str]) -> Node:
        inputs = [aq, *dq_scale_zero(make, adq, ap, aq.name), *operand_inputs(make, f"{op.name}_b", b),
                  *dq_scale_zero(make, q, qp, y.name)]
        return Node("QLinearMatMul", inputs, [y], {}, name=op.name, origin=origin)
    return make_op


def _gemm_epilogue(graph: Graph, gemm: Node) -> Rewrite | None:
    """Gemm(DequantizeLinear(a), quantized B, C) -> MatMulInteger, then Cast, Mul by
    a_scale * b_scale and Add of beta * C in float32: the integer product, the float epilogue."""
    a, c, y = activation_input(gemm.input(0)), gemm.input(2), gemm.outputs[0]
    if a is None or int(gemm.attrs["transA"]) or c is None or c.const is None or y.shape is None:
        return None
    b = _matmul_b(graph, gemm)
    if b is None or y.dtype != np.float32 or len(y.shape) != 2:
        return None
    rows, cols = y.shape
    bias = per_column(c.const, rows, cols)
    if bias is None:
        return None
    bias = (bias * float(gemm.attrs["beta"])).astype(np.float32)
    aq, adq, ap = a
    scale = np.broadcast_to(ap.scale * b[1].scale, (cols,)).astype(np.float32)
    origin = merged_origin([gemm])

    def build(make: Maker) -> list[Node]:
        acc = make.value(f"{gemm.name}_acc", np.dtype(np.int32), y.shape)
        real = make.value(f"{gemm.name}_real", np.dtype(np.float32), y.shape)
        scaled = make.value(f"{gemm.name}_scaled", np.dtype(np.float32), y.shape)
        ints = [aq, b[0] if isinstance(b[0], Value) else make.const(f"{gemm.name}_b_codes", b[0]),
                dq_scale_zero(make, adq, ap, aq.name)[1], make.const(f"{gemm.name}_b_zero_point", b[1].zero)]
        return [Node("MatMulInteger", ints, [acc], {}, name=gemm.name, origin=origin),
                Node("Cast", [acc], [real], {"to": "float32"}, name=f"{gemm.name}_real", origin=origin),
                Node("Mul", [real, make.const(f"{gemm.name}_scale", scale)], [scaled], {},
                     name=f"{gemm.name}_scale", origin=origin),
                Node("Add", [scaled, make.const(f"{gemm.name}_bias", bias)], [y], {},
                     name=f"{gemm.name}_bias", origin=origin)]
    return [gemm], build
