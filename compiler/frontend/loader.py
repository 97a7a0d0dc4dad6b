"""Read an ONNX model, check it, bring it into our opset range and bind its symbolic dimensions.

Everything here turns the failures of onnx's own loaders (protobuf decode errors, checker
failures, missing external data) into :class:`ModelError` messages naming the file, input or dim.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.checker
import onnx.shape_inference
import onnx.version_converter
from onnx import external_data_helper
from onnx import helper
from onnx import numpy_helper

from compiler.frontend.window_shapes import infer_with_pool_sizes
from runtime.errors import ModelError
from runtime.errors import ShapeError
from runtime.errors import UnsupportedOpError

__all__ = ["MIN_OPSET", "MAX_OPSET", "load_model", "bind_input_shapes", "bind_input_values", "infer_shapes",
           "opset_of"]

MIN_OPSET = 7
MAX_OPSET = onnx.defs.onnx_opset_version()


def load_model(
    model: str | os.PathLike[str] | onnx.ModelProto,
    large_out: dict[str, onnx.TensorProto] | None = None,
) -> onnx.ModelProto:
    """Load (with external data), check and version-convert ``model``.

    With ``large_out``, initializers over SKELETON_LIMIT bytes are moved into it and the returned
    model is a *skeleton* that lists them as typed graph inputs instead: the checker, the version
    converter and shape inference serialize the whole model, which for a 550 MB VGG-19 costs
    seconds, and none of them needs the weights' values.
    """
    if isinstance(model, onnx.ModelProto):
        proto = model
        where = f"model {proto.graph.name or '<unnamed>'}"
    else:
        path = Path(model)
        where = str(path)
        if not path.is_file():
            raise ModelError(f"{path}: no such model file")
        try:
            proto = onnx.load(str(path), load_external_data=False)
        except Exception as exc:  # protobuf DecodeError and friends
            raise ModelError(f"{path}: not a valid ONNX model ({type(exc).__name__}: {exc})") from None
        if not proto.graph.node and not proto.graph.output:
            raise ModelError(f"{path}: not a valid ONNX model (no graph)")
        _load_external_data(proto, path)
    _check_names(proto.graph, where)
    if large_out is not None:
        proto = _split_large_initializers(proto, large_out)
    try:
        onnx.checker.check_model(proto)
    except Exception as exc:
        raise ModelError(f"{where}: the ONNX checker rejected it: {_first_line(exc)}") from None
    opset = opset_of(proto)
    if opset < MIN_OPSET:
        try:
            proto = onnx.version_converter.convert_version(proto, MIN_OPSET)
        except Exception as exc:
            raise ModelError(
                f"{where}: opset {opset} is older than the supported {MIN_OPSET} and could not be "
                f"converted ({_first_line(exc)})"
            ) from None
    elif opset > MAX_OPSET:
        raise ModelError(f"{where}: opset {opset} is newer than the newest supported ({MAX_OPSET})")
    return proto


def _check_names(graph: onnx.GraphProto, where: str) -> None:
    """Every name is text: protobuf hands back ``bytes`` for a string field that is not UTF-8."""
    def bad(what: str, name: object) -> None:
        if not isinstance(name, str):
            raise ModelError(f"{where}: {what} {name!r} is not valid UTF-8 text")

    bad("graph name", graph.name)
    for info in (*graph.input, *graph.output, *graph.value_info):
        bad("value name", info.name)
    for tensor in graph.initializer:
        bad("initializer name", tensor.name)
    for node in graph.node:
        for what, name in (("node name", node.name), ("op type", node.op_type), ("domain", node.domain)):
            bad(what, name)
        for name in (*node.input, *node.output):
            bad(f"node {node.name!r}: value name", name)
        for attr in node.attribute:
            bad(f"node {node.name!r}: attribute name", attr.name)
            for sub in (*([attr.g] if attr.HasField("g") else []), *attr.graphs):
                _check_names(sub, where)


SKELETON_LIMIT = 1 << 16


def _tensor_nbytes(tensor: onnx.TensorProto) -> int:
    return tensor.ByteSize()  # (len(raw_data) would copy the bytes)


def _repeated(field: object) -> bool:
    if hasattr(field, "is_repeated"):  # protobuf >= 5
        return bool(field.is_repeated)
    return bool(field.label == field.LABEL_REPEATED)  # type: ignore[attr-defined]


def _copy_fields(src: Any, dst: Any, skip: str) -> None:
    """Copy every set field of protobuf message ``src`` but ``skip`` into ``dst`` (same type)."""
    for field, value in src.ListFields():
        if field.name == skip:
            continue
        if _repeated(field):
            getattr(dst, field.name).extend(value)
        elif field.message_type is not None:
            getattr(dst, field.name).CopyFrom(value)
        else:
            setattr(dst, field.name, value)


def _split_large_initializers(proto: onnx.ModelProto,
                              large: dict[str, onnx.TensorProto]) -> onnx.ModelProto:
    names = {t.name for t in proto.graph.initializer if _tensor_nbytes(t) > SKELETON_LIMIT}
    if not names:
        return proto
    skeleton = onnx.ModelProto()
    _copy_fields(proto, skeleton, skip="graph")
    graph = skeleton.graph
    _copy_fields(proto.graph, graph, skip="initializer")
    listed = {i.name for i in proto.graph.input}
    for tensor in proto.graph.initializer:
        if tensor.name not in names:
            graph.initializer.append(tensor)
            continue
        large[tensor.name] = tensor
        if tensor.name not in listed:
            graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type,
                                                                  list(tensor.dims)))
    return skeleton


def _load_external_data(proto: onnx.ModelProto, path: Path) -> None:
    """Read the tensors stored outside ``path``, naming a data file that is missing or unreadable."""
    tensors = list(proto.graph.initializer)
    for node in proto.graph.node:
        for attr in node.attribute:
            tensors.extend([attr.t] if attr.HasField("t") else list(attr.tensors))
    for tensor in tensors:
        if external_data_helper.uses_external_data(tensor):
            location = external_data_helper.ExternalDataInfo(tensor).location
            if not (path.parent / location).is_file():
                raise ModelError(
                    f"{path}: external data file missing: {path.parent / location} (tensor {tensor.name!r})"
                )
    try:
        external_data_helper.load_external_data_for_model(proto, str(path.parent))
    except Exception as exc:
        raise ModelError(f"{path}: external data cannot be read: {_first_line(exc)}") from None


def opset_of(proto: onnx.ModelProto) -> int:
    for entry in proto.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    raise ModelError("model imports no version of the default ONNX domain")


def bind_input_shapes(
    proto: onnx.ModelProto, shapes: dict[str, tuple[int, ...]] | None,
    constants: set[str] | None = None,
) -> onnx.ModelProto:
    """Return a copy of ``proto`` whose real graph inputs all have static shapes.

    ``shapes`` binds inputs by name; every symbolic or unknown dimension left unbound is an error
    naming the input and the dimension. ``constants`` names inputs that stand for initializers
    kept out of a skeleton model (they are not real inputs).
    """
    shapes = dict(shapes or {})
    proto = _copy(proto)
    initializers = {t.name for t in proto.graph.initializer} | set(constants or ())
    real_inputs = [i for i in proto.graph.input if i.name not in initializers]
    known = {i.name for i in real_inputs}
    unknown = sorted(set(shapes) - known)
    if unknown:
        raise ShapeError(
            f"--shape names no graph input: {', '.join(unknown)} (inputs: {', '.join(sorted(known))})"
        )
    for inp in real_inputs:
        if not inp.type.HasField("tensor_type"):
            raise UnsupportedOpError(f"input {inp.name!r} is not a tensor (only tensor inputs are supported)")
        ttype = inp.type.tensor_type
        dims = ttype.shape.dim
        if inp.name in shapes:
            want = tuple(int(d) for d in shapes[inp.name])
            if ttype.HasField("shape") and len(dims) != len(want):
                raise ShapeError(
                    f"input {inp.name!r} has rank {len(dims)} but --shape gives {len(want)} dims"
                )
            for k, (dim, size) in enumerate(zip(dims, want, strict=False)):
                if dim.HasField("dim_value") and dim.dim_value != size:
                    raise ShapeError(
                        f"input {inp.name!r} dim {k} is fixed at {dim.dim_value}, --shape gives {size}"
                    )
            if any(s < 0 for s in want):
                raise ShapeError(f"--shape for {inp.name!r} has a negative dimension: {want}")
            ttype.shape.ClearField("dim")
            for size in want:
                ttype.shape.dim.add().dim_value = size
            continue
        if not ttype.HasField("shape"):
            raise ShapeError(
                f"input {inp.name!r} has no shape; bind it with --shape {inp.name}=D0xD1x..."
            )
        for k, dim in enumerate(dims):
            if not dim.HasField("dim_value") or dim.dim_value < 0:
                label = f" ({dim.dim_param!r})" if dim.dim_param else ""
                raise ShapeError(
                    f"input {inp.name!r} dim {k}{label} is symbolic; bind it with "
                    f"--shape {inp.name}=" + "x".join("N" if not d.HasField("dim_value") else
                                                        str(d.dim_value) for d in dims)
                )
    return proto


def bind_input_values(proto: onnx.ModelProto, values: Mapping[str, Any] | None) -> onnx.ModelProto:
    """Return a copy of ``proto`` in which the graph inputs named in ``values`` are constants.

    This is ``--bind``: shapes, axes, pads, sizes or ``k`` passed as graph inputs become known at
    compile time. Each value is converted to the input's declared element type and reshaped to its
    declared shape (the element count must match); without a declared shape it stays as given.
    """
    if not values:
        return proto
    proto = _copy(proto)
    graph = proto.graph
    initializers = {t.name for t in graph.initializer}
    inputs = {i.name: i for i in graph.input if i.name not in initializers}
    unknown = sorted(set(values) - set(inputs))
    if unknown:
        raise ShapeError(f"--bind names no graph input: {', '.join(unknown)} "
                         f"(inputs: {', '.join(sorted(inputs))})")
    for name, raw in values.items():
        info = inputs[name]
        if not info.type.HasField("tensor_type"):
            raise UnsupportedOpError(f"--bind {name}: the input is not a tensor")
        ttype = info.type.tensor_type
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(ttype.elem_type))
            array = np.asarray(raw).astype(dtype)
        except (TypeError, ValueError, KeyError) as exc:
            raise ShapeError(f"--bind {name}: cannot convert the value to the input's element "
                             f"type: {exc}") from None
        if ttype.HasField("shape") and all(d.HasField("dim_value") for d in ttype.shape.dim):
            want = tuple(int(d.dim_value) for d in ttype.shape.dim)
            if int(np.prod(want, dtype=np.int64)) != array.size:
                raise ShapeError(f"--bind {name}: {array.size} value(s) given, the input has shape "
                                 f"{list(want)} ({int(np.prod(want, dtype=np.int64))} values)")
            array = array.reshape(want)
        graph.initializer.append(numpy_helper.from_array(np.array(array, order="C"), name))  # keeps 0-d
    kept = [i for i in graph.input if i.name not in values]
    del graph.input[:]
    graph.input.extend(kept)
    return proto


# Attribute defaults onnx's shape inference needs spelled out: it infers these function ops through
# their function bodies, which read the attribute and fail when it is absent (onnx 1.23).
_SPELLED_DEFAULTS = {"MeanVarianceNormalization": ("axes", [0, 2, 3]), "STFT": ("onesided", 1)}


def infer_shapes(proto: onnx.ModelProto) -> onnx.ModelProto:
    proto = _spell_defaults(proto)
    try:
        return infer_with_pool_sizes(proto, lambda model: onnx.shape_inference.infer_shapes(
            model, check_type=True, strict_mode=True, data_prop=True))
    except Exception as exc:
        raise ShapeError(f"shape inference failed: {_first_line(exc)}") from None


def _spell_defaults(proto: onnx.ModelProto) -> onnx.ModelProto:
    missing = [n for n in proto.graph.node if n.domain in ("", "ai.onnx") and n.op_type in _SPELLED_DEFAULTS
               and _SPELLED_DEFAULTS[n.op_type][0] not in {a.name for a in n.attribute}]
    if not missing:
        return proto
    proto = _copy(proto)
    for node in proto.graph.node:
        default = _SPELLED_DEFAULTS.get(node.op_type)
        if default and node.domain in ("", "ai.onnx") and default[0] not in {a.name for a in node.attribute}:
            node.attribute.append(helper.make_attribute(*default))
    return proto


def _copy(proto: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    return out


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[0][:500] if lines else text[:500]
