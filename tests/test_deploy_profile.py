"""Per-step profiling (docs/deploy.md): Chrome-trace JSON with one event per step per run, named
after the ONNX nodes; the C entry fills the timing buffer, the reference provider times kernels;
``onnx-aot run --profile`` prints the slowest steps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto
from onnx import helper

from compiler import compile_model
from compiler.cli import main
from runtime import InputError
from runtime import Session
from runtime.profiling import load_trace
from runtime.profiling import slowest_steps
from tests.support.models import small_model


def _check_trace(path: str, plan: dict[str, Any], runs: int) -> list[dict[str, Any]]:
    events = json.loads(Path(path).read_text(encoding="utf-8"))  # a plain Chrome-trace array
    assert isinstance(events, list) and events
    for e in events:
        assert e["ph"] == "X" and isinstance(e["name"], str)
        assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float)) and e["dur"] >= 0
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
    nodes = [e for e in events if e["cat"] == "Node"]
    steps = plan["steps"]
    assert len(nodes) == runs * len(steps)  # one event per step per run
    assert sorted((e["args"]["run"], e["args"]["step"]) for e in nodes) == \
        [(r, s) for r in range(runs) for s in range(len(steps))]
    assert sum(e["cat"] == "Session" and e["name"] == "model_run" for e in events) == runs
    for e in nodes:
        step = steps[e["args"]["step"]]
        assert e["name"] == step["name"] and e["args"]["op_name"] == step["op_type"]
        assert e["args"]["onnx_nodes"] == step["onnx_nodes"]
        for onnx_name in e["args"]["onnx_nodes"]:  # back to the ONNX graph through plan.json
            assert plan["onnx_nodes"][onnx_name]["step"] == step["index"]
        if step["onnx_nodes"]:
            assert e["name"] in step["onnx_nodes"]
    return events


def test_profile_small_model_c_entry_fills_step_times(tmp_path: Path) -> None:
    path = compile_model(small_model(), tmp_path / "small")
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    expected = Session(path).run(None, {"x": x})[0]
    session = Session(path, profile=True)
    for _ in range(3):
        np.testing.assert_array_equal(session.run(None, {"x": x})[0], expected)
    trace = session.end_profiling(tmp_path / "trace.json")
    assert trace == str(tmp_path / "trace.json")
    events = _check_trace(trace, session.plan.to_json(), runs=3)
    conv = [e for e in events if e["name"] == "conv"]
    assert len(conv) == 3 and all(e["dur"] > 0 for e in conv)  # written by the C entry
    assert conv[0]["args"]["onnx_nodes"] == ["conv", "relu"]  # a fused step names both nodes
    for run in range(3):  # steps of a run lie inside its model_run event, in order
        total = next(e for e in events if e["cat"] == "Session" and e["args"]["run"] == run)
        steps = sorted((e for e in events if e["cat"] == "Node" and e["args"]["run"] == run),
                       key=lambda e: e["args"]["step"])
        assert all(a["ts"] <= b["ts"] for a, b in zip(steps, steps[1:], strict=False))
        assert total["ts"] <= steps[0]["ts"] and steps[-1]["ts"] + steps[-1]["dur"] <= \
            total["ts"] + total["dur"] + 1.0
    with pytest.raises(InputError, match="not profiling"):
        session.end_profiling()
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], expected)  # still runs, unrecorded


def test_profile_reference_provider_steps(tmp_path: Path) -> None:
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("Trilu", ["a"], ["m"], upper=1, name="upper"),
             helper.make_node("Sub", ["a", "m"], ["y"], name="sub")]
    graph = helper.make_graph(nodes, "mixed",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)
    session = Session(compile_model(model, tmp_path / "mixed"), profile=True)
    session.run(None, {"x": np.ones((3, 5), np.float32)})
    session.run(None, {"x": np.ones((3, 5), np.float32)})
    events = _check_trace(session.end_profiling(tmp_path / "p.json"), session.plan.to_json(), runs=2)
    upper = [e for e in events if e["name"] == "upper"]
    assert len(upper) == 2 and all(e["args"]["provider"] == "reference" and e["dur"] > 0 for e in upper)


def test_profile_zoo_model_accounts_for_every_onnx_node(zoo, tmp_path: Path) -> None:
    session = Session(zoo.artifact("squeezenet"), profile=True)
    session.run(None, zoo.feeds("squeezenet"))
    events = _check_trace(session.end_profiling(tmp_path / "sq.json"), session.plan.to_json(), runs=1)
    profiled = {n for e in events if e["cat"] == "Node" for n in e["args"]["onnx_nodes"]}
    for k, node in enumerate(zoo.model("squeezenet").graph.node):
        name = node.name or f"{node.op_type}_{k}"
        assert name in profiled or session.plan.onnx_nodes[name].eliminated, name
    top = slowest_steps(load_trace(tmp_path / "sq.json"), 10)
    assert len(top) == 10 and top[0].total_us >= top[-1].total_us
    # one cold run on a possibly busy machine: a layout Transpose can come first, so only ask that
    # the convolutions are among the ten slowest steps
    convs = ("FusedConv", "Conv", "ConvNhwc", "WinogradConvNhwc")
    assert any(step.op_type in convs for step in top)


def test_cli_run_profile_prints_the_slowest_steps(zoo, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    artifact = zoo.artifact("squeezenet")
    out = tmp_path / "cli.json"
    assert main(["run", str(artifact), "--profile", str(out), "--runs", "2"]) == 0
    text = capsys.readouterr().out
    assert "the ten slowest steps" in text
    plan = json.loads((artifact / "plan.json").read_text())
    _check_trace(str(out), plan, runs=2)
    table = text.split("the ten slowest steps:")[1].strip().splitlines()
    assert len(table) == 11 and table[0].split()[:2] == ["step", "mean"]
