"""The command line: compile | run | bench | inspect | --version, as a user calls it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.support.commands import cli
from tests.support.models import small_model

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli")
    model = root / "small.onnx"
    onnx.save(small_model(), str(model))
    out = root / "art"
    result = cli("compile", str(model), "-o", str(out), "-O", "2", "--target", "cpu")
    assert "compiled" in result.stdout and "planning memory" in result.stderr
    return out


def test_version() -> None:
    assert cli("--version").stdout.startswith("onnx-aot ")


def test_help_lists_commands() -> None:
    out = cli("--help").stdout
    for command in ("compile", "run", "bench", "inspect"):
        assert command in out


def test_run_with_inputs_and_output_dir(artifact: Path, tmp_path: Path) -> None:
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    result = cli("run", str(artifact), "--input", f"x={tmp_path / 'x.npy'}", "--output-dir",
                 str(tmp_path / "outs"))
    assert "y: float32 [1, 10]" in result.stdout
    saved = np.load(tmp_path / "outs" / "y.npy")
    from runtime import Session

    np.testing.assert_array_equal(saved, Session(artifact).run(None, {"x": x})[0])


def test_run_with_random_inputs(artifact: Path) -> None:
    assert "y: float32" in cli("run", str(artifact)).stdout


def test_bench_prints_median(artifact: Path) -> None:
    assert "median" in cli("bench", str(artifact), "--runs", "3", "--threads", "1").stdout


def test_inspect_summary_and_json(artifact: Path) -> None:
    out = cli("inspect", str(artifact)).stdout
    for word in ("steps:", "partition 0: c", "arena host", "lower bound", "input  x"):
        assert word in out
    import json

    report = json.loads(cli("inspect", str(artifact), "--json").stdout)
    assert set(report) == {"arenas", "steps", "weights"}  # weights: image, weights.bin, model file


def test_user_errors_are_one_line_with_exit_1(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_text("not a model")
    result = cli("compile", str(bad), "-o", str(tmp_path / "o"), ok=False)
    assert result.returncode == 1
    assert "bad.onnx" in result.stderr and "Traceback" not in result.stderr
    result = cli("run", str(tmp_path / "nowhere"), ok=False)
    assert result.returncode == 1 and "no such artifact" in result.stderr


def test_symbolic_dim_needs_shape(tmp_path: Path) -> None:
    from onnx import TensorProto
    from onnx import helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "sym",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    path = tmp_path / "sym.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    result = cli("compile", str(path), "-o", str(tmp_path / "o"), ok=False)
    assert result.returncode == 1 and "'x'" in result.stderr and "batch" in result.stderr
    cli("compile", str(path), "-o", str(tmp_path / "o"), "--shape", "x=3x4", "-q")
    assert "y: float32 [3, 4]" in cli("run", str(tmp_path / "o")).stdout


def test_bench_zoo_script_smoke() -> None:
    result = subprocess.run([sys.executable, "-m", "scripts.bench_zoo", "--smoke"],
                            capture_output=True, text=True, cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "squeezenet" in result.stdout and "geomean latency ratio" in result.stdout


def test_bench_openvino_script_smoke() -> None:
    """OpenVINO is a benchmark-only peer: with it, the smoke run prints the table; without it (CI),
    the script says how to get it and exits 2."""
    result = subprocess.run([sys.executable, "-m", "scripts.bench_openvino", "--smoke"],
                            capture_output=True, text=True, cwd=REPO, timeout=600)
    if importlib.util.find_spec("openvino") is None:
        assert result.returncode == 2 and "pip install openvino" in result.stderr, result.stderr
    else:
        assert result.returncode == 0 and "| squeezenet |" in result.stdout, result.stderr
