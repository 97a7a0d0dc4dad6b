"""Tests of the partitioner (compiler/partition/partitioner.py).

Fake providers claim chosen nodes; the reference provider takes the rest. Every schedule is
checked against the invariants other stages rely on: each node exactly once, a topological order,
each partition a run of consecutive steps on one provider, an acyclic partition graph, and the
highest-priority claimant owning each node.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import networkx as nx
import numpy as np
import pytest

from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.partition.partitioner import Schedule
from compiler.partition.partitioner import partition_graph
from compiler.providers.reference import ReferenceProvider
from runtime.errors import UnsupportedOpError

F32 = np.float32


class FakeProvider:
    """Claims the nodes ``want`` accepts."""

    memory_space = "host"
    alignment = 64

    def __init__(self, name: str, want: Callable[[Node], bool]) -> None:
        self.name = name
        self.want = want

    def claims(self, graph: Graph) -> set[Node]:
        return {node for node in graph.nodes if self.want(node)}

    def scratch_nbytes(self, node: Node) -> int:
        return 0

    def generate(self, partitions: list, kernels_dir: Path, options: object) -> dict[str, object]:
        return {}


def by_name(*names: str) -> Callable[[Node], bool]:
    return lambda node: node.name in names


def build(edges: dict[str, tuple[str, list[str]]], outputs: list[str]) -> Graph:
    """A graph from ``{node: (op, [input names])}`` in order; ``x`` is the graph input."""
    g = Graph("g")
    values = {"x": g.add_input(Value("x", F32, (4,)))}
    for name, (op, ins) in edges.items():
        out = Value(name, F32, (4,))
        g.add_node(Node(op, [values[i] for i in ins], [out], name=name))
        values[name] = out
    g.outputs.extend(values[o] for o in outputs)
    g.verify()
    return g


def check_schedule(graph: Graph, schedule: Schedule, providers: list) -> None:
    """The invariants of every schedule."""
    steps = schedule.steps
    assert sorted(id(n) for n in steps) == sorted(id(n) for n in graph.nodes)  # each node exactly once
    assert len(schedule.provider_of_step) == len(schedule.partition_of_step) == len(steps)
    position = {id(n): t for t, n in enumerate(steps)}
    for t, node in enumerate(steps):  # topological
        for value in node.inputs:
            if value is not None and value.producer is not None:
                assert position[id(value.producer)] < t, f"{node.name} runs before its input"
    covered = []
    for k, part in enumerate(schedule.partitions):
        assert part.index == k and part.steps
        assert part.steps == list(range(part.steps[0], part.steps[-1] + 1))  # consecutive
        covered.extend(part.steps)
        for t in part.steps:
            assert schedule.partition_of_step[t] == k
            assert schedule.provider_of_step[t] == part.provider.name
    assert covered == list(range(len(steps)))
    quotient = nx.DiGraph()
    quotient.add_nodes_from(range(len(schedule.partitions)))
    for t, node in enumerate(steps):
        for value in node.inputs:
            if value is not None and value.producer is not None:
                a, b = schedule.partition_of_step[position[id(value.producer)]], schedule.partition_of_step[t]
                if a != b:
                    quotient.add_edge(a, b)
    assert nx.is_directed_acyclic_graph(quotient)
    for t, node in enumerate(steps):  # the first provider (in priority order) that claims it owns it
        owner = next(p for p in providers if node in p.claims(graph))
        assert schedule.provider_of_step[t] == owner.name


def summary(schedule: Schedule) -> list[tuple[str, list[str]]]:
    return [(p.provider.name, [schedule.steps[t].name for t in p.steps]) for p in schedule.partitions]


CHAIN = {
    "a": ("Relu", ["x"]),
    "b": ("Sigmoid", ["a"]),
    "c": ("Relu", ["b"]),
    "d": ("Tanh", ["c"]),
    "e": ("Relu", ["d"]),
}


def test_reference_takes_what_the_fake_provider_leaves() -> None:
    g = build(CHAIN, ["e"])
    providers = [FakeProvider("fast", lambda n: n.op_type == "Relu"), ReferenceProvider()]
    schedule = partition_graph(g, providers)
    check_schedule(g, schedule, providers)
    assert summary(schedule) == [
        ("fast", ["a"]),
        ("reference", ["b"]),
        ("fast", ["c"]),
        ("reference", ["d"]),
        ("fast", ["e"]),
    ]


def test_one_provider_for_everything_is_one_partition() -> None:
    g = build(CHAIN, ["e"])
    providers = [FakeProvider("all", lambda n: True), ReferenceProvider()]
    schedule = partition_graph(g, providers)
    check_schedule(g, schedule, providers)
    assert summary(schedule) == [("all", ["a", "b", "c", "d", "e"])]


def test_priority_order_decides_between_claimants() -> None:
    g = build(CHAIN, ["e"])
    providers = [
        FakeProvider("first", by_name("a", "b")),
        FakeProvider("second", by_name("b", "c")),
        ReferenceProvider(),
    ]
    schedule = partition_graph(g, providers)
    check_schedule(g, schedule, providers)
    assert summary(schedule) == [("first", ["a", "b"]), ("second", ["c"]), ("reference", ["d", "e"])]


DIAMOND = {"A": ("Relu", ["x"]), "B": ("Sigmoid", ["A"]), "C": ("Relu", ["A"]), "D": ("Add", ["B", "C"])}


@pytest.mark.parametrize("order", [["A", "B", "C", "D"], ["A", "C", "B", "D"]])
def test_diamond_with_an_unclaimed_middle_is_acyclic(order: list[str]) -> None:
    g = build({k: DIAMOND[k] for k in order}, ["D"])
    providers = [FakeProvider("fast", by_name("A", "C", "D")), ReferenceProvider()]
    schedule = partition_graph(g, providers)
    check_schedule(g, schedule, providers)
    part = dict(zip([n.name for n in schedule.steps], schedule.partition_of_step, strict=True))
    assert part["A"] == part["C"] != part["D"]  # A, C, D in one partition would make a cycle via B
    assert part["A"] < part["B"] < part["D"]
    assert summary(schedule) == [("fast", ["A", "C"]), ("reference", ["B"]), ("fast", ["D"])]


def test_independent_branches_share_partitions_when_they_can() -> None:
    g = build(
        {
            "a": ("Relu", ["x"]),
            "b": ("Relu", ["x"]),
            "c": ("Add", ["a", "b"]),
            "d": ("Sigmoid", ["c"]),
            "e": ("Relu", ["d"]),
        },
        ["e"],
    )
    providers = [FakeProvider("fast", lambda n: n.op_type != "Sigmoid"), ReferenceProvider()]
    schedule = partition_graph(g, providers)
    check_schedule(g, schedule, providers)
    assert summary(schedule) == [("fast", ["a", "b", "c"]), ("reference", ["d"]), ("fast", ["e"])]


def test_partitioning_is_deterministic() -> None:
    providers = [FakeProvider("fast", by_name("A", "C", "D")), ReferenceProvider()]
    first = summary(partition_graph(build(DIAMOND, ["D"]), providers))
    g = build(DIAMOND, ["D"])
    assert summary(partition_graph(g, providers)) == first
    assert summary(partition_graph(g, providers)) == first


def test_every_unsupported_node_is_listed_in_one_error() -> None:
    g = Graph("g")
    x = g.add_input(Value("x", F32, (4,)))
    a, b, c = (Value(n, F32, (4,)) for n in "abc")
    g.add_node(Node("Frobnicate", [x], [a], name="custom", domain="com.example"))
    g.add_node(Node("Relu", [a], [b], name="fine"))
    g.add_node(Node("Blur", [b], [c], name="hard", domain="com.example"))
    g.outputs.append(c)
    with pytest.raises(UnsupportedOpError) as info:
        partition_graph(g, [FakeProvider("fast", by_name("nothing")), ReferenceProvider()])
    message = str(info.value)
    assert "2 node(s)" in message
    assert "custom (com.example.Frobnicate)" in message and "hard (com.example.Blur)" in message
    assert "fine" not in message
    assert info.value.nodes == [("custom", "com.example.Frobnicate"), ("hard", "com.example.Blur")]


def test_without_a_fallback_every_unclaimed_node_is_listed() -> None:
    g = build(CHAIN, ["e"])
    with pytest.raises(UnsupportedOpError) as info:
        partition_graph(g, [FakeProvider("fast", lambda n: n.op_type == "Relu")])
    assert [name for name, _ in info.value.nodes] == ["b", "d"]


def random_graph(rng: np.random.Generator, n: int) -> Graph:
    g = Graph("random")
    pool = [g.add_input(Value("x", F32, (4,))), g.add_input(Value("y", F32, (4,)))]
    for k in range(n):
        if rng.random() < 0.5:
            ins = [pool[int(rng.integers(len(pool)))]]
            op = str(rng.choice(["Relu", "Sigmoid", "Tanh", "Neg"]))
        else:
            ins = [pool[int(i)] for i in rng.integers(len(pool), size=2)]
            op = str(rng.choice(["Add", "Mul", "Sub"]))
        out = Value(f"v{k}", F32, (4,))
        g.add_node(Node(op, ins, [out], name=f"n{k}"))
        pool.append(out)
        if len(pool) > 6:
            pool.pop(int(rng.integers(2, len(pool) - 1)))
    g.outputs.append(pool[-1])
    g.verify()
    return g


@pytest.mark.parametrize("seed", range(40))
def test_random_graphs_keep_every_invariant(seed: int) -> None:
    rng = np.random.default_rng(seed)
    g = random_graph(rng, int(rng.integers(3, 40)))
    picks = {node.name: int(rng.integers(3)) for node in g.nodes}
    providers = [
        FakeProvider("p0", lambda n: picks[n.name] == 0),
        FakeProvider("p1", lambda n: picks[n.name] in (1, 0) and n.op_type != "Neg"),
        ReferenceProvider(),
    ]
    schedule = partition_graph(g, providers)
    check_schedule(g, schedule, providers)
    assert summary(partition_graph(g, providers)) == summary(schedule)
    # neighbouring partitions always change provider (else they would be one partition)
    names = [p.provider.name for p in schedule.partitions]
    assert all(a != b for a, b in zip(names, names[1:], strict=False))


def test_layering_split_is_merged_back_when_no_other_path_joins_the_parts() -> None:
    # x -> a(fast) -> b(fast), x -> c(reference) -> b: depth puts a and b apart, but nothing
    # leads from a to b except the direct edge, so they form one partition run after c.
    g = build({"a": ("Relu", ["x"]), "c": ("Sigmoid", ["x"]), "b": ("Add", ["a", "c"])}, ["b"])
    providers = [FakeProvider("fast", by_name("a", "b")), ReferenceProvider()]
    schedule = partition_graph(g, providers)
    check_schedule(g, schedule, providers)
    assert summary(schedule) == [("reference", ["c"]), ("fast", ["a", "b"])]


def test_groups_joined_through_another_provider_stay_apart() -> None:
    # a(fast) -> c(reference) -> b(fast) and a -> b: merging a and b would need c inside.
    g = build({"a": ("Relu", ["x"]), "c": ("Sigmoid", ["a"]), "b": ("Add", ["a", "c"])}, ["b"])
    providers = [FakeProvider("fast", by_name("a", "b")), ReferenceProvider()]
    schedule = partition_graph(g, providers)
    check_schedule(g, schedule, providers)
    assert summary(schedule) == [("fast", ["a"]), ("reference", ["c"]), ("fast", ["b"])]
