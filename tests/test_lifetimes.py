"""Tests of storage assignment (compiler/memory/lifetimes.py) and of passes/materialize_outputs.py.

Hand-built graphs show each aliasing rule (views, in-place) and each exclusion; random graphs are
then run through partitioning, storage assignment and offset packing, and executed on a simulated
arena (every value read from and written to its planned bytes): if the plan let two live values
share bytes, the results differ from a plain run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from compiler.ir.evaluate import Interpreter
from compiler.ir.evaluate import evaluate
from compiler.ir.graph import AOT_DOMAIN
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.memory import Buffer
from compiler.memory import plan_offsets
from compiler.memory import verify_plan
from compiler.memory.lifetimes import Storage
from compiler.memory.lifetimes import assign_storage
from compiler.partition.partitioner import partition_graph
from compiler.passes.materialize_outputs import materialize_outputs
from compiler.providers.reference import ReferenceProvider

F32 = np.float32


class G:
    """Builds IR graphs concisely: ``g.op("Relu", x)`` adds a node and returns its output."""

    def __init__(self) -> None:
        self.graph = Graph("g")

    def input(self, name: str, shape: Sequence[int] = (2, 3)) -> Value:
        return self.graph.add_input(Value(name, F32, tuple(shape)))

    def const(self, name: str, shape: Sequence[int] = (2, 3)) -> Value:
        return self.graph.add_constant(
            name, np.linspace(-1, 1, int(np.prod(shape)), dtype=F32).reshape(shape)
        )

    def op(
        self, op: str, *inputs: Value, name: str, shape: Sequence[int] | None = None, **attrs: Any
    ) -> Value:
        out_shape = tuple(shape) if shape is not None else np.broadcast_shapes(*(v.shape for v in inputs))
        if op == "Reshape":
            attrs = {"shape": list(out_shape)}
        out = Value(name, F32, out_shape)
        self.graph.add_node(Node(op, list(inputs), [out], attrs, name=name))
        return out

    def done(self, *outputs: Value) -> Graph:
        for value in outputs:
            self.graph.add_output(value)
        self.graph.output_names.extend(v.name for v in outputs)
        self.graph.verify()
        return self.graph


def storage_of(
    graph: Graph,
    scratch: Sequence[int] | None = None,
    spaces: Sequence[str] | None = None,
    inplace: bool = True,
) -> Storage:
    steps = list(graph.nodes)
    return assign_storage(
        graph,
        steps,
        list(spaces or ["host"] * len(steps)),
        list(scratch or [0] * len(steps)),
        inplace=inplace,
    )


def buffer_ids(storage: Storage, space: str = "host") -> dict[str, tuple[int, int, int]]:
    return {str(b.id): (b.nbytes, b.first_step, b.last_step) for b in storage.buffers.get(space, [])}


# -- views ------------------------------------------------------------------------------------
def test_reshape_output_aliases_its_input() -> None:
    g = G()
    a = g.op("Relu", g.input("x"), name="a")
    r = g.op("Reshape", a, name="r", shape=(3, 2))
    i = g.op("Identity", r, name="i", shape=(3, 2))
    graph = g.done(g.op("Neg", i, name="y"))
    s = storage_of(graph)
    assert s.root["r"] == s.root["i"] == "a" and s.views == [("r", "a"), ("i", "r")]
    assert buffer_ids(s) == {"a": (24, 0, 3)}  # one buffer, live until the last reader of any alias
    assert s.tensors["a"] == ["a", "r", "i"]


def test_views_of_inputs_and_constants_use_their_memory() -> None:
    g = G()
    r = g.op("Reshape", g.input("x"), name="r", shape=(6,))
    c = g.op("Reshape", g.const("w"), name="c", shape=(6,))
    graph = g.done(g.op("Add", r, c, name="y"))
    s = storage_of(graph)
    assert s.root["r"] == "x" and s.root["c"] == "w"
    assert s.kind["x"] == "ext" and s.kind["w"] == "weights"
    assert buffer_ids(s) == {}


def test_a_view_that_is_a_graph_output_is_not_an_alias() -> None:
    g = G()
    a = g.op("Relu", g.input("x"), name="a")
    graph = g.done(g.op("Reshape", a, name="y", shape=(6,)))
    s = storage_of(graph)
    assert s.root["y"] == "y" and s.kind["y"] == "ext" and s.views == []
    assert buffer_ids(s) == {"a": (24, 0, 1)}


def test_no_view_across_memory_spaces() -> None:
    g = G()
    a = g.op("Relu", g.input("x"), name="a")
    r = g.op("Reshape", a, name="r", shape=(6,))
    graph = g.done(g.op("Neg", r, name="y"))
    s = storage_of(graph, spaces=["cuda", "host", "host"])
    assert s.root["r"] == "r" and s.views == []
    assert buffer_ids(s, "cuda") == {"a": (24, 0, 1)} and buffer_ids(s, "host") == {"r": (24, 1, 2)}


# -- in place ---------------------------------------------------------------------------------
def test_elementwise_op_writes_over_an_input_that_dies_there() -> None:
    g = G()
    a = g.op("Relu", g.input("x"), name="a")
    b = g.op("Neg", a, name="b")
    c = g.op("Sigmoid", b, name="c")
    graph = g.done(g.op("Tanh", c, name="y"))
    s = storage_of(graph)
    assert s.inplace == [("b", "a"), ("c", "b")]
    assert s.root["b"] == s.root["c"] == "a"
    assert buffer_ids(s) == {"a": (24, 0, 3)}
    assert buffer_ids(storage_of(graph, inplace=False)) == {"a": (24, 0, 1), "b": (24, 1, 2), "c": (24, 2, 3)}


def _over_graph_input(g: G) -> Graph:
    return g.done(g.op("Tanh", g.op("Relu", g.input("x"), name="t"), name="y"))


def _over_constant(g: G) -> Graph:
    return g.done(g.op("Tanh", g.op("Add", g.const("w"), g.input("x", (3,)), name="t"), name="y"))


def _over_input_used_later(g: G) -> Graph:
    a = g.op("Relu", g.input("x"), name="a")
    t = g.op("Neg", a, name="t")
    return g.done(g.op("Mul", t, a, name="y"))


def _over_other_shape(g: G) -> Graph:
    a = g.op("Relu", g.input("x", (3,)), name="a")
    t = g.op("Add", a, g.input("z", (2, 3)), name="t")
    return g.done(g.op("Tanh", t, name="y"))


def _over_a_graph_output(g: G) -> Graph:
    a = g.op("Relu", g.input("x"), name="a")
    t = g.op("Neg", a, name="t")
    return g.done(a, g.op("Tanh", t, name="y"))


def _not_elementwise(g: G) -> Graph:
    a = g.op("Relu", g.input("x", (3, 3)), name="a")
    t = g.op("Transpose", a, name="t", perm=[1, 0])
    return g.done(g.op("Tanh", t, name="y"))


def _same_memory_twice_through_a_view(g: G) -> Graph:
    a = g.op("Relu", g.input("x"), name="a")
    v = g.op("Reshape", a, name="v", shape=(2, 3))
    t = g.op("Add", a, v, name="t")
    return g.done(g.op("Tanh", t, name="y"))


def _into_a_graph_output(g: G) -> Graph:
    a = g.op("Relu", g.input("x"), name="a")
    return g.done(g.op("Neg", a, name="t"))


@pytest.mark.parametrize(
    "build",
    [
        _over_graph_input,
        _over_constant,
        _over_input_used_later,
        _over_other_shape,
        _over_a_graph_output,
        _not_elementwise,
        _same_memory_twice_through_a_view,
        _into_a_graph_output,
    ],
)
def test_no_in_place_where_it_is_not_safe(build: Any) -> None:
    graph = build(G())
    s = storage_of(graph)
    assert all(out != "t" for out, _ in s.inplace), s.inplace
    assert s.root["t"] == "t"
    plan_and_verify(s)


def test_in_place_picks_the_input_that_dies() -> None:
    g = G()
    a = g.op("Relu", g.input("x"), name="a")
    b = g.op("Neg", g.input("z"), name="b")
    t = g.op("Add", a, b, name="t")
    graph = g.done(g.op("Mul", t, a, name="y"))  # a is read again later; b dies at t
    s = storage_of(graph)
    assert s.inplace == [("t", "b")]


def test_no_in_place_across_memory_spaces() -> None:
    g = G()
    a = g.op("Relu", g.input("x"), name="a")
    t = g.op("Neg", a, name="t")
    graph = g.done(g.op("Tanh", t, name="y"))
    s = storage_of(graph, spaces=["cuda", "host", "host"])
    assert s.inplace == []


def test_graph_outputs_are_ext_never_arena() -> None:
    g = G()
    a = g.op("Relu", g.input("x"), name="a")
    y1 = g.op("Neg", a, name="y1")
    graph = g.done(y1, g.op("Exp", y1, name="y2"))
    s = storage_of(graph)
    assert s.kind["y1"] == s.kind["y2"] == s.kind["x"] == "ext"
    assert s.root["y1"] == "y1" and "y1" not in buffer_ids(s) and "y2" not in buffer_ids(s)
    assert set(s.space) == {"a"}


def test_scratch_lives_exactly_one_step() -> None:
    g = G()
    a = g.op("Relu", g.input("x"), name="a")
    b = g.op("Exp", a, name="b")
    graph = g.done(g.op("Add", a, b, name="y"))
    s = storage_of(graph, scratch=[0, 100, 7])
    ids = buffer_ids(s)
    assert ids["scratch/1"] == (100, 1, 1) and ids["scratch/2"] == (7, 2, 2) and "scratch/0" not in ids
    assert s.tensors["scratch/1"] == []
    plan = plan_and_verify(s)
    assert plan.offsets["scratch/1"] != plan.offsets["a"]  # a is live at step 1 too


def test_dead_values_get_a_one_step_buffer() -> None:
    g = G()
    a = g.op("Relu", g.input("x"), name="a")
    g.op("Exp", a, name="unused")
    graph = g.done(g.op("Neg", a, name="y"))
    assert buffer_ids(storage_of(graph, inplace=False))["unused"] == (24, 1, 1)


def plan_and_verify(storage: Storage, alignment: int = 64) -> Any:
    plan = None
    for space, buffers in storage.buffers.items():
        plan = plan_offsets(buffers, alignment)
        verify_plan(buffers, plan, alignment)
        assert space in ("host", "cuda")
    return plan


# -- random graphs on a simulated arena -------------------------------------------------------
SHAPES = {
    12: [(12,), (3, 4), (2, 6), (4, 3), (1, 12)],
    24: [(24,), (2, 12), (4, 6), (1, 24)],
    36: [(36,), (6, 6), (1, 36), (2, 18)],
}
UNARY = ["Relu", "Neg", "Exp", "Sigmoid", "Tanh", "Abs"]
BINARY = ["Add", "Mul", "Sub", "Max"]


def _concat_partner(rng: np.random.Generator, pool: list[Value], src: Value) -> tuple[Value, int] | None:
    """Another pool value that concatenates with ``src`` along some axis into <= 36 elements."""
    assert src.shape is not None
    for other in rng.permutation(len(pool)):
        cand = pool[int(other)]
        assert cand.shape is not None
        if len(cand.shape) != len(src.shape) or src.size + cand.size > 36:
            continue
        for axis in range(len(src.shape)):
            rest_a = src.shape[:axis] + src.shape[axis + 1:]
            rest_b = cand.shape[:axis] + cand.shape[axis + 1:]
            if rest_a == rest_b:
                return cand, axis
    return None


def random_graph(rng: np.random.Generator, n: int) -> Graph:
    g = G()
    pool = [g.input("x0", (3, 4)), g.input("x1", (12,)), g.const("w", (3, 4))]
    for k in range(n):
        roll = rng.random()
        src = pool[int(rng.integers(len(pool)))]
        partner = _concat_partner(rng, pool, src) if roll >= 0.82 else None
        if roll < 0.25:
            shapes = SHAPES[src.size]
            v = g.op("Reshape", src, name=f"v{k}", shape=shapes[int(rng.integers(len(shapes)))])
        elif roll < 0.32:
            v = g.op("Identity", src, name=f"v{k}", shape=src.shape)
        elif roll < 0.57 or (roll >= 0.82 and partner is None):
            v = g.op(str(rng.choice(UNARY)), src, name=f"v{k}")
        elif roll < 0.82:
            same = [p for p in pool if p.shape == src.shape]
            other = same[int(rng.integers(len(same)))]
            v = g.op(str(rng.choice(BINARY)), src, other, name=f"v{k}")
        else:
            assert partner is not None and src.shape is not None and partner[0].shape is not None
            other, axis = partner
            pieces = [src, other] if rng.random() < 0.5 else [other, src]
            shape = list(src.shape)
            shape[axis] = src.shape[axis] + other.shape[axis]
            v = g.op("Concat", *pieces, name=f"v{k}", shape=shape, axis=axis)
        pool.append(v)
        if len(pool) > 7:
            pool.pop(int(rng.integers(0, len(pool) - 2)))
    outputs = [pool[-1]] + [p for p in pool[:-1] if rng.random() < 0.3 and p.producer is not None]
    graph = g.done(*dict.fromkeys(outputs))
    materialize_outputs(graph)
    graph.verify()
    return graph


class PlannedMemory(Interpreter):
    """Runs ``steps`` with every value in its planned bytes; scratch is scribbled over when used."""

    def __init__(self, graph: Graph, steps: list[Node], storage: Storage, plans: dict[str, Any],
                 feeds: dict[str, np.ndarray]) -> None:
        super().__init__(graph, steps)
        self.storage, self.plans, self.feeds = storage, plans, feeds
        self.arenas = {space: np.zeros(max(plan.arena_nbytes, 1), np.uint8) for space, plan in plans.items()}
        self.outputs = {v.name: np.full(v.shape, np.nan, v.dtype) for v in graph.outputs}
        self.scratch = {str(b.id): b for bs in storage.buffers.values() for b in bs
                        if str(b.id).startswith("scratch/")}

    def where(self, value: Value) -> np.ndarray:
        root = self.storage.root[value.name]
        kind = self.storage.kind[root]
        if kind == "weights":
            return self.graph.constants[root].const.reshape(value.shape)
        if kind == "ext":
            return (self.feeds[root] if root in self.feeds else self.outputs[root]).reshape(value.shape)
        space = self.storage.space[root]
        offset = self.plans[space].offsets[root] + self.storage.offset[value.name]
        raw = self.arenas[space][offset : offset + value.nbytes]
        return raw.view(value.dtype).reshape(value.shape)

    def read(self, value: Value) -> np.ndarray:
        return self.where(value).copy()

    def run_node(self, node: Node, args: list[Any]) -> list[Any]:
        buf = self.scratch.get(f"scratch/{self.nodes.index(node)}")
        if buf is not None:
            offset = self.plans["host"].offsets[buf.id]
            self.arenas["host"][offset : offset + buf.nbytes] = 0xFF  # a kernel uses its scratch
        return super().run_node(node, args)

    def write(self, node: Node, value: Value, result: Any) -> None:
        np.copyto(self.where(value), result)


@pytest.mark.parametrize("seed", range(60))
def test_random_graphs_never_overwrite_live_values(seed: int) -> None:
    rng = np.random.default_rng(seed)
    graph = random_graph(rng, int(rng.integers(4, 30)))
    schedule = partition_graph(graph, [ReferenceProvider()])
    scratch = [int(rng.choice([0, 0, 16, 48])) for _ in schedule.steps]
    storage = assign_storage(graph, schedule.steps, ["host"] * len(schedule.steps), scratch)
    plans = {}
    for space, buffers in storage.buffers.items():
        plans[space] = plan_offsets(buffers, 16)
        verify_plan(buffers, plans[space], 16)
    assert set(storage.kind[storage.root[v.name]] for v in graph.outputs) == {"ext"}
    feeds = {v.name: rng.uniform(-2, 2, v.shape).astype(F32) for v in graph.inputs}
    expected = evaluate(graph, feeds)
    got = PlannedMemory(graph, schedule.steps, storage, plans, feeds).run(feeds)
    for k, (a, b) in enumerate(zip(got, expected, strict=True)):
        np.testing.assert_allclose(a, b, rtol=1e-6, err_msg=f"output {k} of seed {seed}")


def test_random_graphs_do_use_views_and_in_place() -> None:
    """The simulation above is only meaningful if aliasing really happens in those graphs."""
    views = inplace = concats = 0
    for seed in range(60):
        graph = random_graph(np.random.default_rng(seed), 20)
        s = storage_of(graph)
        views += len(s.views)
        inplace += len(s.inplace)
        concats += len(s.concats)
    assert views > 20 and inplace > 20 and concats > 10


def test_buffers_match_the_lifetime_interface() -> None:
    graph = random_graph(np.random.default_rng(7), 25)
    s = storage_of(graph, scratch=[8] * len(graph))
    for buffers in s.buffers.values():
        assert all(isinstance(b, Buffer) and b.first_step <= b.last_step < len(graph) for b in buffers)
        assert len({b.id for b in buffers}) == len(buffers)
    plan_and_verify(s)


# -- materialize_outputs ----------------------------------------------------------------------
def test_outputs_that_are_inputs_constants_or_duplicates_get_a_copy() -> None:
    g = G()
    x = g.input("x")
    w = g.const("w")
    a = g.op("Relu", x, name="a")
    graph = g.done(x, w, a, a, g.op("Neg", a, name="b"))
    names = list(graph.output_names)
    materialize_outputs(graph)
    graph.verify()
    copies = [n for n in graph.nodes if n.kind == f"{AOT_DOMAIN}.Copy"]
    assert [n.inputs[0].name for n in copies] == ["x", "w", "a"]
    assert graph.output_names == names
    assert graph.outputs[2] is a and graph.outputs[4].name == "b"  # the first use of a stays as it is
    assert len({id(v) for v in graph.outputs}) == 5
    assert all(v.producer is not None and not v.is_const for v in graph.outputs)
    feeds = {"x": np.linspace(-1, 1, 6, dtype=F32).reshape(2, 3)}
    got = evaluate(graph, feeds)
    np.testing.assert_array_equal(got[0], feeds["x"])
    np.testing.assert_array_equal(got[1], w.const)
    np.testing.assert_array_equal(got[3], np.maximum(feeds["x"], 0))
    s = storage_of(graph)
    assert all(s.kind[s.root[v.name]] == "ext" for v in graph.outputs)


def test_materialize_leaves_ordinary_outputs_alone() -> None:
    g = G()
    graph = g.done(g.op("Relu", g.input("x"), name="y"))
    materialize_outputs(graph)
    assert [n.kind for n in graph.nodes] == ["Relu"]


# -- Concat in place --------------------------------------------------------------------------
def test_concat_inputs_live_in_their_slices_of_the_output() -> None:
    g = G()
    x = g.input("x", (1, 2, 3))
    a = g.op("Relu", x, name="a")
    b = g.op("Neg", x, name="b", shape=(1, 2, 3))
    c = g.op("Concat", a, b, name="c", shape=(1, 4, 3), axis=1)
    y = g.op("Sigmoid", c, name="y")
    s = storage_of(g.done(y), inplace=False)
    assert (s.root["a"], s.offset["a"]) == ("c", 0)
    assert (s.root["b"], s.offset["b"]) == ("c", 2 * 3 * 4)
    assert buffer_ids(s) == {"c": (48, 0, 3)}  # one buffer from a's step to the last reader
    assert s.concats == [("a", "c", 0), ("b", "c", 24)]


def test_chained_concats_share_one_buffer() -> None:
    g = G()
    x = g.input("x", (1, 1, 4))
    f1 = g.op("Relu", x, name="f1")
    y1 = g.op("Concat", x, f1, name="y1", shape=(1, 2, 4), axis=1)  # x is a graph input: copied
    f2 = g.op("Neg", y1, name="f2", shape=(1, 2, 4))
    y2 = g.op("Concat", y1, f2, name="y2", shape=(1, 4, 4), axis=1)
    out = g.op("Exp", y2, name="out")
    s = storage_of(g.done(out), inplace=False)
    assert s.root["x"] == "x" and s.kind["x"] == "ext"
    assert {s.root[n] for n in ("f1", "y1", "f2", "y2")} == {"y2"}
    assert [s.offset[n] for n in ("y1", "f1", "f2")] == [0, 16, 32]
    assert list(buffer_ids(s)) == ["y2"]  # "out" is a graph output: the caller's array


@pytest.mark.parametrize("case", ["outer", "graph_output", "twice", "two_concats", "constant"])
def test_concat_not_in_place_where_it_cannot_be(case: str) -> None:
    g = G()
    x = g.input("x", (2, 3) if case == "outer" else (1, 3))
    a = g.op("Relu", x, name="a")
    if case == "outer":
        c = g.op("Concat", a, a, name="c", shape=(2, 6), axis=1)  # rows interleave: no slices
        graph = g.done(g.op("Neg", c, name="y"))
    elif case == "graph_output":
        c = g.op("Concat", a, x, name="c", shape=(2, 3), axis=0)
        graph = g.done(c)  # the output lives in the caller's array
    elif case == "twice":
        c = g.op("Concat", a, a, name="c", shape=(2, 3), axis=0)
        graph = g.done(g.op("Neg", c, name="y"))
    elif case == "two_concats":
        c = g.op("Concat", a, x, name="c", shape=(2, 3), axis=0)
        d = g.op("Concat", x, a, name="d", shape=(2, 3), axis=0)
        graph = g.done(g.op("Add", c, d, name="y"))
    else:
        w = g.const("w", (1, 3))
        c = g.op("Concat", a, w, name="c", shape=(2, 3), axis=0)
        graph = g.done(g.op("Neg", c, name="y"))
    s = storage_of(graph, inplace=False)
    pieces = [(piece, concat) for piece, concat, _ in s.concats]
    if case in ("outer", "graph_output"):
        assert pieces == []
    elif case == "twice":
        assert pieces == [("a", "c")]  # the second occurrence is copied from the first
    elif case == "two_concats":
        assert pieces == [("a", "c")]  # a value lives in one place only
    else:
        assert pieces == [("a", "c")] and s.kind[s.root["w"]] == "weights"
    plan_and_verify(s)
