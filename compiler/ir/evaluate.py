"""The IR interpreter: runs a Graph node by node through the reference kernels (``runtime/kernels``).

It is the compiler's one way to evaluate a graph: the golden self-test data (``artifact/golden.py``)
and the tests that compare a graph before and after a rewrite use it. Like torch.fx's
``Interpreter`` it is a small class whose steps can be overridden: ``read`` (where an operand's
array comes from), ``run_node`` (how one node computes) and ``write`` (where a result goes), so a
test can, say, run the nodes of a schedule with every value in its planned arena bytes.

A result must have the output value's planned shape; it is stored as an own, C-ordered copy in the
value's dtype. ``onnx_aot.Transfer`` (a move between memory spaces) passes its input through.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np

from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from runtime.contract import TRANSFER
from runtime.errors import CompileError
from runtime.kernels import get_kernel
from runtime.symbolic import Expr
from runtime.symbolic import evaluate as sym_evaluate
from runtime.symbolic import evaluate_text

__all__ = ["EvaluationError", "Interpreter", "concrete_attrs", "concrete_shape", "evaluate", "run_node"]


class EvaluationError(CompileError):
    """A reference kernel gave a result that does not fit the node's outputs."""


def run_node(node: Node, args: Sequence[Any], xp: Any = np,
             binding: Mapping[str, int] | None = None) -> list[Any]:
    """``node``'s reference kernel applied to ``args`` (arrays, None for omitted inputs); where its
    outputs' shapes or its attributes are symbolic, they are taken at ``binding`` (the symbols'
    values)."""
    if node.kind == TRANSFER:
        return [args[0]]
    specs = [(concrete_shape(v.shape, binding), v.dtype) for v in node.outputs if v.shape is not None]
    attrs = dict(node.attrs) if binding is None else concrete_attrs(node.attrs, binding)
    return list(get_kernel(node.kind)(xp, list(args), attrs, specs))


def concrete_attrs(attrs: Mapping[str, Any], binding: Mapping[str, int]) -> dict[str, Any]:
    """``attrs`` with every expression (at any depth in lists, tuples and dicts; in a control step's
    programs written as ``{"expr": text}``) evaluated at ``binding``."""
    def bind(value: Any) -> Any:
        if isinstance(value, Expr):
            return sym_evaluate(value, binding)
        if isinstance(value, list | tuple):
            return type(value)(bind(v) for v in value)
        if isinstance(value, dict):
            if set(value) == {"expr"} and isinstance(value["expr"], str):
                return evaluate_text(value["expr"], binding)
            return {k: bind(v) for k, v in value.items()}
        return value

    return {key: bind(value) for key, value in attrs.items()}


def concrete_shape(shape: Sequence[Any], binding: Mapping[str, int] | None) -> tuple[int, ...]:
    """``shape`` with its symbolic dims evaluated at ``binding`` (a static shape as it is)."""
    if binding is None or not any(isinstance(d, Expr) for d in shape):
        return tuple(shape)
    return tuple(sym_evaluate(d, binding) for d in shape)


class Interpreter:
    """Evaluates ``graph``, or the given ``nodes`` of it in their order (a schedule's steps)."""

    def __init__(self, graph: Graph, nodes: Sequence[Node] | None = None,
                 binding: Mapping[str, int] | None = None) -> None:
        self.graph = graph
        self.nodes: tuple[Node, ...] = tuple(graph.nodes if nodes is None else nodes)
        self.env: dict[int, Any] = {}
        self.binding = binding  # the symbols' values, for a graph with symbolic dims

    def run(self, feeds: Mapping[str, Any]) -> list[Any]:
        """The graph's outputs, in order, for ``feeds`` (one array per graph input name)."""
        self.env = {id(value): feeds[value.name] for value in self.graph.inputs}
        for node in self.nodes:
            results = self.run_node(node, [self.read(v) if v is not None else None for v in node.inputs])
            if len(results) != len(node.outputs):
                raise EvaluationError(f"{node.describe()}: the reference kernel gave {len(results)} "
                                      f"result(s) for {len(node.outputs)} output(s)")
            for value, result in zip(node.outputs, results, strict=True):
                self.write(node, value, result)
        return [self.read(value) for value in self.graph.outputs]

    def read(self, value: Value) -> Any:
        """The array of ``value``: its constant, or what was fed or computed for it."""
        if value.const is not None:
            if value.const.dtype == object and self.binding is not None:  # a symbolic constant
                flat = [sym_evaluate(d, self.binding) for d in value.const.reshape(-1)]
                return np.array(flat, dtype=value.dtype).reshape(value.const.shape)
            return value.const
        return self.env[id(value)]

    def run_node(self, node: Node, args: list[Any]) -> list[Any]:
        return run_node(node, args, binding=self.binding)

    def write(self, node: Node, value: Value, result: Any) -> None:
        """Keep ``result`` as ``value``'s array (checked against the planned shape)."""
        array = np.asarray(result)
        if value.shape is not None and array.shape != concrete_shape(value.shape, self.binding):
            raise EvaluationError(f"{node.describe()}: result shape {array.shape} for output "
                                  f"{value.name!r}, planned {concrete_shape(value.shape, self.binding)}")
        self.env[id(value)] = np.array(array, dtype=value.dtype, copy=True, order="C")


def evaluate(graph: Graph, feeds: Mapping[str, Any], binding: Mapping[str, int] | None = None) -> list[Any]:
    """``graph``'s outputs for ``feeds``, every node through its reference kernel (symbolic dims,
    attributes and constants taken at ``binding``)."""
    return Interpreter(graph, binding=binding).run(feeds)
