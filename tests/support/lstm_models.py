"""An LSTM graph as ``torch.onnx.export`` writes ``nn.LSTM`` (weights as initializers in ONNX's
iofc order, h0 / c0 as graph inputs, Y squeezed — or, bidirectional, transposed and reshaped to
(seq, batch, 2H)), and what onnxruntime's ``quantize_dynamic`` makes of it (DynamicQuantizeLSTM)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper
from onnxruntime.quantization import QuantType
from onnxruntime.quantization import quantize_dynamic

__all__ = ["lstm_feeds", "lstm_model", "quantized_lstm"]


def lstm_model(seq: int, batch: int, size: int, hidden: int, *, bidirectional: bool = False,
               lengths: bool = False, with_y: bool = True, seed: int = 0) -> onnx.ModelProto:
    """The exported LSTM; ``lengths`` adds a sequence_lens input; ``with_y`` False leaves Y unused."""
    dirs = 2 if bidirectional else 1
    rng = np.random.default_rng(seed)
    bound = 1 / np.sqrt(hidden)  # nn.LSTM's initialization
    weights = {"W": (dirs, 4 * hidden, size), "R": (dirs, 4 * hidden, hidden), "B": (dirs, 8 * hidden)}
    inits = [numpy_helper.from_array(rng.uniform(-bound, bound, s).astype(np.float32), f"lstm.{n}")
             for n, s in weights.items()]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, batch, size])]
    if lengths:
        ins.append(helper.make_tensor_value_info("lens", TensorProto.INT32, [batch]))
    ins += [helper.make_tensor_value_info(n, TensorProto.FLOAT, [dirs, batch, hidden]) for n in ("h0", "c0")]
    attrs: dict[str, Any] = {"hidden_size": hidden}
    if bidirectional:
        attrs["direction"] = "bidirectional"
    y = "y_all" if with_y else ""
    lstm_in = ["x", "lstm.W", "lstm.R", "lstm.B", "lens" if lengths else "", "h0", "c0"]
    nodes = [helper.make_node("LSTM", lstm_in, [y, "h_n", "c_n"], name="/lstm/LSTM", **attrs)]
    state = [dirs, batch, hidden]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, state) for n in ("h_n", "c_n")]
    if with_y and bidirectional:
        inits.append(numpy_helper.from_array(np.array([seq, batch, 2 * hidden], np.int64), "shape"))
        nodes += [helper.make_node("Transpose", ["y_all"], ["y_t"], perm=[0, 2, 1, 3]),
                  helper.make_node("Reshape", ["y_t", "shape"], ["y"])]
    elif with_y:
        inits.append(numpy_helper.from_array(np.array([1], np.int64), "axes"))
        nodes.append(helper.make_node("Squeeze", ["y_all", "axes"], ["y"]))
    if with_y:
        outs.insert(0, helper.make_tensor_value_info("y", TensorProto.FLOAT, [seq, batch, dirs * hidden]))
    graph = helper.make_graph(nodes, "lstm", ins, outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


def quantized_lstm(model: onnx.ModelProto, root: Path, *, per_channel: bool) -> onnx.ModelProto:
    """``quantize_dynamic`` of ``model`` (LSTM among the op types, int8 weights) read back."""
    fp, q = root / "fp32.onnx", root / "int8.onnx"
    onnx.save(model, fp)
    quantize_dynamic(fp, q, op_types_to_quantize=["LSTM"], per_channel=per_channel,
                     weight_type=QuantType.QInt8)
    return onnx.load(q)


def lstm_feeds(model: onnx.ModelProto, seed: int) -> dict[str, np.ndarray]:
    """Seeded float inputs (x standard normal, states half that) and, where present, lengths
    (the full length, then shorter ones)."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for value in model.graph.input:
        shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
        if value.name == "lens":
            seq = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim][0]
            feeds["lens"] = np.array([seq - (i % seq) for i in range(shape[0])], np.int32)
        else:
            spread = 1.0 if value.name == "x" else 0.5
            feeds[value.name] = (rng.standard_normal(shape) * spread).astype(np.float32)
    return feeds
