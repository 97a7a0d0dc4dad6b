"""The light model zoo shipped inside the ``onnx`` package, with seeded random weights.

The shipped models build their weights with ConstantOfShape (every weight 0.02), so their
outputs ignore the input. ``random_weight_model`` replaces every weight with seeded random data
scaled so deep nets stay finite: He (fan-in) scaled Conv/Gemm weights, BatchNorm scale < 1 and
variance > 0, small biases. ``strip_softmax`` cuts the final Softmax (it saturates) so tests
compare logits. Models with IR version < 4 must list initializers as graph inputs; we keep that
(``for_onnxruntime``, from ``compiler.bench``, removes them for onnxruntime).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import helper
from onnx import numpy_helper

__all__ = ["LIGHT_DIR", "ZOO", "light_model_path", "random_weight_model", "strip_softmax",
           "zoo_model", "dummy_input"]

LIGHT_DIR = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"
ZOO = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
       "squeezenet", "vgg19", "zfnet512")
PASS_THROUGH = ("Reshape", "Unsqueeze", "Flatten", "Squeeze")


def light_model_path(name: str) -> Path:
    return LIGHT_DIR / f"light_{name}.onnx"


def _consumer(graph: onnx.GraphProto, name: str) -> tuple[onnx.NodeProto | None, int]:
    """The first real consumer of ``name``, following shape-only ops."""
    for node in graph.node:
        for k, inp in enumerate(node.input):
            if inp == name:
                if node.op_type in PASS_THROUGH and k == 0:
                    return _consumer(graph, node.output[0])
                return node, k
    return None, -1


def _random_tensor(rng: np.random.Generator, shape: tuple[int, ...], node: onnx.NodeProto | None,
                   index: int, residual: bool) -> np.ndarray:
    op = node.op_type if node is not None else ""
    size = int(np.prod(shape)) if shape else 1
    if op == "Conv" and index == 1:
        fan_in = max(size // max(shape[0], 1), 1)
        return rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
    if op == "Gemm" and index == 1:
        trans_b = any(a.name == "transB" and a.i for a in node.attribute)  # type: ignore[union-attr]
        fan_in = shape[-1] if trans_b else shape[0]
        if len(shape) != 2:
            fan_in = max(size // max(shape[0], 1), 1)
        return rng.standard_normal(shape) * np.sqrt(1.0 / max(fan_in, 1))
    if op == "BatchNormalization":
        # scale < 1 and variance > 0. Plain deep stacks (Inception v2 has ~70 BatchNorms) need
        # scale / sqrt(var) near 1 or the input's signal fades; residual nets add branches, so
        # there a gain near 0.65 keeps the logits O(1).
        if index == 1:
            return rng.uniform(0.4, 0.9, shape) if residual else rng.uniform(0.8, 1.0, shape)
        if index == 4:
            return rng.uniform(0.5, 1.5, shape) if residual else rng.uniform(0.6, 1.0, shape)
        return rng.uniform(-0.1, 0.1, shape)
    if op == "Mul":
        return rng.uniform(0.8, 1.0, shape)
    return rng.uniform(-0.1, 0.1, shape)


def random_weight_model(name_or_model: str | onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """A copy of a light-zoo model whose weights are seeded random tensors."""
    src = onnx.load(str(light_model_path(name_or_model))) if isinstance(name_or_model, str) \
        else name_or_model
    model = onnx.ModelProto()
    model.CopyFrom(src)
    graph = model.graph
    rng = np.random.default_rng(seed)
    inits = {t.name: t for t in graph.initializer}
    weights: dict[str, np.ndarray] = {}
    residual = any(n.op_type == "Sum" for n in graph.node)
    keep_nodes = []
    for node in graph.node:
        if node.op_type == "ConstantOfShape" and node.input and node.input[0] in inits:
            shape = tuple(int(d) for d in numpy_helper.to_array(inits[node.input[0]]))
            consumer, index = _consumer(graph, node.output[0])
            weights[node.output[0]] = _random_tensor(rng, shape, consumer, index, residual).astype(np.float32)
            continue
        keep_nodes.append(node)
    for t in list(graph.initializer):  # real float initializers feeding weights get randomized too
        if t.data_type == onnx.TensorProto.FLOAT and t.name not in weights:
            consumer, index = _consumer(graph, t.name)
            if consumer is None:
                continue
            if consumer.op_type in ("Mul", "Add") or (
                    consumer.op_type in ("Conv", "Gemm", "BatchNormalization") and index >= 1):
                shape = tuple(t.dims)
                weights[t.name] = _random_tensor(rng, shape, consumer, index, residual).astype(np.float32)
    used = {i for n in keep_nodes for i in n.input}
    new_inits = [t for t in graph.initializer if t.name not in weights and t.name in used]
    new_inits += [numpy_helper.from_array(a, n) for n, a in weights.items()]
    init_names = {t.name for t in new_inits}
    del graph.node[:]
    graph.node.extend(keep_nodes)
    del graph.initializer[:]
    graph.initializer.extend(new_inits)
    old_inputs = list(graph.input)
    del graph.input[:]
    all_inits = {t.name for t in src.graph.initializer}
    for inp in old_inputs:
        if inp.name in all_inits and inp.name not in init_names:
            continue  # a dropped shape initializer
        if inp.name in weights:
            continue
        graph.input.append(inp)
    if model.ir_version < 4:
        for name, array in weights.items():
            graph.input.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, array.shape))
    return model


def strip_softmax(model: onnx.ModelProto) -> onnx.ModelProto:
    """Cut a final Softmax: its input becomes the graph output (logits are what tests compare)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    last = graph.node[-1]
    if last.op_type != "Softmax" or len(graph.output) != 1 or last.output[0] != graph.output[0].name:
        return out
    logits = last.input[0]
    del graph.node[-1]
    del graph.output[:]
    graph.output.append(helper.make_empty_tensor_value_info(logits))
    inferred = onnx.shape_inference.infer_shapes(out)
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        if vi.name == logits and vi.type.tensor_type.HasField("shape"):
            graph.output[0].CopyFrom(vi)
    return out


def zoo_model(name: str, seed: int = 0) -> onnx.ModelProto:
    """The random-weight, softmax-stripped zoo model ``name``."""
    return strip_softmax(random_weight_model(name, seed))


def dummy_input(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded standard-normal feeds for the model's real inputs."""
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        shape = tuple(d.dim_value for d in inp.type.tensor_type.shape.dim)
        feeds[inp.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds
