"""onnx's shape inference of one node at many bindings of the symbols, in one call.

Checking a fitted dim (``fit_check.py``) takes onnx's inference of the node at hundreds of sizes.
One model per size costs ~100 us of model building and serialization each; one model holding a
copy of the node per size, its inputs renamed per copy where they depend on the symbols (static
ones shared), costs a few us of inference per copy. Inference runs in onnx's default mode: a copy
whose inference fails gets no output type (strict mode would fail them all), which is what a size
the node refuses reads as.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper
from onnx import numpy_helper

from compiler.frontend.window_shapes import infer_with_pool_sizes
from compiler.ir.evaluate import concrete_shape
from compiler.ir.graph import Value
from runtime.symbolic import evaluate

__all__ = ["OutputTypes", "infer_many"]

OutputTypes = dict[str, tuple[np.dtype, tuple[int, ...]]]
MAX_CONST = 4096  # larger constants (weights) are typed inputs: inference needs their type only


def infer_many(proto: onnx.NodeProto, inputs: Sequence[Value | None], opset: int,
               bindings: Sequence[Mapping[str, int]]) -> list[OutputTypes | None]:
    """Per binding, the static output types onnx infers for ``proto`` with its inputs taken there
    (None where it infers none)."""
    if not bindings:
        return []
    graph = onnx.GraphProto(name="many")
    symbolic = {name for name, v in zip(proto.input, inputs, strict=True) if v is not None and v.is_symbolic}
    added: set[str] = set()
    for name, value in zip(proto.input, inputs, strict=True):
        if value is not None and name not in symbolic and name not in added:
            added.add(name)
            _add_input(graph, name, value, None)
    outputs = [n for n in proto.output if n]
    for k, binding in enumerate(bindings):
        node = graph.node.add()
        node.CopyFrom(proto)
        node.name = f"{proto.name}__{k}"
        del node.input[:]
        node.input.extend(f"{n}__{k}" if n in symbolic else n for n in proto.input)
        del node.output[:]
        node.output.extend(f"{n}__{k}" if n else "" for n in proto.output)
        for name, value in zip(proto.input, inputs, strict=True):
            if name in symbolic and f"{name}__{k}" not in added:
                added.add(f"{name}__{k}")
                _add_input(graph, f"{name}__{k}", value, binding)
        graph.output.extend(helper.make_empty_tensor_value_info(f"{n}__{k}") for n in outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    try:
        inferred = infer_with_pool_sizes(model, _infer)
    except Exception:
        return [None] * len(bindings)
    types = {info.name: info.type for info in [*inferred.graph.value_info, *inferred.graph.output]}
    results: list[OutputTypes | None] = []
    for k in range(len(bindings)):
        found: OutputTypes = {}
        for name in outputs:
            read = _static(types.get(f"{name}__{k}"))
            if read is not None:
                found[name] = read
        results.append(found or None)
    return results


def _infer(model: onnx.ModelProto) -> onnx.ModelProto:
    return onnx.shape_inference.infer_shapes(model, data_prop=True)


def _add_input(graph: onnx.GraphProto, name: str, value: Value | None,
               binding: Mapping[str, int] | None) -> None:
    assert value is not None and value.dtype is not None and value.shape is not None
    elem = helper.np_dtype_to_tensor_dtype(value.dtype)
    shape = concrete_shape(value.shape, binding) if binding is not None else tuple(value.shape)
    const = value.const
    if const is not None and const.dtype == object and binding is not None:
        flat = [evaluate(d, binding) for d in const.reshape(-1)]
        if value.dtype == np.int64:  # (a shape computation's values: the common case, built fast)
            graph.initializer.add(name=name, data_type=elem, dims=list(const.shape), int64_data=flat)
        else:
            array = np.array(flat, dtype=value.dtype).reshape(const.shape)
            graph.initializer.append(numpy_helper.from_array(array, name))
    elif const is not None and const.size <= MAX_CONST:
        graph.initializer.append(numpy_helper.from_array(const, name))
    info = graph.input.add(name=name)
    info.type.tensor_type.elem_type = elem
    dims = info.type.tensor_type.shape.dim
    for size in shape:
        dims.add(dim_value=int(size))


def _static(ttype: onnx.TypeProto | None) -> tuple[np.dtype, tuple[int, ...]] | None:
    if ttype is None or not ttype.HasField("tensor_type") or not ttype.tensor_type.HasField("shape"):
        return None
    tt = ttype.tensor_type
    dims = []
    for dim in tt.shape.dim:
        if not dim.HasField("dim_value") or dim.dim_value < 0:
            return None
        dims.append(int(dim.dim_value))
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)), tuple(dims)
    except Exception:
        return None
