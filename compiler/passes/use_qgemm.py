"""MatMulInteger and QLinearMatMul with a constant B -> ``onnx_aot.QGemm`` (the C integer GEMM).

B (K, N) int8 / uint8 is stored packed for the int8 micro-kernel (``runtime/kernels/qgemm.py:
pack_qb``: one layout for every target) with its column sums, so the kernel corrects zero points and
A's +128 shift from precomputed sums, never in its inner loop. MatMulInteger becomes the "int32"
output, QLinearMatMul the "quantized" one (its requantization in the epilogue). Left alone: a B that
is not a 2-D constant (batched B), a zero point or scale of A that is not per tensor (per-row A), a
per-column parameter of another length than N, an A with run-time dims (the C kernel's sizes are
compile-time constants; the reference MatMulInteger runs it). A lowering for the C target, from level 2; the
fusion of quantize_dynamic's chain (``fuse_dynamic_qgemm``) runs first and takes the MatMulIntegers
it fuses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from compiler.ir.graph import AOT_DOMAIN
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.passes.base import NO_ACTIVATION
from compiler.passes.base import Pass
from compiler.passes.base import PassResult
from compiler.passes.base import add_constant
from compiler.passes.base import replace_nodes
from compiler.passes.base import rewrite_each
from compiler.passes.base import sole_consumer
from runtime.contract import QGEMM
from runtime.contract import op_name
from runtime.kernels.qgemm import column_sums
from runtime.kernels.qgemm import pack_qb

__all__ = ["UseQGemm", "lowers", "qgemm_node", "quantized_b", "sized"]


def sized(value: Value | None, *sizes: int) -> bool:
    """``value`` is absent or has a static shape of one of ``sizes`` elements, along its last dim."""
    if value is None:
        return True
    shape = value.shape
    if shape is None or any(not isinstance(d, int) for d in shape):
        return False
    return math.prod(shape) in sizes and all(d == 1 for d in shape[:-1])


def quantized_b(b: Value | None) -> np.ndarray | None:
    """B as a 2-D int8 / uint8 constant, else None."""
    if b is None or b.const is None or b.const.ndim != 2 or b.const.dtype not in (np.int8, np.uint8):
        return None
    return b.const if min(b.const.shape) >= 1 else None


def qgemm_node(graph: Graph, node: Node, a: Value, b: np.ndarray, params: Sequence[Value | None],
               attrs: dict[str, object], outputs: Sequence[Value], origin: Sequence[Node]) -> Node:
    """A QGemm of ``a`` by the constant ``b`` with inputs ``params`` (a_scale .. bias) and ``attrs``
    (output, dynamic), replacing the nodes ``origin`` (``node`` last)."""
    packed = add_constant(graph, f"{node.name}_qb", pack_qb(b))
    sums = add_constant(graph, f"{node.name}_qbsum", column_sums(b))
    k, n = b.shape
    full = {"k": int(k), "n": int(n), "b_type": b.dtype.name, "dynamic": 0, **attrs, **NO_ACTIVATION}
    inputs = [a, packed, sums, *params]
    while inputs[-1] is None:
        inputs.pop()
    new = Node(op_name(QGEMM), inputs, list(outputs), full, name=node.name, domain=AOT_DOMAIN,
               origin=[name for o in origin for name in o.origin])
    return replace_nodes(graph, list(origin), new)


_Plan = tuple[Value, np.ndarray, list[Value | None], dict[str, object]]


def _plan(node: Node) -> _Plan | None:
    """A, the constant B, the parameters and attributes of the QGemm ``node`` becomes, or None."""
    ins = list(node.inputs) + [None] * 8
    if node.kind == "MatMulInteger":
        a, b_value, a_zero, b_zero = ins[:4]
        params: list[Value | None] = [None, a_zero, None, b_zero]
        attrs: dict[str, object] = {"output": "int32"}
    elif node.kind == "QLinearMatMul":
        a, a_scale, a_zero, b_value, b_scale, b_zero, y_scale, y_zero = ins[:8]
        if None in (a_scale, y_scale, y_zero) or not all(sized(v, 1) for v in (a_scale, y_scale, y_zero)):
            return None
        params = [a_scale, a_zero, b_scale, b_zero, y_scale, y_zero]
        attrs = {"output": "quantized"}
    else:
        return None
    b = quantized_b(b_value)
    if a is None or a.is_symbolic or a.shape is None or b is None or not sized(params[1], 1):
        return None
    n = b.shape[1]
    if not (sized(params[2], 1, n) and sized(params[3], 1, n)) or a.shape[-1] != b.shape[0]:
        return None
    return a, b, params, attrs


def lowers(node: Node) -> bool:
    """Whether this lowering takes ``node`` (a MatMulInteger / QLinearMatMul the C kernels run)."""
    return _plan(node) is not None


def _bias_add(graph: Graph, node: Node, n: int) -> tuple[Node, Value] | None:
    """(the Add, C) where the sole consumer of MatMulInteger ``node`` adds a constant int32 C of N."""
    add = sole_consumer(graph, node.outputs[0])
    if add is None or add.kind != "Add" or len(add.inputs) != 2:
        return None
    if add.outputs[0].shape != node.outputs[0].shape:
        return None
    c = add.inputs[1] if add.inputs[0] is node.outputs[0] else add.inputs[0]
    if c is None or c.const is None or c.dtype != np.int32 or not sized(c, n) or c is node.outputs[0]:
        return None
    return add, c


def _lower(graph: Graph, node: Node) -> bool:
    plan = _plan(node)
    if plan is None:
        return False
    a, b, params, attrs = plan
    biased = _bias_add(graph, node, b.shape[1]) if node.kind == "MatMulInteger" else None
    if biased is None:
        qgemm_node(graph, node, a, b, params, attrs, node.outputs, [node])
        return True
    add, c = biased
    params = [*params, None, None, add_constant(graph, f"{node.name}_bias", np.asarray(c.const).reshape(-1))]
    qgemm_node(graph, node, a, b, params, attrs, add.outputs, [node, add])
    return True


class UseQGemm(Pass):
    name = "use_qgemm"

    def run(self, graph: Graph) -> PassResult:
        modified = rewrite_each(graph, ("MatMulInteger", "QLinearMatMul"), _lower)
        if modified:
            graph.prune_constants()
        return PassResult(graph, modified)
