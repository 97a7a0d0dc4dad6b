"""onnxruntime's quantize_dynamic chain -> one ``onnx_aot.QGemm`` that quantizes A itself.

``quantize_dynamic`` writes each MatMul of a constant B as::

    x -> DynamicQuantizeLinear -> (xq, xs, xz)
    MatMulInteger(xq, Bq, xz, bz) -> Cast(to float) -> Mul(., Mul(xs, b_scale)) [-> Add(., bias)]

with Bq int8 / uint8 and b_scale, bz and bias constants (per tensor or per column). The chain
becomes a QGemm with ``dynamic`` 1 and the "float" output (runtime/kernels/qgemm.py): A is
quantized inside the step exactly as DynamicQuantizeLinear does, and the epilogue computes
``float(acc) * (xs * b_scale[n]) + bias[n]`` in the chain's order, so the step equals the chain
but for the contraction of the last multiply-add into one FMA (a rounding of the output: docs/ops.md).
The DynamicQuantizeLinear stays where something else reads its outputs. The forms onnxruntime's
own fusions write (com.microsoft DynamicQuantizeMatMul, MatMulIntegerToFloat) import as this
chain (compiler/frontend/canonical/quantize_ms.py), so they fuse here too. For the C target, from
level 2, before elementwise fusion takes the chain's Mul and Add.
"""

from __future__ import annotations

import numpy as np

from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.passes.base import Pass
from compiler.passes.base import PassResult
from compiler.passes.base import merged_origin
from compiler.passes.base import rewrite_each
from compiler.passes.base import sole_consumer
from compiler.passes.eliminate_dead_code import EliminateDeadCode
from compiler.passes.use_qgemm import qgemm_node
from compiler.passes.use_qgemm import quantized_b
from compiler.passes.use_qgemm import sized

__all__ = ["FuseDynamicQGemm"]


def _other(node: Node, value: Value) -> Value | None:
    """The other input of a binary node one of whose inputs is ``value``."""
    a, b = node.input(0), node.input(1)
    return b if a is value else a if b is value else None


def _const_of(value: Value | None, n: int) -> bool:
    return value is not None and value.const is not None and value.dtype == np.float32 and sized(value, 1, n)


def _scale(mul: Node, dq: Node, n: int) -> Value | None:
    """b_scale, when ``mul`` (the scale product) is Mul(xs, b_scale) in either order."""
    if mul.kind != "Mul" or len(mul.inputs) != 2:
        return None
    other = _other(mul, dq.outputs[1])
    return other if _const_of(other, n) else None


def _chain(graph: Graph, mi: Node) -> tuple[Node, list[Node], Value, Value | None] | None:
    """(DynamicQuantizeLinear, the chain's nodes after it and the scale product's Mul last,
    b_scale, bias) from MatMulInteger ``mi``."""
    xq, _, xz, _ = (list(mi.inputs) + [None] * 4)[:4]
    dq = xq.producer if xq is not None else None
    if dq is None or dq.kind != "DynamicQuantizeLinear" or xz is not dq.outputs[2] or len(mi.outputs) != 1:
        return None
    cast = sole_consumer(graph, mi.outputs[0])
    if cast is None or cast.kind != "Cast" or cast.outputs[0].dtype != np.float32:
        return None
    mul = sole_consumer(graph, cast.outputs[0])
    if mul is None or mul.kind != "Mul" or len(mul.inputs) != 2:
        return None
    product = _other(mul, cast.outputs[0])
    b = quantized_b(mi.input(1))
    if product is None or product.producer is None or b is None:
        return None
    b_scale = _scale(product.producer, dq, b.shape[1])
    if b_scale is None:
        return None
    nodes, bias = [mi, cast, mul], None
    add = sole_consumer(graph, mul.outputs[0])
    if add is not None and add.kind == "Add" and len(add.inputs) == 2:
        other = _other(add, mul.outputs[0])
        if _const_of(other, b.shape[1]) and add.outputs[0].shape == mul.outputs[0].shape:
            nodes, bias = [*nodes, add], other
    return dq, [*nodes, product.producer], b_scale, bias


def _fuse(graph: Graph, mi: Node) -> bool:
    found = _chain(graph, mi)
    if found is None:
        return False
    dq, found_nodes, b_scale, bias = found
    nodes, scale_mul = found_nodes[:-1], found_nodes[-1]
    x, b = dq.input(0), quantized_b(mi.input(1))
    b_zero = mi.input(3)
    if x is None or x.dtype != np.float32 or x.shape is None or x.is_symbolic or b is None:
        return False
    if not sized(b_zero, 1, b.shape[1]) or (b_zero is not None and b_zero.const is None):
        return False
    params = [None, None, b_scale, b_zero, None, None, bias]
    new = qgemm_node(graph, mi, x, b, params, {"output": "float", "dynamic": 1}, nodes[-1].outputs, nodes)
    new.origin = merged_origin([new, dq, scale_mul])  # they go once nothing else reads them
    return True


class FuseDynamicQGemm(Pass):
    name = "fuse_dynamic_qgemm"

    def run(self, graph: Graph) -> PassResult:
        modified = rewrite_each(graph, ("MatMulInteger",), _fuse)
        if modified:
            EliminateDeadCode().run(graph)  # the DynamicQuantizeLinears and scale products left unread
        return PassResult(graph, modified)
