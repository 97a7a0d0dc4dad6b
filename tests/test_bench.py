"""``onnx-aot bench``: --compare against onnxruntime, cold start, overhead, --json; the runtime's fast
data-address read that keeps its per-run overhead small."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler import compile_model
from compiler.bench import BenchError
from compiler.bench import error_stats
from compiler.bench import for_onnxruntime
from compiler.bench import initializers_as_inputs
from compiler.bench import measure_overhead
from runtime import Session
from runtime.address import _ctypes_address
from runtime.address import data_address
from tests.support.commands import cli

REPO = Path(__file__).resolve().parent.parent


def relu_add_model(ir_version: int = 8) -> onnx.ModelProto:
    """Relu(x) + w; with ``ir_version`` 3 the initializer w is also listed as a graph input."""
    w = numpy_helper.from_array(np.linspace(-1, 1, 16, dtype=np.float32).reshape(1, 16), "w")
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])]
    if ir_version < 4:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [1, 16]))
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "w"], ["y"])], "relu_add",
        inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])], initializer=[w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 8 if ir_version < 4 else 13)],
                             ir_version=ir_version)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("bench")
    model = root / "tiny.onnx"
    onnx.save(relu_add_model(), str(model))
    return model, compile_model(str(model), root / "art", golden_cases=0)


def test_data_address_matches_ctypes() -> None:
    base = np.arange(60, dtype=np.float32)
    arrays = [base, base[7:], base.reshape(6, 10)[2:, 3:], base.reshape(6, 10).T, np.empty((0, 3)),
              np.ones(5, np.int8), np.ma.masked_array(base), np.array(3.0)]
    for array in arrays:
        assert data_address(array) == _ctypes_address(array)


def test_bench_compare_json_on_a_tiny_model(tiny: tuple[Path, Path]) -> None:
    pytest.importorskip("onnxruntime")
    model, artifact = tiny
    result = cli("bench", str(artifact), "--compare", str(model), "--runs", "5", "--threads", "1",
                 "--cold-reps", "1", "--overhead", "--json")
    assert result.returncode == 0, result.stderr
    r = json.loads(result.stdout)
    assert r["threads"] == 1 and r["runs"] == 5
    assert r["latency"]["ratio"] > 0 and r["latency"]["onnxruntime_s"] > 0
    assert r["accuracy"]["within_tolerance"] and r["accuracy"]["max_abs_err"] < 1e-6
    cold = r["cold"]
    assert cold["reps"] == 1 and cold["load_ratio"] > 0 and cold["load_first_ratio"] > 0
    assert cold["onnx-aot"]["peak_rss"] >= cold["onnx-aot"]["base_rss"] > 0
    assert cold["onnxruntime"]["peak_rss"] > 0
    ov = r["overhead"]
    assert 0 < ov["kernels_s"] < ov["run_s"] and 0 < ov["overhead_fraction"] <= 1
    assert r["compare"]["initializer_inputs_removed"] == 0


def test_bench_text_without_compare(tiny: tuple[Path, Path]) -> None:
    _, artifact = tiny
    result = cli("bench", str(artifact), "--runs", "3", "--cold-reps", "0")
    assert result.returncode == 0, result.stderr
    assert "median onnx-aot" in result.stdout and "onnxruntime" not in result.stdout


def test_compare_without_onnxruntime_is_a_clear_error(tiny: tuple[Path, Path]) -> None:
    model, artifact = tiny
    code = ("import sys; sys.modules['onnxruntime'] = None; from compiler.cli import main; "
            f"sys.exit(main(['bench', {str(artifact)!r}, '--compare', {str(model)!r}]))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                            timeout=120)
    assert result.returncode == 1
    assert "--compare needs onnxruntime" in result.stderr and "pip install onnxruntime" in result.stderr


def test_ir3_model_is_normalized_for_onnxruntime(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    model = relu_add_model(ir_version=3)
    assert initializers_as_inputs(model) == ["w"]
    fixed = for_onnxruntime(model)
    assert initializers_as_inputs(fixed) == [] and fixed.ir_version == 4
    path = tmp_path / "ir3.onnx"
    onnx.save(model, str(path))
    artifact = compile_model(str(path), tmp_path / "art", golden_cases=0)
    result = cli("bench", str(artifact), "--compare", str(path), "--runs", "2", "--cold-reps", "0")
    assert result.returncode == 0, result.stderr
    assert "1 initializers listed as graph inputs were removed for onnxruntime" in result.stdout
    assert "within rtol" in result.stdout


def test_compare_with_another_model_names_the_mismatch(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    _, artifact = tiny
    graph = helper.make_graph([helper.make_node("Relu", ["z"], ["y"])], "other",
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])])
    other = tmp_path / "other.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(other))
    result = cli("bench", str(artifact), "--compare", str(other), "--cold-reps", "0", ok=False)
    assert result.returncode == 1 and "'z'" in result.stderr and "'x'" in result.stderr


def test_overhead_probe_leaves_the_session_as_it_was(tiny: tuple[Path, Path]) -> None:
    _, artifact = tiny
    session = Session(artifact, threads=1)
    feeds = {"x": np.ones((1, 16), np.float32)}
    before = session.run(None, feeds)[0]
    ov = measure_overhead(session, feeds, runs=20)
    assert ov["runs"] == 20 and ov["overhead_s"] > 0
    for _, part in session._partitions:
        assert "entry" not in vars(part) or not hasattr(part.entry, "__self__")
    np.testing.assert_array_equal(session.run(None, feeds)[0], before)


def test_error_stats() -> None:
    a, b = np.array([1.0, 2.0]), np.array([1.0, 2.001])
    stats = error_stats([a], [b])
    assert stats["within_tolerance"] and stats["max_abs_err"] == pytest.approx(0.001)
    assert not error_stats([a], [b * 1.01])["within_tolerance"]
    with pytest.raises(BenchError, match="shapes differ"):
        error_stats([a], [b[:1]])


def _embedding_model(vocab: int = 1000) -> onnx.ModelProto:
    """Token ids -> rows of a (vocab, 8) table: random ids in [0, 10) work, but real ids index
    far into the table and the ones past it make onnxruntime refuse the feed."""
    table = numpy_helper.from_array(np.arange(vocab * 8, dtype=np.float32).reshape(vocab, 8), "table")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["y"])], "embedding",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 8])], initializer=[table])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_bench_feeds_given_inputs_to_both_engines(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    model = tmp_path / "embedding.onnx"
    onnx.save(_embedding_model(), str(model))
    artifact = compile_model(str(model), tmp_path / "art", golden_cases=0)
    ids = tmp_path / "ids.npy"
    np.save(ids, np.array([[101, 999, 7, 512, 0, 300]], np.int64))
    result = cli("bench", str(artifact), "--compare", str(model), "--input", f"ids={ids}", "--runs", "3",
                 "--cold-reps", "0", "--json")
    assert result.returncode == 0, result.stderr
    r = json.loads(result.stdout)
    assert r["given_inputs"] == ["ids"] and r["accuracy"]["within_tolerance"]
    assert r["accuracy"]["max_abs_err"] == 0.0
    # ids past the table: onnxruntime refuses them, and bench says so in one line
    np.save(ids, np.array([[101, 1000, 7, 512, 0, 300]], np.int64))
    bad = cli("bench", str(artifact), "--compare", str(model), "--input", f"ids={ids}", "--runs", "1",
              "--cold-reps", "0", ok=False)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert "onnx-aot: error:" in bad.stderr, bad.stderr
    wrong = cli("bench", str(artifact), "--input", f"tokens={ids}", "--runs", "1", "--cold-reps", "0",
                ok=False)
    assert wrong.returncode == 1 and "--input names 'tokens', which is not an input (ids)" in wrong.stderr
