"""Static sequences: ONNX sequence values whose length and element shapes are known at compile time.

A sequence is held in the importer's name -> value table as a :class:`SeqValue`, a Python list of
the tensor IR values that are its elements; no sequence type reaches the IR, the plan or the
kernels. The sequence ops become what they do to that list: SequenceConstruct / SequenceInsert /
SequenceErase / SequenceAt / SequenceLength move values around (positions must be known at compile
time), ConcatFromSequence becomes a Concat (Unsqueeze + Concat with ``new_axis``), SplitToSequence
Slices (Gathers with ``keepdims=0``), SequenceMap its body inlined once per element. Control flow
carries them too (an unrolled Loop, an If; see control/). A sequence graph output becomes its
elements as graph outputs ``NAME.0``, ``NAME.1``, ... (``element_name``); the ONNX backend regroups
them, and feeds a sequence input as tensor inputs of those names (compiler/backend.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper

from compiler.frontend.control.scope import ControlScope
from compiler.frontend.control.scope import element
from compiler.frontend.control.scope import inline
from compiler.ir.graph import Value
from runtime.errors import ModelError
from runtime.errors import UnsupportedOpError
from runtime.symbolic import Expr

__all__ = ["SEQUENCE_OPS", "SEQUENCE_COMPILE_TIME_INPUTS", "OptValue", "SeqValue", "element_name",
           "graph_outputs", "import_sequence_op", "is_sequence_node", "refuse_sequences"]

# (with the optional ops: an optional's presence is known at compile time too)
SEQUENCE_OPS = frozenset({"SequenceEmpty", "SequenceConstruct", "SequenceInsert", "SequenceAt",
                          "SequenceErase", "SequenceLength", "ConcatFromSequence", "SplitToSequence",
                          "SequenceMap", "Optional", "OptionalHasElement", "OptionalGetElement"})
# node inputs whose values the import needs (positions, a split): the backend binds graph inputs
# they come from, as for COMPILE_TIME_INPUTS
SEQUENCE_COMPILE_TIME_INPUTS = {"SequenceInsert": (2,), "SequenceAt": (1,), "SequenceErase": (1,),
                                "SplitToSequence": (1,)}


class SeqValue(Value):
    """A sequence of compile-time length: ``items`` are its elements (tensor values, each with its
    own static shape), ``elem_dtype`` their dtype (known for an empty sequence too). It only lives
    in the importer's table: it has no dtype or shape of its own and no node ever reads it."""

    __slots__ = ("items", "elem_dtype")

    def __init__(self, name: str, items: Sequence[Value], elem_dtype: Any) -> None:
        super().__init__(name)
        self.items = list(items)
        self.elem_dtype = np.dtype(elem_dtype)

    def __repr__(self) -> str:
        return f"<sequence {self.name!r} of {len(self.items)} {self.elem_dtype}>"


class OptValue(Value):
    """An optional whose presence is known at compile time: ``item`` is what it holds (a tensor
    value or a SeqValue), or None. Like a SeqValue it only lives in the importer's table."""

    __slots__ = ("item",)

    def __init__(self, name: str, item: Value | None) -> None:
        super().__init__(name)
        self.item = item

    def __repr__(self) -> str:
        return f"<optional {self.name!r} holding {self.item!r}>"


def graph_outputs(name: str, value: Value) -> list[tuple[str, Value]]:
    """The graph outputs (public name, tensor value) that graph output ``name`` becomes: a sequence
    its elements (``element_name``), an optional what it holds (nothing when it is empty)."""
    if isinstance(value, OptValue):
        return [] if value.item is None else graph_outputs(name, value.item)
    if isinstance(value, SeqValue):
        return [(element_name(name, k), item) for k, item in enumerate(value.items)]
    return [(name, value)]


def element_name(name: str, k: int) -> str:
    """The graph output (or backend input) holding element ``k`` of sequence ``name``."""
    return f"{name}.{k}"


def is_sequence_node(node: onnx.NodeProto, env: dict[str, Value]) -> bool:
    """Whether the sequence import handles ``node``: a sequence or optional op, or an Identity of a
    sequence or an optional."""
    if node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type == "Identity":
        return bool(node.input) and isinstance(env.get(node.input[0]), (SeqValue, OptValue))
    return node.op_type in SEQUENCE_OPS


def refuse_sequences(inputs: Sequence[Value | None], where: str, node: tuple[str, str],
                     why: str = "which this op cannot take") -> None:
    """A tensor op (or a run-time control step) reading a sequence: UnsupportedOpError naming it."""
    for k, value in enumerate(inputs):
        if isinstance(value, (SeqValue, OptValue)):
            what = "a sequence" if isinstance(value, SeqValue) else "an optional"
            raise UnsupportedOpError(f"{where}: input {k} ({value.name!r}) is {what}, {why} (onnx-aot "
                                     "supports sequences of compile-time length and optionals present or "
                                     "not at compile time: docs/ops.md)", [node])


def _attr(node: onnx.NodeProto, key: str, default: object) -> object:
    for attr in node.attribute:
        if attr.name == key:
            return helper.get_attribute_value(attr)
    return default


def _seq(scope: ControlScope, name: str, where: str) -> SeqValue:
    value = scope.value(name, where)
    if not isinstance(value, SeqValue):
        raise ModelError(f"{where}: input {name!r} is not a sequence")
    return value


def _position(scope: ControlScope, node: onnx.NodeProto, k: int, count: int, default: int | None,
              name: str, where: str) -> int:
    """Input ``k`` of ``node`` as a position among ``count`` (negative counts from the end); it must
    be known at compile time. ``default`` where the input is absent."""
    if len(node.input) <= k or not node.input[k]:
        assert default is not None
        return default
    found = element(scope.value(node.input[k], where))
    if found is None or isinstance(found, Expr):
        raise UnsupportedOpError(f"{where}: the position {node.input[k]!r} is known only at run time; "
                                 "onnx-aot needs sequence positions at compile time (--bind the inputs it "
                                 "depends on)",
                                 [(name, node.op_type)])
    position = int(found) + (count if int(found) < 0 else 0)
    if not 0 <= position <= count - (0 if node.op_type == "SequenceInsert" else 1):
        raise ModelError(f"{where}: position {int(found)} is out of range for a sequence of {count}")
    return position


def import_sequence_op(scope: ControlScope, node: onnx.NodeProto, name: str) -> None:
    """Import sequence op ``node`` (named ``name`` in messages) into ``scope``."""
    where = f"node {name!r} ({node.op_type})"
    op = node.op_type
    out = node.output[0] if node.output else ""
    if op == "SequenceMap":
        _sequence_map(scope, node, name, where)
    elif op == "SequenceEmpty":
        dtype = helper.tensor_dtype_to_np_dtype(int(_attr(node, "dtype", onnx.TensorProto.FLOAT)))  # type: ignore[call-overload]
        scope.env[out] = SeqValue(out, [], dtype)
    elif op == "SequenceConstruct":
        items = [scope.value(n, where) for n in node.input]
        refuse_sequences(items, where, (name, op))
        if len({v.dtype for v in items}) != 1:
            raise ModelError(f"{where}: its inputs differ in element type")
        scope.env[out] = SeqValue(out, items, items[0].dtype or np.float32)
    elif op == "SplitToSequence":
        _split_to_sequence(scope, node, name, where)
    elif op == "ConcatFromSequence":
        _concat_from_sequence(scope, node, name, where)
    elif op.startswith("Optional"):
        _optional(scope, node, name, where)
    else:
        _positional(scope, node, name, where)
    scope.graph.eliminated[name] = "sequence op: resolved at compile time"


def _positional(scope: ControlScope, node: onnx.NodeProto, name: str, where: str) -> None:
    """Identity, SequenceInsert / At / Erase / Length: the list itself changes."""
    if node.op_type == "Identity":
        scope.env[node.output[0]] = scope.value(node.input[0], where)
        return
    seq = _seq(scope, node.input[0], where)
    items, out, op = list(seq.items), node.output[0], node.op_type
    if op == "SequenceLength":
        scope.env[out] = scope.env[scope.constant(f"{name}/length", np.array(len(items), np.int64))]
    elif op == "SequenceAt":
        scope.env[out] = items[_position(scope, node, 1, len(items), None, name, where)]
    elif op == "SequenceErase":
        del items[_position(scope, node, 1, len(items), len(items) - 1, name, where)]
        scope.env[out] = SeqValue(out, items, seq.elem_dtype)
    else:  # SequenceInsert
        tensor = scope.value(node.input[1], where)
        refuse_sequences([tensor], where, (name, op))
        if tensor.dtype != seq.elem_dtype:
            raise ModelError(f"{where}: inserts {tensor.dtype} into a sequence of {seq.elem_dtype}")
        items.insert(_position(scope, node, 2, len(items), len(items), name, where), tensor)
        scope.env[out] = SeqValue(out, items, seq.elem_dtype)


def _optional(scope: ControlScope, node: onnx.NodeProto, name: str, where: str) -> None:
    """Optional / OptionalHasElement (a constant) / OptionalGetElement; the latter two also take a
    tensor or a sequence (present), and OptionalHasElement no input (empty)."""
    given = node.input[0] if node.input and node.input[0] else None
    value = scope.value(given, where) if given else None
    out = node.output[0]
    if node.op_type == "Optional":
        scope.env[out] = OptValue(out, value)
    elif node.op_type == "OptionalHasElement":
        present = value.item is not None if isinstance(value, OptValue) else value is not None
        scope.env[out] = scope.env[scope.constant(f"{name}/present", np.array(present))]
    else:
        item = value.item if isinstance(value, OptValue) else value
        if item is None:
            raise ModelError(f"{where}: the optional {given!r} is empty")
        scope.env[out] = item


def _named(scope: ControlScope, value: Value, base: str) -> str:
    """A name under which ``value`` (an element) is in the table, for nodes to read it by."""
    name = scope.fresh(base)
    scope.env[name] = value
    return name


def _concat_from_sequence(scope: ControlScope, node: onnx.NodeProto, name: str, where: str) -> None:
    seq = _seq(scope, node.input[0], where)
    if not seq.items:
        raise UnsupportedOpError(f"{where}: concatenates an empty sequence (empty tensors are not supported)",
                                 [(name, node.op_type)])
    axis = int(_attr(node, "axis", 0))  # type: ignore[call-overload]
    new_axis = int(_attr(node, "new_axis", 0))  # type: ignore[call-overload]
    names = [_named(scope, v, f"{name}/item{k}") for k, v in enumerate(seq.items)]
    if new_axis:
        rank = len(seq.items[0].shape or ())
        axis = axis + rank + 1 if axis < 0 else axis
        if scope.opset < 13:
            names = [scope.emit("Unsqueeze", [n], name, axes=[axis]) for n in names]
        else:
            axes = scope.constant(f"{name}/axes", np.array([axis], np.int64))
            names = [scope.emit("Unsqueeze", [n, axes], name) for n in names]
    result = scope.emit("Concat", names, name, axis=axis)
    scope.env[node.output[0]] = scope.env[result]


def _split_to_sequence(scope: ControlScope, node: onnx.NodeProto, name: str, where: str) -> None:
    x = scope.value(node.input[0], where)
    refuse_sequences([x], where, (name, node.op_type))
    rank = len(x.shape or ())
    axis = int(_attr(node, "axis", 0))  # type: ignore[call-overload]
    axis = axis + rank if axis < 0 else axis
    length = (x.shape or ())[axis] if 0 <= axis < rank else None
    if not isinstance(length, int):
        raise UnsupportedOpError(f"{where}: axis {axis} of {x.name!r} has no compile-time length",
                                 [(name, node.op_type)])
    keepdims = int(_attr(node, "keepdims", 1))  # type: ignore[call-overload]
    items: list[Value] = []
    if len(node.input) < 2 or not node.input[1]:
        for k in range(length):
            index = scope.constant(f"{name}/index", np.array(k if not keepdims else [k], np.int64))
            items.append(scope.env[scope.emit("Gather", [node.input[0], index], name, axis=axis)])
    else:
        for start, stop in _chunks(scope, node, length, name, where):
            bounds = [scope.constant(f"{name}/bound", np.array([b], np.int64)) for b in (start, stop, axis)]
            items.append(scope.env[scope.emit("Slice", [node.input[0], *bounds], name)])
    scope.env[node.output[0]] = SeqValue(node.output[0], items, x.dtype or np.float32)


def _chunks(scope: ControlScope, node: onnx.NodeProto, length: int, name: str,
            where: str) -> list[tuple[int, int]]:
    """The (start, stop) of each piece SplitToSequence's ``split`` input asks for."""
    split = scope.value(node.input[1], where)
    if split.const is None or split.const.dtype == object:
        raise UnsupportedOpError(f"{where}: the split {node.input[1]!r} is known only at run time; onnx-aot "
                                 "needs it at compile time (--bind the inputs it depends on)",
                                 [(name, node.op_type)])
    sizes = [int(s) for s in split.const.reshape(-1)]
    if split.const.ndim == 0:
        sizes = [sizes[0]] * (length // sizes[0]) + ([length % sizes[0]] if length % sizes[0] else [])
    if sum(sizes) != length or any(s <= 0 for s in sizes):
        raise ModelError(f"{where}: split {sizes} does not cover the axis of length {length}")
    starts = np.cumsum([0, *sizes]).tolist()
    return list(zip(starts[:-1], starts[1:], strict=True))


def _sequence_map(scope: ControlScope, node: onnx.NodeProto, name: str, where: str) -> None:
    """SequenceMap: the body inlined once per element of the first input sequence; each body output
    collects into an output sequence."""
    body = next((a.g for a in node.attribute if a.name == "body"), None)
    if body is None or len(body.input) != len(node.input) or len(body.output) != len(node.output):
        raise ModelError(f"{where}: the body's inputs/outputs do not match the node's")
    inputs = [scope.value(n, where) for n in node.input]
    first = inputs[0]
    if not isinstance(first, SeqValue):
        raise ModelError(f"{where}: input 0 is not a sequence")
    count = len(first.items)
    if any(isinstance(v, SeqValue) and len(v.items) != count for v in inputs):
        raise ModelError(f"{where}: its input sequences differ in length")
    results: list[list[Value]] = [[] for _ in node.output]
    for k in range(count):
        base = f"{name}/elem{k}"
        bindings = {info.name: (_named(scope, v.items[k], f"{base}/in") if isinstance(v, SeqValue) else n)
                    for info, v, n in zip(body.input, inputs, node.input, strict=True)}
        for j, out in enumerate(inline(scope, body, base, bindings, where)):
            value = scope.env[out]
            refuse_sequences([value], where, (name, node.op_type))
            results[j].append(value)
    for out, items, info in zip(node.output, results, body.output, strict=True):
        elem = info.type.tensor_type.elem_type if info.type.HasField("tensor_type") else 0
        dtype = items[0].dtype if items else helper.tensor_dtype_to_np_dtype(elem or onnx.TensorProto.FLOAT)
        if out:
            scope.env[out] = SeqValue(out, items, dtype or np.float32)
