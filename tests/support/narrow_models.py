"""Models that ship their weights narrow, built from the BERT-style encoder of ``encoder_model.py``.

``narrowed(model, how)`` rewrites every MatMul weight (the ``*.weight`` initializers) the way
weight-only exporters write it:

- ``"cast"``: int8 codes + ``Cast`` to float + ``Mul`` by a per-column float32 scale [1, N] (the
  form of tinyocr's PP-OCRv6 models: ``Cast(q) * scale``);
- ``"cast_only"``: int8 codes + ``Cast`` alone (the weights are the small integers);
- ``"dq"``: int8 codes + ``DequantizeLinear`` per axis (axis 1, the output columns), zero points 0
  (or ``zero`` for a uint8 variant with zero point 128 when ``how == "dq_uint8"``);
- ``"fp16"``: float16 initializers + ``Cast`` to float.

Scales are max |w| / 127 per column, codes round half to even, so the models compute what the
float encoder does to within the quantization error.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

__all__ = ["NARROW_KINDS", "narrowed"]

NARROW_KINDS = ("cast", "cast_only", "dq", "dq_uint8", "fp16")


def _codes(w: np.ndarray, how: str) -> tuple[np.ndarray, np.ndarray]:
    scale = (np.abs(w).max(axis=0) / 127).astype(np.float32)
    q = np.clip(np.rint(w / scale), -127, 127)
    if how == "cast_only":
        return (q / 16).round().astype(np.int8), scale
    return q.astype(np.int8), scale


def _rewrite(name: str, w: np.ndarray, how: str) -> tuple[list[onnx.TensorProto], list[onnx.NodeProto]]:
    if how == "fp16":
        return ([numpy_helper.from_array(w.astype(np.float16), f"{name}.h")],
                [helper.make_node("Cast", [f"{name}.h"], [name], name=f"{name}/Cast", to=TensorProto.FLOAT)])
    q, scale = _codes(w, how)
    if how in ("dq", "dq_uint8"):
        uint8 = how == "dq_uint8"
        codes = (q.astype(np.int16) + 128).astype(np.uint8) if uint8 else q
        zero = np.full(scale.shape, 128 if uint8 else 0, np.uint8 if uint8 else np.int8)
        inits = [numpy_helper.from_array(codes, f"{name}.q"), numpy_helper.from_array(scale, f"{name}.s"),
                 numpy_helper.from_array(zero, f"{name}.z")]
        return inits, [helper.make_node("DequantizeLinear", [f"{name}.q", f"{name}.s", f"{name}.z"], [name],
                                        name=f"{name}/DequantizeLinear", axis=1)]
    cast = helper.make_node("Cast", [f"{name}.q"], [name if how == "cast_only" else f"{name}.c"],
                            name=f"{name}/Cast", to=TensorProto.FLOAT)
    if how == "cast_only":
        return [numpy_helper.from_array(q, f"{name}.q")], [cast]
    scales = numpy_helper.from_array(scale.reshape(1, -1), f"{name}.s")
    return ([numpy_helper.from_array(q, f"{name}.q"), scales],
            [cast, helper.make_node("Mul", [f"{name}.c", f"{name}.s"], [name], name=f"{name}/Mul")])


def narrowed(model: onnx.ModelProto, how: str) -> onnx.ModelProto:
    """A copy of ``model`` whose ``*.weight`` initializers are stored narrow as ``how`` says."""
    if how not in NARROW_KINDS:
        raise ValueError(f"unknown narrowing {how!r} (one of {', '.join(NARROW_KINDS)})")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []
    for t in g.initializer:
        if not t.name.endswith(".weight"):
            inits.append(t)
            continue
        more_inits, more_nodes = _rewrite(t.name, numpy_helper.to_array(t), how)
        inits += more_inits
        nodes += more_nodes
    del g.initializer[:]
    g.initializer.extend(inits)
    rest = list(g.node)
    del g.node[:]
    g.node.extend(nodes + rest)
    onnx.checker.check_model(out, full_check=True)
    return out
