"""Memory spaces and transfers, without a GPU: a simulated device space ("sim") whose provider is
the reference kernels, placed before the C provider in priority order.

This exercises what the CUDA provider will rely on: values live in their producer's space,
transfers are inserted only where a value crosses spaces (once per value and space), each space
gets its own arena and its own copy of the weights, and graph outputs produced off the host are
transferred into the caller's arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler import compile_model
from compiler.providers.c.provider import CProvider
from compiler.providers.reference import ReferenceProvider
from runtime import Session
from runtime.errors import ArtifactError
from runtime.memory import HostSpace
from runtime.memory import register_memory_space
from tests.support.models import ort_run


class SimSpace(HostSpace):
    """Host memory that pretends to be a device: moving data in or out always copies."""

    def __init__(self) -> None:
        super().__init__("sim")
        self.transfers = 0

    def from_host(self, array: np.ndarray) -> np.ndarray:
        self.transfers += 1
        return np.array(array, copy=True)

    def to_host(self, array: Any) -> np.ndarray:
        self.transfers += 1
        return np.array(array, copy=True)

    def upload(self, weights: np.ndarray) -> np.ndarray:
        return np.array(weights, copy=True)


class SimProvider(ReferenceProvider):
    """Runs only the ops in ``kinds``, in the "sim" space."""

    def __init__(self, kinds: set[str]) -> None:
        super().__init__("sim")
        self.kinds = kinds

    def claims(self, graph):  # type: ignore[no-untyped-def]
        return {node for node in graph.nodes if node.kind in self.kinds}


@pytest.fixture()
def sim() -> SimSpace:
    space = SimSpace()
    register_memory_space("sim", space)
    return space


def model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 2, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal((1, 4, 1, 1)).astype(np.float32), "b")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),  # C (host)
        helper.make_node("Sigmoid", ["c"], ["s"], name="sigmoid"),  # sim
        helper.make_node("Tanh", ["c"], ["t"], name="tanh"),  # sim: reads c's copy again
        helper.make_node("Mul", ["s", "t"], ["m"], name="mul"),  # C (host)
        helper.make_node("Add", ["m", "b"], ["y"], name="add"),  # sim, constant b, graph output
        helper.make_node("Neg", ["x"], ["z"], name="neg"),  # sim straight from a graph input
    ]
    graph = helper.make_graph(
        nodes, "spaces", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 5, 5]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 2, 5, 5])], initializer=[w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_transfers_only_where_values_cross_spaces(tmp_path, sim: SimSpace) -> None:
    providers = [SimProvider({"Sigmoid", "Tanh", "Add", "Neg"}), CProvider(), ReferenceProvider()]
    path = compile_model(model(), tmp_path / "art", opt_level=0, providers=providers)
    plan = Session(path).plan.to_json()
    transfers = [(s["inputs"][0], s["attrs"]["from"], s["attrs"]["to"])
                 for s in plan["steps"] if s["op_type"] == "Transfer"]
    assert sorted(transfers) == sorted([
        ("c", "host", "sim"),  # once, though Sigmoid and Tanh both read it
        ("s", "sim", "host"), ("t", "sim", "host"),  # into the host Mul
        ("m", "host", "sim"),  # into the sim Add
        ("y", "sim", "host"), ("z", "sim", "host"),  # graph outputs into the caller's arrays
        ("x", "host", "sim"),  # graph input into the sim Neg
    ])
    for step in plan["steps"]:
        if step["op_type"] == "Transfer":
            assert step["provider"] == "reference@sim"
    assert {a["memory_space"] for a in plan["arenas"]} == {"host", "sim"}
    locations = {name: v["location"] for name, v in plan["values"].items()}
    assert locations["c"][2] == "host" and locations["s"][2] == "sim"
    assert {p["runner"] for p in plan["partitions"]} == {"c", "reference"}


def test_results_match_onnxruntime_across_spaces(tmp_path, sim: SimSpace) -> None:
    providers = [SimProvider({"Sigmoid", "Tanh", "Add", "Neg"}), CProvider(), ReferenceProvider()]
    session = Session(compile_model(model(), tmp_path / "art", providers=providers))
    x = np.random.default_rng(1).standard_normal((1, 2, 5, 5)).astype(np.float32)
    before = sim.transfers
    for got, want in zip(session.run(None, {"x": x}), ort_run(model(), {"x": x}), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert sim.transfers > before  # data really moved through the simulated space


def test_a_plan_needing_an_unknown_space_is_a_clear_error(tmp_path, sim: SimSpace) -> None:
    providers = [SimProvider({"Neg"}), CProvider(), ReferenceProvider()]
    path = compile_model(model(), tmp_path / "art", providers=providers)
    import runtime.memory as memory

    del memory._SPACES["sim"]
    with pytest.raises(ArtifactError, match="'sim'"):
        Session(path)
