"""Control steps compiled into nested schedules: each If branch and each Loop / Scan body goes
through the same back half as the model (compiler/back_half.py: partition, storage, memory plan;
its C kernels are built into the model's library with the rest), and the control step runs them
between partitions.

The frontend keeps every subgraph of an ``onnx_aot.If`` / ``Loop`` / ``Scan`` step as an IR graph
(``Body``, in the ``bodies`` attribute) beside its program. :func:`optimize_bodies` runs the model's
passes over them; ``back_half.compile_control`` compiles them (nested control steps inside first)
on the host target; on any other target (or when told not to) it drops them, and the step keeps
its programs and runs them with the reference kernels (the fallback). Here: the provider that
claims the compiled steps, and the :func:`layout` of a step's region.

A compiled step's memory is its *region*: kernel scratch of the step in the outer arena, live for
that step only. The body's own arena plan (offsets relative to the region) comes first; both
branches of an If share it (the larger of the two plans); after it come a loop's slots: the
iteration number, the condition the body returns, two buffers per carried value or state (a body
reads one and writes the other, swapped each iteration), and a Scan's slices and elements that are
not contiguous in the outer tensors (copied in and out there). Inputs and outer values are read
where the outer plan put them; an If's outputs, a Loop's scan outputs and a Scan's contiguous
slices and elements are written where the outer plan put the step's outputs.

In a dynamic graph (docs/dynamic-shapes.md) a body of static shapes compiles as above; a body of
symbolic shapes too, its region planned at the max binding (compiler/memory_policy.py: every
binding's values fit the max binding's places; its shapes, attributes and symbolic constants are
bound per binding by the runtime), its C kernels those that take run-time dims. A body placing a
value at an in-buffer offset that follows the symbols (a Concat slice) keeps its program.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from compiler.dynamic import bindings
from compiler.frontend.control.program import BODIES
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.plan import Compiled
from compiler.plan import NestedSchedule
from compiler.providers.base import GenPartition
from runtime.contract import ALIGNMENT
from runtime.contract import round_up
from runtime.symbolic import Expr
from runtime.symbolic import evaluate

__all__ = ["ControlProvider", "layout", "optimize_bodies", "static_body"]


class ControlProvider:
    """Claims the compiled control steps; their region is their scratch. No code of its own: the
    runtime's control runner (runtime/providers/control.py) calls the bodies' partitions."""

    name = "control"
    runner = "control"
    memory_space = "host"
    alignment = ALIGNMENT

    def __init__(self, compiled: dict[int, Compiled]) -> None:
        self.compiled = compiled

    def claims(self, graph: Graph) -> set[Node]:
        return {node for node in graph.nodes if id(node) in self.compiled}

    def scratch_nbytes(self, node: Node) -> int:
        return self.compiled[id(node)].region_nbytes

    def generate(self, partitions: list[GenPartition], kernels_dir: Any, options: Any) -> None:
        return None


def static_body(graph: Graph) -> bool:
    """Whether a body has static shapes only (no expression of the symbols in a shape, a constant or
    an attribute)."""
    if any(v.is_symbolic for v in graph.values()):
        return False
    return not any(_has_expr(node.attrs) for node in graph.nodes)


def _has_expr(item: Any) -> bool:
    if isinstance(item, Expr):
        return True
    if isinstance(item, dict):
        return "expr" in item or any(_has_expr(v) for v in item.values())
    if isinstance(item, list | tuple):
        return any(_has_expr(v) for v in item)
    return False


def optimize_bodies(graph: Graph, optimize: Callable[[Graph], Graph]) -> None:
    """Run ``optimize`` (the model's passes and lowerings) over the bodies of ``graph``'s control
    steps, nested ones first. Only the compiled path sees the result: the programs (the fallback)
    were written at import."""
    for node in graph.nodes:
        for body in node.attrs.get(BODIES, ()):
            optimize_bodies(body.graph, optimize)
            body.graph = optimize(body.graph)


class _Slots:
    """Places after the bodies' arena in a control step's region."""

    def __init__(self, start: int, most: dict[str, int]) -> None:
        self.end = round_up(start, ALIGNMENT)
        self.most = most  # (values of symbolic shapes take their size at the max binding)

    def take(self, value: Value) -> int:
        offset = self.end
        self.end = round_up(offset + evaluate(value.nbytes, self.most), ALIGNMENT)
        return offset


def layout(node: Node, schedules: list[NestedSchedule]) -> Compiled:
    """The region of control step ``node`` and the plan attributes saying where its slots are."""
    slots = _Slots(max(s.mem_plan.arena_nbytes for s in schedules), bindings(schedules[0].graph)["max"])
    attrs = dict(node.attrs)
    if node.op_type == "If":
        return Compiled(schedules, slots.end, {})
    body = schedules[0]
    args = _arguments(body)
    outs = body.graph.outputs
    if node.op_type == "Loop":
        n = int(attrs["n_carried"])
        loop_attrs: dict[str, Any] = {"n_carried": n}
        loop_attrs["iteration"] = slots.take(args[0]) if 0 in args else None
        loop_attrs["cond"] = slots.take(outs[0])
        loop_attrs["carried"] = [[slots.take(outs[1 + k]), slots.take(outs[1 + k])] for k in range(n)]
        return Compiled(schedules, slots.end, loop_attrs)
    n = int(attrs["n_states"])
    scan_attrs = {k: attrs[k] for k in ("n_states", "length", "in_axes", "in_dirs", "out_axes", "out_dirs")}
    scan_attrs["states"] = [[slots.take(outs[k]), slots.take(outs[k])] for k in range(n)]
    scan_attrs["slices"] = [slots.take(args[n + k]) if axis and n + k in args else None
                            for k, axis in enumerate(attrs["in_axes"])]
    scan_attrs["elements"] = [slots.take(value) if axis else None
                              for value, axis in zip(outs[n:], attrs["out_axes"], strict=True)]
    return Compiled(schedules, slots.end, scan_attrs)


def _arguments(body: NestedSchedule) -> dict[int, Value]:
    """The body's inputs bound to arguments, by argument number."""
    return {int(ref[1:]): value for ref, value in zip(body.refs, body.graph.inputs, strict=True)
            if ref.startswith("a")}
