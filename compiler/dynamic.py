"""What a compile does with symbolic dims (issue 17; docs/dynamic-shapes.md): the helpers the
memory policies of compiler/memory_policy.py use.

The import keeps ranged dims as symbols (``Graph.symbols``). The providers are those of a static
compile, their kernels taking the dims at run time where a shape has symbols. Lifetimes and aliasing
are the static ones (``assign_storage`` works on expressions); a buffer's size is an ``Expr`` of the
symbols, and its offset is placed *by the runtime* at each binding (``runtime/placement.py``):
plan.json names it with the placeholder ``_b<k>`` (``k`` its index in ``buffers``), and every arena
value's offset is that placeholder plus its offset in the buffer. The arena figures plan.json
records are those at the max binding; the memory report shows the placement at the min and the max
bindings. Golden cases run at the min binding and at a middle one (``bindings``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from compiler.ir.graph import Graph
from compiler.memory import Buffer
from compiler.memory import MemoryPlan
from compiler.memory.lifetimes import Storage
from runtime.contract import placeholder as plan_placeholder
from runtime.errors import ShapeError
from runtime.placement import lower_bound
from runtime.placement import place
from runtime.symbolic import Dim
from runtime.symbolic import evaluate
from runtime.symbolic import sym

__all__ = ["STRATEGY", "Binding", "bindings", "describe_symbols", "dynamic_report", "OPT_DIR", "opt_binding",
           "placeholder", "placeholder_plan", "plan_at", "storage_at"]

STRATEGY = "runtime"  # plan.json's arena strategy: the runtime places the buffers per binding
Binding = dict[str, int]


def describe_symbols(graph: Graph) -> str:
    """``W=32..2048, batch=1..8``: the symbols and their ranges, for messages."""
    return ", ".join(f"{name}={lo}..{hi}" for name, (lo, hi) in sorted(graph.symbols.items()))


def bindings(graph: Graph) -> dict[str, Binding]:
    """The named bindings a dynamic compile plans and tests at: every symbol at its ``min``, at its
    ``max``, and in the ``middle`` of its range (a value symbol rounded up: a condition in 0..1 is
    1 there, so the golden cases run the loop)."""
    ranges = graph.symbols
    up = graph.value_symbols
    return {"min": {s: lo for s, (lo, _hi) in ranges.items()},
            "middle": {s: (lo + hi + (s in up)) // 2 for s, (lo, hi) in ranges.items()},
            "max": {s: hi for s, (_lo, hi) in ranges.items()}}


def placeholder(k: int) -> Dim:
    """The offset of buffer ``k`` (its index in plan.json's ``buffers``), bound by the runtime."""
    return sym(plan_placeholder(k))


def _sizes(buffers: list[Buffer], binding: Mapping[str, int]) -> list[int]:
    return [evaluate(b.nbytes, binding) for b in buffers]


def plan_at(buffers: list[Buffer], alignment: int, binding: Mapping[str, int]) -> MemoryPlan:
    """The runtime's placement of ``buffers`` at ``binding``, as a MemoryPlan (for the report)."""
    sizes = _sizes(buffers, binding)
    firsts = [b.first_step for b in buffers]
    lasts = [b.last_step for b in buffers]
    offsets, total = place(sizes, firsts, lasts, alignment)
    return MemoryPlan({b.id: int(offsets[k]) for k, b in enumerate(buffers)}, int(total),
                      int(lower_bound(sizes, firsts, lasts, alignment)), sum(sizes), STRATEGY)


def placeholder_plan(buffers: list[Buffer], alignment: int, graph: Graph) -> MemoryPlan:
    """plan.json's memory plan of a dynamic graph: every offset a placeholder, the figures at the
    max binding."""
    at_max = plan_at(buffers, alignment, bindings(graph)["max"])
    offsets: dict[Any, Any] = {b.id: placeholder(k) for k, b in enumerate(buffers)}  # Exprs, not ints
    return dataclasses.replace(at_max, offsets=offsets)


def storage_at(storage: Storage, binding: Mapping[str, int]) -> Storage:
    """``storage`` with every size and in-buffer offset evaluated at ``binding`` (for the report)."""
    buffers = {space: [dataclasses.replace(b, nbytes=evaluate(b.nbytes, binding)) for b in bufs]
               for space, bufs in storage.buffers.items()}
    offset = {name: evaluate(off, binding) for name, off in storage.offset.items()}
    return dataclasses.replace(storage, buffers=buffers, offset=offset)


def dynamic_report(graph: Graph, storage: Storage, alignment: Mapping[str, int]) -> dict[str, Any]:
    """report/memory.json's ``dynamic`` section: the symbols, and per named binding each arena's
    placed size against its lower bound."""
    out: dict[str, Any] = {"symbols": {s: list(r) for s, r in sorted(graph.symbols.items())}, "bindings": {}}
    for label, binding in bindings(graph).items():
        arenas = {}
        for space, bufs in storage.buffers.items():
            mplan = plan_at(bufs, alignment[space], binding)
            ratio = mplan.arena_nbytes / mplan.lower_bound_nbytes if mplan.lower_bound_nbytes else 1.0
            arenas[space] = {"arena_nbytes": mplan.arena_nbytes,
                             "lower_bound_nbytes": mplan.lower_bound_nbytes,
                             "naive_nbytes": mplan.naive_nbytes, "ratio": round(ratio, 4)}
        out["bindings"][label] = {"binding": dict(sorted(binding.items())), "arenas": arenas}
    return out


OPT_DIR = "opt"  # an --opt-shape variant k is the static artifact opt/<k>/ inside the dynamic one


def opt_binding(graph: Graph, spec: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
    """Every graph input's shape at the binding that the ``--opt-shape`` ``spec`` (input name ->
    sizes, for some of the inputs) gives; ``ShapeError`` naming the input or symbol otherwise."""
    inputs = {v.name: v for v in graph.inputs}
    binding: dict[str, int] = {}
    for name, sizes in spec.items():
        if name not in inputs:
            raise ShapeError(f"--opt-shape {name}=...: the model's inputs are {', '.join(sorted(inputs))}")
        dims = inputs[name].shape or ()
        sizes = tuple(int(s) for s in sizes)
        if len(sizes) != len(dims):
            raise ShapeError(f"--opt-shape {name}: {len(sizes)} dims given, input {name!r} has {len(dims)}")
        for k, (dim, size) in enumerate(zip(dims, sizes, strict=True)):
            if isinstance(dim, int):
                if dim != size:
                    raise ShapeError(f"--opt-shape {name}: dim {k} is fixed at {dim}, got {size}")
                continue
            symbol = str(dim)
            lo, hi = graph.symbols[symbol]
            if not lo <= size <= hi or binding.get(symbol, size) != size:
                other = f" and another input gives {binding[symbol]}" if symbol in binding else ""
                raise ShapeError(f"--opt-shape {name}: dim {k} ({symbol}) is {size}; its range is "
                                 f"{lo}..{hi}{other}")
            binding[symbol] = size
    unbound = sorted(set(graph.symbols) - set(binding))
    if unbound:
        raise ShapeError(f"--opt-shape {','.join(spec)}: dims {', '.join(unbound)} are not given; name the "
                         f"inputs that have them in the same --opt-shape (NAME=DIMS,NAME2=DIMS2)")
    return {name: tuple(evaluate(d, binding) for d in (v.shape or ())) for name, v in inputs.items()}
