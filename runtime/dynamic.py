"""A session's dynamic-plan side (issue 17): the binding from the feeds, bound plans cached.

``Session`` makes one ``DynamicRuns`` for a plan with symbols. For each run it reads the binding
off the feeds' shapes (every symbol is a dim of some graph input; a symbol in several inputs must
agree), checks each dim against its range (``InputError`` naming the input, the dim and its
range), and takes the ``Bound`` of that binding (``runtime/run_path.py``: the bound plan, its
partitions, its output shapes and each arena's size at that binding) from a small LRU cache
(``CACHE_SIZE`` bindings, thread-safe) or makes it: ``runtime/binding.py`` binds and places the
plan (assumptions checked), and the session's loader loads its partitions for the bound plan.

``interface(plan)`` gives the ``TensorSpec`` records a session and ``load_plan`` report: ``None``
for a dynamic dim in ``shape``, ``ranges`` per dim (an output's from ``runtime.symbolic.bounds``)
and ``dims`` (the plan's expressions).
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from runtime.binding import Binder
from runtime.errors import ArtifactError
from runtime.errors import InputError
from runtime.run_path import Bound
from runtime.run_path import bound_of
from runtime.symbolic import bounds

__all__ = ["DynamicRuns", "Bound", "Variants", "interface", "describe_spec", "CACHE_SIZE"]

CACHE_SIZE = 16


def _spec(spec: Any, ranges: Mapping[str, tuple[int, int]]) -> Any:
    if all(type(d) is int for d in spec.shape):
        return spec
    dim_ranges = tuple(bounds(d, ranges) for d in spec.shape)
    shape = tuple(d if type(d) is int else None for d in spec.shape)
    return replace(spec, shape=shape, ranges=dim_ranges, dims=tuple(spec.shape))


def interface(plan: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The plan's input and output specs as a caller sees them (see the module docstring)."""
    if not plan.symbols:
        return tuple(plan.inputs), tuple(plan.output_specs)
    ranges = plan.ranges
    return (tuple(_spec(s, ranges) for s in plan.inputs),
            tuple(_spec(s, ranges) for s in plan.output_specs))


def describe_spec(spec: Any) -> str:
    """``float32 [1, 3, 48, W in 32..2048]``: a spec with its dynamic dims' ranges."""
    if spec.ranges is None:
        return f"{spec.dtype.name} {list(spec.shape)}"
    parts = [str(d) if type(d) is int else f"{d} in {lo}..{hi}"
             for d, (lo, hi) in zip(spec.dims, spec.ranges, strict=True)]
    return f"{spec.dtype.name} [{', '.join(parts)}]"


Loader = Callable[[Any, Any], tuple[str, Any]]


class DynamicRuns:
    """Bindings from feeds, and the bound plans of the recent ones (see the module docstring)."""

    def __init__(self, plan: Any, where: str, load: Loader, capacity: int = CACHE_SIZE) -> None:
        self.plan = plan
        self.where = where
        self.binder = Binder(plan)
        self._load = load
        self.names = [s.name for s in plan.symbols]
        self.ranges = plan.ranges
        self.inputs, self.outputs = interface(plan)
        # per input: its dims as (index, size) or (index, symbol name)
        self._dims: list[tuple[str, np.dtype, list[tuple[int, Any]]]] = [
            (spec.name, spec.dtype, [(k, d if type(d) is int else str(d)) for k, d in enumerate(spec.shape)])
            for spec in plan.inputs]
        # value symbols: (symbol, the one-element input whose value it is)
        self._values = [(s.name, s.input) for s in plan.symbols if s.input is not None]
        self._cache: OrderedDict[tuple[int, ...], Bound] = OrderedDict()
        self._capacity = capacity
        self._lock = threading.Lock()
        self.binds = 0  # bindings bound so far (cache misses)

    # -- feeds -> binding ------------------------------------------------------------------------
    def key(self, shapes: Mapping[str, tuple[int, ...]],
            feeds: Mapping[str, np.ndarray] | None = None) -> tuple[int, ...]:
        """The binding (symbol values in name order) the input ``shapes`` give, and the ``feeds``
        of value symbols' inputs."""
        found: dict[str, tuple[int, str, int]] = {}
        for symbol, name in self._values:
            found[symbol] = (self._value_of(symbol, name, feeds), name, -1)
        for name, _, dims in self._dims:
            shape = shapes[name]
            if len(shape) != len(dims):
                raise InputError(f"input {name!r}: shape {tuple(shape)} has {len(shape)} dims, expected "
                                 f"{len(dims)} ({describe_spec(self._spec_of(name))})")
            for k, d in dims:
                size = int(shape[k])
                if type(d) is int:
                    if size != d:
                        raise InputError(f"input {name!r}: dim {k} is {size}, expected {d} "
                                         f"(shape {tuple(shape)}; {describe_spec(self._spec_of(name))})")
                    continue
                lo, hi = self.ranges[d]
                if not lo <= size <= hi:
                    raise InputError(f"input {name!r}: dim {k} ({d}) is {size}, outside its range {lo}..{hi} "
                                     f"(shape {tuple(shape)}; {describe_spec(self._spec_of(name))})")
                seen = found.get(d)
                if seen is None:
                    found[d] = (size, name, k)
                elif seen[0] != size:
                    raise InputError(f"input {name!r} dim {k} is {size} but input {seen[1]!r} dim {seen[2]} "
                                     f"is {seen[0]}: both are {d!r} and must agree")
        return tuple(found[n][0] for n in self.names)

    def _value_of(self, symbol: str, name: str, feeds: Mapping[str, np.ndarray] | None) -> int:
        if feeds is None or name not in feeds:
            raise InputError(f"input {name!r}: its value ({symbol}, which sizes the model's results) is "
                             f"needed to bind the plan")
        value = np.asarray(feeds[name])
        if value.size != 1:  # (read before the shapes are checked)
            raise InputError(f"input {name!r}: shape {value.shape}, expected one element (its value is "
                             f"{symbol}, which sizes the model's results)")
        size = int(value.reshape(-1)[0])
        lo, hi = self.ranges[symbol]
        if not lo <= size <= hi:
            raise InputError(f"input {name!r}: value {size} ({symbol}) is outside its range {lo}..{hi} "
                             f"(the artifact was compiled for values in that range: --value {name}=LO..HI)")
        return size

    def _spec_of(self, name: str) -> Any:
        return next(s for s in self.inputs if s.name == name)

    def check_feeds(self, feeds: Any) -> dict[str, np.ndarray]:
        """The feeds as C-contiguous arrays of the right dtypes (shapes: see ``key``)."""
        if not isinstance(feeds, dict):
            raise InputError(f"feeds must be a dict of input name -> array, got {type(feeds).__name__}")
        extra = sorted(set(feeds) - {n for n, _, _ in self._dims})
        if extra:
            raise InputError(f"unknown input(s) {', '.join(map(repr, extra))}; the model's inputs are "
                             f"{', '.join(repr(n) for n, _, _ in self._dims)}")
        arrays: dict[str, np.ndarray] = {}
        for name, dtype, _ in self._dims:
            if name not in feeds:
                raise InputError(f"missing input {name!r} ({describe_spec(self._spec_of(name))})")
            value = feeds[name]
            if not isinstance(value, np.ndarray):
                value = np.asarray(value)
            if value.dtype != dtype:
                raise InputError(f"input {name!r}: dtype {value.dtype}, expected {dtype}")
            if not value.flags.c_contiguous or not value.flags.aligned:
                value = np.array(value, order="C", copy=True)
            arrays[name] = value
        return arrays

    # -- binding -> bound plan --------------------------------------------------------------------
    def bound(self, shapes: Mapping[str, tuple[int, ...]], key: tuple[int, ...] | None = None,
              feeds: Mapping[str, np.ndarray] | None = None) -> Bound:
        """The bound plan of the binding the input ``shapes`` (and value symbols' ``feeds``) give
        (cached); ``key``: their :meth:`key`, when the caller has it already."""
        key = self.key(shapes, feeds) if key is None else key
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        made = self._make(key, shapes)
        with self._lock:
            self._cache[key] = made
            self._cache.move_to_end(key)
            while len(self._cache) > self._capacity:
                self._cache.popitem(last=False)
            self.binds += 1
        return made

    def _make(self, key: tuple[int, ...], shapes: Mapping[str, tuple[int, ...]]) -> Bound:
        context = "; input shapes " + ", ".join(f"{n} {tuple(s)}" for n, s in shapes.items())
        made = self.binder.bind(dict(zip(self.names, key, strict=True)), context)
        partitions = [self._load(made.plan, record) for record in made.plan.partitions]
        text = ", ".join(f"{n}={v}" for n, v in zip(self.names, key, strict=True))
        return bound_of(made.plan, partitions, key, text, made.dyn)

    def cached(self) -> list[tuple[int, ...]]:
        """The bindings cached now, least recently used first."""
        with self._lock:
            return list(self._cache)


_VARIANT_PLAN = re.compile(r"opt/(\d+)/plan\.json")


class Variants:
    """A dynamic artifact's ``--opt-shape`` variants: the static artifacts ``opt/<k>/`` inside it,
    each run instead of the dynamic plan at exactly its binding (sessions made at first use)."""

    def __init__(self, root: Path, manifest: Mapping[str, Any], runs: DynamicRuns,
                 make: Callable[[Path], Any]) -> None:
        self._paths: dict[tuple[int, ...], Path] = {}
        for rel in manifest.get("files", {}):
            found = _VARIANT_PLAN.fullmatch(rel)
            if found is None:
                continue
            try:
                inputs = json.loads((root / rel).read_text(encoding="utf-8"))["inputs"]
                key = runs.key({spec["name"]: tuple(spec["shape"]) for spec in inputs})
            except (OSError, ValueError, KeyError, TypeError, InputError) as exc:
                raise ArtifactError(f"{root / rel}: not a static variant of this artifact: {exc}") from None
            self._paths[key] = root / "opt" / found.group(1)
        self._sessions: dict[tuple[int, ...], Any] = {}
        self._make = make
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self._paths)

    def keys(self) -> list[tuple[int, ...]]:
        return sorted(self._paths)

    def session(self, key: tuple[int, ...]) -> Any:
        """The variant's session for binding ``key``, or None when it has none."""
        path = self._paths.get(key)
        if path is None:
            return None
        with self._lock:
            if key not in self._sessions:
                self._sessions[key] = self._make(path)
            return self._sessions[key]
