"""Small integer-GEMM graphs for tests/test_qgemm.py, in the forms exporters and onnxruntime's
quantizer write them: MatMulInteger / QLinearMatMul with constant B (u8 and s8, per-tensor and
per-column zero points and scales, odd M / N / K, K not a multiple of 4, batched A), and
DynamicQuantizeLinear on its own.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

__all__ = ["integer_matmuls", "integer_feeds", "dynamic_quantize_model", "RANGES"]

RANGES = {np.int8: (-128, 128), np.uint8: (0, 256)}
_ONNX = {np.int8: TensorProto.INT8, np.uint8: TensorProto.UINT8}
# (A's shape, N, A's type, B's type, per-column B parameters, QLinearMatMul)
CASES = (
    ((5, 37), 21, np.uint8, np.int8, True, False),
    ((2, 7, 30), 50, np.int8, np.int8, False, False),
    ((13, 9), 70, np.uint8, np.uint8, True, False),
    ((33, 130), 17, np.int8, np.uint8, False, False),
    ((1, 3), 1, np.uint8, np.int8, False, False),
    ((11, 45), 33, np.uint8, np.int8, False, True),
    ((3, 6, 66), 40, np.int8, np.int8, True, True),
    ((19, 23), 65, np.uint8, np.uint8, True, True),
)


def _ints(rng: np.random.Generator, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    lo, hi = RANGES[dtype]
    return rng.integers(lo, hi, shape).astype(dtype)


def _scale(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.uniform(0.001, 0.02, shape).astype(np.float32)


def integer_matmuls(seed: int = 0, cases: tuple[tuple, ...] = CASES) -> onnx.ModelProto:
    """Every case of ``cases`` as one node of one graph (inputs a0, a1, ...; outputs y0, y1, ...)."""
    rng = np.random.default_rng(seed)
    nodes, inits, ins, outs = [], [], [], []
    for i, (shape, n, at, bt, per_col, qlinear) in enumerate(cases):
        k = shape[-1]
        cols = (n,) if per_col else ()
        b = _ints(rng, bt, (k, n))
        bz = (rng.integers(-6, 6, cols) + (128 if bt == np.uint8 else 0)).astype(bt)
        az = np.array(rng.integers(-9, 9) + (128 if at == np.uint8 else 0), at)
        params = {"b": b, "bz": bz, "az": az}
        if qlinear:
            yt = at
            params.update(as_=np.array(0.02, np.float32), bs=_scale(rng, cols), ys=np.array(0.5, np.float32),
                          yz=np.array(3, yt))
            names = ["a", "as_", "az", "b", "bs", "bz", "ys", "yz"]
            op, y_type = "QLinearMatMul", _ONNX[yt]
        else:
            names, op, y_type = ["a", "b", "az", "bz"], "MatMulInteger", TensorProto.INT32
        for key, value in params.items():
            inits.append(numpy_helper.from_array(value, f"{key}{i}"))
        nodes.append(helper.make_node(op, [f"{name}{i}" for name in names], [f"y{i}"], name=f"{op}_{i}"))
        ins.append(helper.make_tensor_value_info(f"a{i}", _ONNX[at], list(shape)))
        outs.append(helper.make_tensor_value_info(f"y{i}", y_type, [*shape[:-1], n]))
    graph = helper.make_graph(nodes, "integer_matmuls", ins, outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def integer_feeds(seed: int = 1, cases: tuple[tuple, ...] = CASES) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"a{i}": _ints(rng, at, shape) for i, (shape, _, at, *_rest) in enumerate(cases)}


def dynamic_quantize_model(shapes: tuple[tuple[int, ...], ...]) -> onnx.ModelProto:
    """One DynamicQuantizeLinear per shape (inputs x0, ...; outputs q0, s0, z0, ...)."""
    nodes, ins, outs = [], [], []
    for i, shape in enumerate(shapes):
        nodes.append(helper.make_node("DynamicQuantizeLinear", [f"x{i}"], [f"q{i}", f"s{i}", f"z{i}"]))
        ins.append(helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, list(shape)))
        outs += [helper.make_tensor_value_info(f"q{i}", TensorProto.UINT8, list(shape)),
                 helper.make_tensor_value_info(f"s{i}", TensorProto.FLOAT, []),
                 helper.make_tensor_value_info(f"z{i}", TensorProto.UINT8, [])]
    graph = helper.make_graph(nodes, "dynamic_quantize", ins, outs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
