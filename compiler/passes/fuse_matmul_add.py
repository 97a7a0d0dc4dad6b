"""MatMul (or Gemm without a bias) followed by the Add of a constant bias -> Gemm with that bias.

MatMul needs a constant 2-D B; the bias is a constant that broadcasts to the [M, N] output and
varies along N only ([N], [1, N], a scalar, ...); it is stored as a 1-D [N] C with beta 1. A
Gemm whose C is such a constant takes the Add too (C' = beta * C + bias). The product's output
must have that one use and not be a graph output.

A MatMul whose A has more than two dims (K and N static), the linear layer of a transformer
([batch, seq, K] x [K, N] + bias, as PyTorch exports it), is one product over the rows of all
batches: it becomes Reshape (A to [rows, K]) + Gemm + Reshape (back to [..., N]), views of the
same contiguous data, so the Gemm lowerings (B packed ahead of time, the bias in the tile's
epilogue) apply to it too. In a dynamic graph the rows may be an expression of the symbols
(batch * seq): the C Gemm takes them at run time.
"""

from __future__ import annotations

import math

import numpy as np

from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.passes.base import Pass
from compiler.passes.base import PassResult
from compiler.passes.base import add_constant
from compiler.passes.base import merged_origin
from compiler.passes.base import replace_nodes
from compiler.passes.base import sole_consumer

__all__ = ["FuseMatMulAdd", "per_column"]


def per_column(array: np.ndarray, rows: int, cols: int) -> np.ndarray | None:
    """``array`` as a float64 [cols] vector if it broadcasts to [rows, cols] varying along cols only."""
    del rows  # any number of rows: the vector is broadcast over all of them
    if array.ndim > 2:
        return None
    shape = (1,) * (2 - array.ndim) + tuple(array.shape)
    if shape[0] != 1 or shape[1] not in (1, cols):
        return None
    return np.broadcast_to(array.astype(np.float64).reshape(-1), (cols,))


class FuseMatMulAdd(Pass):
    name = "fuse_matmul_add"

    def run(self, graph: Graph) -> PassResult:
        modified = False
        for node in graph:
            if node.graph is graph and node.kind in ("MatMul", "Gemm") and self._fuse(graph, node):
                modified = True
        if modified:
            graph.prune_constants()
        return PassResult(graph, modified)

    def _fuse(self, graph: Graph, node: Node) -> bool:
        if len(node.outputs) != 1:
            return False
        y = node.outputs[0]
        if y.shape is None or len(y.shape) < 2 or y.dtype is None or y.dtype.kind != "f":
            return False
        if len(y.shape) > 2:
            return node.kind == "MatMul" and _fuse_batched(graph, node)
        rows, cols = y.shape
        if node.kind == "MatMul":
            a, b = node.input(0), node.input(1)
            if a is None or b is None or a.shape is None or len(a.shape) != 2:
                return False
            if b.const is None or b.const.ndim != 2:
                return False
            attrs = {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0}
            base = np.zeros(cols)
        else:
            c = node.input(2)
            if c is None:
                base = np.zeros(cols)
            else:
                existing = per_column(c.const, rows, cols) if c.const is not None else None
                if existing is None:
                    return False
                base = float(node.attrs["beta"]) * existing
            attrs = {**node.attrs, "beta": 1.0}
        add = sole_consumer(graph, y)
        if add is None:
            return False
        bias = _bias(add, y, rows, cols)
        if bias is None:
            return False
        c_const = add_constant(graph, f"{node.name}_bias", (base + bias).astype(y.dtype))
        gemm = Node(
            "Gemm",
            [node.input(0), node.input(1), c_const],
            list(add.outputs),
            attrs,
            name=node.name,
            origin=merged_origin([node, add]),
        )
        replace_nodes(graph, [node, add], gemm)
        return True


def _fuse_batched(graph: Graph, node: Node) -> bool:
    """[..., K] x constant [K, N] + bias -> Reshape [rows, K], Gemm with the bias, Reshape [..., N]."""
    a, b, y = node.input(0), node.input(1), node.outputs[0]
    if a is None or b is None or b.const is None or b.const.ndim != 2 or a.shape is None or y.shape is None:
        return False
    if not isinstance(a.shape[-1], int) or not isinstance(y.shape[-1], int) or len(a.shape) != len(y.shape):
        return False
    rows, k, cols = math.prod(a.shape[:-1]), a.shape[-1], y.shape[-1]  # rows may be symbolic
    add = sole_consumer(graph, y)
    bias = _bias(add, y, rows, cols) if add is not None else None
    if add is None or bias is None:
        return False
    flat_a = graph.make_value(f"{a.name}_rows", a.dtype, (rows, k))
    flat_y = graph.make_value(f"{y.name}_rows", y.dtype, (rows, cols))
    c_const = add_constant(graph, f"{node.name}_bias", bias.astype(y.dtype))
    origin = merged_origin([node, add])
    flat = Node("Reshape", [a], [flat_a], {"shape": [rows, k]}, name=f"{node.name}_rows", origin=origin)
    graph.add_node(flat, before=node)
    attrs = {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0}
    gemm = Node("Gemm", [flat_a, b, c_const], [flat_y], attrs, name=node.name, origin=origin)
    graph.add_node(gemm, before=node)
    unflat = Node("Reshape", [flat_y], list(add.outputs), {"shape": list(y.shape)}, name=f"{add.name}_unflat",
                  origin=origin)
    replace_nodes(graph, [node, add], unflat)
    return True


def _bias(add: Node, y: Value, rows: int, cols: int) -> np.ndarray | None:
    if add.kind != "Add" or len(add.inputs) != 2 or len(add.outputs) != 1:
        return None
    a, b = add.inputs
    other = b if a is y else a
    if other is None or other is y or (a is not y and b is not y) or other.const is None:
        return None
    if add.outputs[0].shape != y.shape or add.outputs[0].dtype != y.dtype:
        return None
    return per_column(other.const, rows, cols)
