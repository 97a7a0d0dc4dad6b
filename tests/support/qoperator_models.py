"""Small graphs of onnxruntime's ``com.microsoft`` quantized ops, in the form its quantizer writes
them (QOperator format: every scale and zero point an initializer scalar), and the three runs
tests compare: onnxruntime's, onnx-aot's compiled artifact and its reference kernels."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx import numpy_helper

__all__ = ["QBuilder", "ort_outputs", "ours_outputs", "reference_outputs", "steps_off"]

MS = "com.microsoft"


class QBuilder:
    """Collects nodes, graph inputs / outputs and scalar quantization parameters."""

    def __init__(self, dtype: Any, seed: int = 0) -> None:
        self.dtype = np.dtype(dtype)
        self.elem = helper.np_dtype_to_tensor_dtype(self.dtype)
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.feeds: dict[str, np.ndarray] = {}

    def data(self, name: str, shape: Sequence[int], dtype: Any = None) -> str:
        """A graph input of random codes (``dtype``: default the builder's 8-bit type)."""
        dt = np.dtype(dtype) if dtype is not None else self.dtype
        if dt == np.bool_:
            self.feeds[name] = self.rng.random(shape) < 0.5
        elif dt.kind == "f":
            self.feeds[name] = self.rng.uniform(0.01, 0.1, shape).astype(dt)
        else:
            info = np.iinfo(dt)
            self.feeds[name] = self.rng.integers(info.min, info.max + 1, shape).astype(dt)
        elem = helper.np_dtype_to_tensor_dtype(dt)
        self.inputs.append(helper.make_tensor_value_info(name, elem, list(shape)))
        return name

    def params(self, name: str, scale: float | None = None, zero: int | None = None) -> list[str]:
        """A float32 scale and a zero point (random where not given) as initializer scalars."""
        info = np.iinfo(self.dtype)
        if scale is None:
            scale = float(self.rng.uniform(0.002, 0.08))
        if zero is None:
            zero = int(self.rng.integers(info.min // 2, info.max // 2 + 1)) if info.min < 0 else \
                int(self.rng.integers(60, 200))
        self.inits += [numpy_helper.from_array(np.array(scale, np.float32), f"{name}_scale"),
                       numpy_helper.from_array(np.array(zero, self.dtype), f"{name}_zero")]
        return [f"{name}_scale", f"{name}_zero"]

    def node(self, op: str, inputs: list[str], output: str, **attrs: Any) -> str:
        self.nodes.append(helper.make_node(op, inputs, [output], name=output, domain=MS, **attrs))
        self.outputs.append(helper.make_tensor_value_info(output, self.elem, None))
        return output

    def model(self, results: Sequence[np.ndarray] | None = None) -> onnx.ModelProto:
        """The model; ``results`` (onnxruntime's outputs) give the graph outputs their shapes."""
        outputs = self.outputs
        if results is not None:
            outputs = [helper.make_tensor_value_info(o.name, self.elem, list(r.shape))
                       for o, r in zip(self.outputs, results, strict=True)]
        graph = helper.make_graph(self.nodes, "q", self.inputs, outputs, initializer=self.inits)
        opsets = [helper.make_opsetid("", 13), helper.make_opsetid(MS, 1)]
        return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def ort_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def ours_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray], out: Path,
                 threads: Sequence[int] = (1,), cpu: str | None = None) -> list[list[np.ndarray]]:
    """The compiled artifact's outputs (C kernels for ``cpu``: default this host's level), one
    list per thread count in ``threads``."""
    from compiler import compile_model
    from runtime import Session

    art = compile_model(model, out, cpu=cpu)
    return [Session(art, threads=n).run(None, feeds) for n in threads]


def reference_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The imported graph run on the reference kernels."""
    from compiler.frontend.importer import import_model
    from tests.support.graphs import run_graph

    return list(run_graph(import_model(model), feeds).values())


def steps_off(a: np.ndarray, b: np.ndarray) -> tuple[int, int]:
    """(largest difference in quantization steps, how many elements differ)."""
    d = np.abs(a.astype(np.int64) - b.astype(np.int64))
    return int(d.max(initial=0)), int(np.count_nonzero(d))
