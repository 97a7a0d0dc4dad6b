"""Output types of onnxruntime's ``com.microsoft.DynamicQuantizeLSTM``, which onnx's shape
inference does not know: float32 Y (seq, directions, batch, hidden), Y_h and Y_c (directions, batch,
hidden), layout 0 (the only one onnxruntime runs); the importer asks ``qlstm_types`` where a file
carries none (canonical form: compiler/frontend/canonical/quantize_lstm.py). Static shapes only.
"""

from __future__ import annotations

import numpy as np
import onnx

from compiler.frontend.qgemm_shapes import Types
from compiler.ir.graph import Value

__all__ = ["qlstm_types"]


def qlstm_types(proto: onnx.NodeProto, inputs: list[Value | None]) -> Types:
    """{output: (float32, shape)} for a DynamicQuantizeLSTM with static X and R; {} otherwise."""
    if proto.domain != "com.microsoft" or proto.op_type != "DynamicQuantizeLSTM" or len(inputs) < 3:
        return {}
    x, r = inputs[0], inputs[2]
    if x is None or r is None or x.shape is None or r.shape is None or x.is_symbolic or r.is_symbolic:
        return {}
    if len(x.shape) != 3 or len(r.shape) != 3:
        return {}  # (the canonical form names what is wrong)
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in proto.attribute}
    direction = attrs.get("direction", b"forward")
    dirs = 2 if direction in (b"bidirectional", "bidirectional") else 1
    hidden = int(attrs.get("hidden_size", r.shape[1]))
    seq, batch = int(x.shape[0]), int(x.shape[1])
    shapes = [(seq, dirs, batch, hidden), (dirs, batch, hidden), (dirs, batch, hidden)]
    named = zip(proto.output, shapes, strict=False)
    return {name: (np.dtype(np.float32), shape) for name, shape in named if name}
