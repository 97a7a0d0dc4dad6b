"""The C provider's recurrent kernels (RNN, GRU, LSTM) against the reference kernels.

Each case compiles a one-node ONNX model, checks in plan.json that the C provider ran the node,
runs the artifact and compares every output with the reference kernel (runtime/kernels/recurrent.py)
applied in float64 to the step's canonical attributes. Shapes are unlike the ONNX node suite's: odd
hidden and input sizes, batch above 1, one step and seven, both directions, initial states, clip,
peepholes, sequence lengths (0, partial, full), layout 1, non-default activations, and weights both
as graph inputs and as initializers.
"""

from __future__ import annotations

import json
import subprocess
import sys
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
from tests.support.crnn_model import crnn_input
from tests.support.crnn_model import crnn_model
from tests.support.models import ort_run

RNG = np.random.default_rng(20261126)
RTOL, ATOL = 1e-5, 1e-6  # float32 C (expf / tanhf) against the float64 reference
INPUTS = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
OUTPUTS = {"RNN": ["Y", "Y_h"], "GRU": ["Y", "Y_h"], "LSTM": ["Y", "Y_h", "Y_c"]}


def feeds_for(op: str, seq: int, batch: int, size: int, hidden: int, dirs: int, layout: int,
              present: set[str]) -> dict[str, np.ndarray]:  # fmt: skip
    """Random inputs of a recurrent node; ``present`` names the optional ones."""
    g = GATES[op]
    x_shape = (seq, batch, size) if layout == 0 else (batch, seq, size)
    state = (dirs, batch, hidden) if layout == 0 else (batch, dirs, hidden)
    shapes = {"X": x_shape, "W": (dirs, g * hidden, size), "R": (dirs, g * hidden, hidden),
              "B": (dirs, 2 * g * hidden), "initial_h": state, "initial_c": state,
              "P": (dirs, 3 * hidden)}  # fmt: skip
    feeds = {n: RNG.standard_normal(s).astype(np.float32) * (0.5 if n != "X" else 1.0)
             for n, s in shapes.items() if n in {"X", "W", "R"} | present}  # fmt: skip
    if "sequence_lens" in present:  # one entry of each kind: full, partial, and (with 3+) empty
        feeds["sequence_lens"] = np.array([seq, max(seq - 3, 1)] + [0] * (batch - 2), np.int32)[:batch]
    return feeds


def recurrent_model(op: str, feeds: dict[str, np.ndarray], hidden: int, outputs: list[str], inits: set[str],
                    **attrs: Any) -> onnx.ModelProto:  # fmt: skip
    """One ``op`` node over ``feeds`` (those named in ``inits`` as initializers)."""
    names = [n if n in feeds else "" for n in INPUTS]
    while names and not names[-1]:
        names.pop()
    node = helper.make_node(op, names, outputs, hidden_size=hidden, **attrs)
    graph = helper.make_graph(
        [node],
        "recurrent",
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


def output_shapes(op: str, x_shape: tuple[int, ...], attrs: dict[str, Any]) -> list[tuple[int, ...]]:
    """Y, Y_h[, Y_c] shapes of a canonical recurrent node."""
    dirs, hidden = (2 if attrs["direction"] == "bidirectional" else 1), int(attrs["hidden_size"])
    states = len(OUTPUTS[op]) - 1
    if attrs["layout"] == 0:
        return [(x_shape[0], dirs, x_shape[1], hidden)] + [(dirs, x_shape[1], hidden)] * states
    return [(x_shape[0], x_shape[1], dirs, hidden)] + [(x_shape[0], dirs, hidden)] * states


def run_case(model: onnx.ModelProto, feeds: dict[str, np.ndarray], inits: set[str], tmp_path: Path,
             provider: str = "c") -> None:  # fmt: skip
    """Compile, check the provider of the recurrent step, compare with the float64 reference."""
    path = compile_model(model, tmp_path / "artifact")
    plan = json.loads((path / "plan.json").read_text())
    (step,) = [s for s in plan["steps"] if s["op_type"] in GATES]
    assert step["provider"] == provider, step
    session = Session(path)
    results = session.run(None, {n: a for n, a in feeds.items() if n not in inits})
    got = dict(zip([o.name for o in session.outputs], results, strict=True))
    node = model.graph.node[0]
    args = [(feeds[n] if n == "sequence_lens" else feeds[n].astype(np.float64)) if n else None
            for n in node.input]  # fmt: skip
    specs = [(s, np.float64) for s in output_shapes(node.op_type, feeds["X"].shape, step["attrs"])]
    want = get_kernel(step["op_type"])(np, args, step["attrs"], specs)
    for name, w in zip(node.output, want[: len(node.output)], strict=True):
        if name:
            np.testing.assert_allclose(got[name], w, rtol=RTOL, atol=ATOL, err_msg=name)


CASES = [
    # op, seq, batch, size, hidden, direction, layout, optional inputs, extra attributes
    ("LSTM", 7, 3, 5, 9, "forward", 0, {"B"}, {}),
    ("LSTM", 1, 1, 128, 128, "forward", 0, {"B", "initial_h", "initial_c"}, {}),
    ("LSTM", 7, 2, 13, 17, "reverse", 0, {"B", "initial_h"}, {}),
    ("LSTM", 7, 4, 6, 11, "bidirectional", 0, {"B", "initial_h", "initial_c"}, {}),
    ("LSTM", 5, 3, 7, 6, "bidirectional", 0, {"B", "P", "initial_c"}, {"clip": 0.7}),
    ("LSTM", 7, 3, 4, 10, "bidirectional", 1, {"B", "initial_h", "initial_c", "P"}, {}),
    ("LSTM", 1, 5, 33, 19, "reverse", 1, set(), {"clip": 2.5}),
    ("LSTM", 7, 3, 5, 9, "bidirectional", 0, {"B", "sequence_lens", "initial_h", "initial_c", "P"}, {}),
    ("LSTM", 6, 4, 5, 7, "reverse", 1, {"sequence_lens", "initial_c"}, {"input_forget": 1}),
    ("LSTM", 4, 2, 3, 5, "bidirectional", 0, {"B"},
     {"activations": ["HardSigmoid", "Relu", "Softsign", "Sigmoid", "Elu", "Softplus"],
      "activation_alpha": [0.3, 0.9], "activation_beta": [0.4]}),  # fmt: skip
    ("GRU", 7, 3, 5, 9, "forward", 0, {"B"}, {}),
    ("GRU", 7, 3, 5, 9, "forward", 0, {"B", "initial_h"}, {"linear_before_reset": 1}),
    ("GRU", 1, 2, 17, 13, "reverse", 1, {"initial_h"}, {"clip": 1.5}),
    ("GRU", 7, 4, 6, 11, "bidirectional", 0, {"B", "sequence_lens", "initial_h"}, {"linear_before_reset": 1}),
    ("GRU", 5, 3, 4, 6, "bidirectional", 1, {"B", "sequence_lens"},
     {"activations": ["LeakyRelu", "ScaledTanh", "Sigmoid", "Affine"], "activation_alpha": [0.2, 0.8, 1.5],
      "activation_beta": [1.2, -0.3]}),  # fmt: skip
    # large enough for the two directions to run on two threads
    ("LSTM", 7, 2, 24, 31, "bidirectional", 1, {"B", "P", "initial_h"}, {}),
    ("GRU", 7, 3, 40, 33, "bidirectional", 0, {"B", "initial_h", "sequence_lens"}, {}),
    ("RNN", 7, 3, 5, 9, "forward", 0, {"B"}, {}),
    ("RNN", 7, 4, 6, 11, "bidirectional", 1, {"B", "initial_h", "sequence_lens"}, {"clip": 0.9}),
    ("RNN", 1, 1, 64, 96, "reverse", 0, {"B", "initial_h"}, {"activations": ["ThresholdedRelu"]}),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[5]}-l{c[6]}-s{c[1]}b{c[2]}i{c[3]}h{c[4]}")
def test_c_matches_reference(case: tuple[Any, ...], tmp_path: Path) -> None:
    op, seq, batch, size, hidden, direction, layout, present, attrs = case
    dirs = 2 if direction == "bidirectional" else 1
    feeds = feeds_for(op, seq, batch, size, hidden, dirs, layout, present)
    inits = {"W", "R", "B"} if seq == 1 else set()
    attrs = {"direction": direction, "layout": layout, **attrs}
    model = recurrent_model(op, feeds, hidden, OUTPUTS[op], inits, **attrs)
    run_case(model, feeds, inits, tmp_path)


@pytest.mark.parametrize("outputs", [["", "Y_h"], ["Y"], ["", "", "Y_c"]])
def test_lstm_any_subset_of_outputs(outputs: list[str], tmp_path: Path) -> None:
    feeds = feeds_for("LSTM", 4, 2, 5, 7, 2, 0, {"B", "initial_c"})
    model = recurrent_model("LSTM", feeds, 7, outputs, set(), direction="bidirectional")
    run_case(model, feeds, set(), tmp_path)



def test_a_crnn_recognizer_matches_onnxruntime_with_every_step_on_c(tmp_path: Path) -> None:
    """Issue 21's model kind at small dims: convs, a bidirectional LSTM, a transB classifier
    Gemm (its weights packed at compile time)."""
    model = crnn_model(height=32, width=72, features=64, hidden=40, classes=250)
    feeds = crnn_input(model)
    out = compile_model(model, tmp_path / "crnn", golden_cases=0)
    plan = json.loads((out / "plan.json").read_text())
    assert {s["provider"] for s in plan["steps"]} == {"c"}
    assert any(s["op_type"] == "PackedGemm" for s in plan["steps"])
    (got,) = Session(out).run(None, feeds)
    (want,) = ort_run(model, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)


def test_bench_crnn_script_smoke() -> None:
    command = [sys.executable, "-m", "scripts.bench_crnn", "--smoke", "--threads", "1"]
    repo = Path(__file__).resolve().parents[1]
    result = subprocess.run(command, capture_output=True, text=True, cwd=repo, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "threads 1: onnx-aot" in result.stdout and "ratio" in result.stdout
