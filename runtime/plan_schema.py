"""plan.json as typed records, shared by the compiler (which builds and writes them) and the runtime
(which reads and validates them once, at load, and uses attributes afterwards).

Every record is a frozen dataclass with ``to_json()`` (plain JSON types, keys in a fixed order, so
artifacts stay byte-identical from compile to compile) and ``from_json(data, where)``, which checks
every field and raises ``ArtifactError`` naming the file and the field (``plan.json:
steps[3].partition must ...``): a plan rewritten by a broken pipeline (and re-hashed into the
manifest) fails at load, never as a ``KeyError`` in the middle of a run. ``Plan.from_json`` also
checks what ties the records together: step and partition indices, the steps each partition
covers, the values every step names, the library of a C partition and the module of a CUDA one.

Room for what later issues add, without changing what is here:

- **Dims as expressions of symbols.** A shape is ``tuple[Dim, ...]`` with ``Dim = int`` today. A
  symbolic dim widens ``Dim`` to ``int | DimExpr`` (an expression over named symbols, written in
  JSON as a string such as ``"2*seq+1"``); every shape in the schema is read by ``_shape`` and
  written by ``_shape_json``, so those two functions and ``TensorSpec.nbytes`` are where it goes.
- **Sub-schedules.** The steps and their partitions are read together (``_schedule``), and a step
  carries only what a kernel step needs. A conditional step (two sub-schedules) or a loop step (a
  body) becomes a ``kind`` field on ``PlanStep`` ("kernel" when absent, so today's plans stay
  valid) plus ``branches: tuple[PlanSchedule, PlanSchedule]`` / ``body: PlanSchedule``, where a
  ``PlanSchedule`` holds ``steps`` and ``partitions`` read by the same ``_schedule``: a nested
  schedule is read and validated exactly like the top-level one.

Adding a field changes plan.json and so bumps ``FORMAT_VERSION`` (docs/architecture.md says so).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from runtime.errors import ArtifactError

__all__ = [
    "FORMAT_VERSION", "Dim", "Shape", "Where", "TensorSpec", "PlanOutput", "PlanConstant", "PlanArena",
    "PlanBuffer", "ValueLocation", "PlanValue", "StepScratch", "LaunchArg", "KernelLaunch", "PlanStep",
    "CudaModule", "PlanPartition", "OnnxNodeFate", "Plan",
]

FORMAT_VERSION = 1

Dim = int  # a dim: a size today; later also an expression of symbols (see the module docstring)
Shape = tuple[Dim, ...]

LOCATION_KINDS = ("arena", "weights", "ext")
SCALAR_KINDS = ("i32", "i64", "f32", "f64")
POINTER_SPACES = ("arena", "weights")

T = TypeVar("T")


# -- reading JSON with the field's name at hand ------------------------------------------------------
@dataclass(frozen=True)
class Where:
    """Where a JSON value sits: the file and the path of keys and indices down to it."""

    file: str = "plan.json"
    path: str = ""

    def key(self, name: str) -> Where:
        return Where(self.file, f"{self.path}.{name}" if self.path else name)

    def item(self, index: int | str) -> Where:
        return Where(self.file, f"{self.path}[{index!r}]" if isinstance(index, str) else
                     f"{self.path}[{index}]")

    def error(self, message: str) -> ArtifactError:
        return ArtifactError(f"{self.file}: {self.path} {message}" if self.path else
                             f"{self.file}: {message}")

    def wrong(self, wants: str, got: Any) -> ArtifactError:
        text = repr(got)
        return self.error(f"must be {wants}, got {text if len(text) <= 80 else text[:77] + '...'}")


def _object(data: Any, where: Where) -> Mapping[str, Any]:
    if not isinstance(data, dict):
        raise where.wrong("an object", data)
    return data


def _field(record: Mapping[str, Any], key: str, where: Where) -> Any:
    if key not in record:
        raise where.key(key).error("is missing")
    return record[key]


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _text(record: Mapping[str, Any], key: str, where: Where) -> str:
    value = _field(record, key, where)
    if not isinstance(value, str):
        raise where.key(key).wrong("a string", value)
    return value


def _name(record: Mapping[str, Any], key: str, where: Where, what: str) -> str:
    """A string that must not be empty: it names ``what``."""
    value = _text(record, key, where)
    if not value:
        raise where.key(key).error(f"is empty: it must name {what}")
    return value


def _optional_text(record: Mapping[str, Any], key: str, where: Where) -> str | None:
    value = record.get(key)
    if value is not None and not isinstance(value, str):
        raise where.key(key).wrong("a string or null", value)
    return value


def _count(record: Mapping[str, Any], key: str, where: Where, *, positive: bool = False) -> int:
    value = _field(record, key, where)
    if not _is_count(value) or (positive and value == 0):
        raise where.key(key).wrong("a positive integer" if positive else "an integer >= 0", value)
    return int(value)


def _texts(record: Mapping[str, Any], key: str, where: Where) -> tuple[str, ...]:
    value = _field(record, key, where)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise where.key(key).wrong("a list of strings", value)
    return tuple(value)


def _list(record: Mapping[str, Any], key: str, where: Where) -> list[Any]:
    value = _field(record, key, where)
    if not isinstance(value, list):
        raise where.key(key).wrong("a list", value)
    return value


def _records(record: Mapping[str, Any], key: str, where: Where,
             read: Callable[[Any, Where], T]) -> tuple[T, ...]:
    """``record[key]``, a list of objects, each read with ``read``."""
    at = where.key(key)
    return tuple(read(item, at.item(k)) for k, item in enumerate(_list(record, key, where)))


def _dtype(record: Mapping[str, Any], key: str, where: Where) -> np.dtype:
    name = _text(record, key, where)
    try:
        return np.dtype(name)
    except TypeError:
        raise where.key(key).wrong("a numpy dtype name", name) from None


def _shape(record: Mapping[str, Any], key: str, where: Where) -> Shape:
    value = _field(record, key, where)
    if not isinstance(value, list) or not all(_is_count(d) for d in value):
        raise where.key(key).wrong("a list of sizes", value)
    return tuple(int(d) for d in value)


def _shape_json(shape: Shape) -> list[Any]:
    return list(shape)


def _nbytes(dtype: np.dtype, shape: Shape) -> int:
    return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


# -- the interface and the constants -----------------------------------------------------------------
@dataclass(frozen=True)
class TensorSpec:
    """A graph input or output as the caller sees it."""

    name: str
    dtype: np.dtype
    shape: Shape

    @property
    def nbytes(self) -> int:
        return _nbytes(self.dtype, self.shape)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype.name, "shape": _shape_json(self.shape)}

    @classmethod
    def from_json(cls, data: Any, where: Where) -> TensorSpec:
        record = _object(data, where)
        return cls(_text(record, "name", where), _dtype(record, "dtype", where),
                   _shape(record, "shape", where))


@dataclass(frozen=True)
class PlanOutput:
    """A graph output: what the caller gets (``spec``) and the value the steps write (``value``)."""

    spec: TensorSpec
    value: str

    def to_json(self) -> dict[str, Any]:
        return {**self.spec.to_json(), "value": self.value}

    @classmethod
    def from_json(cls, data: Any, where: Where) -> PlanOutput:
        spec = TensorSpec.from_json(data, where)
        return cls(spec, _text(data, "value", where))


@dataclass(frozen=True)
class PlanConstant:
    """A constant's bytes in weights.bin."""

    name: str
    offset: int
    nbytes: int
    dtype: np.dtype
    shape: Shape

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "offset": self.offset, "nbytes": self.nbytes, "dtype": self.dtype.name,
                "shape": _shape_json(self.shape)}

    @classmethod
    def from_json(cls, data: Any, where: Where) -> PlanConstant:
        r = _object(data, where)
        return cls(_text(r, "name", where), _count(r, "offset", where), _count(r, "nbytes", where),
                   _dtype(r, "dtype", where), _shape(r, "shape", where))


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
        r = _object(data, where)
        return cls(_text(r, "memory_space", where), _count(r, "nbytes", where),
                   _count(r, "alignment", where, positive=True), _count(r, "lower_bound_nbytes", where),
                   _count(r, "naive_nbytes", where), _text(r, "strategy", where))


@dataclass(frozen=True)
class PlanBuffer:
    """One buffer of an arena: its place, its lifetime (steps, inclusive) and the values in it
    (none for kernel scratch)."""

    id: str
    arena: str
    offset: int
    nbytes: int
    first_step: int
    last_step: int
    values: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "arena": self.arena, "offset": self.offset, "nbytes": self.nbytes,
                "first_step": self.first_step, "last_step": self.last_step, "values": list(self.values)}

    @classmethod
    def from_json(cls, data: Any, where: Where) -> PlanBuffer:
        r = _object(data, where)
        return cls(_text(r, "id", where), _text(r, "arena", where), _count(r, "offset", where),
                   _count(r, "nbytes", where), _count(r, "first_step", where), _count(r, "last_step", where),
                   _texts(r, "values", where))


@dataclass(frozen=True)
class ValueLocation:
    """Where a value's bytes are: ``arena`` (``offset`` into the ``space`` arena), ``weights``
    (``offset`` into weights.bin, readable in every space) or ``ext`` (the caller's array of the
    graph input or output named ``ext``). JSON: ``["arena", offset, space]``, ``["weights",
    offset]``, ``["ext", name]``."""

    kind: str
    offset: int = 0
    space: str = "host"
    ext: str = ""

    def to_json(self) -> list[Any]:
        if self.kind == "ext":
            return ["ext", self.ext]
        if self.kind == "weights":
            return ["weights", self.offset]
        return ["arena", self.offset, self.space]

    @classmethod
    def from_json(cls, data: Any, where: Where) -> ValueLocation:
        kind = data[0] if isinstance(data, list) and data else None
        if kind == "ext" and len(data) == 2 and isinstance(data[1], str):
            return cls("ext", ext=data[1])
        if kind == "weights" and len(data) == 2 and _is_count(data[1]):
            return cls("weights", int(data[1]))
        if kind == "arena" and len(data) in (2, 3) and _is_count(data[1]) and \
                (len(data) == 2 or isinstance(data[2], str)):
            return cls("arena", int(data[1]), data[2] if len(data) == 3 else "host")
        raise where.wrong('["arena", offset, space], ["weights", offset] or ["ext", name]', data)


@dataclass(frozen=True)
class PlanValue:
    """One operand of a step: its dtype, shape and location."""

    name: str
    dtype: np.dtype
    shape: Shape
    location: ValueLocation

    @property
    def nbytes(self) -> int:
        return _nbytes(self.dtype, self.shape)

    def to_json(self) -> dict[str, Any]:
        return {"dtype": self.dtype.name, "shape": _shape_json(self.shape),
                "location": self.location.to_json()}

    @classmethod
    def from_json(cls, name: str, data: Any, where: Where) -> PlanValue:
        r = _object(data, where)
        return cls(name, _dtype(r, "dtype", where), _shape(r, "shape", where),
                   ValueLocation.from_json(_field(r, "location", where), where.key("location")))


# -- steps and partitions ----------------------------------------------------------------------------
@dataclass(frozen=True)
class StepScratch:
    """A step's kernel scratch in its partition's arena."""

    offset: int
    nbytes: int

    def to_json(self) -> dict[str, Any]:
        return {"offset": self.offset, "nbytes": self.nbytes}

    @classmethod
    def from_json(cls, data: Any, where: Where) -> StepScratch:
        r = _object(data, where)
        return cls(_count(r, "offset", where), _count(r, "nbytes", where))


@dataclass(frozen=True)
class LaunchArg:
    """One argument of a CUDA launch: a pointer (``kind`` "ptr", ``space`` "arena" or "weights",
    ``value`` a byte offset) or a scalar (``kind`` "i32" / "i64" / "f32" / "f64"). JSON:
    ``["ptr", space, offset]`` or ``[kind, value]``."""

    kind: str
    value: int | float
    space: str = ""

    def to_json(self) -> list[Any]:
        return ["ptr", self.space, self.value] if self.kind == "ptr" else [self.kind, self.value]

    @classmethod
    def from_json(cls, data: Any, where: Where) -> LaunchArg:
        if not isinstance(data, list) or not data:
            raise where.wrong("a launch argument", data)
        if data[0] == "ptr":
            if len(data) != 3 or data[1] not in POINTER_SPACES or not _is_count(data[2]):
                raise where.error(f'is a bad pointer argument {data!r} (expected ["ptr", "arena" or '
                                  f'"weights", offset])')
            return cls("ptr", int(data[2]), data[1])
        number = data[1] if len(data) == 2 else None
        if data[0] not in SCALAR_KINDS or isinstance(number, bool) or not isinstance(number, int | float):
            raise where.error(f"is an unknown argument kind {data!r} (known: ptr, {', '.join(SCALAR_KINDS)})")
        return cls(str(data[0]), number)


def _launch_dims(record: Mapping[str, Any], key: str, where: Where) -> tuple[int, ...]:
    value = _field(record, key, where)
    if not isinstance(value, list) or not 1 <= len(value) <= 3 or \
            not all(_is_count(v) and v >= 1 for v in value):
        raise where.key(key).wrong("1-3 positive integers", value)
    return tuple(value)


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
        return {"kernel": self.kernel, "grid": list(self.grid), "block": list(self.block),
                "shared": self.shared, "args": [a.to_json() for a in self.args]}

    @classmethod
    def from_json(cls, data: Any, where: Where) -> KernelLaunch:
        r = _object(data, where)
        return cls(_name(r, "kernel", where, "the kernel launched"), _launch_dims(r, "grid", where),
                   _launch_dims(r, "block", where),
                   _count(r, "shared", where), _records(r, "args", where, LaunchArg.from_json))


def _attrs(record: Mapping[str, Any], where: Where) -> Mapping[str, Any]:
    return _object(_field(record, "attrs", where), where.key("attrs"))


def _operands(record: Mapping[str, Any], key: str, where: Where) -> tuple[str | None, ...]:
    value = _field(record, key, where)
    if not isinstance(value, list) or not all(v is None or isinstance(v, str) for v in value):
        raise where.key(key).wrong("a list of value names (null for an omitted input)", value)
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

    @property
    def kind(self) -> str:
        """The op's registry name: ``op_type`` for the ONNX domain, else ``domain.op_type``."""
        return self.op_type if self.domain in ("", "ai.onnx") else f"{self.domain}.{self.op_type}"

    def to_json(self) -> dict[str, Any]:
        out = {"index": self.index, "name": self.name, "op_type": self.op_type, "domain": self.domain,
               "provider": self.provider, "partition": self.partition, "onnx_nodes": list(self.onnx_nodes),
               "inputs": list(self.inputs), "outputs": list(self.outputs), "attrs": dict(self.attrs),
               "scratch": self.scratch.to_json() if self.scratch is not None else None}
        if self.launches is not None:
            out["launches"] = [launch.to_json() for launch in self.launches]
        return out

    @classmethod
    def from_json(cls, data: Any, where: Where) -> PlanStep:
        r = _object(data, where)
        outputs = _operands(r, "outputs", where)
        if None in outputs:
            raise where.key("outputs").wrong("a list of value names", list(outputs))
        scratch = r.get("scratch")
        launches = _records(r, "launches", where, KernelLaunch.from_json) if "launches" in r else None
        return cls(_count(r, "index", where), _text(r, "name", where), _text(r, "op_type", where),
                   _text(r, "domain", where), _text(r, "provider", where), _count(r, "partition", where),
                   _texts(r, "onnx_nodes", where), _operands(r, "inputs", where),
                   tuple(str(v) for v in outputs), _attrs(r, where),
                   StepScratch.from_json(scratch, where.key("scratch")) if scratch is not None else None,
                   launches)


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
        r = _object(data, where)
        source = _name(r, "source", where, "the module's source")
        cubins = _object(_field(r, "cubins", where), where.key("cubins"))
        if not all(isinstance(path, str) for path in cubins.values()):
            raise where.key("cubins").wrong("an object mapping arch -> file", cubins)
        return cls(source, dict(cubins), _optional_text(r, "ptx", where))


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
        out: dict[str, Any] = {
            "index": self.index, "provider": self.provider, "runner": self.runner,
            "memory_space": self.memory_space, "entry": self.entry, "first_step": self.first_step,
            "last_step": self.last_step, "ext": list(self.ext)}
        if self.module is not None:
            out["module"] = self.module.to_json()
        if self.library is not None:
            out["library"] = self.library
        return out

    @classmethod
    def from_json(cls, data: Any, where: Where) -> PlanPartition:
        r = _object(data, where)
        module = r.get("module")
        part = cls(_count(r, "index", where), _text(r, "provider", where), _text(r, "runner", where),
                   _text(r, "memory_space", where), _text(r, "entry", where), _count(r, "first_step", where),
                   _count(r, "last_step", where), _texts(r, "ext", where),
                   _optional_text(r, "library", where),
                   CudaModule.from_json(module, where.key("module")) if module is not None else None)
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
        r = _object(data, where)
        if "eliminated" in r:
            return cls(eliminated=_text(r, "eliminated", where))
        return cls(_text(r, "provider", where), _count(r, "partition", where), _count(r, "step", where))


# -- the plan ----------------------------------------------------------------------------------------
def _mapping(record: Mapping[str, Any], key: str, where: Where,
             read: Callable[[str, Any, Where], T]) -> dict[str, T]:
    """``record[key]``, an object of name -> record, each read with ``read``."""
    at = where.key(key)
    items = _object(_field(record, key, where), at)
    return {name: read(name, item, at.item(name)) for name, item in items.items()}


def _schedule(record: Mapping[str, Any], where: Where,
              values: Mapping[str, PlanValue]) -> tuple[tuple[PlanStep, ...], tuple[PlanPartition, ...]]:
    """The steps and the partitions that run them, checked against each other and ``values``."""
    steps = _records(record, "steps", where, PlanStep.from_json)
    partitions = _records(record, "partitions", where, PlanPartition.from_json)
    for k, part in enumerate(partitions):
        at = where.key("partitions").item(k)
        if part.index != k:
            raise at.key("index").wrong(f"{k} (its position)", part.index)
        if not part.first_step <= part.last_step < len(steps):
            raise at.error(f"covers steps {part.first_step}-{part.last_step}; the plan has "
                           f"{len(steps)} steps")
    for t, step in enumerate(steps):
        at = where.key("steps").item(t)
        if step.index != t:
            raise at.key("index").wrong(f"{t} (its position)", step.index)
        if step.partition >= len(partitions) or t not in partitions[step.partition].step_range:
            raise at.key("partition").wrong(f"one of {len(partitions)} partitions, covering step {t}",
                                            step.partition)
        for name in (*step.inputs, *step.outputs):
            if name is not None and name not in values:
                raise at.error(f"names value {name!r}, which 'values' does not have")
    return steps, partitions


@dataclass(frozen=True)
class Plan:
    """plan.json: the interface, the constants in weights.bin, the arenas and their buffers, every
    operand's location, the steps, the partitions, and the fate of every ONNX node."""

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

    def partition_steps(self, part: PlanPartition) -> tuple[PlanStep, ...]:
        return self.steps[part.first_step:part.last_step + 1]

    @property
    def output_specs(self) -> tuple[TensorSpec, ...]:
        return tuple(out.spec for out in self.outputs)

    def arena(self, space: str) -> PlanArena | None:
        return next((a for a in self.arenas if a.memory_space == space), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "name": self.name,
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
        where = Where(str(file))
        r = _object(data, where)
        version = r.get("format_version")
        if version != FORMAT_VERSION:
            raise where.error(f"plan format version {version!r}; this runtime reads version {FORMAT_VERSION}")
        values = _mapping(r, "values", where, PlanValue.from_json)
        steps, partitions = _schedule(r, where, values)
        return cls(FORMAT_VERSION, _text(r, "name", where),
                   _records(r, "inputs", where, TensorSpec.from_json),
                   _records(r, "outputs", where, PlanOutput.from_json),
                   _records(r, "constants", where, PlanConstant.from_json),
                   _count(r, "weights_nbytes", where),
                   _records(r, "arenas", where, PlanArena.from_json),
                   _records(r, "buffers", where, PlanBuffer.from_json), values, steps, partitions,
                   _mapping(r, "onnx_nodes", where, lambda _n, d, w: OnnxNodeFate.from_json(d, w)))

