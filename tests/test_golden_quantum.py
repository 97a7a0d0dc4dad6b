"""The golden tolerance of an integer artifact (issue 32, compiler/artifact/quantum.py): an output that
is a quantized value -- a DequantizeLinear's (through value-keeping movement) or an 8-bit one -- is
held to ``QUANTUM_STEPS`` steps of its scale relative to max|ref|, recorded in golden.json with that
step (``quantum``); every other output keeps its dtype's tolerance (float32: 2e-3, unchanged). The
deploy-side check holds an 8-bit output with a quantum to its tolerance instead of exactly. ResNet-50
quantized by onnxruntime's quantizer (QDQ here; QOperator in tests/test_qoperator_zoo.py), whose
softmax output spans three steps so that one rounding flip is 0.33 of it, compiles with the check on
and passes ``verify`` without a widened (conditioning) tolerance.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper
from onnx import version_converter

from compiler import compile_model
from compiler.artifact.quantum import QUANTUM_STEPS
from runtime import Session
from runtime.selftest import relative_error
from tests.support.golden_records import golden_outputs
from tests.support.qdq_models import quantize_file
from tests.support.zoo import dummy_input
from tests.support.zoo import random_weight_model

_SCALE = 0.0125


def _model(nodes: list[onnx.NodeProto], out_type: int, inits: dict[str, np.ndarray],
           shape: tuple[int, ...] = (2, 3, 4)) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])
    y = helper.make_tensor_value_info("y", out_type, shape)
    graph = helper.make_graph(nodes, "g", [x], [y], [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


_QPARAMS: dict[str, np.ndarray] = {"s": np.array(_SCALE, np.float32), "z": np.array(-3, np.int8),
                                   "shape": np.array([6, 4], np.int64)}
_Q = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"])
_DQ = helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"])
MODELS = {  # name -> (model, the quantum golden.json must record: None for none)
    "float": (_model([helper.make_node("Sigmoid", ["x"], ["t"]), helper.make_node("Mul", ["t", "x"], ["y"])],
                     TensorProto.FLOAT, {}), None),
    "dequantized": (_model([_Q, _DQ, helper.make_node("Reshape", ["d", "shape"], ["y"])], TensorProto.FLOAT,
                           _QPARAMS, (6, 4)), _SCALE),
    "float_after_dequantize": (_model([_Q, _DQ, helper.make_node("Softmax", ["d"], ["y"])], TensorProto.FLOAT,
                                      _QPARAMS), None),
    "eight_bit": (_model([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])], TensorProto.INT8,
                         _QPARAMS), 1.0),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_golden_tolerance_is_a_few_steps_of_a_quantized_output_and_unchanged_elsewhere(
        name: str, tmp_path: Path) -> None:
    model, quantum = MODELS[name]
    artifact = compile_model(model, tmp_path / "a", cpu="x86-64-v2")
    found = golden_outputs(artifact)
    assert len(found) == 2
    for record, ref in found:
        if quantum is None:
            assert "quantum" not in record and record["tolerance"] == 2e-3  # float32's, as before
            continue
        assert record["quantum"] == pytest.approx(quantum, rel=1e-7)
        want = QUANTUM_STEPS * quantum / float(np.abs(ref.astype(np.float64)).max())
        assert record["tolerance"] == pytest.approx(max(want, 2e-3 if ref.dtype.kind == "f" else 0.0))
    assert Session(artifact).verify().verified


def test_an_eight_bit_output_with_a_quantum_is_held_to_its_steps() -> None:
    from runtime.selftest import _check

    ref = np.array([[0, 5, -7, 12]], np.int8)
    record = {"tolerance": QUANTUM_STEPS / 12, "quantum": 1.0}
    for moved, ok in ((1, True), (2, True), (3, False)):
        got = ref.copy()
        got[0, 1] += moved
        assert _check(0, "y", got, ref, record).ok is ok, moved
        assert relative_error(got, ref, exact=False) == pytest.approx(moved / 12)
        assert relative_error(got, ref) == float("inf")  # without a quantum: exact, as before
        assert not _check(0, "y", got, ref, {"tolerance": 0.0}).ok


def test_resnet50_qdq_compiles_with_the_check_and_verifies(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = version_converter.convert_version(random_weight_model("resnet50"), 13)
    fp32 = tmp_path / "resnet50.onnx"
    onnx.save(model, fp32)
    int8 = quantize_file(fp32, tmp_path / "resnet50.qdq.onnx", "qdq", lambda seed: dummy_input(model, seed))
    last = onnx.load(int8).graph.node[-1]
    assert last.op_type == "DequantizeLinear"
    scale = {t.name: numpy_helper.to_array(t) for t in onnx.load(int8).graph.initializer}[last.input[1]]
    artifact = compile_model(int8, tmp_path / "art")
    for record, ref in golden_outputs(artifact):
        assert record["quantum"] == pytest.approx(float(scale)) and "conditioning" not in record
        assert record["tolerance"] == pytest.approx(QUANTUM_STEPS * float(scale) / float(np.abs(ref).max()))
    assert Session(artifact).verify().verified
