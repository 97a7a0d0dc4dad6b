"""``--max-error`` with ``--precision bf16``: a graph's bf16 steps, their error, their restoration.

A bf16 step is a step reading a constant that ``pack_gemm_weights`` / ``pack_conv_bf16`` rounded to
bfloat16 (``Graph.narrowing.rounded`` keeps each one's fp32 original, in the layout the fp32 kernel
reads). The error of a choice is measured with the reference kernels on the golden feeds (the
inputs the golden cases get, ``compiler/artifact/golden.py: case_feeds``): the rounded weights where
a step stays bf16 (the reference rounds an AMX step's input too, as AMX-BF16 does), the originals
elsewhere, against the run with every original. One fp32 run per feed keeps every value, so a
step's sensitivity (its error alone reduced, on the first feed) reruns only the nodes downstream
of it. Restoring a
step gives its node a constant holding the fp32 original: the ordinary fp32 PackedGemm / ConvNhwc.
"""

from __future__ import annotations

from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from compiler.artifact.golden import case_feeds
from compiler.ir.evaluate import Interpreter
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.passes.base import add_constant
from runtime.errors import GoldenReferenceError
from runtime.errors import OnnxAotError
from runtime.selftest import relative_error

__all__ = ["Bf16Steps", "bf16_constants"]

Binding = Mapping[str, int]


class _Replay(Interpreter):
    """Runs some nodes of a graph; every other value is read from an earlier run's ``base``."""

    def __init__(self, graph: Graph, nodes: Sequence[Node], base: Mapping[int, Any],
                 binding: Binding | None) -> None:
        super().__init__(graph, nodes, binding)
        self.base = base

    def read(self, value: Value) -> Any:
        if value.const is None and id(value) not in self.env:
            return self.base[id(value)]
        return super().read(value)


def bf16_constants(graph: Graph) -> dict[str, Value]:
    """The constants ``graph`` rounded to bf16, by the name of the first step reading each."""
    steps: dict[str, Value] = {}
    seen: set[int] = set()
    for node in graph.nodes:
        for value in node.inputs:
            entry = graph.narrowing.rounded.get(id(value.const)) if value is not None else None
            if value is not None and entry is not None and entry[0] is value.const and id(value) not in seen:
                steps[node.name] = value
                seen.add(id(value))
    return steps


class Bf16Steps:
    """The bf16 steps of ``graph`` (by the name of the first step reading each rounded constant),
    measured on ``cases`` golden feeds (at ``bindings``, as the golden cases take them)."""

    def __init__(self, graph: Graph, cases: int, bindings: Sequence[Binding] | None) -> None:
        self.graph = graph
        self.steps = bf16_constants(graph)
        self.rounded = {name: value.const for name, value in self.steps.items()}
        at = list(bindings) if bindings else [None]
        self.cases: list[tuple[dict[str, np.ndarray], Binding | None]] = []
        self.base: list[dict[int, Any]] = []
        self.refs: list[list[np.ndarray]] = []
        with self.weights(frozenset(self.steps)):
            for seed in range(max(cases, 1)):
                self._fp32_case(seed, at[min(seed, len(at) - 1)])

    def readers(self, name: str) -> list[str]:
        """The names of the steps reading the constant of step ``name`` (itself first)."""
        return [name, *(n.name for n in self.steps[name].consumers() if n.name != name)]

    def _fp32_case(self, seed: int, binding: Binding | None) -> None:
        """Run case ``seed`` in fp32 (integer inputs 0..3, else zeros, as the golden cases)."""
        failure: Exception | None = None
        for integers in (True, False):
            _, feeds = case_feeds(self.graph, seed, binding, integers)
            interpreter = Interpreter(self.graph, binding=binding)
            try:
                outputs = interpreter.run(feeds)
            except (OnnxAotError, ArithmeticError, ValueError, TypeError, IndexError, KeyError) as exc:
                failure = exc
                continue
            self.cases.append((feeds, binding))
            if not self.base:  # (the sensitivities rerun the first feed only)
                self.base.append(interpreter.env)
            self.refs.append([np.asarray(o) for o in outputs])
            return
        raise GoldenReferenceError(f"--max-error: the reference run on golden case {seed}'s inputs failed "
                                   f"({type(failure).__name__}: {failure}); nothing was written")

    @contextmanager
    def weights(self, restored: frozenset[str]) -> Iterator[None]:
        """The steps in ``restored`` read their fp32 originals inside the block, the rest bf16."""
        for name, value in self.steps.items():
            rounded = self.rounded[name]
            value.const = self.graph.narrowing.rounded[id(rounded)][1] if name in restored else rounded
        try:
            yield
        finally:
            for name, value in self.steps.items():
                value.const = self.rounded[name]

    def _error(self, outputs: Sequence[list[Any]]) -> float:
        worst = 0.0
        for got, refs in zip(outputs, self.refs[:len(outputs)], strict=True):
            for array, ref in zip(got, refs, strict=True):
                if ref.dtype.kind == "f":
                    worst = max(worst, relative_error(np.asarray(array), ref))
        return worst

    def measure(self, restored: frozenset[str]) -> float:
        """The largest relative error over the outputs and feeds with ``restored`` back in fp32."""
        with self.weights(restored):
            return self._error([Interpreter(self.graph, binding=b).run(f) for f, b in self.cases])

    def sensitivity(self, name: str) -> float:
        """The error with step ``name`` alone in bf16 on the first feed (only the nodes downstream of
        it rerun: a ranking, one per step; the bisection measures on every feed)."""
        dirty = {id(self.steps[name])}
        nodes = []
        for node in self.graph.nodes:
            if any(v is not None and id(v) in dirty for v in node.inputs):
                nodes.append(node)
                dirty.update(id(v) for v in node.outputs)
        with self.weights(frozenset(self.steps) - {name}):
            (feeds, binding), base = self.cases[0], self.base[0]
            return self._error([_Replay(self.graph, nodes, base, binding).run(feeds)])

    def restore(self, names: Sequence[str]) -> None:
        """Put the steps ``names`` back in fp32 in the graph (their constants: the fp32 originals)."""
        for name in names:
            value = self.steps.pop(name)
            rounded = self.rounded.pop(name)
            _, original = self.graph.narrowing.rounded.pop(id(rounded))
            wide = add_constant(self.graph, f"{value.name}_fp32", original)
            for node in value.consumers():
                for k, operand in enumerate(node.inputs):
                    if operand is value:
                        self.graph.set_input(node, k, wide)
                _unfold_prescale(self.graph, node)
        if names:
            self.graph.prune_constants()


def _unfold_prescale(graph: Graph, conv: Node) -> None:
    """A conv put back in fp32 that ``fuse_conv_prescale`` gave its input's per-channel affine (S, T
    at inputs 4 and 5, ``pre_relu``): the affine goes back ahead of it as Mul, Add (and Relu), since
    only the bf16 conv computes it in its input pass (the fp32 C conv would leave it to the
    reference kernels)."""
    if "pre_relu" not in conv.attrs or len(conv.inputs) < 6:
        return
    x, scale, shift = conv.input(0), conv.input(4), conv.input(5)
    assert x is not None and scale is not None and shift is not None
    steps = [("Mul", scale), ("Add", shift)] + ([("Relu", None)] if conv.attrs.pop("pre_relu") else [])
    for op, operand in steps:
        out = graph.make_value(f"{conv.name}_pre_{op.lower()}", x.dtype, x.shape)
        graph.add_node(Node(op, [x] if operand is None else [x, operand], [out], {},
                            name=f"{conv.name}_pre_{op.lower()}"), before=conv)
        x = out
    inputs = list(conv.inputs[:4])
    while inputs and inputs[-1] is None:
        inputs.pop()
    graph.set_inputs(conv, [x, *inputs[1:]])
