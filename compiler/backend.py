"""onnx-aot as an ONNX backend (``onnx.backend.base.Backend``).

``prepare(model, device)`` compiles the model into a temporary artifact and returns a
:class:`OnnxAotRep` whose ``run(inputs)`` executes it through :class:`runtime.Session`.

An ahead-of-time compiler needs shapes, axes, pads, ``k`` and sizes at compile time, but many
models (and most of ONNX's node test cases) pass them as graph inputs. Such *compile-time inputs*
(see :data:`compiler.frontend.canonical.COMPILE_TIME_INPUTS`) are found before compiling; when a
model has any, compilation waits for the first ``run`` and specializes on the values of the
compile-time inputs (folded in as constants, as ``onnx-aot compile --bind`` does). One artifact is
kept per distinct binding. Ordinary data inputs stay inputs.

Inputs without static shapes do not specialize: every unknown dim (a ``dim_param``, no value, -1)
becomes a range, ``dim_range`` (default :data:`DIM_RANGE`; ``prepare(model, dim_range=(1, 4096))``),
and the model compiles into one dynamic artifact (docs/dynamic-shapes.md) -- at ``prepare`` when it
has no compile-time inputs, else once per binding of their values. A run whose shapes fall outside
the ranges, and a model the dynamic compile refuses (``OnnxAotRep.dynamic_error`` says why), get a
static artifact per distinct input shapes instead, compiled at their first run.

An If whose condition is known only at run time compiles both branches; where one of them cannot
take the run's shapes (Silero VAD's 8 kHz model at a 16 kHz window), the compile fails, and the
inputs the If conditions read (:func:`condition_inputs`) become compile-time inputs from then on:
the branch taken is inlined.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend
from onnx.backend.base import BackendRep
from onnx.backend.base import namedtupledict

from compiler.driver import compile_model
from compiler.frontend.canonical import COMPILE_TIME_INPUTS
from compiler.frontend.control import outer_names
from compiler.frontend.control import subgraphs
from compiler.frontend.control import walk_nodes
from compiler.frontend.dims import DimSpec
from compiler.frontend.dims import known_size
from compiler.frontend.importer import reject_unknown_ops
from compiler.frontend.sequences import SEQUENCE_COMPILE_TIME_INPUTS
from compiler.frontend.sequences import element_name
from compiler.frontend.window_ranges import RangeTooShortError
from runtime.errors import GoldenReferenceError
from runtime.errors import InputError
from runtime.errors import ModelError
from runtime.errors import OnnxAotError
from runtime.session import Session

__all__ = ["DIM_RANGE", "OnnxAotBackend", "OnnxAotRep", "VALUE_RANGE", "compile_time_inputs",
           "condition_inputs", "prepare", "run_model", "run_node", "supports_device", "is_compatible",
           "ranged_shapes", "value_symbol_inputs"]

_DEVICES = {"CPU": "cpu", "CUDA": "cuda"}

# The range an unknown input dim gets in the backend's dynamic artifact (the golden self-test runs
# at its min and its middle, so the top also bounds the compile's cost)
DIM_RANGE = (1, 1024)
_NARROWINGS = 8  # times a guessed range's low end is raised to what a window op takes


def _starting_at(shapes: Shapes, name: str, axis: int, low: int) -> Shapes:
    """``shapes`` with input ``name``'s range at ``axis`` starting at ``low``."""
    dims = list(shapes[name])
    lo, hi = dims[axis]  # type: ignore[misc]
    dims[axis] = (max(int(lo), low), hi)
    return {**shapes, name: tuple(dims)}
Shapes = dict[str, tuple[DimSpec, ...]]


def compile_time_inputs(graph: onnx.GraphProto) -> list[str]:
    """Graph inputs whose *values* the compiler needs: shapes, axes, pads, sizes, ``k``...

    An input counts when a compile-time input slot of some node (COMPILE_TIME_INPUTS) depends on
    its value, directly or through other nodes. Paths through Shape and Size do not count: those
    read only the shape, which is known anyway.
    """
    nodes = list(walk_nodes(graph))  # subgraphs too (their value names are unique model-wide)
    needs = {**COMPILE_TIME_INPUTS, **SEQUENCE_COMPILE_TIME_INPUTS}
    stack = [node.input[i] for node in nodes
             for i in needs.get(node.op_type, ()) if i < len(node.input) and node.input[i]]
    stack += [node.input[0] for node in nodes if node.op_type == "If"  # (optionals: presence at compile time)
              and any(o.type.HasField("optional_type") for g in subgraphs(node) for o in g.output)]
    return _inputs_reaching(graph, stack)


def condition_inputs(graph: onnx.GraphProto) -> list[str]:
    """Graph inputs that If conditions depend on (through other nodes; not through Shape / Size).
    An If whose condition is known only at run time compiles both branches at the run's shapes;
    where one branch cannot take them (Silero VAD's 8 kHz model at 16 kHz input sizes), binding
    these inputs inlines the branch taken instead."""
    return _inputs_reaching(graph, [node.input[0] for node in walk_nodes(graph) if node.op_type == "If"])


def _inputs_reaching(graph: onnx.GraphProto, stack: list[str]) -> list[str]:
    """The graph inputs the values ``stack`` names are computed from."""
    initializers = {t.name for t in graph.initializer}
    inputs = [i.name for i in graph.input if i.name not in initializers]
    producer = {out: node for node in walk_nodes(graph) for out in node.output if out}
    needed: set[str] = set()
    seen: set[str] = set()
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        node = producer.get(name)
        if node is None:
            needed.add(name)
        elif node.op_type not in ("Shape", "Size"):
            stack.extend(_sources(node, name))
    return [name for name in inputs if name in needed]


def _sources(node: onnx.NodeProto, output: str) -> list[str]:
    """The values ``node``'s ``output`` is computed from: its inputs and, for an If, the branches'
    matching outputs; for a Loop or Scan, also whatever outer values its body reads."""
    names = [n for n in node.input if n]
    if node.op_type == "If":
        k = list(node.output).index(output)
        names += [g.output[k].name for g in subgraphs(node) if k < len(g.output)]
    else:
        names += [n for g in subgraphs(node) for n in sorted(outer_names(g))]
    return names


# The range a Loop's trip count gets as a value symbol in the backend's first compile (a bool
# condition: 0..1); a run with a value outside it compiles an artifact bound to its values.
VALUE_RANGE = (0, 1024)


def value_symbol_inputs(graph: onnx.GraphProto) -> list[str]:
    """Graph inputs of one integer or bool element (declared shape) that the model reads only as a
    Loop's trip count or first condition: the backend compiles them as value symbols (one artifact
    for a range of values) before it binds them to each run's values."""
    initializers = {t.name for t in graph.initializer}
    candidates = {i.name for i in graph.input if i.name not in initializers and _one_element(i)}
    candidates -= {o.name for o in graph.output}
    for node in walk_nodes(graph):
        carries = node.op_type == "Loop" and any(not i.type.HasField("tensor_type")
                                                 for sub in subgraphs(node) for i in sub.input)
        for k, name in enumerate(node.input):  # (a Loop carrying a sequence needs its length bound)
            if name in candidates and not (node.op_type == "Loop" and k < 2 and not carries):
                candidates.discard(name)
        for sub in subgraphs(node):
            candidates -= {o.name for o in sub.output}
    return [i.name for i in graph.input if i.name in candidates]


def _one_element(info: onnx.ValueInfoProto) -> bool:
    t = info.type
    if not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return False
    dims = t.tensor_type.shape.dim
    kind = np.dtype(helper.tensor_dtype_to_np_dtype(t.tensor_type.elem_type)).kind
    return kind in "iub" and all(d.HasField("dim_value") and d.dim_value == 1 for d in dims)


def _value_range(array: np.ndarray) -> tuple[int, int] | None:
    """The value symbol range for an input fed ``array``; None when its value lies outside."""
    if array.dtype == np.bool_:
        return 0, 1
    value = int(array.reshape(-1)[0])
    return VALUE_RANGE if VALUE_RANGE[0] <= value <= VALUE_RANGE[1] else None


def _static_shape(value_info: onnx.ValueInfoProto) -> bool:
    t = value_info.type
    if not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return False
    return all(known_size(d) is not None for d in t.tensor_type.shape.dim)


def ranged_shapes(graph: onnx.GraphProto, dim_range: tuple[int, int],
                  skip: Sequence[str] = ()) -> Shapes | None:
    """``shapes=`` for a dynamic compile: each input with an unknown dim (but those in ``skip``),
    its known sizes kept and every unknown dim the range ``dim_range``; None when one has no rank."""
    initializers = {t.name for t in graph.initializer}
    shapes: Shapes = {}
    for info in graph.input:
        if info.name in initializers or info.name in skip or _static_shape(info):
            continue
        t = info.type
        if not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
            return None
        sizes = [known_size(d) for d in t.tensor_type.shape.dim]
        shapes[info.name] = tuple(dim_range if size is None else size for size in sizes)
    return shapes


def _within(shapes: Shapes, feeds: Mapping[str, np.ndarray]) -> bool:
    """Whether every feed's shape is one ``shapes`` (sizes and ranges) allows."""
    for name, dims in shapes.items():
        shape = feeds[name].shape
        if len(shape) != len(dims):
            return False
        for size, dim in zip(shape, dims, strict=True):
            lo, hi = dim if isinstance(dim, tuple) else (dim, dim)
            if not lo <= size <= hi:
                return False
    return True


class OnnxAotRep(BackendRep):
    """A prepared model: one compiled artifact, or one per binding of its compile-time inputs."""

    def __init__(self, model: onnx.ModelProto, target: str, *, opt_level: int = 3,
                 threads: int | None = None, dim_range: tuple[int, int] = DIM_RANGE) -> None:
        self.model = model
        self.target = target
        self.opt_level = opt_level
        self.threads = threads
        graph = model.graph
        initializers = {t.name for t in graph.initializer}
        self.input_names = [i.name for i in graph.input if i.name not in initializers]
        self.output_names = [o.name for o in graph.output]
        self.bound_inputs = compile_time_inputs(graph)
        # compile-time inputs compiled as value symbols (until a compile with them fails)
        self.value_inputs = [n for n in value_symbol_inputs(graph) if n in self.bound_inputs]
        self.static = all(_static_shape(i) for i in graph.input if i.name not in initializers)
        self.dim_range = dim_range
        # the ranged input shapes of the dynamic artifact; None once the dynamic compile is refused
        self.ranges = None if self.static else ranged_shapes(graph, dim_range, self.bound_inputs)
        self.dynamic_error: str | None = None if self.static or self.ranges is not None else (
            "an input has no rank")
        self._dirs: list[str] = []
        self._sessions: dict[tuple[Any, ...], Session] = {}
        self._lock = threading.Lock()
        self._outputs_type = namedtupledict("Outputs", self.output_names)
        # sequence and optional inputs: one artifact per length and element shapes (per presence),
        # their elements tensor inputs
        self.seq_inputs = {i.name: i.type for i in graph.input if i.name not in initializers
                           and i.type.WhichOneof("value") in ("sequence_type", "optional_type")}
        self._flat: dict[tuple[Any, ...], OnnxAotRep] = {}
        if not self.bound_inputs and not self.seq_inputs and (self.static or self.ranges is not None):
            try:
                session = self._compile({}, self.ranges)
            except ModelError:  # (a branch that cannot take the shapes: decided at the first run)
                if not self._bind_conditions():
                    raise
                session = None
            if session is not None:
                self._sessions[()] = session

    @property
    def deferred(self) -> bool:
        """True when compilation waits for the first run (compile-time input values, or shapes)."""
        return () not in self._sessions

    def _compile(self, values: Mapping[str, np.ndarray], shapes: Shapes | None,
                 symbols: Mapping[str, tuple[int, int]] | None = None) -> Session | None:
        """A session on a fresh artifact; None when ``shapes`` has ranges and the dynamic compile
        refuses the model (then ``dynamic_error`` says why and every later compile is static). A
        compile with value ``symbols`` that fails raises (``session_for`` then binds them)."""
        workdir = tempfile.mkdtemp(prefix="onnx-aot-backend-")
        self._dirs.append(workdir)
        guessed = shapes is not None and shapes is self.ranges
        try:
            path = self._compile_guessed(f"{workdir}/model", values, shapes, symbols)
        except OnnxAotError as exc:
            if not guessed or symbols:
                raise
            self.dynamic_error, self.ranges = f"{type(exc).__name__}: {exc}", None
            return None
        return Session(path, threads=self.threads)

    def _compile_guessed(self, out: str, values: Mapping[str, np.ndarray], shapes: Shapes | None,
                         symbols: Mapping[str, tuple[int, int]] | None) -> Any:
        """compile_model; the ranges are this backend's guess (DIM_RANGE, VALUE_RANGE), so where the
        reference cannot run the model at any golden binding of them (a height its pooling cannot
        take at the low end), the artifact is compiled unchecked (warned), as the user's run decides."""
        guessed = shapes is self.ranges
        for _ in range(_NARROWINGS):
            options: dict[str, Any] = {"opt_level": self.opt_level, "target": self.target, "shapes": shapes,
                                       "binds": values, "values": symbols}
            try:
                return compile_model(self.model, out, **options)
            except GoldenReferenceError:
                if not guessed and not symbols:
                    raise
                return compile_model(self.model, out, golden_cases=0, **options)
            except RangeTooShortError as exc:  # a guessed range starts below what the model takes
                if not guessed or exc.at is None or shapes is None:
                    raise
                shapes = self.ranges = _starting_at(shapes, *exc.at)
        raise ModelError(f"the guessed ranges were narrowed {_NARROWINGS} times and still do not compile")

    def _feeds(self, inputs: Any) -> dict[str, Any]:
        """Arrays by input name (a list of arrays for a sequence input)."""
        def value(name: str, given: Any) -> Any:
            if name not in self.seq_inputs or given is None:  # (None: an empty optional)
                return None if given is None and name in self.seq_inputs else np.asarray(given)
            listed = _holds_sequence(self.seq_inputs[name])
            return [np.asarray(a) for a in given] if listed else np.asarray(given)

        if isinstance(inputs, Mapping):
            feeds = {str(k): value(str(k), v) for k, v in inputs.items()}
        else:
            arrays = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
            if len(arrays) > len(self.input_names):
                raise InputError(f"{len(arrays)} inputs given, the model takes {len(self.input_names)}: "
                                 f"{', '.join(self.input_names)}")
            feeds = {name: value(name, a) for name, a in zip(self.input_names, arrays, strict=False)}
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise InputError(f"missing input(s) {', '.join(map(repr, missing))}")
        return feeds

    def session_for(self, feeds: Mapping[str, np.ndarray]) -> Session:
        """The session compiled for these feeds' compile-time values (compiled on first use): the
        value-symbol inputs' values within their ranges share one. A compile that fails while some
        If condition depends on inputs not bound yet is retried with them bound (condition_inputs)."""
        try:
            return self._session_for_values(feeds)
        except ModelError:
            if not self._bind_conditions():
                raise
        return self._session_for_values(feeds)

    def _bind_conditions(self) -> bool:
        """Make the inputs If conditions read compile-time inputs; False when there are none left."""
        more = [n for n in condition_inputs(self.model.graph) if n not in self.bound_inputs]
        self.bound_inputs = [*self.bound_inputs, *more]
        self.value_inputs = [n for n in self.value_inputs if n not in more]
        if more and not self.static:  # the dynamic compile may take the model with the branches decided
            self.ranges = ranged_shapes(self.model.graph, self.dim_range, self.bound_inputs)
            self.dynamic_error = None if self.ranges is not None else "an input has no rank"
        return bool(more)

    def _session_for_values(self, feeds: Mapping[str, np.ndarray]) -> Session:
        values = {n: np.array(feeds[n], order="C") for n in self.bound_inputs}
        ranges = [_value_range(values[n]) for n in self.value_inputs]
        symbols = {n: r for n, r in zip(self.value_inputs, ranges, strict=True) if r is not None}
        if not symbols or len(symbols) < len(ranges):
            return self._session_for(feeds, values, None)
        try:
            return self._session_for(feeds, {n: v for n, v in values.items() if n not in symbols}, symbols)
        except OnnxAotError:  # the model needs the values themselves: bind them from now on
            self.value_inputs = []
            return self._session_for(feeds, values, None)

    def _session_for(self, feeds: Mapping[str, np.ndarray], values: dict[str, np.ndarray],
                     symbols: Mapping[str, tuple[int, int]] | None) -> Session:
        key: tuple[Any, ...] = tuple((n, v.dtype.str, v.shape, v.tobytes()) for n, v in values.items())
        key += ("values",) if symbols else ()
        with self._lock:
            if self.ranges is not None and _within(self.ranges, feeds):
                session = self._sessions.get(key) or self._compile(values, self.ranges, symbols)
                if session is not None:
                    self._sessions[key] = session
                    return session
            shapes = None if self.static else {
                n: tuple(feeds[n].shape) for n in self.input_names if n not in values}
            if shapes is not None:
                key += ("static", *sorted(shapes.items()))
            found = self._sessions.get(key) or self._compile(values, shapes, symbols)
            assert found is not None  # a static compile raises instead
            self._sessions[key] = found
        return found

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        feeds = self._feeds(inputs)
        if self.seq_inputs:
            rep, flat = self._flattened(feeds)
            return rep.run(flat)
        session = self.session_for(feeds)
        data = {s.name: feeds[s.name] for s in session.inputs}
        results = dict(zip((s.name for s in session.outputs), session.run(None, data), strict=True))
        outputs = self.model.graph.output
        return self._outputs_type(*(_regrouped(out.name, out.type, results) for out in outputs))

    def _flattened(self, feeds: Mapping[str, Any]) -> tuple[OnnxAotRep, dict[str, np.ndarray]]:
        """The model whose sequence inputs are tensor inputs, one per element fed (NAME.0, NAME.1,
        ...; compiled once per lengths and element types and shapes), and its feeds."""
        seqs = {n: [] if feeds[n] is None else feeds[n] if isinstance(feeds[n], list) else [feeds[n]]
                for n in self.seq_inputs}
        key = tuple((n, feeds[n] is None, tuple((a.dtype.str, a.shape) for a in items))
                    for n, items in seqs.items())
        if key not in self._flat:
            model = _with_element_inputs(self.model, {n: feeds[n] for n in seqs})
            self._flat[key] = OnnxAotRep(model, self.target, opt_level=self.opt_level, threads=self.threads)
        flat = {n: v for n, v in feeds.items() if n not in seqs}
        flat.update({element_name(n, k): a for n, items in seqs.items() for k, a in enumerate(items)})
        return self._flat[key], flat

    def close(self) -> None:
        """Delete the temporary artifacts (sessions already loaded keep working)."""
        for rep in self._flat.values():
            rep.close()
        for workdir in self._dirs:
            shutil.rmtree(workdir, ignore_errors=True)
        self._dirs.clear()

    def __del__(self) -> None:
        self.close()


class OnnxAotBackend(Backend):
    """The ONNX backend API over compile_model + runtime.Session."""

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> OnnxAotRep:
        """Compile ``model`` for ``device`` ("CPU" or "CUDA"); see the module docstring."""
        if not isinstance(model, onnx.ModelProto):
            if isinstance(model, bytes):
                model = onnx.load_model_from_string(model)
            else:
                model = onnx.load(str(model))
        target = _target(device)
        if not cls.supports_device(device):
            raise ModelError(f"device {device!r} is not available here")
        # unsupported ops fail here, before any compile-time input is known
        reject_unknown_ops(model)
        return OnnxAotRep(model, target, opt_level=int(kwargs.get("opt_level", 3)),
                          threads=kwargs.get("threads"), dim_range=tuple(kwargs.get("dim_range", DIM_RANGE)))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU",
                  **kwargs: Any) -> tuple[Any, ...]:
        rep = cls.prepare(model, device, **kwargs)
        return rep.run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[Any, tuple[int, ...]]] | None = None,
                 **kwargs: Any) -> tuple[Any, ...]:
        """Run one node on ``inputs`` (a list in node-input order, or a dict by name)."""
        if isinstance(inputs, Mapping):
            arrays = [np.asarray(inputs[n]) for n in node.input if n]
        else:
            arrays = [np.asarray(a) for a in inputs]
        names = [n for n in node.input if n]
        if len(arrays) != len(names):
            raise InputError(f"node {node.name or node.op_type!r} takes {len(names)} input(s), "
                             f"{len(arrays)} given")
        graph_inputs = [helper.make_tensor_value_info(
            n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in zip(names, arrays, strict=True)]
        if outputs_info:
            graph_outputs = [helper.make_tensor_value_info(
                n, helper.np_dtype_to_tensor_dtype(np.dtype(dt)), shape)
                for n, (dt, shape) in zip(node.output, outputs_info, strict=False)]
        else:
            graph_outputs = [helper.make_empty_tensor_value_info(n) for n in node.output if n]
        opset = int(kwargs.pop("opset_version", onnx.defs.onnx_opset_version()))
        model = helper.make_model(
            helper.make_graph([node], f"run_node_{node.op_type}", graph_inputs, graph_outputs),
            opset_imports=[helper.make_opsetid(node.domain or "", opset)])
        if not outputs_info:
            _type_outputs(model, node)
        return cls.prepare(model, device, **kwargs).run(dict(zip(names, arrays, strict=True)))

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """CPU always; CUDA only when cupy can see a GPU."""
        kind = str(device).split(":")[0].upper()
        if kind == "CPU":
            return True
        if kind == "CUDA":
            return _cuda_available()
        return False


def _holds_sequence(t: onnx.TypeProto) -> bool:
    """A sequence, or an optional of one."""
    return t.HasField("sequence_type") or (t.HasField("optional_type")
                                           and t.optional_type.elem_type.HasField("sequence_type"))


def _regrouped(name: str, t: onnx.TypeProto, results: Mapping[str, np.ndarray]) -> Any:
    """Model output ``name`` of type ``t`` from the artifact's outputs: a sequence's elements are
    NAME.0, NAME.1, ... (a list); an optional holds what is there (None: nothing, and also an empty
    sequence, which the artifact cannot tell apart from an empty optional)."""
    if _holds_sequence(t):
        count = next(k for k in range(len(results) + 1) if element_name(name, k) not in results)
        items = [results[element_name(name, k)] for k in range(count)]
        return items if items or t.HasField("sequence_type") else None
    return results.get(name) if t.HasField("optional_type") else results[name]


def _with_element_inputs(model: onnx.ModelProto, feeds: Mapping[str, Any]) -> onnx.ModelProto:
    """A copy of ``model`` whose sequence and optional inputs (in ``feeds``: a list of arrays, an
    array or None) are tensor inputs, one per element (named by ``element_name``, shaped as fed),
    made the input's value again by SequenceConstruct / SequenceEmpty / Optional nodes."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    inputs, nodes = [], []
    for info in graph.input:
        if info.name not in feeds:
            inputs.append(info)
            continue
        t, given, target = info.type, feeds[info.name], info.name
        if t.HasField("optional_type"):
            t, target = t.optional_type.elem_type, f"{info.name}/value"
            node = helper.make_node("Optional", [target] if given is not None else [], [info.name],
                                    name=f"{info.name}/optional", **({"type": t} if given is None else {}))
            if given is None:
                nodes.append(node)
                continue
        arrays = given if isinstance(given, list) else [given]
        sequence = t.sequence_type.elem_type if t.HasField("sequence_type") else None
        elem = (sequence or t).tensor_type.elem_type
        names = [element_name(info.name, k) for k in range(len(arrays))]
        for name, array in zip(names, arrays, strict=True):
            if elem and helper.np_dtype_to_tensor_dtype(array.dtype) != elem:
                raise InputError(f"input {info.name!r}: element {name!r} is {array.dtype}, the input "
                                 f"holds {helper.tensor_dtype_to_np_dtype(elem)}")
            inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype),
                                                        array.shape))
        if sequence is None:
            nodes.append(helper.make_node("Identity", names, [target], name=f"{info.name}/tensor"))
        else:
            nodes.append(helper.make_node("SequenceConstruct", names, [target], name=f"{info.name}/sequence")
                         if names else helper.make_node("SequenceEmpty", [], [target], dtype=elem or 1,
                                                        name=f"{info.name}/sequence"))
        if target != info.name:
            nodes.append(node)
    del graph.input[:]
    graph.input.extend(inputs)
    kept = list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes + kept)
    return copy


def _type_outputs(model: onnx.ModelProto, node: onnx.NodeProto) -> None:
    """Give the one-node model's outputs the types shape inference finds for them."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except Exception as exc:
        raise ModelError(f"node {node.name or node.op_type!r}: shape inference failed: "
                         f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc}") from None
    types = {v.name: v for v in inferred.graph.value_info}
    del model.graph.output[:]
    for name in (n for n in node.output if n):
        if name not in types:
            raise ModelError(f"node {node.name or node.op_type!r}: cannot infer the type of output {name!r}")
        model.graph.output.append(types[name])


def _target(device: str) -> str:
    kind = str(device).split(":")[0].upper()
    if kind not in _DEVICES:
        raise ModelError(f"unknown device {device!r} (onnx-aot supports CPU and CUDA)")
    return _DEVICES[kind]


def _cuda_available() -> bool:
    try:
        import cupy  # noqa: F401

        return int(cupy.cuda.runtime.getDeviceCount()) > 0
    except Exception:
        return False


prepare = OnnxAotBackend.prepare
run_model = OnnxAotBackend.run_model
run_node = OnnxAotBackend.run_node
supports_device = OnnxAotBackend.supports_device
is_compatible = OnnxAotBackend.is_compatible
