"""Output types of onnxruntime's ``com.microsoft`` integer GEMMs (DynamicQuantizeMatMul,
MatMulIntegerToFloat), which onnx's shape inference does not know: float32, of MatMul's shape
(numpy matmul broadcasting); the importer asks ``qgemm_types`` where a file carries none
(canonical forms: compiler/frontend/canonical/quantize_ms.py). Static shapes only.
"""

from __future__ import annotations

import numpy as np
import onnx

from compiler.ir.graph import Value

__all__ = ["Types", "qgemm_types"]

_OPS = ("DynamicQuantizeMatMul", "MatMulIntegerToFloat")


Types = dict[str, tuple[np.dtype, tuple[int, ...]]]


def qgemm_types(proto: onnx.NodeProto, inputs: list[Value | None]) -> Types:
    """{output: (float32, shape)} for those ops with static A and B; {} otherwise."""
    if proto.domain != "com.microsoft" or proto.op_type not in _OPS or len(inputs) < 2 or not proto.output:
        return {}
    a, b = inputs[0], inputs[1]
    if a is None or b is None or a.shape is None or b.shape is None or a.is_symbolic or b.is_symbolic:
        return {}
    try:
        shape = np.matmul(np.zeros(a.shape, np.int8), np.zeros(b.shape, np.int8)).shape
    except ValueError:
        return {}  # (the canonical form's MatMulInteger names what is wrong)
    return {proto.output[0]: (np.dtype(np.float32), tuple(int(d) for d in shape))}
