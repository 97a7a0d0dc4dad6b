"""Assign nodes to execution providers and order them into steps grouped in partitions.

Providers claim nodes in priority order; the last (reference) provider takes the rest, so every
model whose ops the reference kernels know runs. Claimed nodes are grouped with networkx into
connected, cycle-free partitions by layering: a node's depth is the number of provider changes on
the longest path reaching it, and a partition is a connected component of same-provider,
same-depth nodes. Depth never decreases along an edge and grows when the provider changes, so no
path can leave a partition and come back: the partition graph is acyclic by construction (and
checked). The schedule is a deterministic topological order in which each partition's steps are
consecutive.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from compiler.ir.graph import AOT_DOMAIN
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.providers.base import Provider
from runtime.contract import TRANSFER
from runtime.contract import op_name
from runtime.errors import CompileError
from runtime.errors import UnsupportedOpError

__all__ = ["Partition", "Schedule", "partition_graph"]


@dataclass
class Partition:
    index: int
    provider: Provider
    steps: list[int]  # global step indices, consecutive


@dataclass
class Schedule:
    steps: list[Node]
    partitions: list[Partition]
    provider_of_step: list[str]
    partition_of_step: list[int]


def partition_graph(graph: Graph, providers: list[Provider]) -> Schedule:
    """The schedule of ``graph``'s nodes on ``providers`` (in priority order), transfers inserted
    where a value crosses memory spaces."""
    owner = _owners(graph, providers)
    if any(p.memory_space != "host" for p in providers):
        insert_transfers(graph, owner, providers)
    nodes = list(graph.nodes)
    order = {id(n): k for k, n in enumerate(nodes)}

    dag = nx.DiGraph()
    dag.add_nodes_from(range(len(nodes)))
    for k, node in enumerate(nodes):
        for value in node.inputs:
            if value is not None and value.producer is not None:
                dag.add_edge(order[id(value.producer)], k)

    depth = [0] * len(nodes)
    for k in range(len(nodes)):  # graph order is topological
        for pred in dag.predecessors(k):
            step = 0 if owner[id(nodes[pred])] == owner[id(nodes[k])] else 1
            depth[k] = max(depth[k], depth[pred] + step)

    same = nx.Graph()
    same.add_nodes_from(range(len(nodes)))
    for u, v in dag.edges:
        if owner[id(nodes[u])] == owner[id(nodes[v])] and depth[u] == depth[v]:
            same.add_edge(u, v)
    groups = sorted((sorted(c) for c in nx.connected_components(same)), key=lambda c: c[0])
    group_of = {k: g for g, members in enumerate(groups) for k in members}

    quotient = nx.DiGraph()
    quotient.add_nodes_from(range(len(groups)))
    for u, v in dag.edges:
        if group_of[u] != group_of[v]:
            quotient.add_edge(group_of[u], group_of[v])
    if not nx.is_directed_acyclic_graph(quotient):  # pragma: no cover - guaranteed by layering
        raise CompileError("internal error: partition graph has a cycle")
    provider_of_group = [owner[id(nodes[members[0]])] for members in groups]
    _merge_groups(quotient, groups, provider_of_group)
    groups = [sorted(groups[g]) for g in sorted(quotient.nodes)]
    group_ids = sorted(quotient.nodes)
    quotient = nx.relabel_nodes(quotient, {g: k for k, g in enumerate(group_ids)})
    if not nx.is_directed_acyclic_graph(quotient):  # pragma: no cover - merges keep it acyclic
        raise CompileError("internal error: partition graph has a cycle after merging")
    group_order = list(nx.lexicographical_topological_sort(quotient, key=lambda g: groups[g][0]))
    return _schedule([[nodes[k] for k in groups[g]] for g in group_order],
                     [providers[owner[id(nodes[groups[g][0]])]] for g in group_order])


def _owners(graph: Graph, providers: list[Provider]) -> dict[int, int]:
    """id(node) -> the index of the first provider claiming it; UnsupportedOpError naming the nodes
    none claims."""
    owner: dict[int, int] = {}
    for p_index, provider in enumerate(providers):
        claimed = provider.claims(graph)
        for node in graph.nodes:
            if id(node) not in owner and node in claimed:
                owner[id(node)] = p_index
    missing = [n for n in graph.nodes if id(n) not in owner]
    if missing:
        listed = "\n  ".join(f"{n.name} ({n.kind})" for n in missing)
        raise UnsupportedOpError(
            f"{len(missing)} node(s) use ops no provider supports:\n  {listed}",
            [(n.name, n.kind) for n in missing],
        )
    return owner


def _schedule(groups: list[list[Node]], providers: list[Provider]) -> Schedule:
    """The steps of ``groups`` (in schedule order, each on its provider), consecutive groups of one
    provider in one partition."""
    steps: list[Node] = []
    partitions: list[Partition] = []
    provider_of_step: list[str] = []
    partition_of_step: list[int] = []
    for group, provider in zip(groups, providers, strict=True):
        if not partitions or partitions[-1].provider is not provider:
            partitions.append(Partition(len(partitions), provider, []))
        part = partitions[-1]
        for node in group:
            part.steps.append(len(steps))
            partition_of_step.append(part.index)
            provider_of_step.append(provider.name)
            steps.append(node)
    return Schedule(steps, partitions, provider_of_step, partition_of_step)


def insert_transfers(graph: Graph, owner: dict[int, int], providers: list[Provider]) -> None:
    """Insert an onnx_aot.Transfer step wherever a value crosses memory spaces.

    A value lives in the memory space of the provider that produced it (graph inputs and outputs
    in "host": the caller's arrays; constants in every space, as the runtime keeps weights.bin
    in each space it uses). A step reading a value from another space reads a copy made once per
    (value, space) just before its first reader; a graph output produced off the host gets a
    transfer into the caller's array. Transfers belong to the provider of the non-host side.
    """
    def mover(a: str, b: str) -> int:
        device = b if b != "host" else a
        for k, provider in enumerate(providers):
            if provider.memory_space == device:
                return k
        raise CompileError(f"no provider can move data between {a!r} and {b!r}")  # pragma: no cover

    home: dict[int, str] = {id(v): "host" for v in graph.inputs}
    copies: dict[tuple[int, str], Value] = {}
    for node in list(graph.nodes):
        space = providers[owner[id(node)]].memory_space
        for i, value in enumerate(node.inputs):
            if value is None or value.const is not None or home[id(value)] == space:
                continue
            key = (id(value), space)
            if key not in copies:
                copies[key] = _transfer(graph, value, home[id(value)], space,
                                        f"{value.name}@{space}", before=node)
                owner[id(copies[key].producer)] = mover(home[id(value)], space)
                home[id(copies[key])] = space
            graph.set_input(node, i, copies[key])
        for value in node.outputs:
            home[id(value)] = space
    for k, value in enumerate(list(graph.outputs)):
        if home.get(id(value), "host") == "host":
            continue
        public = graph.output_names[k] if k < len(graph.output_names) else value.name
        out = _transfer(graph, value, home[id(value)], "host", f"{public}@host", before=None)
        owner[id(out.producer)] = mover(home[id(value)], "host")
        graph.set_output(k, out)


def _transfer(graph: Graph, value: Value, src: str, dst: str, name: str,
              before: Node | None) -> Value:
    out = graph.make_value(name, value.dtype, value.shape)
    node = Node(op_name(TRANSFER), [value], [out], {"from": src, "to": dst}, domain=AOT_DOMAIN,
                name=graph.unique_name(f"transfer_{value.name}_to_{dst}"), origin=[])
    graph.add_node(node, before=before)
    return out


def _merge_groups(quotient: nx.DiGraph, groups: list[list[int]], provider: list[int]) -> None:
    """Merge same-provider groups joined by an edge when no other path joins them.

    Layering can split a provider's connected nodes (x -> A(P) -> B(P) with x -> C(Q) -> B puts A
    and B at different depths); contracting the edge A -> B keeps the graph acyclic exactly when
    B is not otherwise reachable from A. Repeats until no edge qualifies (deterministic order).
    """
    changed = True
    while changed:
        changed = False
        for a, b in sorted(quotient.edges):
            if provider[a] != provider[b]:
                continue
            quotient.remove_edge(a, b)
            other_path = nx.has_path(quotient, a, b)
            quotient.add_edge(a, b)
            if other_path:
                continue
            for succ in list(quotient.successors(b)):
                quotient.add_edge(a, succ)
            for pred in list(quotient.predecessors(b)):
                if pred != a:
                    quotient.add_edge(pred, a)
            quotient.remove_node(b)
            groups[a] = groups[a] + groups[b]
            changed = True
            break
