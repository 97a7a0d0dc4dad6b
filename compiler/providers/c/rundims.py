"""Run-time dims for the C kernels that move bytes, normalize and reduce (movement, indexing,
spatial, norm, reduce): one helper deciding, per step, whether its dims are C text over the
binding (``cdims.kernel_dims``) and adding the binding's argument and parameter, so that a static
node renders exactly as before."""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from compiler.codegen.cdims import kernel_dims
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.providers.base import GenStep
from compiler.providers.c.common import Arg
from compiler.providers.c.common import dyn_arg
from compiler.providers.kit import Param
from runtime.symbolic import Expr

__all__ = ["RunDims", "is_dynamic", "run_dims", "known_zero", "parallel_if", "symbolic_const", "int_or_none",
           "assumed_equal"]


def is_dynamic(node: Node) -> bool:
    """A value of ``node`` has a symbolic dim (or is a symbolic constant)."""
    return any(v is not None and v.is_symbolic for v in (*node.inputs, *node.outputs))


def symbolic_const(v: Value | None) -> bool:
    """``v`` is a constant whose elements are expressions of the symbols (a shape computed from a
    run-time dim): no kernel here reads it."""
    return v is not None and v.is_const and v.is_symbolic


def assumed_equal(node: Node) -> Callable[[Any, Any], bool] | None:
    """Where ``node``'s graph records import assumptions (``Graph.assumptions``: two different
    expressions of the symbols that must be equal, which the runtime checks at each binding before
    any step runs), whether two dims are one of those pairs; None without any."""
    graph = node.graph
    pairs = {frozenset((a, b)) for _, a, b in graph.assumptions} if graph is not None else set()
    if not pairs:
        return None
    return lambda a, b: isinstance(a, Expr) and isinstance(b, Expr) and frozenset((a, b)) in pairs


def int_or_none(x: object) -> int | None:
    """``x`` as an int where it is one (numpy ints too; a bool is not), else None."""
    if isinstance(x, bool) or isinstance(x, Expr):
        return None
    try:
        return operator.index(x)  # type: ignore[arg-type]
    except TypeError:
        return None


def known_zero(x: object) -> bool:
    """``x`` is the int 0 (a run-time dim, ``Expr`` or ``CDim``, never is known to be)."""
    return int_or_none(x) == 0


@dataclass(frozen=True)
class RunDims:
    """``write`` turns a dim (int or Expr) into what a template uses (int, or ``CDim``);
    ``args`` / ``params`` are the binding's argument and parameter to append (none for a static
    node)."""

    write: Callable[[Any], Any]
    args: tuple[Arg, ...]
    params: tuple[Param, ...]

    @property
    def dynamic(self) -> bool:
        return bool(self.args)


def run_dims(step: GenStep) -> RunDims:
    if not is_dynamic(step.node):
        return RunDims(lambda x: int(x), (), ())
    return RunDims(kernel_dims(step.symbols), (dyn_arg(step),), (Param("dyn", "int64_t", True, True),))


def parallel_if(work: object, least: int) -> str:
    """The OpenMP if clause's condition where ``work`` is a run-time size (C text), else ""."""
    return "" if isinstance(work, int) else f"{work} >= {least}"
