"""The back half of a compile, one for every graph: the model, an If branch, a Loop / Scan body.

:func:`plan_graph` takes an optimized graph through its outputs' own steps
(compiler/passes/materialize_outputs.py), the IR check, its control steps (each body through
:func:`plan_graph` in turn, compiler/nested.py), partition and schedule, storage (lifetimes and
aliasing) and the memory plan, each space's plan checked. What differs between static and
symbolic shapes, and between the model and a body, is the memory policy it is given
(compiler/memory_policy.py). The model's plan records and code come after (compiler/plan.py,
compiler/artifact/writer.py); a body's are built into the model's.
"""

from __future__ import annotations

from collections.abc import Callable

from compiler.frontend.control.program import BODIES
from compiler.frontend.control.program import Body
from compiler.ir.graph import Graph
from compiler.memory.lifetimes import assign_storage
from compiler.memory_policy import MemoryPolicy
from compiler.memory_policy import PlacedInBuffer
from compiler.memory_policy import body_policy
from compiler.nested import ControlProvider
from compiler.nested import layout
from compiler.nested import static_body
from compiler.partition.partitioner import partition_graph
from compiler.passes.materialize_outputs import materialize_outputs
from compiler.plan import Compiled
from compiler.plan import NestedSchedule
from compiler.plan import PlannedGraph
from compiler.providers.base import Provider
from runtime.contract import ALIGNMENT

__all__ = ["compile_control", "plan_graph"]

Progress = Callable[[str], None]


def _quiet(_message: str) -> None:
    return None


def _no_input(_node: object) -> None:
    return None


def plan_graph(graph: Graph, providers: list[Provider], policy: MemoryPolicy, budget_ms: float | None,
               *, compiled_control: bool = True, say: Progress = _quiet) -> PlannedGraph:
    """Take ``graph`` (changed in place) through the back half with ``providers`` (in priority
    order) and the memory ``policy``; ``budget_ms`` bounds the offset packing, ``compiled_control``
    False leaves the control steps their programs (compile_control), ``say`` reports progress."""
    materialize_outputs(graph)
    graph.verify()
    nodes = len(graph)
    control = compile_control(graph, providers, budget_ms, enabled=compiled_control)
    if control:
        say(f"compiled {len(control)} control step(s) into nested schedules")
        providers = [ControlProvider(control), *providers]
    schedule = partition_graph(graph, providers)
    placed = [(p.name, schedule.provider_of_step.count(p.name)) for p in providers]
    say(f"partitioning {nodes} nodes: " + ", ".join(f"{n} on {name}" for name, n in placed if n))
    by_name = {p.name: p for p in providers}
    step_space = [by_name[name].memory_space for name in schedule.provider_of_step]
    scratch = [by_name[name].scratch_nbytes(node)
               for name, node in zip(schedule.provider_of_step, schedule.steps, strict=True)]
    # the input a provider's kernel may write a step's output over (``overwritable_input``, optional)
    overwrites = [getattr(by_name[name], "overwritable_input", _no_input)(node)
                  for name, node in zip(schedule.provider_of_step, schedule.steps, strict=True)]
    say("planning memory")
    storage = policy.storage(assign_storage(graph, schedule.steps, step_space, scratch,
                                            overwrites=overwrites))
    alignment = policy.alignment(providers)
    mem_plans = {space: policy.plan(storage.buffers.get(space, []), alignment[space], budget_ms)
                 for space in sorted(set(step_space))}
    return PlannedGraph(graph, schedule, storage, mem_plans, alignment, control, providers, policy)


def compile_control(graph: Graph, providers: list[Provider], budget_ms: float | None,
                    *, enabled: bool = True) -> dict[int, Compiled]:
    """Compile the bodies of ``graph``'s control steps (by id(node)) on the host target. Every step
    loses its ``bodies`` attribute; those not compiled (a target other than the host's, not
    ``enabled``, or a body placing values at offsets that follow the symbols) keep their programs,
    which run on the reference kernels."""
    host_only = enabled and all(p.memory_space == "host" for p in providers)
    compiled: dict[int, Compiled] = {}
    for node in graph.nodes:
        bodies: list[Body] | None = node.attrs.pop(BODIES, None)
        if bodies is None or not host_only:
            continue
        for body in bodies:  # (static: the outer graph's symbols, if any, are not the body's)
            if static_body(body.graph):
                body.graph.symbols, body.graph.value_symbols = {}, {}
        try:
            schedules = [_schedule(body, providers, budget_ms) for body in bodies]
        except PlacedInBuffer:  # values placed at offsets that follow the symbols: the programs run
            continue
        compiled[id(node)] = layout(node, schedules)
        node.attrs = dict(compiled[id(node)].attrs)  # the programs are not needed any more
    return compiled


def _schedule(body: Body, providers: list[Provider], budget_ms: float | None) -> NestedSchedule:
    """A body through the back half: host memory only, its region's offsets in ALIGNMENT steps."""
    policy = body_policy(body.graph, {"host": ALIGNMENT})
    planned = plan_graph(body.graph, providers, policy, budget_ms)
    # (every body has an output, so a step: If, Loop and Scan bodies return one or more values)
    return NestedSchedule(body.graph, body.refs, planned.schedule, planned.storage,
                          planned.mem_plans["host"], planned.control, policy)
