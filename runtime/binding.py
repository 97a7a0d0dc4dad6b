"""A dynamic plan at one binding of its symbols: a static plan, placed (issue 17, format version 3).

``Binder(plan).bind(sizes)`` (``Plan.bind`` makes a ``Binder`` each call; ``Session`` keeps one
and caches what it returns per binding) checks each size against its symbol's range and every
assumption (``a == b``, recorded by the import where a model needs two dims to agree), evaluates
every dim, buffer size, scratch, ``{"expr": ...}`` attribute and CUDA launch (grid, run-time
dims, arena pointers), places each arena's buffers
(``runtime/placement.py``: lifetimes from the plan, sizes at this binding), binds each
placeholder ``_b<k>`` to buffer k's offset, evaluates the values' arena offsets, and returns a
``BoundPlan``: ``plan`` (a static plan: every dim an int, no symbols; its arenas sized for this
binding, with their lower bound and strategy ``"runtime"``) and ``arrays`` (each ``symbolic``
value as a numpy array of its dtype). Records without expressions are reused as they are, and each
distinct expression is evaluated once per binding.

Records are handled duck-typed (``dataclasses.replace``): ``runtime/plan_schema.py`` imports this
module from ``Plan.bind``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from typing import Any

import numpy as np

from runtime.errors import InputError
from runtime.placement import aligned
from runtime.placement import lower_bound
from runtime.placement import place
from runtime.plan_symbols import attr_exprs
from runtime.plan_symbols import placeholder
from runtime.symbolic import Expr
from runtime.symbolic import parse

__all__ = ["BoundPlan", "Binder", "bind_plan"]


@dataclass(frozen=True)
class BoundPlan:
    """A dynamic plan at one binding: ``plan`` is static; ``arrays`` are the symbolic values;
    ``dyn`` is what a C partition with run-time dims reads through its ext slot ``DYN_EXT``: the
    symbols' values (plan order), then each buffer's offset (compiler/codegen/cdims.py)."""

    sizes: Mapping[str, int]
    plan: Any
    arrays: Mapping[str, np.ndarray]
    dyn: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


class _Eval:
    """Dims at one binding, each distinct expression evaluated once."""

    def __init__(self, env: dict[str, int]) -> None:
        self.env = env
        self.memo: dict[Any, int] = {}

    def __call__(self, dim: Any) -> Any:
        if type(dim) is int or type(dim) is float:  # (a float: an element of a symbolic value)
            return dim
        value = self.memo.get(dim)
        if value is None:
            value = self.memo[dim] = dim.evaluate(self.env)
        return value

    def shape(self, shape: tuple[Any, ...], what: str) -> tuple[int, ...]:
        out = tuple(self(d) for d in shape)
        if any(d < 0 for d in out):
            raise InputError(f"{what} has shape {list(out)} (negative) at {_text(self.env)}: the model "
                             f"cannot take this shape")
        return out


def _text(sizes: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sizes.items() if not k.startswith("_"))


def _attrs(value: Any, ev: _Eval) -> Any:
    if isinstance(value, dict):
        if set(value) == {"expr"}:
            return ev(parse(value["expr"]))
        return {k: _attrs(v, ev) for k, v in value.items()}
    if isinstance(value, list):
        return [_attrs(v, ev) for v in value]
    return value


def _bind_schedule(schedule: Any, ev: _Eval) -> Any:
    """A nested schedule at this binding: its values' shapes, symbolic values and its steps'
    attributes (its buffers are placed at the max binding, static; compiler/nested.py), nested
    schedules too."""
    values = {name: _bind_value(v, name, ev) for name, v in schedule.values.items()}
    steps = tuple(_with(s, attrs=_attrs(s.attrs, ev), schedules=tuple(
        _bind_schedule(c, ev) for c in s.schedules) if s.schedules else s.schedules) for s in schedule.steps)
    return _with(schedule, values=values, steps=steps)


def _bind_value(value: Any, name: str, ev: _Eval) -> Any:
    """A nested schedule's value at this binding: its shape, a symbolic value's elements."""
    loc = value.location
    if loc.kind == "symbolic":
        loc = _with(loc, elements=tuple(ev(e) for e in loc.elements))
    elif all(type(d) is int for d in value.shape):
        return value
    return _with(value, shape=ev.shape(value.shape, f"value {name!r}"), location=loc)


def _with(record: Any, **changes: Any) -> Any:
    """``dataclasses.replace`` for the plan's frozen records without its per-call introspection
    (a bind replaces hundreds of records; this is ~5x faster)."""
    out = object.__new__(type(record))
    out.__dict__.update(record.__dict__)
    out.__dict__.update(changes)
    return out


def _symbolic(value: Any) -> bool:
    loc = value.location
    return any(type(d) is not int for d in (*value.shape, loc.offset)) or loc.kind == "symbolic"


class Binder:
    """Binds one dynamic plan, many times: what needs evaluating is found once, here."""

    def __init__(self, plan: Any) -> None:
        self.plan = plan
        self.ranges = {s.name: (s.min, s.max) for s in plan.symbols}
        self.values = [name for name, v in plan.values.items() if _symbolic(v)]
        self.steps = [k for k, s in enumerate(plan.steps)
                      if s.scratch is not None or any(True for _ in attr_exprs(s.attrs)) or s.launches]
        self.spaces = sorted({b.arena for b in plan.buffers})

    def check(self, sizes: Mapping[str, int], context: str = "") -> dict[str, int]:
        """``sizes`` as ints, each symbol given once and within its range, every assumption true;
        ``InputError`` otherwise (``context``, such as the input shapes, ends the message)."""
        unknown = sorted(set(sizes) - set(self.ranges))
        missing = sorted(set(self.ranges) - set(sizes))
        if unknown or missing:
            raise InputError(f"binding {dict(sizes)}: {self.plan.name} has symbols {', '.join(self.ranges)}"
                             + (f"; unknown: {', '.join(unknown)}" if unknown else "")
                             + (f"; missing: {', '.join(missing)}" if missing else ""))
        env = {name: int(sizes[name]) for name in self.ranges}
        for name, (lo, hi) in self.ranges.items():
            if not lo <= env[name] <= hi:
                raise InputError(f"symbol {name!r} = {env[name]} is outside its range {lo}..{hi}{context}")
        ev = _Eval(env)
        for rule in self.plan.assumptions:
            a, b = ev(rule.a), ev(rule.b)
            if a != b:
                raise InputError(f"node {rule.node!r} needs {rule.a} == {rule.b}, but at {_text(env)} they "
                                 f"are {a} and {b}: the model cannot take this shape{context}")
        return env

    def bind(self, sizes: Mapping[str, int], context: str = "") -> BoundPlan:
        """The plan at ``sizes`` (see the module docstring)."""
        env = self.check(sizes, context)
        plan = self.plan
        ev = _Eval(dict(env))
        arenas, buffers = self._place(ev)
        values = dict(plan.values)
        arrays: dict[str, np.ndarray] = {}
        for name in self.values:
            value = values[name]
            loc = value.location
            shape = ev.shape(value.shape, f"value {name!r}")
            if loc.kind == "symbolic":
                elements = tuple(ev(e) for e in loc.elements)
                arrays[name] = np.array(elements, value.dtype).reshape(shape)
                loc = _with(loc, elements=elements)
            elif type(loc.offset) is not int:
                loc = _with(loc, offset=ev(loc.offset))
            values[name] = _with(value, shape=shape, location=loc)
        steps = list(plan.steps)
        for k in self.steps:
            step = steps[k]
            scratch = step.scratch
            if scratch is not None:
                scratch = _with(scratch, offset=ev(scratch.offset), nbytes=ev(scratch.nbytes))
            launches = step.launches
            if launches:  # a CUDA step's grids, run-time dims and arena pointers at this binding
                launches = tuple(_with(launch, grid=tuple(ev(d) for d in launch.grid), args=tuple(
                    a if type(a.value) is not Expr else _with(a, value=ev(a.value)) for a in launch.args))
                    for launch in launches)
            schedules = step.schedules
            if schedules:  # a compiled body of symbolic shapes: its values and attributes bound
                schedules = tuple(_bind_schedule(s, ev) for s in schedules)
            steps[k] = _with(step, scratch=scratch, attrs=_attrs(step.attrs, ev), launches=launches,
                             schedules=schedules)
        inputs = tuple(_with(s, shape=ev.shape(s.shape, f"input {s.name!r}")) for s in plan.inputs)
        outputs = tuple(_with(o, spec=_with(o.spec, shape=ev.shape(o.spec.shape, f"output {o.value!r}")))
                        for o in plan.outputs)
        bound = _with(plan, symbols=(), assumptions=(), inputs=inputs, outputs=outputs, arenas=arenas,
                        buffers=buffers, values=values, steps=tuple(steps))
        dyn = np.array([env[s.name] for s in plan.symbols] + [b.offset for b in buffers], np.int64)
        return BoundPlan(env, bound, arrays, dyn)

    def _place(self, ev: _Eval) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """Each arena's buffers placed at this binding; binds the placeholders in ``ev``."""
        plan = self.plan
        sizes = [ev(b.nbytes) for b in plan.buffers]
        offsets = [0] * len(sizes)
        arenas = []
        for arena in plan.arenas:
            space = arena.memory_space
            mine = [k for k, b in enumerate(plan.buffers) if b.arena == space]
            mine_sizes = [sizes[k] for k in mine]
            firsts = [plan.buffers[k].first_step for k in mine]
            lasts = [plan.buffers[k].last_step for k in mine]
            where, total = place(mine_sizes, firsts, lasts, arena.alignment)
            for k, offset in zip(mine, where, strict=True):
                offsets[k] = offset
            arenas.append(_with(arena, nbytes=total, strategy="runtime",
                                  lower_bound_nbytes=lower_bound(mine_sizes, firsts, lasts, arena.alignment),
                                  naive_nbytes=sum(aligned(s, arena.alignment) for s in mine_sizes)))
        for k, offset in enumerate(offsets):
            ev.env[placeholder(k)] = offset
        buffers = tuple(_with(b, offset=offsets[k], nbytes=sizes[k]) for k, b in enumerate(plan.buffers))
        return tuple(arenas), buffers


def bind_plan(plan: Any, sizes: Mapping[str, int]) -> BoundPlan:
    """``plan`` (dynamic) at the binding ``sizes`` (symbol -> int)."""
    return Binder(plan).bind(sizes)
