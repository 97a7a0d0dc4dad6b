"""Load-time checks of a plan's symbolic parts (format version 3, docs/dynamic-shapes.md).

``Plan.from_json`` reads every dim as an int or an expression (``runtime/plan_schema.py``); this
module checks what ties them to the plan's ``symbols``: a static plan (no symbols) holds no
expression at all; a dynamic one names only its own symbols (and, in arena offsets, the buffers'
placeholders ``_b<k>``), every graph input dim is an int or a bare symbol and every symbol is one
of them (the binding comes from the feeds), ``buffers[k].offset`` is ``_b<k>``, a ``symbolic``
value is a 0-D or 1-D integer tensor with one element per entry, ``{"expr": TEXT}`` in attrs
parses, CUDA launches name only symbols (and placeholders in pointers), and only reference, C,
CUDA and control partitions (nested schedules whose memory is static: a body's region is planned
at the max binding; its values' shapes and attributes may name symbols) run it; a value symbol
(``input``) names a one-element integer or bool input. Each failure is an
``ArtifactError`` naming the file and the field. Records are taken duck-typed (this module is
imported by plan_schema).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from runtime.contract import DYN_EXT
from runtime.contract import placeholder
from runtime.json_fields import Where
from runtime.symbolic import free_symbols
from runtime.symbolic import parse
from runtime.symbolic import sym

__all__ = ["DYN_EXT", "check_symbols", "placeholder", "attr_exprs"]


def _dims(shape: Iterable[Any]) -> list[Any]:
    return [d for d in shape if type(d) is not int and type(d) is not float]


def _value_dims(value: Any) -> list[Any]:
    loc = value.location
    return [*_dims(value.shape), *_dims((loc.offset,)), *_dims(loc.elements)]


def _check_static(plan: Any, where: Where) -> None:
    """No expression anywhere in a plan without symbols."""
    for name, value in plan.values.items():
        if _value_dims(value):
            raise where.key("values").item(name).error("holds a dim expression, but the plan has no symbols")
    for k, buf in enumerate(plan.buffers):
        if _dims((buf.offset, buf.nbytes)):
            raise where.key("buffers").item(k).error("holds an expression, but the plan has no symbols")
    for key, specs in (("inputs", plan.inputs), ("outputs", plan.output_specs)):
        for k, spec in enumerate(specs):
            if _dims(spec.shape):
                raise where.key(key).item(k).key("shape").error(
                    "holds an expression, but the plan has no symbols")
    for step in plan.steps:
        if step.scratch is not None and _dims((step.scratch.offset, step.scratch.nbytes)):
            raise where.key("steps").item(step.index).key("scratch").error(
                "holds an expression, but the plan has no symbols")
        if any(_dims((*launch.grid, *(a.value for a in launch.args))) for launch in step.launches or ()):
            raise where.key("steps").item(step.index).key("launches").error(
                "holds an expression, but the plan has no symbols")


def _names(where: Where, dims: Iterable[Any], allowed: frozenset[str] | set[str]) -> None:
    for dim in dims:
        unknown = sorted(free_symbols(dim) - allowed)
        if unknown:
            raise where.error(f"names {', '.join(map(repr, unknown))} in {dim}, which 'symbols' does not "
                              f"have")


def check_symbols(plan: Any, where: Where) -> None:
    """Raise ``ArtifactError`` where the plan's expressions do not fit its symbols."""
    if not plan.symbols:
        _check_static(plan, where)
        return
    names = [s.name for s in plan.symbols]
    if names != sorted(set(names)):
        raise where.key("symbols").error(f"must be sorted by name, each once; got {names}")
    allowed = frozenset(names)
    _check_interface(plan, where, allowed)
    places = {placeholder(k) for k in range(len(plan.buffers))}
    for k, buf in enumerate(plan.buffers):
        at = where.key("buffers").item(k)
        if type(buf.offset) is int or buf.offset != sym(placeholder(k)):
            raise at.key("offset").wrong(f'the placeholder "{placeholder(k)}" in a dynamic plan',
                                         str(buf.offset))
        _names(at.key("nbytes"), (buf.nbytes,), allowed)
    for name, value in plan.values.items():
        at = where.key("values").item(name)
        _names(at.key("shape"), _dims(value.shape), allowed)
        loc = value.location
        _names(at.key("location"), _dims((loc.offset,)), allowed | places)
        _names(at.key("location"), _dims(loc.elements), allowed)
        if loc.kind == "symbolic":
            _check_symbolic_value(value, at)
    _check_steps(plan, where, allowed, places)
    for k, assumption in enumerate(plan.assumptions):
        _names(where.key("assumptions").item(k), _dims((assumption.a, assumption.b)), allowed)


def _check_interface(plan: Any, where: Where, allowed: frozenset[str]) -> None:
    seen: set[str] = set()
    for k, spec in enumerate(plan.inputs):
        at = where.key("inputs").item(k).key("shape")
        for d, dim in enumerate(spec.shape):
            if type(dim) is int:
                continue
            bare = [n for n in free_symbols(dim) if dim == sym(n)]
            if not bare:
                raise at.item(d).error(f"is {dim}: a graph input's dim must be an int or a bare symbol")
            seen.add(bare[0])
    _names(where.key("inputs"), [d for s in plan.inputs for d in _dims(s.shape)], allowed)
    seen |= _value_symbols(plan, where)
    missing = sorted(allowed - seen)
    if missing:
        raise where.key("symbols").error(f"has {', '.join(map(repr, missing))}, which no graph input's dim "
                                         f"is (the runtime binds symbols from the inputs' shapes)")
    for k, spec in enumerate(plan.output_specs):
        _names(where.key("outputs").item(k).key("shape"), _dims(spec.shape), allowed)


def _value_symbols(plan: Any, where: Where) -> set[str]:
    """The value symbols (``input`` set), each naming a one-element integer or bool graph input of
    static shape."""
    inputs = {spec.name: spec for spec in plan.inputs}
    found = set()
    for k, symbol in enumerate(plan.symbols):
        if symbol.input is None:
            continue
        spec = inputs.get(symbol.input)
        if spec is None or spec.dtype.kind not in "iub" or any(type(d) is not int for d in spec.shape) \
                or math.prod(spec.shape) != 1:
            raise where.key("symbols").item(k).key("input").error(
                f"is {symbol.input!r}: a value symbol names a one-element integer or bool graph input")
        found.add(symbol.name)
    return found


def _check_schedule(schedule: Any, at: Where, allowed: frozenset[str]) -> None:
    """A dynamic plan's nested schedule: its values' shapes, symbolic values and its steps'
    attributes may name the symbols; its buffers, offsets and scratch are static (placed at the max
    binding)."""
    for name, value in schedule.values.items():
        loc = value.location
        _names(at.key("values").item(name).key("shape"), _dims(value.shape), allowed)
        _names(at.key("values").item(name).key("location"), _dims(loc.elements), allowed)
        if type(loc.offset) not in (int, type(None)):
            raise at.key("values").item(name).key("location").error("is not static")
    dims = [d for b in schedule.buffers for d in (b.offset, b.nbytes)] + [schedule.arena_nbytes]
    for step in schedule.steps:
        dims += [step.scratch.offset, step.scratch.nbytes] if step.scratch is not None else []
        for _path, text in attr_exprs(step.attrs):
            _names(at.key("steps").item(step.index).key("attrs"), [parse(text)], allowed)
        for s, inner in enumerate(step.schedules or ()):
            _check_schedule(inner, at.key("steps").item(step.index).key("schedules").item(s), allowed)
    if any(type(d) is not int for d in dims):
        raise at.error("places a buffer at an expression: a nested schedule's memory is static")


def _check_symbolic_value(value: Any, at: Where) -> None:
    shape = value.shape
    count = 1 if len(shape) == 0 else shape[0]
    if value.dtype.kind not in "iufb" or len(shape) > 1 or type(count) is not int \
            or count != len(value.location.elements):
        raise at.error(f"is a symbolic value of dtype {value.dtype} and shape {list(shape)} with "
                       f"{len(value.location.elements)} elements: it must be a 0-D or 1-D numeric tensor "
                       f"with one element per entry (a dim cast to float is a float; a value symbol's "
                       f"bool is a bool)")


def _check_steps(plan: Any, where: Where, allowed: frozenset[str], places: set[str]) -> None:
    for k, part in enumerate(plan.partitions):
        if part.runner not in ("reference", "c", "cuda", "control"):
            raise where.key("partitions").item(k).key("runner").wrong(
                '"reference", "c", "cuda" or "control" in a dynamic plan', part.runner)
        if part.runner == "c" and part.ext[:1] != (DYN_EXT,):
            raise where.key("partitions").item(k).key("ext").wrong(
                f'{DYN_EXT!r} first in a dynamic plan\'s C partition (the binding it reads)', list(part.ext))
    for step in plan.steps:
        at = where.key("steps").item(step.index)
        for s, schedule in enumerate(step.schedules or ()):  # (a compiled body of a dynamic plan)
            _check_schedule(schedule, at.key("schedules").item(s), allowed)
        for j, launch in enumerate(step.launches or ()):  # grids and scalars: symbols; pointers too
            _names(at.key("launches").item(j), _dims(launch.grid), allowed)
            _names(at.key("launches").item(j), _dims(a.value for a in launch.args), allowed | places)
        if step.scratch is not None:
            _names(at.key("scratch"), _dims((step.scratch.offset,)), allowed | places)
            _names(at.key("scratch"), _dims((step.scratch.nbytes,)), allowed)
        for path, text in attr_exprs(step.attrs):
            try:
                dim = parse(text) if isinstance(text, str) else None
            except ValueError as exc:
                raise at.key("attrs").error(f"{path}: {exc}") from None
            if dim is None:
                raise at.key("attrs").error(f"{path}: {{\"expr\": ...}} must hold an expression's text, "
                                            f"got {text!r}")
            _names(at.key("attrs"), _dims((dim,)), allowed)


def attr_exprs(value: Any, path: str = "") -> Iterable[tuple[str, Any]]:
    """Every ``{"expr": TEXT}`` inside ``value`` (attrs: lists and objects, at any depth), with
    its path (``axes[1]``)."""
    if isinstance(value, dict):
        if set(value) == {"expr"}:
            yield path, value["expr"]
            return
        for key, item in value.items():
            yield from attr_exprs(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for k, item in enumerate(value):
            yield from attr_exprs(item, f"{path}[{k}]")

