"""Output types of onnxruntime's ``com.microsoft`` integer GEMMs, which onnx's shape inference does
not know: DynamicQuantizeMatMul and MatMulIntegerToFloat give float32 of MatMul's shape (numpy matmul
broadcasting); QGemm gives (M, N) of its 2-D A and B (transA / transB), of y_zero_point's type, else
float32 (onnxruntime's rule). The importer asks ``qgemm_types`` where a file carries none
(canonical forms: compiler/frontend/canonical/quantize_ms.py). Static shapes only.
"""

from __future__ import annotations

import numpy as np
import onnx

from compiler.ir.graph import Value

__all__ = ["Types", "qgemm_types"]

_OPS = ("DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QGemm")


Types = dict[str, tuple[np.dtype, tuple[int, ...]]]


def qgemm_types(proto: onnx.NodeProto, inputs: list[Value | None]) -> Types:
    """{output: (float32, shape)} for those ops with static A and B; {} otherwise."""
    if proto.domain != "com.microsoft" or proto.op_type not in _OPS or len(inputs) < 2 or not proto.output:
        return {}
    if proto.op_type == "QGemm":
        return _qgemm_types(proto, inputs)
    a, b = inputs[0], inputs[1]
    if a is None or b is None or a.shape is None or b.shape is None or a.is_symbolic or b.is_symbolic:
        return {}
    try:
        shape = np.matmul(np.zeros(a.shape, np.int8), np.zeros(b.shape, np.int8)).shape
    except ValueError:
        return {}  # (the canonical form's MatMulInteger names what is wrong)
    return {proto.output[0]: (np.dtype(np.float32), tuple(int(d) for d in shape))}


def _qgemm_types(proto: onnx.NodeProto, inputs: list[Value | None]) -> Types:
    a, b = inputs[0], inputs[3] if len(inputs) > 3 else None
    if a is None or b is None or a.shape is None or b.shape is None or len(a.shape) != 2 or len(b.shape) != 2:
        return {}
    attrs = {attr.name: attr.i for attr in proto.attribute if attr.name in ("transA", "transB")}
    m = a.shape[1] if attrs.get("transA", 0) else a.shape[0]
    n = b.shape[0] if attrs.get("transB", 0) else b.shape[1]
    y_zero = inputs[8] if len(inputs) > 8 else None
    if not isinstance(m, int) or not isinstance(n, int) or (y_zero is not None and y_zero.dtype is None):
        return {}
    dtype = np.dtype(np.float32) if y_zero is None else np.dtype(y_zero.dtype)
    return {proto.output[0]: (dtype, (m, n))}
