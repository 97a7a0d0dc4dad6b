"""The C provider's recurrent kernels against the reference kernels (runtime/kernels/recurrent.py).

Each case compiles a one-node ONNX model, checks in plan.json which provider ran the node, runs the
artifact and compares every output with the reference kernel applied in float64 to the step's
canonical attributes. Shapes are unlike the ONNX node suite's: odd hidden and input sizes, batch
above 1, one step and seven, both directions, initial states, clip, peepholes, layout 1, and
weights both as graph inputs and as initializers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx import numpy_helper

from compiler.driver import compile_model
from runtime import Session
from runtime.kernels import get_kernel

RNG = np.random.default_rng(20261126)
RTOL, ATOL = 1e-5, 1e-6  # float32 C (expf / tanhf) against the float64 reference
LSTM_INPUTS = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]


def lstm_feeds(seq: int, batch: int, size: int, hidden: int, dirs: int, layout: int,
               present: set[str]) -> dict[str, np.ndarray]:  # fmt: skip
    """Random float32 inputs of an LSTM node; ``present`` names the optional ones."""
    x_shape = (seq, batch, size) if layout == 0 else (batch, seq, size)
    state = (dirs, batch, hidden) if layout == 0 else (batch, dirs, hidden)
    shapes = {"X": x_shape, "W": (dirs, 4 * hidden, size), "R": (dirs, 4 * hidden, hidden),
              "B": (dirs, 8 * hidden), "initial_h": state, "initial_c": state,
              "P": (dirs, 3 * hidden)}  # fmt: skip
    return {n: RNG.standard_normal(s).astype(np.float32) * (0.5 if n != "X" else 1.0)
            for n, s in shapes.items() if n in {"X", "W", "R"} | present}  # fmt: skip


def lstm_model(feeds: dict[str, np.ndarray], hidden: int, outputs: list[str], inits: set[str],
               **attrs: Any) -> onnx.ModelProto:  # fmt: skip
    """One LSTM node over ``feeds`` (those named in ``inits`` as initializers)."""
    names = [n if n in feeds else "" for n in LSTM_INPUTS]
    while names and not names[-1]:
        names.pop()
    node = helper.make_node("LSTM", names, outputs, hidden_size=hidden, **attrs)
    graph = helper.make_graph(
        [node],
        "lstm",
        [
            helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
            for n, a in feeds.items()
            if n not in inits
        ],
        [helper.make_empty_tensor_value_info(o) for o in outputs if o],
        [numpy_helper.from_array(a, n) for n, a in feeds.items() if n in inits],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model, strict_mode=True)


def output_shapes(x_shape: tuple[int, ...], attrs: dict[str, Any]) -> list[tuple[int, ...]]:
    """Y, Y_h, Y_c shapes of a canonical recurrent node."""
    dirs, hidden = (2 if attrs["direction"] == "bidirectional" else 1), int(attrs["hidden_size"])
    if attrs["layout"] == 0:
        return [(x_shape[0], dirs, x_shape[1], hidden)] + [(dirs, x_shape[1], hidden)] * 2
    return [(x_shape[0], x_shape[1], dirs, hidden)] + [(x_shape[0], dirs, hidden)] * 2


def run_case(model: onnx.ModelProto, feeds: dict[str, np.ndarray], inits: set[str], tmp_path: Path,
             provider: str = "c") -> None:  # fmt: skip
    """Compile, check the provider of the recurrent step, compare with the float64 reference."""
    path = compile_model(model, tmp_path / "artifact")
    plan = json.loads((path / "plan.json").read_text())
    (step,) = [s for s in plan["steps"] if s["op_type"] in ("LSTM", "GRU", "RNN")]
    assert step["provider"] == provider, step
    session = Session(path)
    results = session.run(None, {n: a for n, a in feeds.items() if n not in inits})
    got = dict(zip([o.name for o in session.outputs], results, strict=True))
    node = model.graph.node[0]
    args = [feeds[n].astype(np.float64) if n else None for n in node.input]
    specs = [(shape, np.float64) for shape in output_shapes(feeds["X"].shape, step["attrs"])]
    want = get_kernel(step["op_type"])(np, args, step["attrs"], specs)
    for name, w in zip(node.output, want[: len(node.output)], strict=True):
        if name:
            np.testing.assert_allclose(got[name], w, rtol=RTOL, atol=ATOL, err_msg=name)


LSTM_CASES = [
    # seq, batch, size, hidden, direction, layout, optional inputs, extra attributes
    (7, 3, 5, 9, "forward", 0, {"B"}, {}),
    (1, 1, 128, 128, "forward", 0, {"B", "initial_h", "initial_c"}, {}),
    (7, 2, 13, 17, "reverse", 0, {"B", "initial_h"}, {}),
    (7, 4, 6, 11, "bidirectional", 0, {"B", "initial_h", "initial_c"}, {}),
    (5, 3, 7, 6, "bidirectional", 0, {"B", "P", "initial_c"}, {"clip": 0.7}),
    (7, 3, 4, 10, "bidirectional", 1, {"B", "initial_h", "initial_c", "P"}, {}),
    (1, 5, 33, 19, "reverse", 1, set(), {"clip": 2.5}),
]


@pytest.mark.parametrize("case", LSTM_CASES, ids=lambda c: f"{c[4]}-l{c[5]}-s{c[0]}b{c[1]}i{c[2]}h{c[3]}")
def test_lstm_c_matches_reference(case: tuple[Any, ...], tmp_path: Path) -> None:
    seq, batch, size, hidden, direction, layout, present, attrs = case
    dirs = 2 if direction == "bidirectional" else 1
    feeds = lstm_feeds(seq, batch, size, hidden, dirs, layout, present)
    inits = {"W", "R", "B"} if seq == 1 else set()
    model = lstm_model(feeds, hidden, ["Y", "Y_h", "Y_c"], inits, direction=direction, layout=layout, **attrs)
    run_case(model, feeds, inits, tmp_path)


@pytest.mark.parametrize("outputs", [["", "Y_h"], ["Y"], ["", "", "Y_c"]])
def test_lstm_c_any_subset_of_outputs(outputs: list[str], tmp_path: Path) -> None:
    feeds = lstm_feeds(4, 2, 5, 7, 2, 0, {"B", "initial_c"})
    model = lstm_model(feeds, 7, outputs, set(), direction="bidirectional")
    run_case(model, feeds, set(), tmp_path)


@pytest.mark.parametrize("attrs", [
    {"input_forget": 1},
    {"activations": ["HardSigmoid", "Tanh", "Tanh"]},
    {"activations": ["Sigmoid", "Relu", "Tanh"]},
], ids=["input_forget", "hardsigmoid", "relu"])  # fmt: skip
def test_lstm_unclaimed_attributes_stay_on_the_reference(attrs: dict[str, Any], tmp_path: Path) -> None:
    feeds = lstm_feeds(3, 2, 4, 5, 1, 0, {"B"})
    model = lstm_model(feeds, 5, ["Y", "Y_h", "Y_c"], set(), **attrs)
    run_case(model, feeds, set(), tmp_path, provider="reference")


def test_lstm_with_sequence_lens_stays_on_the_reference(tmp_path: Path) -> None:
    feeds: dict[str, Any] = lstm_feeds(4, 3, 4, 5, 1, 0, {"B"})
    feeds["sequence_lens"] = np.array([4, 2, 1], np.int32)
    model = lstm_model(feeds, 5, ["Y", "Y_h", "Y_c"], set())
    path = compile_model(model, tmp_path / "artifact")
    plan = json.loads((path / "plan.json").read_text())
    assert [s["provider"] for s in plan["steps"] if s["op_type"] == "LSTM"] == ["reference"]
