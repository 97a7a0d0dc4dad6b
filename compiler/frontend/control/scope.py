"""The scope control flow imports into: the importer's graph and tables, fresh names, inlining.

``inline`` imports a subgraph's nodes into the outer graph with its inputs bound to outer values
and the outer scope visible (an ONNX subgraph may read any value of an enclosing graph by name).
Its value and node names are made unique (``<node>/<branch or iteration>/<name>``), so a body
imported many times, or two branches that reuse a name, never collide; nested control flow is
resolved the same way when the importer reaches its node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx import numpy_helper

from compiler.frontend.window_shapes import infer_with_pool_sizes
from compiler.ir.graph import Graph
from compiler.ir.graph import Value
from runtime.errors import ModelError
from runtime.errors import UnsupportedOpError
from runtime.symbolic import Expr

__all__ = [
    "CONTROL_FLOW_OPS",
    "ControlScope",
    "inline",
    "element",
    "int_list",
    "one_element",
    "like_input",
    "is_control_flow",
    "names_in",
    "outer_names",
    "referenced_names",
    "scalar",
    "select",
    "subgraphs",
    "walk_nodes",
]

CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})
# Outer constants up to this size are given to shape inference of an inlined subgraph as values.
_INFER_CONST_LIMIT = 4096


def is_control_flow(node: onnx.NodeProto) -> bool:
    return node.domain in ("", "ai.onnx") and node.op_type in CONTROL_FLOW_OPS


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    out: list[onnx.GraphProto] = []
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            out.append(attr.g)
        elif attr.type == onnx.AttributeProto.GRAPHS:
            out.extend(attr.graphs)
    return out


def walk_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of ``graph`` and of its subgraphs, at any depth (a node before its subgraphs')."""
    for node in graph.node:
        yield node
        for sub in subgraphs(node):
            yield from walk_nodes(sub)


def referenced_names(graph: onnx.GraphProto) -> set[str]:
    """Every value name read in ``graph`` or its subgraphs, and their outputs."""
    names = {o.name for o in graph.output}
    for node in walk_nodes(graph):
        names.update(n for n in node.input if n)
    for node in walk_nodes(graph):
        for sub in subgraphs(node):
            names.update(o.name for o in sub.output)
    return names


def names_in(graph: onnx.GraphProto) -> set[str]:
    """Every value and node name in ``graph`` and its subgraphs (inlined names must avoid them)."""
    names = referenced_names(graph) | {i.name for i in graph.input} | {t.name for t in graph.initializer}
    for node in walk_nodes(graph):
        names.update(node.output)
        names.add(node.name)
        for sub in subgraphs(node):
            names.update(i.name for i in sub.input)
            names.update(t.name for t in sub.initializer)
    names.discard("")
    return names


def _defined(graph: onnx.GraphProto) -> set[str]:
    return (
        {i.name for i in graph.input}
        | {t.name for t in graph.initializer}
        | {o for node in graph.node for o in node.output if o}
    )


def outer_names(graph: onnx.GraphProto) -> set[str]:
    """Names read in ``graph`` (or its subgraphs) that no scope inside it defines: outer values."""
    free = {o.name for o in graph.output} | {n for node in graph.node for n in node.input if n}
    for node in graph.node:
        for sub in subgraphs(node):
            free |= outer_names(sub)
    return free - _defined(graph)


@dataclass
class ControlScope:
    """What control flow needs of the importer: its graph, name -> value table and type table, and a
    callback importing one ONNX node into a scope (with the set of value names something reads)."""

    graph: Graph
    env: dict[str, Value]
    types: dict[str, onnx.TypeProto]
    opset: int
    opset_imports: list[onnx.OperatorSetIdProto]
    used: frozenset[str]
    taken: set[str]
    import_with: Callable[[ControlScope, onnx.NodeProto, frozenset[str]], None]
    # id(a run-time value) -> (the value, sample values): the importer's Knowledge.samples (shapes
    # that a loop step's iteration number decides are read off its first iterations)
    samples: dict[int, tuple[Value, list[np.ndarray]]] = dataclasses.field(default_factory=dict)

    def import_node(self, node: onnx.NodeProto, used: frozenset[str]) -> None:
        """Import one ONNX node into this scope's graph (control flow included)."""
        self.import_with(self, node, used)

    def child(self, graph: Graph, env: dict[str, Value]) -> ControlScope:
        """A scope importing into ``graph`` (a sub-schedule), sharing names and types with this one."""
        return dataclasses.replace(self, graph=graph, env=env)

    def fresh(self, base: str) -> str:
        """A name no value or node of the model or the graph has (deterministic)."""
        name = self.graph.unique_name(base)
        while name in self.taken or name in self.env:
            name = self.graph.unique_name(base)
        self.taken.add(name)
        return name

    def value(self, name: str, where: str) -> Value:
        if name not in self.env:
            raise ModelError(f"{where} reads {name!r}, which nothing before it produces")
        return self.env[name]

    def constant(self, base: str, array: np.ndarray, dtype: np.dtype | None = None) -> str:
        """A new constant; ``dtype``: a symbolic constant's (an object array) ONNX dtype."""
        name = self.fresh(base)
        value = Value(name, dtype, const=np.ascontiguousarray(array).reshape(np.shape(array)))
        self.graph.constants[name] = value
        self.env[name] = value
        return name

    def emit(self, op_type: str, inputs: list[str], base: str, **attrs: Any) -> str:
        """Import one generated ONNX node (one output); return its output's name."""
        out = self.fresh(f"{base}/{op_type}")
        node = helper.make_node(op_type, inputs, [out], name=self.fresh(f"{base}/{op_type}_node"), **attrs)
        self.import_node(node, self.used | {out})
        return out


def scalar(scope: ControlScope, name: str, base: str) -> str:
    value = scope.env[name]
    if value.shape == ():
        return name
    return scope.emit("Reshape", [name, scope.constant(f"{base}/scalar", np.zeros(0, np.int64))], base)


def select(scope: ControlScope, flag: str, a: str, b: str, base: str, where: str) -> str:
    """``Where(flag, a, b)``, refused when ``a`` and ``b`` differ in dtype or shape."""
    va, vb = scope.env[a], scope.env[b]
    if va.shape != vb.shape or va.dtype != vb.dtype:
        raise UnsupportedOpError(
            f"{where}: the condition is known only at run time and the values it chooses between differ "
            f"({va.dtype}{list(va.shape or ())} vs {vb.dtype}{list(vb.shape or ())}); onnx-aot needs them "
            "to have one static shape (--bind the inputs the condition depends on to decide at compile time)"
        )
    if a == b:
        return a
    return scope.emit("Where", [flag, a, b], base)


def inline(
    scope: ControlScope, sub: onnx.GraphProto, prefix: str, bindings: dict[str, str], where: str
) -> list[str]:
    """Import ``sub``'s nodes into the outer graph, its inputs bound to the values named in
    ``bindings`` (by input name); return the names of the values of its outputs."""
    rename = {name: scope.fresh(f"{prefix}/{name}") for name in sorted(_defined(sub))}
    renamed = _renamed(sub, rename)
    for inp in sub.input:
        if inp.name not in bindings:
            raise ModelError(f"{where}: subgraph input {inp.name!r} is not bound")
        scope.env[rename[inp.name]] = scope.value(bindings[inp.name], where)
    for tensor in sub.initializer:
        value = Value(rename[tensor.name], const=numpy_helper.to_array(tensor))
        scope.graph.constants[value.name] = value
        scope.env[value.name] = value
    for free in sorted(outer_names(renamed)):
        scope.value(free, f"{where}: its subgraph")
    _infer_types(scope, renamed)
    nodes = list(renamed.node)
    for node in nodes:
        node.name = scope.fresh(f"{prefix}/{node.name or node.op_type}")
    used = scope.used | referenced_names(renamed)
    for node in nodes:
        scope.import_node(node, used)
    for out in renamed.output:
        scope.value(out.name, f"{where}: subgraph output")
    return [out.name for out in renamed.output]


def _renamed(graph: onnx.GraphProto, rename: dict[str, str]) -> onnx.GraphProto:
    """A copy of ``graph`` with every name in ``rename`` replaced, in its subgraphs too (where a
    subgraph defines a name itself, that definition wins)."""
    out = onnx.GraphProto()
    out.CopyFrom(graph)
    _rename_in(out, rename)
    return out


def _rename_in(graph: onnx.GraphProto, rename: dict[str, str]) -> None:
    for info in (*graph.input, *graph.output, *graph.value_info):
        info.name = rename.get(info.name, info.name)
    for tensor in graph.initializer:
        tensor.name = rename.get(tensor.name, tensor.name)
    for node in graph.node:
        node.input[:] = [rename.get(n, n) for n in node.input]
        node.output[:] = [rename.get(n, n) for n in node.output]
        for sub in subgraphs(node):
            inner = _defined(sub)
            _rename_in(sub, {k: v for k, v in rename.items() if k not in inner})


def _infer_types(scope: ControlScope, sub: onnx.GraphProto) -> None:
    """Shape-infer ``sub`` on its own with the outer values' real types (small constants as values),
    adding what it finds to the importer's type table; what stays unknown is inferred node by node."""
    inputs, inits = [], []
    for name in sorted(outer_names(sub) | {i.name for i in sub.input}):
        value = scope.env[name]
        if value.dtype is None or value.shape is None:
            continue
        const = value.const
        if const is not None and const.dtype != object and const.size <= _INFER_CONST_LIMIT:
            inits.append(numpy_helper.from_array(const, name))
        shape = [d if isinstance(d, int) else str(d) for d in value.shape]  # a symbol: a dim_param
        elem = helper.np_dtype_to_tensor_dtype(value.dtype)
        inputs.append(helper.make_tensor_value_info(name, elem, shape))
    graph = helper.make_graph(
        list(sub.node),
        "subgraph",
        inputs,
        [helper.make_empty_tensor_value_info(o.name) for o in sub.output],
        initializer=[*sub.initializer, *inits],
    )
    model = helper.make_model(graph, opset_imports=scope.opset_imports)
    try:
        inferred = infer_with_pool_sizes(
            model, lambda m: onnx.shape_inference.infer_shapes(m, data_prop=True)
        )
    except Exception:
        return
    for info in (*inferred.graph.value_info, *inferred.graph.output):
        if info.type.HasField("tensor_type") and info.name not in scope.types:
            scope.types[info.name] = info.type


def like_input(scope: ControlScope, info: onnx.ValueInfoProto, array: np.ndarray, base: str) -> str:
    """A constant ``array`` shaped as the body input ``info`` declares (scalar or one element)."""
    dims = info.type.tensor_type.shape.dim if info.type.HasField("tensor_type") else []
    if dims and all(d.HasField("dim_value") for d in dims) and int(np.prod([d.dim_value for d in dims])) == 1:
        array = array.reshape([d.dim_value for d in dims])
    return scope.constant(base, array)


def one_element(value: Value, what: str, where: str) -> Value:
    """``value``, refused unless it holds exactly one element (a condition, a trip count)."""
    size = value.size if value.shape is not None else -1
    if size != 1:
        raise ModelError(f"{where}: {what} {value.name!r} has {max(size, 0)} elements, not one")
    return value


def element(value: Value) -> Any:
    """The one element of a constant ``value`` (a trip count, a condition): an int / bool, an
    expression of the graph's symbols (a symbolic constant), or None when known only at run time."""
    if value.const is None:
        return None
    item = value.const.reshape(-1)[0]
    if isinstance(item, Expr):
        return item
    return bool(item) if value.const.dtype == np.bool_ else int(item)


def int_list(node: onnx.NodeProto, key: str, default: list[int]) -> list[int]:
    """Ints attribute ``key`` of ``node``, or ``default``."""
    for attr in node.attribute:
        if attr.name == key:
            return [int(v) for v in helper.get_attribute_value(attr)]
    return default
