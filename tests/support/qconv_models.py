"""One-node QLinearConv / ConvInteger models with seeded random weights and quantization
parameters, in the form onnxruntime's quantizer writes them (constant initializers), for the
integer convolution tests."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper
from onnx import numpy_helper

__all__ = ["QConvCase", "qconv_model", "qconv_feed"]

_ONNX_TYPE = {np.dtype(np.uint8): onnx.TensorProto.UINT8, np.dtype(np.int8): onnx.TensorProto.INT8,
              np.dtype(np.int32): onnx.TensorProto.INT32}


@dataclass(frozen=True)
class QConvCase:
    c: int = 3
    m: int = 5
    hw: tuple[int, ...] = (9, 7)
    kernel: tuple[int, ...] = (3, 3)
    strides: tuple[int, ...] = (1, 1)
    pads: tuple[int, ...] = (1, 1, 1, 1)
    dilations: tuple[int, ...] = (1, 1)
    group: int = 1
    batch: int = 2
    x: str = "uint8"
    w: str = "int8"
    y: str = "uint8"
    per_channel: bool = True
    bias: bool = True
    integer: bool = False  # ConvInteger (int32 output) rather than QLinearConv
    w_zero: bool = True  # nonzero weight zero points
    y_scale: float | None = None  # Y's scale (default 0.3-0.4: requantizing scales ~1e-4)

    def out_hw(self) -> tuple[int, ...]:
        rank = len(self.hw)
        return tuple((self.hw[d] + self.pads[d] + self.pads[rank + d]
                      - self.dilations[d] * (self.kernel[d] - 1) - 1) // self.strides[d] + 1
                     for d in range(rank))


def _rand(rng: np.random.Generator, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(int(info.min), int(info.max) + 1, size=shape).astype(dtype)


def _zero(rng: np.random.Generator, dtype: str, shape: tuple[int, ...], spread: int) -> np.ndarray:
    mid = 128 if dtype == "uint8" else 0
    return (mid + rng.integers(-spread, spread + 1, size=shape)).astype(dtype)


def qconv_model(case: QConvCase, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    m, cg = case.m, case.c // case.group
    w = _rand(rng, case.w, (m, cg, *case.kernel))
    wz_shape = (m,) if case.per_channel else ()
    wz = _zero(rng, case.w, wz_shape, 5 if case.w_zero else 0)
    xz = _zero(rng, case.x, (), 40)
    ydt = "int32" if case.integer else case.y
    attrs = {"kernel_shape": list(case.kernel), "strides": list(case.strides), "pads": list(case.pads),
             "dilations": list(case.dilations), "group": case.group}
    inits = [numpy_helper.from_array(w, "w")]
    if case.integer:
        inits += [numpy_helper.from_array(xz, "xz"), numpy_helper.from_array(wz, "wz")]
        node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], **attrs)
    else:
        ws = (rng.random(wz_shape) * 0.004 + 0.001).astype(np.float32)
        ys = 0.3 + 0.1 * rng.random() if case.y_scale is None else case.y_scale
        scales = [np.array(0.02, np.float32), ws, np.array(ys, np.float32)]
        yz = _zero(rng, case.y, (), 30)
        inits += [numpy_helper.from_array(a, n) for a, n in
                  zip([scales[0], xz, scales[1], wz, scales[2], yz], ["xs", "xz", "ws", "wz", "ys", "yz"],
                      strict=True)]
        names = ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"]
        if case.bias:
            inits.append(numpy_helper.from_array(rng.integers(-3000, 3000, m).astype(np.int32), "b"))
            names.append("b")
        node = helper.make_node("QLinearConv", names, ["y"], **attrs)
    x = helper.make_tensor_value_info("x", _ONNX_TYPE[np.dtype(case.x)], [case.batch, case.c, *case.hw])
    y = helper.make_tensor_value_info("y", _ONNX_TYPE[np.dtype(ydt)], [case.batch, m, *case.out_hw()])
    graph = helper.make_graph([node], "qconv", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def qconv_feed(case: QConvCase, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": _rand(rng, case.x, (case.batch, case.c, *case.hw))}
