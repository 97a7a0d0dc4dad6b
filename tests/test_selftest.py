"""The deploy-machine self-test: golden inputs and reference outputs stored at compile time,
rerun by ``Session.verify()`` / ``onnx-aot verify DIR``; a broken kernel or damaged weights that
still pass the manifest (re-hashed) fail it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler import compile_model
from runtime import Session
from runtime.selftest import SelfTestError
from runtime.selftest import relative_error
from tests.support.damage import rehash
from tests.support.damage import shift_library_weights
from tests.support.models import small_model

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_model(small_model(), tmp_path_factory.mktemp("selftest") / "art")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "compiler", *args], capture_output=True, text=True, cwd=REPO, timeout=300
    )


def test_golden_files_are_small_json_and_raw_bytes_and_hashed(pristine: Path) -> None:
    manifest = json.loads((pristine / "manifest.json").read_text())
    assert {"golden.json", "golden.bin"} <= set(manifest["files"])
    index = json.loads((pristine / "golden.json").read_text())
    assert len(index["cases"]) == 2 and index["seed"] == 0
    case = index["cases"][0]
    assert [r["name"] for r in case["inputs"]] == ["x"] and [r["name"] for r in case["outputs"]] == ["y"]
    assert case["outputs"][0]["tolerance"] > 0
    assert (pristine / "golden.bin").stat().st_size < 4096


def test_verify_passes_and_reports_the_worst_error(pristine: Path) -> None:
    report = Session(pristine).verify()
    assert report.ok and report.cases == 2 and len(report.checks) == 2
    assert report.worst is not None and report.worst.error <= report.worst.tolerance
    assert "OK" in report.summary() and "worst relative error" in report.summary()
    result = _cli("verify", str(pristine))
    assert result.returncode == 0, result.stderr
    assert "OK: 2 golden case(s)" in result.stdout


def test_a_broken_kernel_fails_verify(pristine: Path, tmp_path: Path) -> None:
    # Damage weights.bin (the conv bias) and re-hash it: loading succeeds, the numbers change.
    art = tmp_path / "broken"
    shutil.copytree(pristine, art)
    plan = json.loads((art / "plan.json").read_text())
    const = next(c for c in plan["constants"] if c["shape"] == [8])
    weights = bytearray((art / "weights.bin").read_bytes())
    weights[const["offset"] : const["offset"] + 4] = np.float32(1e3).tobytes()
    (art / "weights.bin").write_bytes(bytes(weights))
    rehash(art, "weights.bin")
    session = Session(art)
    with pytest.raises(SelfTestError) as info:
        session.verify()
    assert "MISMATCH" in str(info.value) and "'y'" in str(info.value)
    assert not info.value.report.ok
    assert not session.verify(raise_on_mismatch=False).ok
    result = _cli("verify", str(art))
    assert result.returncode == 1 and "MISMATCH" in result.stdout


def test_a_patched_library_fails_verify(pristine: Path, tmp_path: Path) -> None:
    # A kernel build that computes something else, compiled into the library and re-hashed (as a
    # broken build pipeline would ship it): only the self-test can notice.
    art = tmp_path / "patched"
    shutil.copytree(pristine, art)
    shift_library_weights(art)
    report = Session(art).verify(raise_on_mismatch=False)
    assert not report.ok, report.summary()


def test_relative_error_metric() -> None:
    ref = np.array([1.0, -2.0, np.nan, np.inf], np.float32)
    assert relative_error(ref.copy(), ref) == 0.0
    assert relative_error(np.array([1.0, -2.002, np.nan, np.inf], np.float32), ref) == pytest.approx(
        1e-3, rel=1e-3
    )
    assert relative_error(np.array([1.0, -2.0, 0.0, np.inf], np.float32), ref) == float("inf")  # NaN lost
    assert relative_error(np.array([1.0, -2.0, np.nan, -np.inf], np.float32), ref) == float("inf")
    assert relative_error(np.array([1, 2]), np.array([1, 3])) == float("inf")
    assert relative_error(np.array([True]), np.array([True])) == 0.0


def _mm_model(n: int) -> object:
    w = numpy_helper.from_array(np.eye(n, dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, n])],
        initializer=[w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_big_outputs_are_sampled_and_disabled_cases_cannot_verify(tmp_path: Path) -> None:
    big = compile_model(_mm_model(600), tmp_path / "big", golden_cases=2)  # 2 x 1.4 MB per case
    index = json.loads((big / "golden.json").read_text())
    assert len(index["cases"]) == 1 and "sample" not in index["cases"][0]["outputs"][0]  # what fits
    huge = compile_model(_mm_model(1100), tmp_path / "huge")  # 4.8 MB per output: sampled
    (record,) = json.loads((huge / "golden.json").read_text())["cases"][0]["outputs"]
    assert record["sample"]["of"] == 1100 * 1100 and record["nbytes"] <= 4 << 20
    assert (huge / "golden.bin").stat().st_size <= 4 << 20
    assert Session(huge).verify().verified
    none = compile_model(_mm_model(8), tmp_path / "none", golden_cases=0)
    report = Session(none).verify()
    assert not report.verified and report.cases == 0 and "disabled" in report.summary()
    result = _cli("verify", str(none))
    assert result.returncode == 1 and "cannot verify" in result.stdout


def test_integer_inputs_stay_valid_indices(tmp_path: Path) -> None:
    table = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4), "table")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["y"], axis=0, name="g")],
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 4])],
        initializer=[table],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    art = compile_model(model, tmp_path / "gather")
    assert Session(art).verify().cases == 2
