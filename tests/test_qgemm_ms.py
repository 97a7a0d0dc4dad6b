"""onnxruntime's ``com.microsoft.QGemm`` (issue 32), in the form its quantizer writes the final Gemm of
a CNN in the QOperator format (transB 1, an int8 weight, an int32 bias C, a uint8 output), and the
other forms its schema allows (per-column b_scale, no C, a float output with or without y_scale,
alpha, transA, a uint8 B, an int8 output). Imported as MatMulInteger [-> Add C] -> Cast -> Mul
[-> QuantizeLinear] (compiler/frontend/canonical/quantize_ms.py), with onnxruntime's own output scale
formed in float32: every case equals onnxruntime bit for bit, on the reference provider and on the C
target (where the MatMulInteger and C are the int32 onnx_aot.QGemm) at x86-64-v2 (the portable path)
and x86-64-v4 (AVX-512BW, and VNNI where the host has it).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler import compile_model
from compiler.providers.base import Provider
from compiler.providers.reference import ReferenceProvider
from runtime import Session
from runtime.errors import ModelError
from tests.cpu_targets import host_runs

M, K, N = 3, 37, 21
_MS = "com.microsoft"
_TYPES = {"uint8": TensorProto.UINT8, "int8": TensorProto.INT8, "float32": TensorProto.FLOAT}

# case -> (per-column b_scale, C, y_scale, y_zero_point (its type: A's), attributes, A's and B's types)
Case = tuple[bool, bool, bool, str | None, dict[str, float], tuple[str, str]]
CASES: dict[str, Case] = {
    "quantizer_form": (False, True, True, "uint8", {"transB": 1}, ("uint8", "int8")),
    "per_column": (True, True, True, "uint8", {"transB": 1}, ("uint8", "int8")),
    "per_column_float_out": (True, False, False, None, {"transB": 1}, ("uint8", "int8")),
    "bias_float_out": (False, True, False, None, {"transB": 1}, ("uint8", "int8")),
    "y_scale_float_out": (False, True, True, None, {"transB": 1}, ("uint8", "int8")),
    "uint8_b": (False, True, True, "uint8", {"transB": 1}, ("uint8", "uint8")),  # Inception v1's
    "int8_alpha_transposed_a": (True, True, True, "int8", {"transA": 1, "alpha": 0.75}, ("int8", "int8")),
}


def _ints(rng: np.random.Generator, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


def qgemm_model(case: str, seed: int = 0) -> onnx.ModelProto:
    """One QGemm of an 8-bit A by a constant B, in the form of ``CASES[case]``."""
    per_column, bias, y_scale, y_zero, attrs, (a_type, b_type) = CASES[case]
    rng = np.random.default_rng(seed)
    scales = (N,) if per_column else ()
    params = {"a_scale": np.array(0.087, np.float32), "a_zero": np.array(3, a_type),
              "b": _ints(rng, b_type, (N, K) if attrs.get("transB") else (K, N)),
              "b_scale": rng.uniform(0.001, 0.004, scales).astype(np.float32),
              "b_zero": np.full(scales, 119 if b_type == "uint8" else 0, b_type)}
    names = ["a", "a_scale", "a_zero", "b", "b_scale", "b_zero", "", "", ""]
    if bias:
        params["c"], names[6] = rng.integers(-3000, 3000, N).astype(np.int32), "c"
    if y_scale:
        params["y_scale"], names[7] = np.array(0.108, np.float32), "y_scale"
    if y_zero is not None:
        params["y_zero"], names[8] = np.array(135 if y_zero == "uint8" else -7, y_zero), "y_zero"
    a_shape = [K, M] if attrs.get("transA") else [M, K]
    while not names[-1]:
        names.pop()
    node = helper.make_node("QGemm", names, ["y"], name="gemm_quant", domain=_MS)
    node.attribute.extend(helper.make_attribute(k, v) for k, v in attrs.items())
    graph = helper.make_graph([node], "qgemm", [helper.make_tensor_value_info("a", _TYPES[a_type], a_shape)],
                              [helper.make_tensor_value_info("y", _TYPES[y_zero or "float32"], [M, N])],
                              [numpy_helper.from_array(v, k) for k, v in params.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(_MS, 1)])


def _feeds(model: onnx.ModelProto, seed: int) -> dict[str, np.ndarray]:
    a = model.graph.input[0].type.tensor_type
    dtype = helper.tensor_dtype_to_np_dtype(a.elem_type).name
    return {"a": _ints(np.random.default_rng(seed), dtype, tuple(d.dim_value for d in a.shape.dim))}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("where", ["reference", "x86-64-v2", "x86-64-v4"])
def test_qgemm_equals_onnxruntime_bit_for_bit(case: str, where: str, tmp_path: Path) -> None:
    model = qgemm_model(case)
    providers: list[Provider] | None = [ReferenceProvider()] if where == "reference" else None
    cpu = "x86-64-v2" if where == "reference" else where
    artifact = compile_model(model, tmp_path / "a", cpu=cpu, providers=providers, golden_cases=1)
    steps = [(s["op_type"], s["provider"]) for s in json.loads((artifact / "plan.json").read_text())["steps"]]
    if where != "reference":  # C joins the int32 QGemm; the float scaling and requantization follow it
        tail = ["Cast", "Mul"] + (["QuantizeLinear"] if CASES[case][3] else [])
        assert steps[-len(tail) - 1:] == [("QGemm", "c")] + [(k, "c") for k in tail], steps
        assert all(p == "c" for _, p in steps) and len(steps) <= len(tail) + 2, steps
    if not host_runs(cpu):
        pytest.skip(f"this host does not run {cpu} code")
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ours = Session(artifact)
    for seed in range(3):
        feeds = _feeds(model, seed)
        (want,), (got,) = theirs.run(None, feeds), ours.run(None, feeds)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(got, want), (case, seed, np.abs(got.astype(float) - want).max())


def test_qgemm_with_a_run_time_scale_is_refused_naming_the_node(tmp_path: Path) -> None:
    model = qgemm_model("quantizer_form")
    scale = model.graph.initializer[[i.name for i in model.graph.initializer].index("y_scale")]
    model.graph.initializer.remove(scale)
    model.graph.input.append(helper.make_tensor_value_info("y_scale", TensorProto.FLOAT, []))
    with pytest.raises(ModelError, match=r"'gemm_quant' \(QGemm\).*y_scale.*constant"):
        compile_model(model, tmp_path / "a", cpu="x86-64-v2", golden_cases=0)
