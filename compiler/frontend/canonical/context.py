"""What a canonicalizer sees of one ONNX node (``CanonContext``), and the conversions every
canonical form needs: ONNX attributes to Python values, ONNX element types to numpy dtypes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx import numpy_helper

from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from runtime.errors import ModelError
from runtime.errors import UnsupportedOpError

__all__ = ["CanonContext", "first_float", "flat_ints", "ints", "np_dtype_of", "onnx_attrs", "shape_of"]


# Element types onnx-aot computes in: numpy's own bool, integer and IEEE float types.
_NUMPY_DTYPES = frozenset(np.dtype(t) for t in (
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64))


def np_dtype_of(elem_type: int, what: str) -> np.dtype:
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except Exception:
        raise UnsupportedOpError(f"{what}: unsupported element type {elem_type}") from None
    if dtype not in _NUMPY_DTYPES:  # also rejects bfloat16 / float8 / int4 (ml_dtypes' types)
        raise UnsupportedOpError(f"{what}: unsupported element type "
                                 f"{onnx.TensorProto.DataType.Name(elem_type).lower()}")
    return dtype


def onnx_attrs(node: onnx.NodeProto) -> dict[str, Any]:
    """The node's attributes as Python values (tensors become numpy arrays)."""
    out: dict[str, Any] = {}
    for attr in node.attribute:
        if attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
            out[attr.name] = attr  # control flow: left for the partitioner to reject
            continue
        value = helper.get_attribute_value(attr)
        if isinstance(value, onnx.TensorProto):
            value = numpy_helper.to_array(value)
        elif isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            value = [v.decode("utf-8", "replace") for v in value]
        out[attr.name] = value
    return out


@dataclass
class CanonContext:
    """What a canonicalizer sees of one ONNX node."""

    proto: onnx.NodeProto
    name: str
    attrs: dict[str, Any]
    inputs: list[Value | None]
    outputs: list[Value]
    opset: int
    graph: Graph
    used: frozenset[str]  # ONNX value names something consumes (or the graph outputs)
    # why a value is not known at compile time and what to do (the importer's Knowledge.explain)
    explain: Callable[[str], str] | None = None

    @property
    def op_type(self) -> str:
        return self.proto.op_type

    def describe(self) -> str:
        return f"node {self.name!r} ({self.op_type})"

    def error(self, message: str) -> ModelError:
        return ModelError(f"{self.describe()}: {message}")

    def attr(self, key: str, default: Any) -> Any:
        return self.attrs[key] if key in self.attrs else default

    def rank(self, i: int = 0) -> int:
        value = self.inputs[i]
        assert value is not None and value.shape is not None
        return len(value.shape)

    def const_input(self, i: int, what: str) -> np.ndarray | None:
        """The constant value of input ``i`` (None when omitted); an error when not constant."""
        value = self.inputs[i] if i < len(self.inputs) else None
        if value is None:
            return None
        if value.const is None:
            why = f": {self.explain(value.name)}" if self.explain is not None else ""
            raise self.error(
                f"input {i} ({what}, {value.name!r}) must be a constant for ahead-of-time compilation{why}"
            )
        return value.const

    def axis(self, axis: int, rank: int) -> int:
        if not -rank <= axis < max(rank, 1):
            raise self.error(f"axis {axis} out of range for rank {rank}")
        return axis + rank if axis < 0 else axis

    def node(self, op_type: str, inputs: list[Value | None], attrs: dict[str, Any],
             outputs: list[Value] | None = None, *, domain: str = "", name: str | None = None) -> Node:
        while inputs and inputs[-1] is None:
            inputs = inputs[:-1]
        return Node(op_type, inputs, outputs if outputs is not None else self.outputs, attrs,
                    name=name if name is not None else self.name, domain=domain, origin=[self.name])


def shape_of(value: Value | None) -> tuple[int, ...]:
    """The static shape of a value the canonicalizer knows is present and shaped."""
    assert value is not None and value.shape is not None
    return value.shape


def ints(values: Any) -> list[int]:
    """A list of ints from an attribute list or a 1-D constant."""
    return [int(v) for v in values]


def flat_ints(values: Any) -> list[int]:
    """A list of ints from an array of any rank, flattened."""
    return [int(v) for v in np.asarray(values).reshape(-1)]


def first_float(value: Any) -> float:
    """The first element of a constant as a float (0.0 when it is empty)."""
    return float(np.asarray(value).reshape(-1)[0]) if np.asarray(value).size else 0.0
