"""plan.json as typed records, shared by the compiler (which builds and writes them) and the runtime
(which reads and validates them once, at load, and uses attributes afterwards).

Every record is a frozen dataclass with ``to_json()`` (plain JSON types, keys in a fixed order, so
artifacts stay byte-identical from compile to compile) and ``from_json(data, where)``, which checks
every field (with ``runtime/json_fields.py``) and raises ``ArtifactError`` naming the file and the
field (``plan.json: steps[3].partition must ...``): a plan rewritten by a broken pipeline (and
re-hashed into the manifest) fails at load, never as a ``KeyError`` in the middle of a run.
``Plan.from_json`` also checks what ties the records together: step and partition indices, the
steps each partition covers, the values every step names, the library of a C partition and the
module of a CUDA one.

Format version 3 adds **dynamic plans** (issue 17; docs/dynamic-shapes.md): ``symbols`` (each
with its range) and ``assumptions`` (equalities a binding must satisfy), always written right
after ``name`` (empty for a static plan). In a dynamic plan a dim is an int or an expression of
the symbols (``runtime.symbolic``: ``to_json`` writes it, ``parse`` reads it, into an ``Expr``);
buffer offsets are placeholders ``_b<k>`` (``k`` the buffer's index) that the runtime places per
binding, and buffer sizes, value offsets (``"_b3+1536*W"``) and scratch are expressions of the
symbols and placeholders; a ``"symbolic"`` location holds a small numeric tensor's elements (a
Reshape target) and ``{"expr": TEXT}`` inside a step's attrs is an int at each binding.
``runtime/binding.py`` turns a dynamic plan and a binding into a static plan (``Plan.bind``).
A static plan reads as before: every dim is checked to be an int on the fast path, and expressions
are only parsed where the plan holds a string.

**Sub-schedules** (format version 2). A control step compiled into nested schedules (an
``onnx_aot.If``: two, the branches; a ``Loop`` / ``Scan``: one, the body) carries them in
``schedules``: each a ``PlanSchedule`` with its own ``values``, ``buffers``, ``steps`` and
``partitions``, read and checked by the same ``_schedule`` as the top level (so nesting goes to
any depth). Its arena offsets are relative to the control step's scratch region, where the step
runs it. (One ``schedules`` tuple instead of ``branches`` / ``body`` fields: the op type already
says which it is, and one field is one reader.)

Adding a field changes plan.json and so bumps ``FORMAT_VERSION`` (docs/architecture.md says so).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtime.json_fields import Fields
from runtime.json_fields import Where
from runtime.json_fields import is_count
from runtime.json_fields import optional_json
from runtime.narrow_weights import StoredForm
from runtime.plan_symbols import check_symbols
from runtime.symbolic import parse
from runtime.symbolic import to_json

__all__ = [
    "FORMAT_VERSION", "OLDEST_FORMAT_VERSION", "NARROW_FORMAT_VERSION", "Dim", "Shape", "TensorSpec",
    "PlanOutput", "PlanConstant", "PlanArena",
    "PlanBuffer", "ValueLocation", "PlanValue", "StepScratch", "LaunchArg", "KernelLaunch", "PlanStep",
    "CudaModule", "PlanPartition", "OnnxNodeFate", "PlanSchedule", "PlanSymbol", "PlanAssumption", "Plan",
]

FORMAT_VERSION = 4  # 2: control steps' nested schedules; 3: dynamic plans (symbols, expressions);
# 4: narrow weights (``PlanConstant.stored``). A plan is written at the oldest version that holds it
# (3 without stored constants, so those artifacts read on older runtimes as before).
OLDEST_FORMAT_VERSION = 3
NARROW_FORMAT_VERSION = 4

# A dim: an int, or in a dynamic plan an ``Expr`` of the symbols. Typed ``Any``: every reader but
# runtime/binding.py sees static plans (bound ones included), where a dim is always an int.
Dim = Any
Shape = tuple[Dim, ...]

SCALAR_KINDS = ("i32", "i64", "f32", "f64")
POINTER_BASES = ("arena", "weights")


# -- dims and shapes: ints, or expressions of the symbols ----------------------------------------------
_EXPRESSIONS_READ = [0]  # texts parsed so far: a static plan's load skips the no-expression walk when 0 more


def _expr(value: Any, where: Where, wants: str) -> Dim:
    """An int >= 0, or an expression's text read with ``runtime.symbolic.parse``."""
    if is_count(value):
        return int(value)
    if isinstance(value, str):
        _EXPRESSIONS_READ[0] += 1
        try:
            return parse(value)
        except ValueError as exc:
            raise where.error(f"must be {wants}, got {value!r}: {exc}") from None
    raise where.wrong(wants, value)


def _shape(f: Fields, key: str) -> Shape:
    value = f.raw(key)
    if not isinstance(value, list):
        raise f.at(key).wrong("a list of sizes", value)
    if all(is_count(d) for d in value):  # a static shape: the fast path
        return tuple(int(d) for d in value)
    at = f.at(key)
    shape = tuple(_expr(d, at.item(k), "a size or a dim expression") for k, d in enumerate(value))
    return shape


def _shape_json(shape: Shape) -> list[Any]:
    if all(type(d) is int for d in shape):
        return list(shape)
    return [to_json(d) for d in shape]


def _dim_json(dim: Dim) -> int | float | str:
    return dim if type(dim) is int or type(dim) is float else to_json(dim)  # (float: a symbolic element)


def _nbytes(dtype: np.dtype, shape: Shape) -> Any:
    return math.prod(shape) * dtype.itemsize  # an int; an expression of the symbols where a dim is one


def _dim(f: Fields, key: str) -> Dim:
    value = f.raw(key)
    return int(value) if is_count(value) else _expr(value, f.at(key), "an integer >= 0 or a dim expression")


def _dtype(f: Fields, key: str) -> np.dtype:
    name = f.text(key)
    try:
        return np.dtype(name)
    except TypeError:
        raise f.at(key).wrong("a numpy dtype name", name) from None


# -- the interface and the constants -----------------------------------------------------------------
@dataclass(frozen=True)
class TensorSpec:
    """A graph input or output as the caller sees it.

    In plan records ``shape`` holds the plan's dims (ints; expressions in a dynamic plan). The
    specs a ``Session`` and ``load_plan`` report for a dynamic plan have ``None`` for each dynamic
    dim in ``shape``, ``ranges`` (``(lo, hi)`` per dim, inclusive; ``(n, n)`` for a static one)
    and ``dims`` (the plan's dims: ints, and ``runtime.symbolic.Expr`` such as ``W`` or
    ``(W+3)//8``); both are None for a static spec (``shape`` says it all)."""

    name: str
    dtype: np.dtype
    shape: tuple[Any, ...]
    ranges: tuple[tuple[int, int], ...] | None = None
    dims: Shape | None = None

    @property
    def is_dynamic(self) -> bool:
        return self.ranges is not None

    @property
    def nbytes(self) -> Any:
        return _nbytes(self.dtype, self.shape)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype.name, "shape": _shape_json(self.shape)}

    @classmethod
    def from_json(cls, data: Any, where: Where) -> TensorSpec:
        f = Fields.of(data, where)
        return cls(f.text("name"), _dtype(f, "dtype"), _shape(f, "shape"))


@dataclass(frozen=True)
class PlanOutput:
    """A graph output: what the caller gets (``spec``) and the value the steps write (``value``)."""

    spec: TensorSpec
    value: str

    def to_json(self) -> dict[str, Any]:
        return {**self.spec.to_json(), "value": self.value}

    @classmethod
    def from_json(cls, data: Any, where: Where) -> PlanOutput:
        return cls(TensorSpec.from_json(data, where), Fields.of(data, where).text("value"))


@dataclass(frozen=True)
class PlanConstant:
    """A constant's bytes in the weights image the kernels read (``offset`` into it); ``stored``
    when weights.bin holds it narrower (then it is widened into the image at load)."""

    name: str
    offset: int
    nbytes: int
    dtype: np.dtype
    shape: Shape
    stored: StoredForm | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "offset": self.offset, "nbytes": self.nbytes, "dtype": self.dtype.name,
                "shape": _shape_json(self.shape), **optional_json(stored=self.stored)}

    @classmethod
    def from_json(cls, data: Any, where: Where) -> PlanConstant:
        f = Fields.of(data, where)
        return cls(f.text("name"), f.count("offset"), f.count("nbytes"), _dtype(f, "dtype"),
                   _shape(f, "shape"), f.record("stored", StoredForm.from_json))


# -- memory ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlanArena:
    """One memory space's arena: its size and alignment, and the planner's figures for it."""

    memory_space: str
    nbytes: int
    alignment: int
    lower_bound_nbytes: int
    naive_nbytes: int
    strategy: str

    def to_json(self) -> dict[str, Any]:
        return {"memory_space": self.memory_space, "nbytes": self.nbytes, "alignment": self.alignment,
                "lower_bound_nbytes": self.lower_bound_nbytes, "naive_nbytes": self.naive_nbytes,
                "strategy": self.strategy}

    @classmethod
    def from_json(cls, data: Any, where: Where) -> PlanArena:
        f = Fields.of(data, where)
        return cls(f.text("memory_space"), f.count("nbytes"), f.count("alignment", positive=True),
                   f.count("lower_bound_nbytes"), f.count("naive_nbytes"), f.text("strategy"))


@dataclass(frozen=True)
class PlanBuffer:
    """One buffer of an arena: its place, its lifetime (steps, inclusive) and the values in it
    (none for kernel scratch)."""

    id: str
    arena: str
    offset: Dim  # a dynamic plan's: the placeholder _b<k> (k: the buffer's index)
    nbytes: Dim
    first_step: int
    last_step: int
    values: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "arena": self.arena, "offset": _dim_json(self.offset),
                "nbytes": _dim_json(self.nbytes), "first_step": self.first_step, "last_step": self.last_step,
                "values": list(self.values)}

    @classmethod
    def from_json(cls, data: Any, where: Where) -> PlanBuffer:
        f = Fields.of(data, where)
        return cls(f.text("id"), f.text("arena"), _dim(f, "offset"), _dim(f, "nbytes"),
                   f.count("first_step"), f.count("last_step"), f.texts("values"))


@dataclass(frozen=True)
class ValueLocation:
    """Where a value's bytes are: ``arena`` (``offset`` into the ``space`` arena), ``weights``
    (``offset`` into weights.bin, readable in every space), ``ext`` (the caller's array of the
    graph input or output named ``ext``) or ``symbolic`` (a small numeric tensor whose
    ``elements``, in C order, are numbers or expressions of the symbols: a dynamic plan's Reshape
    target, a dim cast to float). JSON: ``["arena", offset, space]``, ``["weights", offset]``,
    ``["ext", name]``, ``["symbolic", [e0, e1, ...]]``. In a dynamic plan an arena offset may be
    an expression of the symbols and the buffers' placeholders (``"_b3+1536*W"``)."""

    kind: str
    offset: Dim = 0
    space: str = "host"
    ext: str = ""
    elements: tuple[Dim, ...] = ()

    def to_json(self) -> list[Any]:
        if self.kind == "ext":
            return ["ext", self.ext]
        if self.kind == "weights":
            return ["weights", self.offset]
        if self.kind == "symbolic":
            return ["symbolic", [_dim_json(e) for e in self.elements]]
        return ["arena", _dim_json(self.offset), self.space]

    @classmethod
    def from_json(cls, data: Any, where: Where) -> ValueLocation:
        kind = data[0] if isinstance(data, list) and data else None
        if kind == "ext" and len(data) == 2 and isinstance(data[1], str):
            return cls("ext", ext=data[1])
        if kind == "weights" and len(data) == 2 and is_count(data[1]):
            return cls("weights", int(data[1]))
        if kind == "arena" and len(data) in (2, 3) and (len(data) == 2 or isinstance(data[2], str)):
            if is_count(data[1]):
                return cls("arena", int(data[1]), data[2] if len(data) == 3 else "host")
            if isinstance(data[1], str):
                return cls("arena", _expr(data[1], where.item(1), "an offset expression"),
                           data[2] if len(data) == 3 else "host")
        if kind == "symbolic" and len(data) == 2 and isinstance(data[1], list):
            return cls("symbolic", elements=tuple(
                e if type(e) in (int, float) else _expr(e, where.item(1).item(k), "a number or an expression")
                for k, e in enumerate(data[1])))
        raise where.wrong('["arena", offset, space], ["weights", offset], ["ext", name] or '
                          '["symbolic", [elements]]', data)


@dataclass(frozen=True)
class PlanValue:
    """One operand of a step: its dtype, shape and location."""

    name: str
    dtype: np.dtype
    shape: Shape
    location: ValueLocation

    @property
    def nbytes(self) -> Any:
        """The size in bytes: an int, or (a dynamic plan's) an expression of the symbols."""
        return _nbytes(self.dtype, self.shape)

    def to_json(self) -> dict[str, Any]:
        return {"dtype": self.dtype.name, "shape": _shape_json(self.shape),
                "location": self.location.to_json()}

    @classmethod
    def from_json(cls, name: str, data: Any, where: Where) -> PlanValue:
        f = Fields.of(data, where)
        return cls(name, _dtype(f, "dtype"), _shape(f, "shape"),
                   ValueLocation.from_json(f.raw("location"), f.at("location")))


# -- steps and partitions ----------------------------------------------------------------------------
@dataclass(frozen=True)
class StepScratch:
    """A step's kernel scratch in its partition's arena."""

    offset: Dim
    nbytes: Dim

    def to_json(self) -> dict[str, Any]:
        return {"offset": _dim_json(self.offset), "nbytes": _dim_json(self.nbytes)}

    @classmethod
    def from_json(cls, data: Any, where: Where) -> StepScratch:
        f = Fields.of(data, where)
        return cls(_dim(f, "offset"), _dim(f, "nbytes"))


@dataclass(frozen=True)
class LaunchArg:
    """One argument of a CUDA launch: a pointer (``kind`` "ptr", ``base`` "arena" or "weights":
    the location kind its byte offset ``value`` is into, in the step's memory space) or a scalar
    (``kind`` "i32" / "i64" / "f32" / "f64"). JSON: ``["ptr", base, offset]`` or ``[kind, value]``.
    In a dynamic plan an arena offset and an integer scalar may be an expression's text (a
    run-time dim; bound per binding)."""

    kind: str
    value: Any  # int | float, or a dynamic plan's Expr
    base: str = ""

    def to_json(self) -> list[Any]:
        value = _dim_json(self.value)
        return ["ptr", self.base, value] if self.kind == "ptr" else [self.kind, value]

    @classmethod
    def from_json(cls, data: Any, where: Where) -> LaunchArg:
        if not isinstance(data, list) or not data:
            raise where.wrong("a launch argument", data)
        if data[0] == "ptr":
            offset = data[2] if len(data) == 3 and data[1] in POINTER_BASES else None
            if offset is None or not (is_count(offset) or isinstance(offset, str)):
                raise where.error(f'is a bad pointer argument {data!r} (expected ["ptr", "arena" or '
                                  f'"weights", offset])')
            return cls("ptr", _expr(data[2], where.item(2), "a byte offset"), data[1])
        number = data[1] if len(data) == 2 else None
        if data[0] in ("i32", "i64") and isinstance(number, str):
            return cls(str(data[0]), _expr(number, where.item(1), "an integer or a dim expression"))
        if data[0] not in SCALAR_KINDS or isinstance(number, bool) or not isinstance(number, int | float):
            raise where.error(f"is an unknown argument kind {data!r} (known: ptr, {', '.join(SCALAR_KINDS)})")
        return cls(str(data[0]), number)


def _launch_dims(f: Fields, key: str) -> tuple[Any, ...]:
    """1-3 positive ints, or (a dynamic plan's) expressions of the symbols."""
    value = f.raw(key)
    if not isinstance(value, list) or not 1 <= len(value) <= 3 or \
            not all((is_count(v) and v >= 1) or isinstance(v, str) for v in value):
        raise f.at(key).wrong("1-3 positive integers", value)
    if all(is_count(v) for v in value):
        return tuple(value)
    return tuple(_expr(v, f.at(key).item(k), "a positive size") for k, v in enumerate(value))


@dataclass(frozen=True)
class KernelLaunch:
    """One CUDA kernel launch of a step: the kernel's name, grid, block, dynamic shared memory
    bytes and arguments in the kernel's parameter order."""

    kernel: str
    grid: tuple[int, ...]
    block: tuple[int, ...]
    shared: int
    args: tuple[LaunchArg, ...]

    def to_json(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "grid": _shape_json(self.grid), "block": list(self.block),
                "shared": self.shared, "args": [a.to_json() for a in self.args]}

    @classmethod
    def from_json(cls, data: Any, where: Where) -> KernelLaunch:
        f = Fields.of(data, where)
        return cls(f.name("kernel", "the kernel launched"), _launch_dims(f, "grid"), _launch_dims(f, "block"),
                   f.count("shared"), f.records("args", LaunchArg.from_json))


def _operands(f: Fields, key: str, *, omitted: bool) -> tuple[Any, ...]:
    """Value names (None for an omitted input, where ``omitted``)."""
    value = f.raw(key)
    if not isinstance(value, list) or not all(isinstance(v, str) or (omitted and v is None) for v in value):
        raise f.at(key).wrong("a list of value names" + (" (null for an omitted input)" if omitted else ""),
                              value)
    return tuple(value)


@dataclass(frozen=True)
class PlanStep:
    """One scheduled kernel: the node it runs (``op_type`` in ``domain``, canonical ``attrs``), the
    ONNX nodes fused into it, its operands (value names; None for an omitted input), its provider
    and partition, its scratch, and (CUDA steps only) its launches."""

    index: int
    name: str
    op_type: str
    domain: str
    provider: str
    partition: int
    onnx_nodes: tuple[str, ...]
    inputs: tuple[str | None, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any]
    scratch: StepScratch | None = None
    launches: tuple[KernelLaunch, ...] | None = None  # None: not a CUDA step (no "launches" key)
    schedules: tuple[PlanSchedule, ...] | None = None  # a compiled control step's (no key: None)

    @property
    def kind(self) -> str:
        """The op's registry name: ``op_type`` for the ONNX domain, else ``domain.op_type``."""
        return self.op_type if self.domain in ("", "ai.onnx") else f"{self.domain}.{self.op_type}"

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "op_type": self.op_type, "domain": self.domain,
                "provider": self.provider, "partition": self.partition, "onnx_nodes": list(self.onnx_nodes),
                "inputs": list(self.inputs), "outputs": list(self.outputs), "attrs": dict(self.attrs),
                "scratch": self.scratch.to_json() if self.scratch is not None else None,
                **optional_json(launches=self.launches, schedules=self.schedules)}

    @classmethod
    def from_json(cls, data: Any, where: Where) -> PlanStep:
        f = Fields.of(data, where)
        launches = f.records("launches", KernelLaunch.from_json) if "launches" in f.data else None
        schedules = f.records("schedules", PlanSchedule.from_json) if "schedules" in f.data else None
        return cls(f.count("index"), f.text("name"), f.text("op_type"), f.text("domain"), f.text("provider"),
                   f.count("partition"), f.texts("onnx_nodes"), _operands(f, "inputs", omitted=True),
                   _operands(f, "outputs", omitted=False), f.obj("attrs").data,
                   f.record("scratch", StepScratch.from_json), launches, schedules)


@dataclass(frozen=True)
class CudaModule:
    """A CUDA partition's binaries (artifact-relative paths): the ``.cu`` source NVRTC can compile
    at load, the cubins nvcc built per arch, and a PTX (or None)."""

    source: str
    cubins: Mapping[str, str]
    ptx: str | None

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "cubins": dict(self.cubins), "ptx": self.ptx}

    @classmethod
    def from_json(cls, data: Any, where: Where) -> CudaModule:
        f = Fields.of(data, where)
        cubins = f.obj("cubins")
        return cls(f.name("source", "the module's source"), {arch: cubins.text(arch) for arch in cubins.data},
                   f.optional_text("ptx"))


@dataclass(frozen=True)
class PlanPartition:
    """A run of consecutive steps on one provider, executed by one call. ``runner`` names the run
    side in runtime/providers ("c", "cuda", "reference"); ``ext`` lists the graph inputs and
    outputs it touches (the C entry's pointer slots); ``library`` (C) and ``module`` (CUDA) name
    the generated code."""

    index: int
    provider: str
    runner: str
    memory_space: str
    entry: str
    first_step: int
    last_step: int
    ext: tuple[str, ...]
    library: str | None = None
    module: CudaModule | None = None

    @property
    def step_range(self) -> range:
        return range(self.first_step, self.last_step + 1)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index, "provider": self.provider, "runner": self.runner,
            "memory_space": self.memory_space, "entry": self.entry, "first_step": self.first_step,
            "last_step": self.last_step, "ext": list(self.ext),
            **optional_json(module=self.module, library=self.library)}

    @classmethod
    def from_json(cls, data: Any, where: Where) -> PlanPartition:
        f = Fields.of(data, where)
        part = cls(f.count("index"), f.text("provider"), f.text("runner"), f.text("memory_space"),
                   f.text("entry"), f.count("first_step"), f.count("last_step"), f.texts("ext"),
                   f.optional_text("library"), f.record("module", CudaModule.from_json))
        if part.runner == "c" and not part.library:
            raise where.key("library").error("is missing: a C partition names its library")
        if part.runner == "cuda" and part.module is None:
            raise where.key("module").error("is missing: a CUDA partition names its module")
        return part


@dataclass(frozen=True)
class OnnxNodeFate:
    """What became of one node of the source model: the step (and its provider and partition)
    that runs it, or why it was ``eliminated``."""

    provider: str | None = None
    partition: int | None = None
    step: int | None = None
    eliminated: str | None = None

    def to_json(self) -> dict[str, Any]:
        if self.eliminated is not None:
            return {"eliminated": self.eliminated}
        return {"provider": self.provider, "partition": self.partition, "step": self.step}

    @classmethod
    def from_json(cls, data: Any, where: Where) -> OnnxNodeFate:
        f = Fields.of(data, where)
        if "eliminated" in f.data:
            return cls(eliminated=f.text("eliminated"))
        return cls(f.text("provider"), f.count("partition"), f.count("step"))


# -- the plan ----------------------------------------------------------------------------------------
def _schedule(f: Fields,
              values: Mapping[str, PlanValue]) -> tuple[tuple[PlanStep, ...], tuple[PlanPartition, ...]]:
    """The steps and the partitions that run them, checked against each other and ``values``."""
    steps = f.records("steps", PlanStep.from_json)
    partitions = f.records("partitions", PlanPartition.from_json)
    for k, part in enumerate(partitions):
        at = f.at("partitions").item(k)
        if part.index != k:
            raise at.key("index").wrong(f"{k} (its position)", part.index)
        if not part.first_step <= part.last_step < len(steps):
            raise at.error(f"covers steps {part.first_step}-{part.last_step}; the plan has "
                           f"{len(steps)} steps")
    for t, step in enumerate(steps):
        at = f.at("steps").item(t)
        if step.index != t:
            raise at.key("index").wrong(f"{t} (its position)", step.index)
        if step.partition >= len(partitions) or t not in partitions[step.partition].step_range:
            raise at.key("partition").wrong(f"one of {len(partitions)} partitions, covering step {t}",
                                            step.partition)
        for name in (*step.inputs, *step.outputs):
            if name is not None and name not in values:
                raise at.error(f"names value {name!r}, which 'values' does not have")
        if (step.schedules is not None) != (partitions[step.partition].runner == "control"):
            raise at.error("has nested schedules but is not in a control partition, or the reverse")
    return steps, partitions


_REF_KINDS = ("i", "a")


@dataclass(frozen=True)
class PlanSchedule:
    """A control step's nested schedule (a branch or a loop body), compiled like the top level.

    ``inputs`` are the values bound from outside, each by ``refs[k]``: ``"i<k>"`` the control
    step's input k, ``"a<k>"`` the body's argument k (a Loop's iteration number and carried values,
    a Scan's states and slices); ``outputs`` the values the body yields, in order. Both live outside
    its arena (``ext``); everything else is in ``buffers`` at offsets relative to the control
    step's scratch region, of which it uses ``arena_nbytes``."""

    inputs: tuple[str, ...]
    refs: tuple[str, ...]
    outputs: tuple[str, ...]
    arena_nbytes: int
    buffers: tuple[PlanBuffer, ...]
    values: Mapping[str, PlanValue]
    steps: tuple[PlanStep, ...]
    partitions: tuple[PlanPartition, ...]

    def partition_steps(self, part: PlanPartition) -> tuple[PlanStep, ...]:
        return self.steps[part.first_step:part.last_step + 1]

    def to_json(self) -> dict[str, Any]:
        return {"inputs": list(self.inputs), "refs": list(self.refs), "outputs": list(self.outputs),
                "arena_nbytes": self.arena_nbytes, "buffers": [b.to_json() for b in self.buffers],
                "values": {name: v.to_json() for name, v in self.values.items()},
                "steps": [s.to_json() for s in self.steps],
                "partitions": [p.to_json() for p in self.partitions]}

    @classmethod
    def from_json(cls, data: Any, where: Where) -> PlanSchedule:
        f = Fields.of(data, where)
        values = f.mapping("values", PlanValue.from_json)
        steps, partitions = _schedule(f, values)
        out = cls(f.texts("inputs"), f.texts("refs"), f.texts("outputs"), f.count("arena_nbytes"),
                  f.records("buffers", PlanBuffer.from_json), values, steps, partitions)
        if len(out.refs) != len(out.inputs) or not all(
                r[:1] in _REF_KINDS and r[1:].isdigit() for r in out.refs):
            raise f.at("refs").wrong('one "i<k>" or "a<k>" per input', list(out.refs))
        for name in (*out.inputs, *out.outputs):
            if name not in values or values[name].location.kind != "ext":
                raise where.error(f"binds {name!r}, which is not one of its values outside the arena")
        for name, value in values.items():
            loc = value.location
            # (a value of symbolic shape in a dynamic plan's body: its slot is sized at the max binding)
            if loc.kind == "arena" and type(value.nbytes) is int \
                    and loc.offset + value.nbytes > out.arena_nbytes:
                raise f.at("values").item(name).error(f"lies past the schedule's {out.arena_nbytes} bytes")
        return out


@dataclass(frozen=True)
class PlanSymbol:
    """A symbol of a dynamic plan: a dim that varies between runs, in ``min..max`` (inclusive), or
    a *value symbol* (``input``): the value of a one-element integer or bool graph input (a Loop's
    trip count or first condition), read from the feed at each run."""

    name: str
    min: int
    max: int
    input: str | None = None  # a value symbol: the value of this scalar graph input (else a dim)

    @property
    def range(self) -> tuple[int, int]:
        return self.min, self.max

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "min": self.min, "max": self.max, **optional_json(input=self.input)}

    @classmethod
    def from_json(cls, data: Any, where: Where) -> PlanSymbol:
        f = Fields.of(data, where)
        out = cls(f.text("name"), f.count("min"), f.count("max"), f.optional_text("input"))
        if not out.name.isidentifier() or out.name.startswith("_") or out.name in ("min", "max"):
            raise f.at("name").wrong("a Python identifier not starting with '_'", out.name)
        if out.min > out.max:
            raise where.error(f"has min {out.min} > max {out.max}")
        return out


@dataclass(frozen=True)
class PlanAssumption:
    """An equality a binding must satisfy (``a == b``), recorded by the import for ``node``."""

    node: str
    a: Dim
    b: Dim

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "a": _dim_json(self.a), "b": _dim_json(self.b)}

    @classmethod
    def from_json(cls, data: Any, where: Where) -> PlanAssumption:
        f = Fields.of(data, where)
        return cls(f.text("node"), _side(f, "a"), _side(f, "b"))


def _side(f: Fields, key: str) -> Dim:
    value = f.raw(key)
    if type(value) is int:
        return value
    return _expr(value, f.at(key), "an int or a dim expression")


@dataclass(frozen=True)
class Plan:
    """plan.json: the interface, the constants in weights.bin, the arenas and their buffers, every
    operand's location, the steps, the partitions, and the fate of every ONNX node; a dynamic
    plan's symbols and assumptions (empty for a static plan)."""

    format_version: int
    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[PlanOutput, ...]
    constants: tuple[PlanConstant, ...]
    weights_nbytes: int
    arenas: tuple[PlanArena, ...]
    buffers: tuple[PlanBuffer, ...]
    values: Mapping[str, PlanValue]
    steps: tuple[PlanStep, ...]
    partitions: tuple[PlanPartition, ...]
    onnx_nodes: Mapping[str, OnnxNodeFate]
    symbols: tuple[PlanSymbol, ...] = ()
    assumptions: tuple[PlanAssumption, ...] = ()

    def partition_steps(self, part: PlanPartition) -> tuple[PlanStep, ...]:
        return self.steps[part.first_step:part.last_step + 1]

    @property
    def output_specs(self) -> tuple[TensorSpec, ...]:
        return tuple(out.spec for out in self.outputs)

    @property
    def is_dynamic(self) -> bool:
        return bool(self.symbols)

    @property
    def ranges(self) -> dict[str, tuple[int, int]]:
        """Each symbol's ``(min, max)``."""
        return {s.name: (s.min, s.max) for s in self.symbols}

    def arena(self, space: str) -> PlanArena | None:
        return next((a for a in self.arenas if a.memory_space == space), None)

    def bind(self, sizes: Mapping[str, int]) -> Any:
        """This dynamic plan at the binding ``sizes`` (symbol -> int): a ``runtime.binding.BoundPlan``
        (a static plan, placed, and the arrays of the symbolic values); ``InputError`` for a size
        out of range or a failed assumption."""
        from runtime.binding import bind_plan

        return bind_plan(self, sizes)

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "name": self.name,
            "symbols": [s.to_json() for s in self.symbols],
            "assumptions": [a.to_json() for a in self.assumptions],
            "inputs": [s.to_json() for s in self.inputs],
            "outputs": [o.to_json() for o in self.outputs],
            "constants": [c.to_json() for c in self.constants],
            "weights_nbytes": self.weights_nbytes,
            "arenas": [a.to_json() for a in self.arenas],
            "buffers": [b.to_json() for b in self.buffers],
            "values": {name: v.to_json() for name, v in self.values.items()},
            "steps": [s.to_json() for s in self.steps],
            "partitions": [p.to_json() for p in self.partitions],
            "onnx_nodes": {name: n.to_json() for name, n in self.onnx_nodes.items()},
        }

    @classmethod
    def from_json(cls, data: Any, file: str | Path = "plan.json") -> Plan:
        """Read and check a parsed plan.json (``file`` names it in errors)."""
        f = Fields.of(data, Where(str(file)))
        raw_version: Any = f.data.get("format_version")
        if not (is_count(raw_version) and OLDEST_FORMAT_VERSION <= raw_version <= FORMAT_VERSION):
            raise f.where.error(f"plan format version {raw_version!r}; this runtime reads versions "
                                f"{OLDEST_FORMAT_VERSION}-{FORMAT_VERSION}")
        version = int(raw_version)
        read_before = _EXPRESSIONS_READ[0]
        values = f.mapping("values", PlanValue.from_json)
        steps, partitions = _schedule(f, values)
        plan = cls(version, f.text("name"), f.records("inputs", TensorSpec.from_json),
                   f.records("outputs", PlanOutput.from_json), f.records("constants", PlanConstant.from_json),
                   f.count("weights_nbytes"), f.records("arenas", PlanArena.from_json),
                   f.records("buffers", PlanBuffer.from_json), values, steps, partitions,
                   f.mapping("onnx_nodes", lambda _name, d, w: OnnxNodeFate.from_json(d, w)),
                   f.records("symbols", PlanSymbol.from_json),
                   f.records("assumptions", PlanAssumption.from_json))
        if plan.symbols or _EXPRESSIONS_READ[0] != read_before:  # (another thread's reads: checked anyway)
            check_symbols(plan, f.where)
        if version < NARROW_FORMAT_VERSION and any(c.stored is not None for c in plan.constants):
            raise f.where.error(f"constants stored narrow need plan format version {NARROW_FORMAT_VERSION}, "
                                f"the plan says {version}")
        return plan
