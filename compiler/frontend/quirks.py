"""Files that break a rule of the ONNX version they declare, in ways whose meaning is clear and
that onnxruntime runs: read as the later version that allows them, with a warning naming the
rule and the first node or initializer concerned.

- An IR version below 4 requires every initializer to be a graph input too; onnxruntime's
  quantizer adds scales and zero points to an old model as initializers only. Read as IR 4 (where
  an initializer need not be an input) -- nothing changes for the initializers that are inputs.
- QuantizeLinear / DequantizeLinear took ``axis`` (per-channel scales) from opset 13 on;
  onnxruntime's quantizer writes it into models of opset 10-12, and its kernels read it with
  opset 13's meaning. Such a model is converted to opset 13 before it is checked.
"""

from __future__ import annotations

import warnings

import onnx
import onnx.version_converter

from runtime.errors import ModelError
from runtime.errors import ModelQuirkWarning

__all__ = ["tolerate_quirks"]

AXIS_OPSET = 13  # the opset that gave QuantizeLinear / DequantizeLinear their axis attribute
QDQ = ("QuantizeLinear", "DequantizeLinear")


def _default_opset(proto: onnx.ModelProto) -> int:
    return next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)


def _initializer_not_input(proto: onnx.ModelProto) -> str | None:
    inputs = {i.name for i in proto.graph.input}
    return next((t.name for t in proto.graph.initializer if t.name not in inputs), None)


def _axis_too_early(proto: onnx.ModelProto) -> str | None:
    if not 10 <= _default_opset(proto) < AXIS_OPSET:
        return None
    return next((node.name or node.output[0] for node in proto.graph.node
                 if node.op_type in QDQ and node.domain in ("", "ai.onnx")
                 and any(a.name == "axis" for a in node.attribute)), None)


def tolerate_quirks(proto: onnx.ModelProto, where: str) -> onnx.ModelProto:
    """``proto`` as the later ONNX version its quirks need (the same object when it has none)."""
    if proto.ir_version < 4:
        name = _initializer_not_input(proto)
        if name is not None:
            warnings.warn(f"{where}: initializer {name!r} is not a graph input, as IR version "
                          f"{proto.ir_version} requires; read as IR version 4", ModelQuirkWarning,
                          stacklevel=3)
            fixed = onnx.ModelProto()
            fixed.CopyFrom(proto)  # (the caller's proto stays as it was)
            fixed.ir_version = 4
            proto = fixed
    node = _axis_too_early(proto)
    if node is not None:
        opset = _default_opset(proto)
        warnings.warn(f"{where}: node {node!r} has an 'axis' attribute, which its op takes only from "
                      f"opset {AXIS_OPSET} on (the model declares {opset}); read as opset {AXIS_OPSET}",
                      ModelQuirkWarning, stacklevel=3)
        try:
            proto = onnx.version_converter.convert_version(proto, AXIS_OPSET)
        except Exception as exc:
            raise ModelError(f"{where}: node {node!r} has an 'axis' attribute its opset {opset} does not "
                             f"define, and converting to opset {AXIS_OPSET} failed: "
                             f"{str(exc).strip().splitlines()[0]}") from None
    return proto
