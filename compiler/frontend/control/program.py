"""Sub-schedules for control steps: a subgraph imported into a graph of its own, then written as the
*program* a control step's reference kernel runs (runtime/kernels/control.py has the format).

The subgraph is imported with the same importer (canonical forms, folding, nested control flow)
into a child graph whose inputs stand for the outer values it reads. Writing it out, every outer
value and every constant the program reads becomes an input of the control step, so the planner
places them like any step's operands (constants in weights.bin) and the step's lifetimes keep them
alive until it runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import onnx

from compiler.frontend.control.scope import ControlScope
from compiler.frontend.control.scope import inline
from compiler.frontend.control.scope import outer_names
from compiler.frontend.sequences import OptValue
from compiler.frontend.sequences import SeqValue
from compiler.frontend.sequences import refuse_sequences
from compiler.ir.graph import Graph
from compiler.ir.graph import Value
from compiler.plan import jsonable
from runtime.errors import ModelError

__all__ = ["BODIES", "Body", "Capture"]

# The node attribute holding a control step's subgraphs as IR graphs (a list of Body, one per
# program): the driver compiles them into nested schedules, or drops them and keeps the programs.
BODIES = "bodies"


@dataclass
class Body:
    """A subgraph imported into a graph of its own. Its inputs are bound by ``refs`` (by position)
    to the control step's inputs (``"i<k>"``) or the program's arguments (``"a<k>"``); its outputs
    are the subgraph's, in order."""

    graph: Graph
    refs: list[str]


class Capture:
    """The inputs of one control step: ``fixed`` outer values first, then whatever its programs read."""

    def __init__(self, scope: ControlScope, name: str, fixed: Sequence[str]) -> None:
        self.scope = scope
        self.name = name
        self.inputs: list[str] = list(fixed)  # outer env names, by input index
        # (id(sub-graph), outer name) -> the value standing for it in that sub-graph (one per
        # sub-graph: a Value belongs to one graph, and each body is compiled on its own)
        self._proxy: dict[tuple[int, str], Value] = {}
        # id(proxy or sub-graph constant) -> (the value, kept alive so that its id is not reused; its
        # input index)
        self._outer: dict[int, tuple[Value, int]] = {}
        self._by_name: dict[str, int] = {}  # outer name read through proxies -> its input index
        self.bodies: list[Body] = []  # one per program written, in order

    def _input(self, outer: str, value: Value, *, proxy: bool = False) -> int:
        if id(value) not in self._outer:
            index = self._by_name.get(outer) if proxy else None
            if index is None:
                index = len(self.inputs)
                self.inputs.append(outer)
                if proxy:
                    self._by_name[outer] = index
            self._outer[id(value)] = (value, index)
        return self._outer[id(value)][1]

    def child(self, base: str) -> ControlScope:
        """A scope importing into a new sub-graph that sees the outer values through proxies."""
        graph = Graph(base, self.scope.opset)
        graph.symbols = self.scope.graph.symbols  # (a body may read values of dynamic shapes)
        return self.scope.child(graph, {})

    def bind_outer(self, child: ControlScope, sub: onnx.GraphProto, where: str) -> None:
        """Make the outer values ``sub`` reads visible in ``child`` (constants stay constants)."""
        for name in sorted(outer_names(sub)):
            if name in child.env:
                continue
            key = (id(child.graph), name)
            if key not in self._proxy:
                outer = self.scope.value(name, f"{where}: its subgraph")
                refuse_sequences([outer], where, (self.name, "control step"),
                                 "which a subgraph run at run time cannot read")
                proxy_name = self.scope.fresh(f"{self.name}/outer/{name}")
                if outer.const is not None:
                    proxy = Value(proxy_name, const=outer.const)
                else:
                    proxy = Value(proxy_name, outer.dtype, outer.shape)
                self._proxy[key] = proxy
            proxy = self._proxy[key]
            child.env[name] = proxy
            if proxy.const is not None:
                child.graph.constants[proxy.name] = proxy
            elif proxy not in child.graph.inputs:
                child.graph.add_input(proxy)

    def program(
        self,
        child: ControlScope,
        sub: onnx.GraphProto,
        prefix: str,
        bindings: dict[str, str],
        args: Sequence[Value],
        where: str,
    ) -> tuple[dict[str, Any], list[Value]]:
        """Import ``sub`` into ``child`` (its inputs bound to ``bindings``) and write it as a program
        whose arguments are ``args``; also return the values of its outputs (in the sub-graph). An
        output that is a sequence (SeqValue) is returned as such; the program has one output per
        element."""
        self.bind_outer(child, sub, where)
        outs = [child.env[n] for n in inline(child, sub, prefix, bindings, where)]
        refuse_sequences([v for v in outs if isinstance(v, OptValue)], where, (self.name, "control step"),
                         "which a subgraph run at run time cannot yield (--bind the inputs its condition "
                         "depends on)")
        flat = [item for v in outs for item in (v.items if isinstance(v, SeqValue) else [v])]
        program = self._write(child.graph, flat, args, where)
        self.bodies.append(self._body(child.graph, flat, args))
        return program, outs

    def _body(self, graph: Graph, outs: Sequence[Value], args: Sequence[Value]) -> Body:
        """``graph`` as a Body: inputs nothing reads are dropped, the outputs set."""
        arg_index = {id(v): k for k, v in enumerate(args)}
        refs: list[str] = []
        kept: list[Value] = []
        for value in graph.inputs:
            if id(value) in arg_index:
                refs.append(f"a{arg_index[id(value)]}")
            elif id(value) in self._outer:
                refs.append(f"i{self._outer[id(value)][1]}")
            else:
                continue
            kept.append(value)
        graph.inputs[:] = kept
        for value in outs:
            graph.add_output(value)
        return Body(graph, refs)

    def _ref(self, value: Value | None, refs: dict[int, str], args: dict[int, int], where: str) -> str | None:
        if value is None:
            return None
        if id(value) in refs:
            return refs[id(value)]
        if id(value) in args:
            return f"a{args[id(value)]}"
        for (_, outer), proxy in self._proxy.items():
            if proxy is value:
                return f"i{self._input(outer, value, proxy=True)}"
        if value.const is not None:  # a constant the sub-graph made: a constant of the outer graph too
            if id(value) not in self._outer:
                self._input(self.scope.constant(f"{self.name}/{value.name}", value.const, value.dtype), value)
            return f"i{self._outer[id(value)][1]}"
        raise ModelError(f"{where}: the subgraph reads {value.name!r}, which it does not compute")

    def _write(
        self, graph: Graph, outs: Sequence[Value], args: Sequence[Value], where: str
    ) -> dict[str, Any]:
        refs: dict[int, str] = {}
        arg_index = {id(v): k for k, v in enumerate(args)}
        steps = []
        for node in graph.nodes:
            inputs = [self._ref(v, refs, arg_index, where) for v in node.inputs]
            for value in node.outputs:
                refs[id(value)] = f"t{len(refs)}"
            steps.append(
                {
                    "kind": node.kind,
                    "attrs": jsonable({k: v for k, v in node.attrs.items() if k != BODIES}),
                    "inputs": inputs,
                    "outputs": [refs[id(v)] for v in node.outputs],
                    "specs": [[list(v.shape or ()), str(v.dtype)] for v in node.outputs],
                }
            )
        return {"steps": steps, "outputs": [self._ref(v, refs, arg_index, where) for v in outs]}

    def values(self) -> list[Value | None]:
        """The control step's input values in the outer graph."""
        return [self.scope.env[name] if name else None for name in self.inputs]
