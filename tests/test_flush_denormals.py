"""Denormal weights stored as zero (compiler/passes/flush_denormal_weights.py): only where every
consumer multiplies with them, the sign kept, results within IEEE noise of onnxruntime's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler.driver import compile_model
from compiler.passes import FlushDenormalWeights
from compiler.passes import passes_for_level
from runtime.session import Session
from tests.support.graphs import CONV_ATTRS
from tests.support.graphs import Builder
from tests.support.graphs import check

F32 = np.float32
TINY = np.finfo(F32).tiny


def _with_denormals(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Normal weights with every third one a denormal of either sign (as decayed weights are)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(shape).astype(F32) * 0.1
    flat = w.reshape(-1)
    n = flat[::3].size
    flat[::3] = (rng.uniform(0.01, 0.99, n) * TINY * rng.choice([-1, 1], n)).astype(F32)
    return w


def _denormals(array: np.ndarray) -> int:
    return int(np.count_nonzero((array != 0) & (np.abs(array) < TINY)))


def test_conv_and_matmul_weights_are_flushed_keeping_their_sign() -> None:
    b = Builder()
    x = b.input("x", (1, 4, 6, 6))
    w = b.const("w", _with_denormals((8, 4, 3, 3), 1))
    c = b.op("Conv", x, w, out_shape=(1, 8, 6, 6), name="conv", **CONV_ATTRS)
    m = b.const("m", _with_denormals((4, 5), 2))
    g = b.output(c, b.op("MatMul", b.input("a", (3, 4)), m, out_shape=(3, 5), name="mm"))
    signs = np.signbit(w.const)
    assert check(g, FlushDenormalWeights()).modified
    assert _denormals(w.const) == 0 and _denormals(m.const) == 0  # type: ignore[arg-type]
    assert np.array_equal(np.signbit(w.const), signs)  # a flushed weight is -0.0 where it was negative
    assert not FlushDenormalWeights().run(g).modified  # nothing left: the manager's rounds end


def test_a_constant_read_by_another_op_keeps_its_bits() -> None:
    b = Builder()
    a = b.input("a", (4, 4))
    m = b.const("m", _with_denormals((4, 4), 3))
    before = m.const.copy()  # type: ignore[union-attr]
    g = b.output(b.op("MatMul", a, m, name="mm"), b.op("Add", a, m, name="add"))
    assert not FlushDenormalWeights().run(g).modified
    assert np.array_equal(m.const, before)  # type: ignore[arg-type]


def test_level_zero_keeps_denormals_and_level_one_flushes() -> None:
    assert not any(isinstance(p, FlushDenormalWeights) for p in passes_for_level(0))
    assert any(isinstance(p, FlushDenormalWeights) for p in passes_for_level(1))


def _se_block() -> onnx.ModelProto:
    """A squeeze-and-excitation block whose 1x1 convolutions hold denormal weights (PP-OCRv4's)."""
    w1, w2 = _with_denormals((16, 48, 1, 1), 4), _with_denormals((48, 16, 1, 1), 5)
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["g"], name="gap"),
             helper.make_node("Conv", ["g", "w1"], ["c1"], name="squeeze"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="excite"),
             helper.make_node("Sigmoid", ["c2"], ["s"], name="gate"),
             helper.make_node("Mul", ["x", "s"], ["y"], name="scale")]
    graph = helper.make_graph(
        nodes, "se", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 48, 5, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 48, 5, 7])],
        initializer=[numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_compiled_artifact_matches_onnxruntime(tmp_path: Path) -> None:
    model = _se_block()
    path = tmp_path / "se.onnx"
    onnx.save(model, str(path))
    compile_model(str(path), str(tmp_path / "art"))
    x = np.random.default_rng(6).standard_normal((2, 48, 5, 7)).astype(F32)
    (ours,) = Session(tmp_path / "art").run(None, {"x": x})
    (ref,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)
    stored = np.fromfile(tmp_path / "art" / "weights.bin", dtype=F32)
    assert _denormals(stored) == 0
