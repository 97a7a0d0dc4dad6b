"""Quantized models for the QDQ-folding tests and ``scripts/bench_int8.py``.

``QdqBuilder`` writes QDQ patterns with onnx.helper the way onnxruntime's quantizer does (opset 13;
every activation a QuantizeLinear / DequantizeLinear pair with scalar scale and zero point; weights
int8 initializers behind a per-channel DequantizeLinear, axis 0 for Conv, 1 for MatMul; biases
int32 at ``x_scale * w_scale`` with an int32 zero point of 0). ``quantize_file`` runs
onnxruntime's own quantizer (static QDQ / QOperator, or dynamic) over a float model, with seeded
calibration feeds.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

__all__ = ["QdqBuilder", "quantize_file", "stray"]


class QdqBuilder:
    """A graph under construction: ``q`` / ``dq`` of activations, quantized weights and biases."""

    def __init__(self, seed: int = 0, dtype: type = np.int8) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.dtype = np.dtype(dtype)
        self.count = 0

    def _name(self, base: str) -> str:
        self.count += 1
        return f"{base}_{self.count}"

    def const(self, array: np.ndarray, base: str = "c") -> str:
        name = self._name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def node(self, op: str, inputs: list[str], **attrs: object) -> str:
        out = self._name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def qparams(self, scale: float, zero: int) -> tuple[str, str]:
        return self.const(np.float32(scale), "scale"), self.const(np.array(zero, self.dtype), "zp")

    def qdq(self, x: str, scale: float, zero: int) -> str:
        """x -> QuantizeLinear -> DequantizeLinear (the pair the quantizer puts on an activation)."""
        s, z = self.qparams(scale, zero)
        return self.node("DequantizeLinear", [self.node("QuantizeLinear", [x, s, z]), s, z])

    def weight(self, shape: tuple[int, ...], axis: int, per_channel: bool = True) -> tuple[str, np.ndarray]:
        """A random int8 weight behind DequantizeLinear; its scales (one per ``axis`` entry or one)."""
        codes = self.rng.integers(-127, 128, shape).astype(np.int8)
        n = shape[axis] if per_channel else 1
        scale = self.rng.uniform(0.002, 0.02, n).astype(np.float32)
        if not per_channel:
            s, z = self.const(scale[0], "w_scale"), self.const(np.int8(0), "w_zp")
            return self.node("DequantizeLinear", [self.const(codes, "w"), s, z]), scale
        s, z = self.const(scale, "w_scale"), self.const(np.zeros(n, np.int8), "w_zp")
        return self.node("DequantizeLinear", [self.const(codes, "w"), s, z], axis=axis), scale

    def bias(self, x_scale: float, w_scale: np.ndarray) -> str:
        scale = (np.float32(x_scale) * w_scale).astype(np.float32)
        codes = self.rng.integers(-2000, 2000, scale.shape).astype(np.int32)
        return self.node("DequantizeLinear", [self.const(codes, "b"), self.const(scale, "b_scale"),
                                              self.const(np.zeros(scale.shape, np.int32), "b_zp")], axis=0)

    def model(self, inputs: dict[str, tuple[int, ...]], outputs: list[str]) -> onnx.ModelProto:
        ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()]
        outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
        graph = helper.make_graph(self.nodes, "qdq", ins, outs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
        return onnx.shape_inference.infer_shapes(model)


def stray(outputs: list[np.ndarray], reference: list[np.ndarray]) -> float:
    """The largest, over outputs, of max |output - reference| / max |reference| (issue 32's measure)."""
    worst = 0.0
    for out, ref in zip(outputs, reference, strict=True):
        r = np.asarray(ref, np.float64)
        scale = float(np.max(np.abs(r))) if r.size else 0.0
        worst = max(worst, float(np.max(np.abs(np.asarray(out, np.float64) - r))) / (scale or 1.0))
    return worst


def quantize_file(fp32: Path, out: Path, form: str, feeds: Callable[[int], dict[str, np.ndarray]],
                  calibration: int = 4, preprocess: bool = False) -> Path:
    """onnxruntime's quantizer over ``fp32``: ``form`` "qdq" (S8S8 per channel), "qoperator" (U8S8
    per channel) or "dynamic" (``quantize_dynamic``, U8 activations, S8 weights). ``preprocess``
    first runs the quantizer's recommended ``quant_pre_process`` (onnxruntime's basic graph
    optimizations: BatchNormalization folded into Conv, ...) and quantizes what it writes."""
    from onnxruntime.quantization import CalibrationDataReader
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization import quantize_dynamic
    from onnxruntime.quantization import quantize_static

    class _Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.left = [feeds(seed) for seed in range(calibration)]

        def get_next(self) -> dict[str, np.ndarray] | None:
            return self.left.pop() if self.left else None

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if preprocess:
            from onnxruntime.quantization.shape_inference import quant_pre_process

            pre = out.with_name(out.stem + ".pre.onnx")
            quant_pre_process(str(fp32), str(pre), skip_symbolic_shape=True)
            fp32 = pre
        if form == "dynamic":
            quantize_dynamic(str(fp32), str(out), weight_type=QuantType.QInt8)
        elif form in ("qdq", "qoperator"):
            fmt = QuantFormat.QDQ if form == "qdq" else QuantFormat.QOperator
            act = QuantType.QInt8 if form == "qdq" else QuantType.QUInt8
            quantize_static(str(fp32), str(out), _Reader(), quant_format=fmt, per_channel=True,
                            activation_type=act, weight_type=QuantType.QInt8)
        else:
            raise ValueError(f"unknown quantization form {form!r}")
    return out
