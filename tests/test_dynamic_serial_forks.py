"""A dynamic kernel's run-time thread decision (``common.c.j2: forked``): where the run's sizes
give too little work for threads, the step runs a plain copy of its loop, not an OpenMP region
that an if clause makes serial (libgomp still starts a team of one, about half a microsecond per
region per run: Silero VAD's dynamic LSTM took 2.4x its static twin's time at batch 1). The C text
of an explicit ``--cpu`` level shows the two copies; runs at sizes that take each copy, on 1 and
2 threads, match onnxruntime.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest

from compiler.driver import compile_model
from runtime import Session
from tests.support.models import ort_run
from tests.test_dynamic_recurrent_pad import pad_model
from tests.test_dynamic_recurrent_pad import recurrent_export

RTOL, ATOL = 1e-3, 1e-4
SERIAL_REGION = re.compile(r"#pragma omp parallel[^\n]* if\(")


def _kernel_of(art: Path, op_type: str) -> str:
    source = (art / "kernels" / "cpu" / "model.c").read_text()
    plan = json.loads((art / "plan.json").read_text())
    step = next(s for s in plan["steps"] if s["op_type"] == op_type)
    assert step["provider"] == "c", step
    call = re.search(rf"/\* step {step['index']}: .*?\*/\s*(k_[0-9a-f]{{16}})\(", source, re.S)
    assert call is not None
    body = source[source.index(f"void {call.group(1)}(") :]
    return body[: body.index("\n}\n")]


def _check(model: onnx.ModelProto, art: Path, shapes: list[tuple[int, ...]]) -> None:
    for threads in (1, 2):
        session = Session(art, threads=threads)
        for shape in shapes:
            x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
            got, want = session.run(None, {"x": x}), ort_run(model, {"x": x})
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=f"{shape}, {threads} threads")


@pytest.mark.parametrize("cpu", ["x86-64-v2", "x86-64-v3"])
def test_lstm_forks_its_products_at_run_time(tmp_path: Path, cpu: str) -> None:
    """Silero's decoder LSTM (128 -> 128, forward): at batch 1 the projection and the step's
    product run serial, from batch 2 on threads; one direction has no direction fork at all."""
    model = recurrent_export("LSTM", 128, 128, "forward")
    art = compile_model(model, tmp_path / "a", dims={"seq": (1, 4), "batch": (1, 8)}, cpu=cpu, golden_cases=0)
    text = _kernel_of(art, "LSTM")
    assert "if (PROJPAR) {" in text and "if (STEPPAR) {" in text
    assert not SERIAL_REGION.search(text)
    assert "for (int d = 0; d < 1; ++d)" in text and "if(DIRPAR)" not in text
    _check(model, art, [(1, 1, 128), (4, 8, 128), (3, 2, 128), (2, 1, 128)])


@pytest.mark.parametrize("cpu", ["x86-64-v2", "x86-64-v3"])
def test_pad_forks_its_rows_at_run_time(tmp_path: Path, cpu: str) -> None:
    """A reflect Pad of [n, L] by 64 at the end (Silero's STFT padding): serial for one short row,
    on the worker pool for many long ones."""
    model = pad_model(["n", "L"], [0, 0, 0, 64], "reflect")
    art = compile_model(model, tmp_path / "a", dims={"n": (1, 64), "L": (65, 4096)}, cpu=cpu, golden_cases=0)
    text = _kernel_of(art, "Pad")
    assert re.search(r"\n    if \(\(.*\) >= \d+\) \{\n      onnx_aot_parallel\(k_\w+_rows_task, ", text)
    assert "#pragma omp" not in text
    _check(model, art, [(1, 576), (64, 4096), (3, 555)])


def _small_ops_model() -> onnx.ModelProto:
    """Silero's STFT tail in small: x [n, 4, L] -> Slice x[:, 1:] -> Cast to double and back ->
    Sigmoid -> Gather of the three rows (the elementwise, strided, typed-map and gather kernels)."""
    from onnx import TensorProto
    from onnx import helper
    from onnx import numpy_helper

    consts = {"starts": [1], "ends": [1 << 62], "axes": [1], "idx": [0, 2, 1]}
    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in consts.items()]
    nodes = [
        helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["s"]),
        helper.make_node("Cast", ["s"], ["d"], to=TensorProto.DOUBLE),
        helper.make_node("Cast", ["d"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Sigmoid", ["f"], ["g"]),
        helper.make_node("Gather", ["g", "idx"], ["y"], axis=1),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4, "L"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3, None])
    graph = helper.make_graph(nodes, "small", [x], [y], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_small_steps_take_no_serial_region(tmp_path: Path) -> None:
    """Every step of the small-ops model decides at run time: each runs on the worker pool or
    serially, no OpenMP region is left in model.c (x86-64-v3), and the results match at sizes
    below and above the thresholds."""
    model = _small_ops_model()
    art = compile_model(model, tmp_path / "a", dims={"n": (1, 4), "L": (2, 20000)}, cpu="x86-64-v3",
                        golden_cases=0)
    plan = json.loads((art / "plan.json").read_text())
    off_c = [(s["name"], s["provider"]) for s in plan["steps"] if s["provider"] != "c"]
    assert not off_c, off_c
    source = (art / "kernels" / "cpu" / "model.c").read_text()
    assert "onnx_aot_parallel(k_" in source and "#pragma omp" not in source
    _check(model, art, [(1, 4, 2), (3, 4, 577), (4, 4, 20000)])
