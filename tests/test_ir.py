"""Tests of the IR (compiler/ir/graph.py): use-def links kept by the graph API, and the verifier.

Each test builds a small graph through the API, changes it, and checks both the links
(``Value.producer``, ``Value.uses``) and what ``Graph.verify`` says about the result.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from compiler.ir.graph import AOT_DOMAIN
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Use
from compiler.ir.graph import Value
from runtime.errors import InternalError
from runtime.errors import ModelError

F32 = np.float32


def chain() -> tuple[Graph, Value, Node, Node, Node]:
    """x -> relu -> a -> neg -> b -> add(b, a) -> y (graph output)."""
    g = Graph("g")
    x = g.add_input(Value("x", F32, (2, 3)))
    a, b, y = (Value(n, F32, (2, 3)) for n in "aby")
    relu = g.add_node(Node("Relu", [x], [a], name="relu"))
    neg = g.add_node(Node("Neg", [a], [b], name="neg"))
    add = g.add_node(Node("Add", [b, a], [y], name="add"))
    g.outputs.append(y)
    g.output_names.append("y")
    g.verify()
    return g, x, relu, neg, add


def uses(value: Value) -> list[tuple[str, int]]:
    return [(u.node.name, u.index) for u in value.uses]


# -- building and links -----------------------------------------------------------------------
def test_add_node_links_producer_and_uses() -> None:
    g, x, relu, neg, add = chain()
    a, b, y = relu.outputs[0], neg.outputs[0], add.outputs[0]
    assert a.producer is relu and b.producer is neg and y.producer is add
    assert x.producer is None
    assert uses(x) == [("relu", 0)]
    assert uses(a) == [("neg", 0), ("add", 1)]
    assert a.consumers() == [neg, add]
    assert [n.name for n in g] == ["relu", "neg", "add"]
    assert all(n.graph is g for n in g.nodes)


def test_add_node_before_and_after_and_unique_names() -> None:
    g, x, relu, neg, add = chain()
    c = Value("c", F32, (2, 3))
    first = g.add_node(Node("Abs", [x], [c]), before=relu)
    d = Value("d", F32, (2, 3))
    mid = g.add_node(Node("Abs", [c], [d]), after=first)
    assert [n.name for n in g] == [first.name, mid.name, "relu", "neg", "add"]
    assert first.name != mid.name and first.name and mid.name
    g.verify()
    assert g.unique_name("relu") != "relu"  # node names are taken
    assert g.unique_name("fresh") == "fresh"
    assert g.unique_name("fresh") != "fresh"


def test_add_node_refuses_a_second_producer_without_changing_links() -> None:
    g, x, relu, _, _ = chain()
    a = relu.outputs[0]
    with pytest.raises(ModelError, match="already has producer"):
        g.add_node(Node("Abs", [x], [a], name="dup"))
    assert a.producer is relu
    assert uses(x) == [("relu", 0)]  # no use left behind by the refused node
    g.verify()


def test_add_node_before_a_foreign_node_changes_nothing() -> None:
    g, x, _, _, _ = chain()
    stranger = Node("Abs", [], [Value("s", F32, (2, 3))], name="stranger")
    out = Value("c", F32, (2, 3))
    with pytest.raises(ValueError, match="not in the graph"):
        g.add_node(Node("Abs", [x], [out], name="new"), before=stranger)
    assert out.producer is None and uses(x) == [("relu", 0)] and len(g) == 3
    g.verify()


def test_remove_node_unlinks_inputs_and_producer() -> None:
    g, x, relu, neg, add = chain()
    a, b = relu.outputs[0], neg.outputs[0]
    g.replace_all_uses(b, a)
    g.remove_node(neg)
    assert neg.graph is None and b.producer is None
    assert uses(a) == [("add", 1), ("add", 0)]
    assert add.inputs == (a, a)
    g.verify()


def test_remove_node_refuses_used_outputs_and_graph_outputs() -> None:
    g, _, relu, neg, add = chain()
    with pytest.raises(ValueError, match="used by add, neg"):
        g.remove_node(relu)
    with pytest.raises(ValueError, match="graph output"):
        g.remove_node(add)
    assert len(g) == 3
    g.verify()


def test_replace_all_uses_moves_uses_and_graph_outputs() -> None:
    g, x, relu, neg, add = chain()
    y = add.outputs[0]
    z = Value("z", F32, (2, 3))
    g.add_node(Node("Sigmoid", [x], [z], name="sig"), after=relu)
    a = relu.outputs[0]
    g.replace_all_uses(a, z)
    assert a.uses == [] and uses(z) == [("neg", 0), ("add", 1)]
    assert neg.inputs == (z,) and add.inputs[1] is z
    g.replace_all_uses(y, z)
    assert g.outputs == [z] and y.uses == []
    g.verify()


def test_set_input_and_set_inputs_keep_links() -> None:
    g, x, relu, neg, add = chain()
    a, b = relu.outputs[0], neg.outputs[0]
    g.set_input(add, 0, x)
    assert uses(b) == [] and ("add", 0) in uses(x)
    g.set_inputs(add, [a, None])
    assert uses(x) == [("relu", 0)] and uses(a) == [("neg", 0), ("add", 0)]
    assert add.inputs == (a, None) and add.input(5) is None
    g.set_inputs(add, [b, a])
    g.verify()


def test_constants_and_prune() -> None:
    g, x, relu, _, _ = chain()
    kept = g.add_constant("w", np.ones((2, 3), F32))
    dropped = g.add_constant("w", np.zeros(3, F32))
    assert kept.name == "w" and dropped.name != "w" and kept.is_const
    assert kept.shape == (2, 3) and kept.dtype == F32 and kept.nbytes == 24 and kept.size == 6
    g.set_input(relu, 0, kept)
    g.prune_constants()
    assert list(g.constants) == ["w"]
    g.verify()
    assert g.values()[:2] == [x, kept]


def test_node_kind_and_describe() -> None:
    plain = Node("Relu", [], [Value("o")], name="r")
    ours = Node("FusedConv", [], [Value("p")], name="f", domain=AOT_DOMAIN)
    onnx_named = Node("Relu", [], [Value("q")], name="r2", domain="ai.onnx")
    assert (plain.kind, ours.kind, onnx_named.kind) == ("Relu", "onnx_aot.FusedConv", "Relu")
    assert plain.describe() == "node 'r' (Relu)" and plain.origin == ["r"]
    assert Use(plain, 0) == Use(plain, 0) and Use(plain, 0) != Use(plain, 1)


# -- sort ---------------------------------------------------------------------------------------
def test_sort_repairs_order_and_keeps_valid_order() -> None:
    g, x, relu, neg, add = chain()
    g._nodes.reverse()  # break the order (nothing else changes the links)
    with pytest.raises(InternalError, match="before definition"):
        g.verify()
    g.sort()
    assert [n.name for n in g] == ["relu", "neg", "add"]
    g.verify()
    g.sort()
    assert [n.name for n in g] == ["relu", "neg", "add"]


def test_sort_keeps_independent_nodes_in_place() -> None:
    g = Graph()
    x = g.add_input(Value("x", F32, (2,)))
    outs = [Value(f"v{k}", F32, (2,)) for k in range(4)]
    for k, v in enumerate(outs):
        g.add_node(Node("Relu", [x], [v], name=f"n{k}"))
    g.outputs.extend(outs)
    g.sort()
    assert [n.name for n in g] == ["n0", "n1", "n2", "n3"]


def test_sort_raises_internal_error_on_a_cycle() -> None:
    g = Graph()
    x = g.add_input(Value("x", F32, (2,)))
    a, b = Value("a", F32, (2,)), Value("b", F32, (2,))
    g.add_node(Node("Add", [x, b], [a], name="p"))
    g.add_node(Node("Relu", [a], [b], name="q"))
    g.outputs.append(b)
    with pytest.raises(InternalError, match="cycle"):
        g.sort()
    with pytest.raises(InternalError, match="before definition"):
        g.verify()


# -- verify -------------------------------------------------------------------------------------
def _dup_value_name(g: Graph) -> None:
    x = g.inputs[0]
    g.add_node(Node("Abs", [x], [Value("a", F32, (2, 3))], name="abs"))


def _dup_node_name(g: Graph) -> None:
    node = g.nodes[1]
    node.name = "relu"


def _missing_shape(g: Graph) -> None:
    g.nodes[0].outputs[0].shape = None


def _missing_dtype(g: Graph) -> None:
    g.inputs[0].dtype = None


def _stale_use(g: Graph) -> None:
    a = g.nodes[0].outputs[0]
    a.uses.append(Use(Node("Neg", [a], [Value("zz")], name="ghost"), 0))


def _hand_edited_input(g: Graph) -> None:
    g.nodes[1]._inputs[0] = g.inputs[0]  # bypasses set_input: uses are now wrong


def _use_before_def(g: Graph) -> None:
    relu, neg = g.nodes[0], g.nodes[1]
    g._nodes[0], g._nodes[1] = neg, relu


def _undefined_output(g: Graph) -> None:
    g.outputs.append(Value("nowhere", F32, (1,)))


def _wrong_producer(g: Graph) -> None:
    g.nodes[1].outputs[0].producer = g.nodes[0]


def _input_with_producer(g: Graph) -> None:
    g.inputs[0].producer = g.nodes[0]


def _malformed_constant(g: Graph) -> None:
    c = g.add_constant("c", np.ones(2, F32))
    g.constants["other"] = c


def _foreign_node(g: Graph) -> None:
    g.nodes[2].graph = Graph()


def _removed_node_still_used(g: Graph) -> None:
    # a node that was added, then dropped from the list by hand: its uses are stale
    x = g.inputs[0]
    node = g.add_node(Node("Abs", [x], [Value("lost", F32, (2, 3))], name="lost"))
    g._nodes.remove(node)


@pytest.mark.parametrize(
    ("breaker", "message"),
    [
        (_dup_value_name, "duplicate value name 'a'"),
        (_dup_node_name, "duplicate node name 'relu'"),
        (_missing_shape, "'a' has no static shape"),
        (_missing_dtype, "'x' has no static shape/dtype"),
        (_stale_use, "stale use of 'a' by 'ghost'"),
        (_hand_edited_input, "missing from uses"),
        (_use_before_def, "used before definition"),
        (_undefined_output, "graph output 'nowhere' is not defined"),
        (_wrong_producer, "wrong producer"),
        (_input_with_producer, "graph input 'x' has a producer"),
        (_malformed_constant, "constant 'other' is malformed"),
        (_foreign_node, "not owned by this graph"),
        (_removed_node_still_used, "stale use of 'x' by 'lost'"),
    ],
)
def test_verify_names_the_problem(breaker: Callable[[Graph], None], message: str) -> None:
    g = chain()[0]
    breaker(g)
    with pytest.raises(InternalError, match="IR verification failed") as info:
        g.verify()
    assert message in str(info.value)


def test_verify_accepts_optional_inputs_and_constant_outputs() -> None:
    g = Graph()
    x = g.add_input(Value("x", F32, (2,)))
    c = g.add_constant("c", np.ones(2, F32))
    y = Value("y", F32, (2,))
    g.add_node(Node("Clip", [x, None, None], [y], {"min": 0.0, "max": 1.0}, name="clip"))
    g.outputs.extend([y, c, x])
    g.verify()
    assert g.is_graph_output(c) and g.is_graph_input(x) and not g.is_graph_input(y)
