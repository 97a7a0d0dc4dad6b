"""Read an ONNX model, check it, bring it into our opset range and bind its symbolic dimensions.

Everything here turns the failures of onnx's own loaders (protobuf decode errors, checker
failures, missing external data) into :class:`ModelError` messages naming the file, input or dim.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
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

from compiler.frontend.dims import DimSpec
from compiler.frontend.dims import dim_label
from compiler.frontend.dims import dim_text
from compiler.frontend.dims import known_size
from compiler.frontend.dims import placeholders
from compiler.frontend.dims import shape_arg
from compiler.frontend.dims import symbol_name
from compiler.frontend.quirks import tolerate_quirks
from compiler.frontend.window_shapes import infer_with_pool_sizes
from runtime.errors import ModelError
from runtime.errors import ShapeError
from runtime.errors import UnsupportedOpError

__all__ = ["MIN_OPSET", "MAX_OPSET", "BoundInputs", "load_model", "bind_input_dims", "bind_input_shapes",
           "bind_input_values", "infer_shapes", "opset_of"]

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
    proto = tolerate_quirks(proto, where)
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


@dataclass
class BoundInputs:
    """A model whose real graph inputs have every dim bound: a size, or a symbol (its ``dim_param``
    is the symbol's name) with an inclusive range in ``ranges``."""

    proto: onnx.ModelProto
    ranges: dict[str, tuple[int, int]]


def bind_input_shapes(
    proto: onnx.ModelProto, shapes: Mapping[str, Sequence[Any]] | None,
    constants: set[str] | None = None,
) -> onnx.ModelProto:
    """:func:`bind_input_dims` for static sizes only: the bound copy of ``proto``."""
    bound = bind_input_dims(proto, shapes, None, constants)
    return bound.proto


def bind_input_dims(
    proto: onnx.ModelProto, shapes: Mapping[str, Sequence[Any]] | None,
    dims: Mapping[str, Any] | None = None, constants: set[str] | None = None,
) -> BoundInputs:
    """A copy of ``proto`` whose real graph inputs all have bound dims, and the symbols' ranges.

    ``shapes`` binds inputs by name (``--shape``): each dim a size or a range ``(LO, HI)``; it may
    give any unknown dim (see compiler/frontend/dims.py: a ``dim_param``, no value, or a negative
    value) and must agree with the known ones. ``dims`` binds ``dim_param`` names wherever they
    appear (``--dim``). A range with LO < HI becomes a symbol. Unknown dims left unbound are one
    error listing every such input, with ``--shape`` text to paste. ``constants`` names inputs that
    stand for initializers kept out of a skeleton model (they are not real inputs).
    """
    given = {name: _given_dims(f"--shape for {name!r}", dims_) for name, dims_ in (shapes or {}).items()}
    symbols = _Symbols({p: _given_range(f"--dim {p}", r) for p, r in (dims or {}).items()})
    proto = _copy(proto)
    initializers = {t.name for t in proto.graph.initializer} | set(constants or ())
    real_inputs = [i for i in proto.graph.input if i.name not in initializers]
    known = {i.name for i in real_inputs}
    stray = sorted(set(given) - known)
    if stray:
        consts = [n for n in stray if n in initializers]
        also = f"; {', '.join(map(repr, consts))} is a constant (an initializer or --bind)" if consts else ""
        raise ShapeError(f"--shape names no graph input: {', '.join(stray)} "
                         f"(inputs: {', '.join(sorted(known)) or 'none'}){also}")
    unbound = []
    for inp in real_inputs:
        if not inp.type.HasField("tensor_type"):
            raise UnsupportedOpError(f"graph input {inp.name!r} is not a tensor (only tensor inputs are "
                                     "supported; the ONNX backend feeds a sequence or optional input as its "
                                     "elements: docs/ops.md)")
        ttype = inp.type.tensor_type
        sizes = [known_size(d) for d in ttype.shape.dim]
        if inp.name in given:
            _bind_sizes(inp.name, ttype, given[inp.name], symbols)
        elif not ttype.HasField("shape") or any(size is None and d.dim_param not in symbols.params
                                                 for d, size in zip(ttype.shape.dim, sizes, strict=True)):
            unbound.append(inp)
        elif None in sizes:  # every unknown dim is a --dim name
            _bind_sizes(inp.name, ttype, [symbols.params[d.dim_param] if size is None else size
                                          for d, size in zip(ttype.shape.dim, sizes, strict=True)], symbols)
    if unbound:
        raise ShapeError(_unbound_message(unbound, symbols.params))
    symbols.check_all_used(real_inputs)
    return BoundInputs(proto, symbols.ranges)


class _Symbols:
    """Names the symbols of ranged dims (after their ``dim_param``, else ``INPUT_K``) and keeps one
    range per symbol: inputs that share a ``dim_param`` share its symbol."""

    def __init__(self, params: dict[str, DimSpec]) -> None:
        self.params = params  # --dim: dim_param -> size or range
        self.ranges: dict[str, tuple[int, int]] = {}
        self._by_param: dict[str, str] = {}
        self._used: set[str] = set()

    def bind(self, what: str, dim: onnx.TensorShapeProto.Dimension, spec: DimSpec, label: str) -> None:
        """Give ``dim`` (dim ``label`` of an input, described by ``what``) the size or range ``spec``."""
        param = dim.dim_param if dim.HasField("dim_param") and dim.dim_param not in ("", "?") else ""
        if param in self.params:
            self._used.add(param)
            if _normal(self.params[param]) != _normal(spec):
                raise ShapeError(f"{what}: --shape gives {dim_text(spec)}, --dim {param} gives "
                                 f"{dim_text(self.params[param])}; give one of them")
        spec = _normal(spec)
        dim.Clear()
        if not isinstance(spec, tuple):
            dim.dim_value = spec
            return
        name = self._by_param.get(param) if param else None
        if name is None:
            name = self._fresh(symbol_name(param or label))
            if param:
                self._by_param[param] = name
        if self.ranges.setdefault(name, spec) != spec:
            raise ShapeError(f"{what}: range {dim_text(spec)}, but dim_param {param!r} is given "
                             f"{dim_text(self.ranges[name])} on another input; inputs that share a "
                             f"dim_param share its range")
        dim.dim_param = name

    def _fresh(self, base: str) -> str:
        name, n = base, 2
        while name in self.ranges or name in self._by_param.values():
            name, n = f"{base}_{n}", n + 1
        return name

    def check_all_used(self, inputs: list[onnx.ValueInfoProto]) -> None:
        unused = sorted(set(self.params) - self._used)
        if unused:
            have = sorted({d.dim_param for i in inputs for d in i.type.tensor_type.shape.dim
                           if d.HasField("dim_param") and d.dim_param} - set(self.params))
            raise ShapeError(f"--dim {unused[0]}: no graph input has a dim named {unused[0]!r} (the "
                             f"inputs' other dim_params: {', '.join(map(repr, have)) or 'none'})")


def _normal(spec: DimSpec) -> DimSpec:
    """A range of one size is that size."""
    return spec[0] if isinstance(spec, tuple) and spec[0] == spec[1] else spec


def _size(what: str, value: Any) -> int:
    try:
        if isinstance(value, bool):
            raise TypeError
        size = operator.index(value)
    except TypeError:
        raise ShapeError(f"{what} is {value!r}, not a number; give the size to compile for") from None
    if size < 0:
        raise ShapeError(f"{what} is {size}, a negative size; give the size to compile for (-1 means "
                         f"unknown only inside a model)")
    return size


def _given_range(what: str, value: Any) -> DimSpec:
    """A size, or a range ``(LO, HI)`` with ``1 <= LO <= HI`` (a range of one size is that size)."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ShapeError(f"{what} is {value!r}: a range is (LO, HI), two sizes")
        lo, hi = _size(f"{what} LO", value[0]), _size(f"{what} HI", value[1])
        if lo > hi:
            raise ShapeError(f"{what} is {lo}..{hi}: LO is above HI")
        if lo == 0 and hi > 0:
            raise ShapeError(f"{what} is {lo}..{hi}: a range starts at 1 or more (a 0 size is an "
                             f"empty tensor: compile it on its own)")
        return _normal((lo, hi))
    return _size(what, value)


def _given_dims(what: str, dims: Sequence[Any]) -> tuple[DimSpec, ...]:
    """The dims ``--shape`` / ``shapes=`` gives an input: sizes >= 0 (0: an empty tensor) or ranges."""
    return tuple(_given_range(f"{what}: dim {k}", dim) for k, dim in enumerate(dims))


def _bind_sizes(name: str, ttype: onnx.TypeProto.Tensor, want: Sequence[DimSpec], symbols: _Symbols) -> None:
    """Give ``ttype`` the dims ``want``, which must have its rank and agree with its known dims."""
    dims = ttype.shape.dim
    if ttype.HasField("shape"):
        model = [known_size(d) for d in dims]
        if len(model) != len(want):
            hint = shape_arg(name, placeholders(model, [d.dim_param for d in dims]))
            raise ShapeError(f"input {name!r} has rank {len(model)} ({_shape_text(dims)}) but --shape "
                             f"gives {len(want)} dims; e.g. {hint}")
        clash = [k for k, size in enumerate(model) if size is not None and size != _normal(want[k])]
        if clash:
            k = clash[0]
            fixed = [size if size is not None else w for size, w in zip(model, want, strict=True)]
            kind = "a range " if isinstance(_normal(want[k]), tuple) else ""
            raise ShapeError(f"input {name!r} dim {k} is fixed at {model[k]} by the model, --shape gives "
                             f"{kind}{dim_text(want[k])}; e.g. {shape_arg(name, fixed)}")
    else:
        for _ in want:
            dims.add()
    for k, (dim, spec) in enumerate(zip(ttype.shape.dim, want, strict=True)):
        symbols.bind(f"input {name!r} dim {k}", dim, spec, f"{name}_{k}")


def _unbound_message(unbound: list[onnx.ValueInfoProto], bound: Mapping[str, DimSpec]) -> str:
    """One message for every input with unknown dims left unbound, ending in ``--shape`` text."""
    described: list[tuple[str, list[str]]] = []  # (input, its unknown dims; [] for no shape)
    hints, shapeless = [], []
    chosen: dict[str, int] = {}
    for inp in unbound:
        ttype = inp.type.tensor_type
        if not ttype.HasField("shape"):
            described.append((inp.name, []))
            shapeless.append(repr(inp.name))
            continue
        dims = ttype.shape.dim
        described.append((inp.name, [f"dim {k} ({dim_label(d)})" for k, d in enumerate(dims)
                                     if known_size(d) is None and d.dim_param not in bound]))
        sizes = placeholders([known_size(d) for d in dims], [d.dim_param for d in dims], chosen)
        hints.append(shape_arg(inp.name, [bound.get(d.dim_param, size) if known_size(d) is None else size
                                          for d, size in zip(dims, sizes, strict=True)]))
    if len(described) > 1:
        listed = "; ".join(f"{name!r} {', '.join(dims) or 'no shape (not even a rank)'}"
                           for name, dims in described)
        text = f"{len(described)} inputs have unknown dims: {listed}"
    elif shapeless:
        text = f"input {described[0][0]!r} has no shape (not even a rank)"
    else:
        name, dims = described[0]
        count = "unknown dims" if len(dims) > 1 else "an unknown dim"
        text = f"input {name!r} has {count}: {', '.join(dims)}"
    if shapeless:
        text += f"; give every dim of {', '.join(shapeless)} with --shape NAME=D0xD1x..."
    if hints:
        text += ("; bind them with --shape (placeholder numbers in place of the unknown dims: edit "
                 f"them to the sizes you will run): {' '.join(hints)}")
    return text


def _shape_text(dims: Sequence[onnx.TensorShapeProto.Dimension]) -> str:
    return "[" + ", ".join(str(known_size(d)) if known_size(d) is not None else dim_label(d)
                           for d in dims) + "]"


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
        if ttype.HasField("shape") and all(known_size(d) is not None for d in ttype.shape.dim):
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
    """ONNX shape inference (strict, with data propagation) over ``proto``, its unknown dims bound.

    Negative dims the model declares for intermediate values and outputs are unknown, not -1:
    they are cleared first, so inference fills them in (onnx would refuse a size it infers
    against a declared -1).
    """
    proto = _spell_defaults(_forget_negative_dims(proto))
    try:
        return infer_with_pool_sizes(proto, lambda model: onnx.shape_inference.infer_shapes(
            model, check_type=True, strict_mode=True, data_prop=True))
    except Exception as exc:
        raise ShapeError(f"shape inference failed: {_first_line(exc)}") from None


def _forget_negative_dims(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``proto`` whose value_info and outputs (and subgraphs' inputs) declare no negative
    dim: each becomes a dim without a value (graph inputs are bound before; unbound ones keep
    their -1, which the importer names in its error)."""
    def infos(graph: onnx.GraphProto, top: bool) -> list[onnx.ValueInfoProto]:
        found = [*([] if top else graph.input), *graph.value_info, *graph.output]
        for node in graph.node:
            for attr in node.attribute:
                for sub in (*([attr.g] if attr.HasField("g") else []), *attr.graphs):
                    found += infos(sub, False)
        return found

    def negative(info: onnx.ValueInfoProto) -> list[onnx.TensorShapeProto.Dimension]:
        if not info.type.HasField("tensor_type"):
            return []
        return [d for d in info.type.tensor_type.shape.dim if d.HasField("dim_value") and d.dim_value < 0]

    if not any(negative(info) for info in infos(proto.graph, True)):
        return proto
    proto = _copy(proto)
    for info in infos(proto.graph, True):
        for dim in negative(info):
            dim.ClearField("dim_value")
    return proto


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
