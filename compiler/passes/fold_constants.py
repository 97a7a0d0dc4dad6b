"""Evaluate nodes whose inputs are all constants, at compile time, with the reference kernels.

The import already folds every node whose known results total at most 64 KiB, at every level
(``compiler/frontend/folding.py``; docs/ops.md, "Folding"). This level-1 pass is the optimization
on top: what is left, i.e. larger results (weights a model computes: a Transpose or
DequantizeLinear of a weight), and nodes whose inputs other passes made constant. It trades
weights.bin bytes for run time, so ``-O0`` keeps those nodes.

A foldable node is deterministic, has a reference kernel, and either produces less than
``MAX_FOLD_NBYTES`` or is one of the shape-plumbing ops (Shape, Gather, Concat, Reshape, Cast,
ConstantOfShape, ...) that are always folded (the light zoo builds its weights with
ConstantOfShape). ``Shape`` folds whatever its input, since every shape is static. A folded
node's outputs become new constants; a node producing a graph output becomes an
``onnx_aot.Copy`` of the constant so the output keeps its name. A kernel that is missing or
fails leaves the node alone: folding is an optimization, never a reason to fail.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from compiler.ir.graph import AOT_DOMAIN
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.passes.base import NONDETERMINISTIC
from compiler.passes.base import Pass
from compiler.passes.base import PassResult
from compiler.passes.base import add_constant
from compiler.passes.base import bypass
from compiler.passes.base import note_eliminated
from compiler.passes.base import replace_nodes
from runtime.contract import COPY
from runtime.contract import op_name
from runtime.errors import OnnxAotError
from runtime.errors import UnsupportedOpError
from runtime.kernels import get_kernel

__all__ = ["ALWAYS_FOLD", "MAX_FOLD_NBYTES", "FoldConstants"]

MAX_FOLD_NBYTES = 64 << 20
# Shape plumbing, folded whatever the size (their results feed shapes, or are views anyway).
ALWAYS_FOLD = frozenset(
    {"ConstantOfShape", "Shape", "Gather", "Concat", "Unsqueeze", "Squeeze", "Flatten", "Reshape", "Cast"}
)


def _read_only(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view


class FoldConstants(Pass):
    name = "fold_constants"

    def run(self, graph: Graph) -> PassResult:
        removed: list[Node] = []
        modified = False
        for node in graph:
            arrays = self._evaluate(graph, node)
            if arrays is None:
                continue
            modified = True
            if any(graph.is_graph_output(v) for v in node.outputs):
                self._copy_into_output(graph, node, arrays[0])
            else:
                consts = [self._constant(graph, value, array)
                          for value, array in zip(node.outputs, arrays, strict=True)]
                if len(consts) == 1 and consts[0].const is not None:  # narrow weights (compiler/ir/narrow.py)
                    graph.narrowing.note_fold(node.kind, node.attrs, [v.const if v is not None else None
                                                                      for v in node.inputs], consts[0].const)
                bypass(graph, node, consts)
                removed.append(node)
        note_eliminated(graph, removed, self.name)
        if modified:
            graph.prune_constants()
        return PassResult(graph, modified)

    @staticmethod
    def _constant(graph: Graph, value: Value, array: np.ndarray) -> Value:
        """The folded ``value`` as a new constant (keeping where it came from)."""
        const = add_constant(graph, value.name, array)
        const.origin = value.origin if value.origin is not None else value.name
        return const

    @staticmethod
    def _copy_into_output(graph: Graph, node: Node, array: np.ndarray) -> None:
        (out,) = node.outputs
        const = add_constant(graph, f"{out.name}_value", array)
        copy = Node(op_name(COPY), [const], [out], {}, name=node.name, domain=AOT_DOMAIN, origin=node.origin)
        replace_nodes(graph, [node], copy)

    @staticmethod
    def _evaluate(graph: Graph, node: Node) -> list[np.ndarray] | None:
        """The node's output values, or None when it should not (or cannot) be folded."""
        outputs = node.outputs
        if not outputs or any(v.shape is None or v.dtype is None for v in outputs):
            return None
        if any(graph.is_graph_output(v) for v in outputs):
            # One Copy keeps one graph output; a Copy of a constant is as folded as it gets.
            if len(outputs) > 1 or node.kind == COPY:
                return None
        if node.op_type in NONDETERMINISTIC:
            return None
        if any(v is not None and v.is_symbolic for v in (*node.inputs, *outputs)):
            return None  # dynamic dims: the import folded what the symbols allow (folding.fold_symbolic)
        if node.kind == "Shape":
            return _fold_shape(node)
        if any(v is not None and not v.is_const for v in node.inputs):
            return None
        if node.kind not in ALWAYS_FOLD and sum(v.nbytes for v in outputs) >= MAX_FOLD_NBYTES:
            return None
        try:
            kernel = get_kernel(node.kind)
        except UnsupportedOpError:
            return None
        inputs: list[Any] = [
            _read_only(v.const) if v is not None and v.const is not None else None for v in node.inputs
        ]
        specs: list[tuple[tuple[int, ...], Any]] = [
            (v.shape, v.dtype) for v in outputs if v.shape is not None
        ]
        try:
            results = kernel(np, inputs, dict(node.attrs), specs)
        except (OnnxAotError, ArithmeticError, ValueError, TypeError, IndexError):
            return None  # e.g. a kernel that rejects this attribute combination
        return _conform(results, outputs)


def _fold_shape(node: Node) -> list[np.ndarray] | None:
    x = node.input(0)
    if x is None or x.shape is None:
        return None
    start, end = int(node.attrs["start"]), int(node.attrs["end"])
    (out,) = node.outputs
    return _conform([np.array(x.shape[start:end], dtype=np.int64)], [out])


def _conform(results: list[Any], outputs: tuple[Value, ...] | list[Value]) -> list[np.ndarray] | None:
    """Own, contiguous copies with the outputs' dtypes; None when a shape disagrees."""
    if len(results) != len(outputs):
        return None
    arrays = []
    for result, value in zip(results, outputs, strict=True):
        array = np.asarray(result)
        if array.shape != value.shape:
            return None
        arrays.append(np.array(array, dtype=value.dtype, copy=True, order="C"))
    return arrays
