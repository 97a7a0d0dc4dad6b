"""A CRNN-style text recognizer built with ``onnx.helper``, with seeded weights (issue 21's model).

Convolutions with ReLU bring a ``1 x 1 x height x width`` line image down to one row of
``features`` channels (strides 2x2, 2x2, 2x1, 2x1, then a full-height conv), the row becomes a
sequence (Squeeze, Transpose to ``(T, 1, features)``), a bidirectional LSTM reads it, and a Gemm
classifies each timestep over ``classes`` symbols (``(T, 2 * hidden) -> (T, classes)``), the form
PyTorch exports for CRNN recognizers. The issue's dims (the defaults): 64 x 256 input, 512
features, hidden 512, 8210 classes (33.6 MB of classifier weights). Weights are He-scaled so
activations stay O(1) and float32 comparisons stay meaningful.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

__all__ = ["crnn_model", "crnn_input"]

_STRIDES = ((2, 2), (2, 2), (2, 1), (2, 1))


def crnn_model(*, height: int = 64, width: int = 256, features: int = 512, hidden: int = 512,
               classes: int = 8210, seed: int = 21) -> onnx.ModelProto:
    """The recognizer; ``height`` must be a multiple of 16 (four stride-2 rows, then a full-height conv)."""
    if height % 16 or width % 4:
        raise ValueError(f"height {height} must be a multiple of 16 and width {width} of 4")
    rng = np.random.default_rng(seed)
    inits: list[onnx.TensorProto] = []

    def weight(name: str, shape: tuple[int, ...], scale: float) -> str:
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    chans = [1, features // 8, features // 4, features // 2, features]
    nodes, x = [], "image"
    for i, stride in enumerate(_STRIDES):
        ci, co = chans[i], chans[i + 1]
        w, b = weight(f"conv{i}.w", (co, ci, 3, 3), (2 / (9 * ci)) ** 0.5), weight(f"conv{i}.b", (co,), 0.01)
        nodes += [helper.make_node("Conv", [x, w, b], [f"conv{i}"], pads=[1, 1, 1, 1], strides=list(stride)),
                  helper.make_node("Relu", [f"conv{i}"], [f"relu{i}"])]
        x = f"relu{i}"
    steps = width // 4
    rows = height // 16
    nodes.append(helper.make_node("Conv", [x, weight("conv4.w", (features, features, rows, 1),
                                                     (1 / (features * rows)) ** 0.5)], ["row"]))
    inits.append(numpy_helper.from_array(np.array([2], np.int64), "squeeze_axes"))
    nodes += [helper.make_node("Squeeze", ["row", "squeeze_axes"], ["squeezed"]),
              helper.make_node("Transpose", ["squeezed"], ["sequence"], perm=[2, 0, 1])]
    g = 4 * hidden
    nodes.append(helper.make_node(
        "LSTM", ["sequence", weight("lstm.W", (2, g, features), features**-0.5),
                 weight("lstm.R", (2, g, hidden), hidden**-0.5), weight("lstm.B", (2, 2 * g), 0.01)],
        ["lstm_y"], hidden_size=hidden, direction="bidirectional"))
    inits.append(numpy_helper.from_array(np.array([steps, 2 * hidden], np.int64), "feature_shape"))
    fc_w = weight("fc.w", (classes, 2 * hidden), (2 * hidden) ** -0.5)
    nodes += [helper.make_node("Transpose", ["lstm_y"], ["lstm_t"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["lstm_t", "feature_shape"], ["features"]),
              helper.make_node("Gemm", ["features", fc_w,
                                        weight("fc.b", (classes,), 0.01)],
                               ["logits"], transB=1)]
    graph = helper.make_graph(
        nodes, "crnn", [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 1, height, width])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [steps, classes])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def crnn_input(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """A normalized line image for ``model``."""
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return {"image": np.random.default_rng(seed).standard_normal(dims).astype(np.float32)}
