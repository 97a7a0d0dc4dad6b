"""compiler.backend: the ONNX backend API, compile-time inputs, --bind, and a broken C kernel."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

import compiler.backend as backend
from compiler.backend import OnnxAotBackend
from compiler.backend import compile_time_inputs
from compiler.driver import compile_model
from runtime import Session
from runtime.errors import InputError
from runtime.errors import ShapeError
from runtime.errors import UnsupportedOpError
from scripts import conformance
from tests.support.fetched import fetched_model
from tests.support.models import onnx_model

ROOT = Path(__file__).resolve().parent.parent


def _reshape_model() -> onnx.ModelProto:
    return onnx_model(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        [helper.make_tensor_value_info("x", T.FLOAT, [2, 6]),
         helper.make_tensor_value_info("shape", T.INT64, [2])],
        [helper.make_tensor_value_info("y", T.FLOAT, ["a", "b"])])


def test_prepare_and_run_a_static_model() -> None:
    model = onnx_model([helper.make_node("Relu", ["x"], ["y"])],
                   [helper.make_tensor_value_info("x", T.FLOAT, [3, 4])],
                   [helper.make_tensor_value_info("y", T.FLOAT, [3, 4])])
    rep = backend.prepare(model, "CPU")
    assert not rep.deferred
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    out = rep.run([x])
    np.testing.assert_array_equal(out[0], np.maximum(x, 0))
    np.testing.assert_array_equal(out["y"], np.maximum(x, 0))
    np.testing.assert_array_equal(rep.run({"x": x})[0], np.maximum(x, 0))
    with pytest.raises(InputError, match="missing input"):
        rep.run({})


def test_shape_inputs_are_specialized_per_value() -> None:
    rep = backend.prepare(_reshape_model())
    assert rep.bound_inputs == ["shape"] and rep.deferred
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    a = rep.run([x, np.array([3, 4])])[0]
    b = rep.run([x, np.array([3, 4])])[0]
    c = rep.run([x, np.array([4, -1])])[0]
    assert a.shape == b.shape == (3, 4) and c.shape == (4, 3)
    np.testing.assert_array_equal(c, x.reshape(4, 3))
    assert len(rep._sessions) == 2  # one artifact per distinct value, reused for equal values
    session = rep.session_for({"x": x, "shape": np.array([3, 4])})
    assert [s.name for s in session.inputs] == ["x"]  # the data input stays an input


def _dense_model(x_dims: list, w_rows: int = 8) -> onnx.ModelProto:
    w = np.random.default_rng(0).standard_normal((w_rows, 4)).astype(np.float32)
    return onnx_model([helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
                      [helper.make_tensor_value_info("x", T.FLOAT, x_dims)],
                      [helper.make_tensor_value_info("z", T.FLOAT, ["batch", 4])],
                      initializers=[helper.make_tensor("w", T.FLOAT, w.shape, w.reshape(-1))])


def test_unknown_dims_compile_one_dynamic_artifact_at_prepare() -> None:
    """A dim_param, an unnamed dim and a -1 each become the range DIM_RANGE (or dim_range=): one
    artifact, compiled at prepare, runs every shape in range; a shape out of range gets a static
    artifact of its own at its first run."""
    model = _dense_model(["batch", 8])
    rep = backend.prepare(model, dim_range=(1, 64))
    assert not rep.deferred and rep.ranges == {"x": ((1, 64), 8)} and rep.dynamic_error is None
    session = rep.session_for({"x": np.zeros((3, 8), np.float32)})
    assert session.inputs[0].shape == (None, 8)  # dynamic: the batch dim is a range
    w = onnx.numpy_helper.to_array(model.graph.initializer[0])
    for batch in (1, 5, 64, 65):
        x = np.random.default_rng(batch).standard_normal((batch, 8)).astype(np.float32)
        np.testing.assert_allclose(rep.run([x])[0], np.maximum(x @ w, 0), rtol=1e-5, atol=1e-5)
        assert len(rep._sessions) == (1 if batch <= 64 else 2)
    assert backend.ranged_shapes(_dense_model([None, -1]).graph, backend.DIM_RANGE) == {
        "x": (backend.DIM_RANGE, backend.DIM_RANGE)}
    no_rank = _dense_model([1, 8])
    no_rank.graph.input[0].type.tensor_type.ClearField("shape")
    assert backend.ranged_shapes(no_rank.graph, backend.DIM_RANGE) is None


def test_a_wide_default_range_self_tests_where_the_values_fit() -> None:
    """Every dim of an image input unknown: the middle binding (512 x 3 x 512 x 512) passes the
    golden reference run's cap, so the self-test runs at the min binding only, and still runs."""
    k = np.random.default_rng(0).standard_normal((16, 3, 3, 3)).astype(np.float32)
    model = onnx_model([helper.make_node("Conv", ["x", "k"], ["y"], pads=[1, 1, 1, 1])],
                       [helper.make_tensor_value_info("x", T.FLOAT, ["n", 3, "h", "w"])],
                       [helper.make_tensor_value_info("y", T.FLOAT, ["n", 16, "h", "w"])],
                       initializers=[helper.make_tensor("k", T.FLOAT, k.shape, k.reshape(-1))])
    rep = backend.prepare(model)
    session = rep.session_for({"x": np.zeros((1, 3, 4, 4), np.float32)})
    golden = json.loads((session.path / "golden.json").read_text())
    assert golden["cases"] and {tuple(c["inputs"][0]["shape"]) for c in golden["cases"]} == {(1, 3, 1, 1)}
    session.verify()
    x = np.random.default_rng(1).standard_normal((2, 3, 17, 33)).astype(np.float32)
    assert rep.run([x])[0].shape == (2, 16, 17, 33) and len(rep._sessions) == 1


def test_a_real_model_with_unknown_dims_serves_every_shape_from_one_artifact() -> None:
    """PP-OCRv4 rec (batch, height and width unknown): one dynamic artifact at prepare, matching
    onnxruntime at several (batch, height, width); a height the model cannot take (its reshape
    needs the pooled height to be 1) is an InputError naming the node, at run time."""
    ort = pytest.importorskip("onnxruntime")
    path = fetched_model("ppocrv4-rec")
    rep = backend.prepare(onnx.load(path))
    assert not rep.deferred and rep.dynamic_error is None
    reference = ort.InferenceSession(str(path))
    for shape in ((1, 3, 48, 320), (2, 3, 48, 100), (1, 3, 64, 200)):
        x = np.random.default_rng(sum(shape)).random(shape).astype(np.float32)
        np.testing.assert_allclose(rep.run([x])[0], reference.run(None, {"x": x})[0], rtol=1e-3, atol=1e-4)
    assert len(rep._sessions) == 1
    with pytest.raises(InputError, match=r"node 'p2o.Reshape.79' needs .* the model cannot take this shape"):
        rep.run([np.zeros((1, 3, 96, 320), np.float32)])


def test_a_refused_dynamic_compile_falls_back_to_one_artifact_per_shape() -> None:
    """A model the dynamic compile refuses (here a ceil-mode average pool whose padding counts and
    whose last window may start in the end pad, over run-time dims) still runs: per distinct shape,
    with the reason kept."""
    ort = pytest.importorskip("onnxruntime")
    model = onnx_model([helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2],
                                         pads=[1, 1, 1, 1], ceil_mode=1, count_include_pad=1)],
                       [helper.make_tensor_value_info("x", T.FLOAT, [1, 1, "h", "w"])],
                       [helper.make_tensor_value_info("y", T.FLOAT, [1, 1, "oh", "ow"])])
    rep = backend.prepare(model)
    assert rep.deferred and rep.ranges is None
    assert rep.dynamic_error is not None and "AveragePool" in rep.dynamic_error
    reference = ort.InferenceSession(model.SerializeToString())
    for h, w in ((5, 8), (4, 4), (5, 8)):
        x = np.random.default_rng(h * w).standard_normal((1, 1, h, w)).astype(np.float32)
        np.testing.assert_allclose(rep.run([x])[0], reference.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    assert len(rep._sessions) == 2


def test_a_branch_that_cannot_take_the_shapes_binds_the_condition_inputs() -> None:
    """Silero VAD's form: an If on the sample rate picks a sub-model, and the other one cannot take
    the input's size. Compiling both branches fails, so the backend binds the inputs the condition
    reads (condition_inputs) and inlines the branch taken; the other rate's run is an error naming
    its node."""
    def branch(name: str, rows: int) -> onnx.GraphProto:
        # the target shape comes through a ReduceMax, which onnx's shape inference does not evaluate
        parts = [helper.make_tensor(f"{name}_0", T.INT64, [2], [rows, 1]),
                 helper.make_tensor(f"{name}_1", T.INT64, [1], [-1])]
        nodes = [helper.make_node("ReduceMax", [parts[0].name], [f"{name}_r"], keepdims=1),
                 helper.make_node("Concat", [f"{name}_r", parts[1].name], [f"{name}_s"], axis=0),
                 helper.make_node("Reshape", ["x", f"{name}_s"], [f"{name}_y"], name=name)]
        return helper.make_graph(nodes,
                                 name, [], [helper.make_tensor_value_info(f"{name}_y", T.FLOAT, ["a", "b"])],
                                 parts)

    model = onnx_model([helper.make_node("Equal", ["sr", "k16"], ["is16"]),
                        helper.make_node("If", ["is16"], ["y"], then_branch=branch("wide", 2),
                                         else_branch=branch("narrow", 3))],
                       [helper.make_tensor_value_info("x", T.FLOAT, [1, 8]),
                        helper.make_tensor_value_info("sr", T.INT64, [])],
                       [helper.make_tensor_value_info("y", T.FLOAT, ["a", "b"])],
                       initializers=[helper.make_tensor("k16", T.INT64, [], [16000])])
    assert backend.condition_inputs(model.graph) == ["sr"]
    rep = backend.prepare(model)  # its compile failed in the 'narrow' branch: sr is bound instead
    assert rep.deferred and rep.bound_inputs == ["sr"]
    x = np.arange(8, dtype=np.float32).reshape(1, 8)
    np.testing.assert_array_equal(rep.run([x, np.array(16000)])[0], x.reshape(2, 4))
    with pytest.raises(ShapeError, match="narrow"):
        rep.run([x, np.array(8000)])


def test_silero_vad_runs_as_shipped_without_binding_its_sample_rate() -> None:
    """Silero VAD v6: its If on sr holds the 8 kHz and the 16 kHz models, and the 8 kHz one cannot
    take a 16 kHz window; the backend binds sr at the first run and matches onnxruntime."""
    ort = pytest.importorskip("onnxruntime")
    path = fetched_model("silero-vad")
    rep = backend.prepare(onnx.load(path))
    reference = ort.InferenceSession(str(path))
    rng = np.random.default_rng(0)
    feeds = {"input": rng.standard_normal((1, 576)).astype(np.float32) * 0.1,
             "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(16000, np.int64)}
    for got, want in zip(rep.run(feeds), reference.run(None, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
    assert "sr" in rep.bound_inputs


def test_compile_time_inputs_follow_values_not_shapes() -> None:
    graph = helper.make_graph(
        [helper.make_node("Cast", ["k_in"], ["k"], to=T.INT64),
         helper.make_node("Shape", ["x"], ["s"]),
         helper.make_node("TopK", ["x", "k"], ["v", "i"]),
         helper.make_node("Reshape", ["x", "s"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", T.FLOAT, [2, 6]),
         helper.make_tensor_value_info("k_in", T.INT32, [1])],
        [helper.make_tensor_value_info(n, T.FLOAT, ["a", "b"]) for n in ("v", "y")])
    # k reaches TopK through a Cast; Reshape's shape comes from Shape(x), which reads no values
    assert compile_time_inputs(graph) == ["k_in"]


def test_run_node_and_devices() -> None:
    node = helper.make_node("Add", ["a", "b"], ["c"])
    a = np.ones((2, 3), np.float32)
    b = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(backend.run_node(node, [a, b])[0], a + b)
    assert backend.supports_device("CPU")
    assert OnnxAotBackend.supports_device("CUDA") == backend._cuda_available()
    assert not backend.supports_device("TPU")


def test_unsupported_ops_fail_at_prepare() -> None:
    model = onnx_model([helper.make_node("StringNormalizer", ["x"], ["y"])],
                   [helper.make_tensor_value_info("x", T.STRING, [2])],
                   [helper.make_tensor_value_info("y", T.STRING, [2])])
    with pytest.raises(UnsupportedOpError, match="StringNormalizer"):
        backend.prepare(model)


def test_bind_from_python_and_cli(tmp_path: Path) -> None:
    model = _reshape_model()
    out = compile_model(model, tmp_path / "a", binds={"shape": [3, -1]})
    session = Session(out)
    assert [s.name for s in session.inputs] == ["x"]
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], x.reshape(3, 4))
    assert json.loads((out / "plan.json").read_text())["inputs"][0]["name"] == "x"
    with pytest.raises(ShapeError, match="3 value"):
        compile_model(model, tmp_path / "b", binds={"shape": [1, 2, 3]})
    with pytest.raises(ShapeError, match="names no graph input: nope"):
        compile_model(model, tmp_path / "b", binds={"nope": [1]})
    assert not (tmp_path / "b").exists()

    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    cli = [sys.executable, "-m", "compiler", "compile", str(path), "-o", str(tmp_path / "c"), "-q"]
    done = subprocess.run(cli + ["--bind", "shape=4,3"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert Session(tmp_path / "c").outputs[0].shape == (4, 3)
    bad = subprocess.run(cli + ["--bind", "shape=a,b"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode != 0 and "values must be numbers" in bad.stderr


def test_a_broken_c_kernel_fails_its_node_cases(monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite exercises generated C: make C's Add subtract and the Add cases fail (the compile's
    check of the artifact on its golden cases catches it before the case's own comparison)."""
    cases = ["test_add_cpu", "test_add_bcast_cpu"]
    assert [conformance.run_case(c)[0] for c in cases] == ["pass", "pass"]
    from compiler.codegen import elementwise

    monkeypatch.setitem(elementwise._BINARY, "Add", lambda a, b: f"({a} - {b})")
    results = [conformance.run_case(c) for c in cases]
    caught = "disagrees with the reference kernels"
    assert all(status == "FAIL" and caught in detail for status, detail in results), results
