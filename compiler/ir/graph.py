"""The compiler's intermediate representation: Graph, Node and Value with use-def links.

Every value has a shape and a numpy dtype once the frontend is done. A dim is an ``int``, or, for
a model imported with dims that have ranges (``--shape x=1x3x48x32..2048``), an expression of the
graph's symbols (``runtime.symbolic.Expr``; ``Graph.symbols`` holds their ranges). Constants are
values with ``const`` set (a numpy array) and no producer; a *symbolic* constant (a shape computed
from symbolic dims) is an object array of ints and expressions with the ONNX dtype it stands for.
Passes change a graph only through the methods here (``add_node``, ``remove_node``,
``replace_all_uses``, ``set_input``), which keep ``Value.producer`` and ``Value.uses`` right;
``Graph.verify`` checks the invariants.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Iterable
from collections.abc import Iterator
from typing import Any

import numpy as np

from compiler.ir.narrow import Narrowing
from runtime.contract import AOT_DOMAIN
from runtime.contract import attr_problems
from runtime.errors import InternalError
from runtime.errors import ModelError
from runtime.symbolic import Dim
from runtime.symbolic import Expr

__all__ = ["Value", "Node", "Graph", "Use", "ONNX_DOMAIN", "AOT_DOMAIN", "Shape", "is_symbolic_shape"]

# A shape: ints, and expressions of symbols where a dim is dynamic. ``Value.shape`` is annotated
# ``tuple[int, ...]`` still, though every stage after the import sees symbolic dims too (passes,
# providers and the memory policies, compiler/memory_policy.py): typing them with ``Shape`` is left.
Shape = tuple[Dim, ...]


def is_symbolic_shape(shape: Iterable[Dim] | None) -> bool:
    return shape is not None and any(isinstance(d, Expr) for d in shape)

ONNX_DOMAIN = ""


class Value:
    """One tensor in the graph: a graph input, a constant, or a node output."""

    __slots__ = ("name", "dtype", "shape", "const", "producer", "uses", "origin")

    def __init__(
        self,
        name: str,
        dtype: np.dtype | None = None,
        shape: tuple[int, ...] | Shape | None = None,
        const: np.ndarray | None = None,
    ) -> None:
        self.name = name
        if const is not None:
            const = np.asarray(const)
            if const.dtype != object or dtype is None:  # (a symbolic constant keeps its ONNX dtype)
                dtype = const.dtype
            shape = tuple(int(d) for d in const.shape)
        self.dtype: np.dtype | None = np.dtype(dtype) if dtype is not None else None
        self.shape: tuple[int, ...] | None = tuple(shape) if shape is not None else None  # type: ignore[arg-type]
        self.const: np.ndarray | None = const
        self.producer: Node | None = None
        self.uses: list[Use] = []
        self.origin: str | None = None  # ONNX name this value came from, when renamed

    @property
    def is_const(self) -> bool:
        return self.const is not None

    @property
    def is_symbolic(self) -> bool:
        """A dim is an expression of symbols, or the value is a symbolic constant."""
        return is_symbolic_shape(self.shape) or (self.const is not None and self.const.dtype == object)

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor (an ``Expr`` where the shape is symbolic: see ``Shape``)."""
        assert self.shape is not None and self.dtype is not None, self.name
        return self.size * self.dtype.itemsize

    @property
    def size(self) -> int:
        """Elements of the tensor (an ``Expr`` where the shape is symbolic: see ``Shape``)."""
        assert self.shape is not None, self.name
        if is_symbolic_shape(self.shape):
            return functools.reduce(operator.mul, self.shape, 1)  # type: ignore[no-any-return]
        return int(np.prod(self.shape, dtype=np.int64))

    def consumers(self) -> list[Node]:
        """Distinct consuming nodes, in use order."""
        seen: dict[int, Node] = {}
        for use in self.uses:
            seen.setdefault(id(use.node), use.node)
        return list(seen.values())

    def __repr__(self) -> str:
        kind = "const" if self.is_const else "value"
        return f"<{kind} {self.name!r} {self.dtype} {self.shape}>"


class Use:
    """``node.inputs[index] is value``."""

    __slots__ = ("node", "index")

    def __init__(self, node: Node, index: int) -> None:
        self.node = node
        self.index = index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Use) and other.node is self.node and other.index == self.index

    def __hash__(self) -> int:
        return hash((id(self.node), self.index))


class Node:
    """One operation. ``inputs`` may hold ``None`` for an omitted optional input.

    ``origin`` lists the ONNX node names this node stands for: one for an ordinary node, several
    after fusion. ``attrs`` hold plain Python values (int, float, str, lists, numpy arrays).
    """

    __slots__ = ("name", "op_type", "domain", "attrs", "_inputs", "outputs", "origin", "graph")

    def __init__(
        self,
        op_type: str,
        inputs: Iterable[Value | None],
        outputs: Iterable[Value],
        attrs: dict[str, Any] | None = None,
        *,
        name: str = "",
        domain: str = ONNX_DOMAIN,
        origin: Iterable[str] | None = None,
    ) -> None:
        self.name = name
        self.op_type = op_type
        self.domain = domain
        self.attrs: dict[str, Any] = dict(attrs or {})
        self._inputs: list[Value | None] = list(inputs)
        self.outputs: list[Value] = list(outputs)
        self.origin: list[str] = list(origin) if origin is not None else ([name] if name else [])
        self.graph: Graph | None = None

    @property
    def inputs(self) -> tuple[Value | None, ...]:
        return tuple(self._inputs)

    @property
    def kind(self) -> str:
        """``op_type`` qualified by domain when it is not the ONNX default domain."""
        return self.op_type if self.domain in ("", "ai.onnx") else f"{self.domain}.{self.op_type}"

    def input(self, i: int) -> Value | None:
        return self._inputs[i] if i < len(self._inputs) else None

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs[key] if key in self.attrs else default

    def describe(self) -> str:
        return f"node {self.name!r} ({self.op_type})"

    def __repr__(self) -> str:
        ins = ", ".join(v.name if v is not None else "-" for v in self._inputs)
        outs = ", ".join(v.name for v in self.outputs)
        return f"<Node {self.name!r} {self.kind}({ins}) -> {outs}>"


class Graph:
    """A topologically ordered list of nodes plus the graph's inputs, outputs and constants."""

    def __init__(self, name: str = "graph", opset: int = 0) -> None:
        self.name = name
        self.opset = opset
        self.symbols: dict[str, tuple[int, int]] = {}  # the dynamic dims' symbols and their ranges
        # value symbols (also in ``symbols``) -> the one-element graph input whose value each is
        self.value_symbols: dict[str, str] = {}
        # (node, a, b): a == b holds only at some sizes in the ranges (a Reshape's element counts):
        # the sizes the model takes; issue 17's runtime checks them at each binding
        self.assumptions: list[tuple[str, Any, Any]] = []
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self.output_names: list[str] = []  # the public (ONNX) names of the outputs, by position
        self.constants: dict[str, Value] = {}
        self._nodes: list[Node] = []
        self._names: set[str] = set()
        self._counter = itertools.count()
        # original ONNX node name -> what happened to it, for plan.json (e.g. "folded")
        self.eliminated: dict[str, str] = {}
        # the weights the model ships narrow, stored so in weights.bin (compiler/ir/narrow.py)
        self.narrowing = Narrowing()

    # -- reading ---------------------------------------------------------------------------
    @property
    def nodes(self) -> tuple[Node, ...]:
        return tuple(self._nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(tuple(self._nodes))

    def __len__(self) -> int:
        return len(self._nodes)

    def values(self) -> list[Value]:
        """Every value: inputs, constants, then node outputs in order."""
        out: list[Value] = list(self.inputs) + list(self.constants.values())
        for node in self._nodes:
            out.extend(node.outputs)
        return out

    def is_graph_output(self, value: Value) -> bool:
        return any(v is value for v in self.outputs)

    def is_graph_input(self, value: Value) -> bool:
        return any(v is value for v in self.inputs)

    # -- naming -----------------------------------------------------------------------------
    def unique_name(self, base: str) -> str:
        """A value/node name not used yet in this graph (deterministic)."""
        name = base
        while name in self._names:
            name = f"{base}__{next(self._counter)}"
        self._names.add(name)
        return name

    def reserve_name(self, name: str) -> None:
        self._names.add(name)

    # -- building ----------------------------------------------------------------------------
    def add_input(self, value: Value) -> Value:
        self.reserve_name(value.name)
        self.inputs.append(value)
        return value

    def add_output(self, value: Value, public_name: str | None = None) -> Value:
        """Make ``value`` the next graph output; ``public_name`` is its ONNX name (the importer
        gives one for every output; a hand-built graph gives none and its outputs keep their value
        names)."""
        if public_name is not None:
            if len(self.output_names) != len(self.outputs):
                raise ModelError(f"output {public_name!r}: the earlier outputs have no public names")
            self.output_names.append(public_name)
        self.outputs.append(value)
        return value

    def set_output(self, index: int, value: Value) -> None:
        """Make ``value`` graph output ``index`` in place of the one there (its public name stays)."""
        self.outputs[index] = value

    def add_constant(self, name: str, array: np.ndarray) -> Value:
        array = np.asarray(array)
        # ascontiguousarray makes 0-d arrays 1-d; keep the rank
        value = Value(self.unique_name(name), const=np.ascontiguousarray(array).reshape(array.shape))
        self.constants[value.name] = value
        return value

    def make_value(self, base: str, dtype: np.dtype | None, shape: tuple[int, ...] | None) -> Value:
        return Value(self.unique_name(base), dtype, shape)

    def add_node(self, node: Node, *, before: Node | None = None, after: Node | None = None) -> Node:
        """Insert ``node`` (at the end, or before/after another node) and link its values."""
        for value in node.outputs:  # check before linking anything, so a refusal changes nothing
            if value.producer is not None and value.producer is not node:
                raise ModelError(f"value {value.name!r} already has producer {value.producer.name!r}")
        position = len(self._nodes)
        if before is not None:
            position = self._index(before)
        elif after is not None:
            position = self._index(after) + 1
        if not node.name:
            node.name = self.unique_name(f"{node.op_type}_{len(self._nodes)}")
        else:
            self.reserve_name(node.name)
        node.graph = self
        for i, operand in enumerate(node._inputs):
            if operand is not None:
                operand.uses.append(Use(node, i))
        for value in node.outputs:
            value.producer = node
            self.reserve_name(value.name)
        self._nodes.insert(position, node)
        return node

    def _index(self, node: Node) -> int:
        for i, n in enumerate(self._nodes):
            if n is node:
                return i
        raise ValueError(f"{node!r} is not in the graph")

    def remove_node(self, node: Node) -> None:
        """Unlink and drop ``node``. Its outputs must be unused (or re-pointed first)."""
        for value in node.outputs:
            if value.uses:
                users = ", ".join(sorted({u.node.name for u in value.uses}))
                raise ValueError(f"cannot remove {node.name!r}: output {value.name!r} used by {users}")
            if self.is_graph_output(value):
                raise ValueError(f"cannot remove {node.name!r}: {value.name!r} is a graph output")
        for i, operand in enumerate(node._inputs):
            if operand is not None:
                operand.uses.remove(Use(node, i))
        for value in node.outputs:
            value.producer = None
        del self._nodes[self._index(node)]
        node.graph = None

    def set_input(self, node: Node, index: int, value: Value | None) -> None:
        old = node._inputs[index]
        if old is not None:
            old.uses.remove(Use(node, index))
        node._inputs[index] = value
        if value is not None:
            value.uses.append(Use(node, index))

    def set_inputs(self, node: Node, values: list[Value | None]) -> None:
        for i, operand in enumerate(node._inputs):
            if operand is not None:
                operand.uses.remove(Use(node, i))
        node._inputs = list(values)
        for i, operand in enumerate(node._inputs):
            if operand is not None:
                operand.uses.append(Use(node, i))

    def replace_all_uses(self, old: Value, new: Value) -> None:
        """Point every use of ``old`` (and graph outputs that are ``old``) at ``new``."""
        for use in list(old.uses):
            self.set_input(use.node, use.index, new)
        for i, value in enumerate(self.outputs):
            if value is old:
                self.outputs[i] = new

    def prune_constants(self) -> None:
        """Drop constants nothing uses."""
        for name in [n for n, v in self.constants.items() if not v.uses and not self.is_graph_output(v)]:
            del self.constants[name]

    def sort(self) -> None:
        """Re-establish topological order, keeping the current order wherever it is valid."""
        ready: set[int] = {id(v) for v in self.inputs} | {id(v) for v in self.constants.values()}
        pending = list(self._nodes)
        ordered: list[Node] = []
        while pending:
            progress = False
            rest: list[Node] = []
            for node in pending:
                if all(v is None or id(v) in ready for v in node._inputs):
                    ordered.append(node)
                    ready.update(id(v) for v in node.outputs)
                    progress = True
                else:
                    rest.append(node)
            if not progress:
                names = ", ".join(n.name for n in rest[:5])
                raise InternalError(f"graph has a cycle or a dangling input among nodes: {names}")
            pending = rest
        self._nodes = ordered

    # -- checking --------------------------------------------------------------------------
    def verify(self) -> None:
        """Check topological order, single producers, unique names, links, shapes and dtypes, and
        the attributes of our own ops against the op table (``runtime/contract.py``); InternalError
        listing what is wrong (a compiler bug: passes and the importer keep these invariants)."""
        problems: list[str] = []
        defined: dict[int, Value] = {}
        names: set[str] = set()

        def define(value: Value, where: str) -> None:
            if id(value) in defined:
                problems.append(f"value {value.name!r} defined twice ({where})")
            if value.name in names:
                problems.append(f"duplicate value name {value.name!r} ({where})")
            names.add(value.name)
            defined[id(value)] = value
            if value.shape is None or value.dtype is None:
                problems.append(f"value {value.name!r} has no static shape/dtype ({where})")

        for value in self.inputs:
            define(value, "graph input")
            if value.producer is not None:
                problems.append(f"graph input {value.name!r} has a producer")
        for name, value in self.constants.items():
            define(value, "constant")
            if name != value.name or value.const is None:
                problems.append(f"constant {name!r} is malformed")
        node_names: set[str] = set()
        for node in self._nodes:
            if node.name in node_names:
                problems.append(f"duplicate node name {node.name!r}")
            node_names.add(node.name)
            if node.graph is not self:
                problems.append(f"{node.describe()} is not owned by this graph")
            if node.domain == AOT_DOMAIN:
                problems += [f"{node.describe()}: {p}" for p in attr_problems(node.kind, node.attrs)]
            for i, operand in enumerate(node._inputs):
                if operand is None:
                    continue
                if id(operand) not in defined:
                    problems.append(f"{node.describe()} input {i} ({operand.name!r}) used before definition")
                elif Use(node, i) not in operand.uses:
                    problems.append(f"{node.describe()} input {i} ({operand.name!r}) missing from uses")
            for value in node.outputs:
                define(value, node.describe())
                if value.producer is not node:
                    problems.append(f"output {value.name!r} of {node.describe()} has a wrong producer")
        in_graph = {id(node) for node in self._nodes}
        for value in defined.values():
            for use in value.uses:
                if id(use.node) not in in_graph or use.node.input(use.index) is not value:
                    problems.append(f"stale use of {value.name!r} by {use.node.name!r}")
        for value in self.outputs:
            if id(value) not in defined:
                problems.append(f"graph output {value.name!r} is not defined")
        if problems:
            raise InternalError("IR verification failed:\n  " + "\n  ".join(problems[:20]))
