"""The quantization step of a graph output, for the golden tolerance of an integer artifact.

An output that is a quantized value -- an 8-bit integer output, or the float output of a
DequantizeLinear (through data movement that keeps its values) -- lies on a grid: its values are
``(q - zero) * scale``. Two correct kernels can put it one grid step apart: a float step upstream
(a float Conv or Gemm left between DequantizeLinear and QuantizeLinear, a float Softmax) sums in
another order, and a value lying that near a rounding boundary of the next QuantizeLinear rounds
the other way; everything after it is integer and exact, so the output moves by whole steps. On an
output whose range spans few steps (a softmax of scores near 3 / 256) one step is a large relative
error (0.33 of max|ref| at three steps), far over float32's 2e-3, though the artifact is right.

``QUANTUM_STEPS`` (2) steps of the output's scale are allowed: a rounding flip moves an output by
one step where it is requantized, and one more where its effect reaches a second rounding boundary
downstream (measured: ResNet-50 QOperator, U8S8 from onnxruntime's quantizer, differs from the
reference by at most 1 step in 6 golden cases, per tensor and per channel; QDQ by 0). A wrong
kernel (a zero point or scale misread, a dropped term) moves an output by many steps. Float outputs
of no dequantization keep ``tolerance_for``'s value (``compiler/artifact/golden.py``).
"""

from __future__ import annotations

import numpy as np

from compiler.ir.graph import Value

__all__ = ["QUANTUM_STEPS", "output_quantum", "quantum_tolerance"]

QUANTUM_STEPS = 2
# ops between a DequantizeLinear and the output that keep its values (so its grid)
_VALUE_KEEPING = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Identity"})
_EIGHT_BIT = frozenset({np.dtype(np.int8), np.dtype(np.uint8)})


def output_quantum(value: Value) -> float | None:
    """The grid step of graph output ``value`` (in its own units), or None where it has none."""
    if value.dtype in _EIGHT_BIT:
        return 1.0
    node = value.producer
    while node is not None and node.kind in _VALUE_KEEPING and node.inputs and node.inputs[0] is not None:
        node = node.inputs[0].producer
    if node is None or node.kind != "DequantizeLinear" or len(node.inputs) < 2:
        return None
    x, scale = node.inputs[0], node.inputs[1]
    if x is None or x.dtype not in _EIGHT_BIT or scale is None or scale.const is None or not scale.const.size:
        return None
    step = float(np.max(np.abs(scale.const.astype(np.float64))))
    return step if np.isfinite(step) and step > 0 else None


def quantum_tolerance(quantum: float, array: np.ndarray) -> float:
    """``QUANTUM_STEPS`` steps of ``quantum`` relative to max|array| (the golden metric's scale)."""
    magnitudes = np.abs(np.asarray(array, np.float64))
    finite = magnitudes[np.isfinite(magnitudes)]
    absmax = float(finite.max()) if finite.size else 0.0
    return QUANTUM_STEPS * quantum / max(absmax, float(np.finfo(np.float32).tiny))
