"""Tiny artifacts the serving tests compile (tests/test_serving.py, tests/test_serving_ray.py):
a batched one (two inputs and an output sharing ``batch`` in 1..8), a static one, and one whose
output sums over the batch (no batch dim to split)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler import compile_model
from tests.support.models import onnx_model
from tests.support.models import small_model

__all__ = ["compile_batched", "compile_static", "compile_unsplittable", "MAX_BATCH"]

MAX_BATCH = 8


def compile_batched(out: Path) -> Path:
    """``y = Relu(x @ W + z)``: x [batch, 4], z [batch, 3], y [batch, 3], batch in 1..8."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "z"], ["a"], name="add"),
             helper.make_node("Relu", ["a"], ["y"], name="relu")]
    inputs = [("x", TensorProto.FLOAT, ["batch", 4]), ("z", TensorProto.FLOAT, ["batch", 3])]
    model = onnx_model(nodes, inputs, [("y", TensorProto.FLOAT, ["batch", 3])], initializers=[w], name="tiny")
    return compile_model(model, out, dims={"batch": (1, MAX_BATCH)})


def compile_static(out: Path) -> Path:
    """tests/support/models.py's small CNN: x [1, 3, 8, 8] -> y [1, 10]."""
    return compile_model(small_model(), out)


def compile_unsplittable(out: Path) -> Path:
    """``total = ReduceSum(x, axis 0)``: x [batch, 4] -> total [1, 4]."""
    node = helper.make_node("ReduceSum", ["x", "axes"], ["total"], keepdims=1, name="sum")
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    model = onnx_model(node, [("x", TensorProto.FLOAT, ["batch", 4])], [("total", TensorProto.FLOAT, [1, 4])],
                       initializers=[axes], name="sum")
    return compile_model(model, out, dims={"batch": (1, MAX_BATCH)})
