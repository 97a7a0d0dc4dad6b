"""ONNX models for tests, and the runners tests compare them with: ``onnx_model`` (the graph-and-model
boilerplate in one call), ``run_backend`` (onnx-aot through the ONNX backend API), ``ort_run``
(onnxruntime, the whole-model oracle) and ``small_model`` (the small CNN many tests compile)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler.bench import for_onnxruntime

__all__ = ["onnx_model", "ort_run", "run_backend", "small_model", "value_info"]

ValueSpec = onnx.ValueInfoProto | tuple[Any, ...]


def value_info(spec: ValueSpec) -> onnx.ValueInfoProto:
    """A graph input/output: a ValueInfoProto as is, or ``(name, elem_type, shape)``."""
    return spec if isinstance(spec, onnx.ValueInfoProto) else helper.make_tensor_value_info(*spec)


def onnx_model(nodes: onnx.NodeProto | Sequence[onnx.NodeProto], inputs: Sequence[ValueSpec],
               outputs: Sequence[ValueSpec], *, opset: int = 17,
               initializers: Sequence[onnx.TensorProto] = (), ir_version: int | None = None,
               name: str = "g") -> onnx.ModelProto:
    """A model of ``nodes`` (one node or a list) in the default domain at ``opset``."""
    node_list = [nodes] if isinstance(nodes, onnx.NodeProto) else list(nodes)
    graph = helper.make_graph(node_list, name, [value_info(i) for i in inputs],
                              [value_info(o) for o in outputs], initializer=list(initializers))
    extra = {} if ir_version is None else {"ir_version": ir_version}
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], **extra)


def run_backend(model: onnx.ModelProto, *feeds: np.ndarray) -> list[Any]:
    """``model`` compiled and run through ``compiler.backend`` on positional ``feeds``."""
    import compiler.backend as backend

    return list(backend.prepare(model).run(list(feeds)))


def ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run ``model`` with onnxruntime's CPU provider (the whole-model oracle)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(for_onnxruntime(model).SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def small_model() -> onnx.ModelProto:
    """Conv + Relu + MaxPool + Flatten + Gemm on a 1x3x8x8 input ``x``, output ``y`` (1x10)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")
    fc = numpy_helper.from_array(rng.standard_normal((10, 8 * 4 * 4)).astype(np.float32), "fc")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc"], ["y"], transB=1, name="fc"),
    ]
    return onnx_model(nodes, [("x", TensorProto.FLOAT, [1, 3, 8, 8])], [("y", TensorProto.FLOAT, [1, 10])],
                      opset=13, initializers=[w, b, fc], ir_version=8, name="small")
