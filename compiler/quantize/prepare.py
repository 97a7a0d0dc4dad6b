"""The fp32 model made ready for the QDQ rewrite: opset 13 or later, BatchNormalization folded.

Per-axis QuantizeLinear / DequantizeLinear need opset 13, so an older model is converted
(``onnx.version_converter``). A BatchNormalization whose input is a Conv's only use (constant
weight, bias and statistics) is folded into that Conv's weight and bias before calibration, as
onnxruntime's recommended ``quant_pre_process`` does: the folded Conv is quantized once, with no
float BatchNormalization left between its DequantizeLinear and QuantizeLinear. Shapes are then
inferred (the placement reads which tensors are float off ``value_info``).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from compiler.quantize.feeds import CalibrationError

__all__ = ["prepare_model", "QDQ_OPSET"]

QDQ_OPSET = 13


def prepare_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` at opset >= 13 with its Conv + BatchNormalization pairs folded."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), QDQ_OPSET)
    if opset < QDQ_OPSET:
        try:
            model = onnx.version_converter.convert_version(model, QDQ_OPSET)
        except Exception as exc:  # the converter raises its own assorted errors
            raise CalibrationError(f"--quantize: the model is opset {opset} and cannot be converted to "
                                   f"opset {QDQ_OPSET} for QuantizeLinear per axis: {exc}") from None
    out = onnx.ModelProto()
    out.CopyFrom(model)
    _fold_batchnorms(out.graph)
    return onnx.shape_inference.infer_shapes(out)


def _fold_batchnorms(graph: onnx.GraphProto) -> None:
    consts = {t.name: t for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    uses: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    outputs = {o.name for o in graph.output}
    dropped = []
    for bn in graph.node:
        conv = producer.get(bn.input[0]) if bn.op_type == "BatchNormalization" else None
        if (conv is None or conv.op_type != "Conv" or len(bn.output) != 1 or uses[bn.input[0]] != 1
                or bn.input[0] in outputs or not all(n in consts for n in [*conv.input[1:], *bn.input[1:]])):
            continue
        _fold_one(graph, conv, bn, consts)
        dropped.append(bn)
    for bn in dropped:
        graph.node.remove(bn)
    read = {n for node in graph.node for n in node.input} | {i.name for i in graph.input}
    unread = [t for t in graph.initializer if t.name not in read]
    for tensor in unread:  # the weights, biases and statistics folded away
        graph.initializer.remove(tensor)


def _fold_one(graph: onnx.GraphProto, conv: onnx.NodeProto, bn: onnx.NodeProto,
              consts: dict[str, onnx.TensorProto]) -> None:
    """Fold ``bn`` into ``conv``: new weight and bias constants, the Conv writing bn's output."""
    gamma, beta, mean, var = (numpy_helper.to_array(consts[n]).astype(np.float64) for n in bn.input[1:5])
    eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
    weight = numpy_helper.to_array(consts[conv.input[1]]).astype(np.float64)
    has_bias = len(conv.input) > 2 and conv.input[2]
    bias = (numpy_helper.to_array(consts[conv.input[2]]).astype(np.float64) if has_bias
            else np.zeros(weight.shape[0]))
    factor = gamma / np.sqrt(var + eps)
    folded_w = (weight * factor.reshape(-1, *[1] * (weight.ndim - 1))).astype(np.float32)
    folded_b = ((bias - mean) * factor + beta).astype(np.float32)
    names = []
    for array, suffix in ((folded_w, "weight"), (folded_b, "bias")):
        name = f"{bn.output[0]}_folded_{suffix}"
        graph.initializer.append(numpy_helper.from_array(array, name))
        consts[name] = graph.initializer[-1]
        names.append(name)
    del conv.input[1:]
    conv.input.extend(names)
    conv.output[0] = bn.output[0]
