"""What a new user meets on the command line (issue 23): every mistake ends in one line naming the
culprit (no traceback), checked before any work is done where it can be; the small CLI niceties."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper

from compiler import compile_model
from compiler.cli import build_parser
from compiler.cli import main
from runtime import Session
from tests.support.commands import REPO
from tests.support.commands import cli
from tests.support.models import onnx_model
from tests.support.models import small_model


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(model.onnx, its artifact folder)."""
    root = tmp_path_factory.mktemp("newcomer")
    proto = small_model()
    onnx.save(proto, str(root / "small.onnx"))
    return root / "small.onnx", compile_model(proto, root / "art", golden_cases=0)


def one_line_error(result: subprocess.CompletedProcess[str], *names: str, code: int = 1) -> str:
    """The error line of a failed command: exit ``code``, one line, no traceback, naming ``names``."""
    assert result.returncode == code, (result.returncode, result.stderr)
    err = result.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith("onnx-aot: error: ")
    for name in names:
        assert name in err, (name, err)
    return err


def test_compile_into_a_path_under_a_file(made: tuple[Path, Path], tmp_path: Path) -> None:
    model, _ = made
    afile = tmp_path / "afile"
    afile.write_text("x")
    err = one_line_error(cli("compile", str(model), "-o", str(afile / "sub"), ok=False), str(afile))
    assert "is a file, not a folder" in err


def test_compile_into_a_folder_that_cannot_be_written(made: tuple[Path, Path], tmp_path: Path) -> None:
    model, _ = made
    if Path("/proc/self").is_dir():  # no one can make a folder in /proc, root included
        result = cli("compile", str(model), "-o", "/proc/onnx-aot-art", ok=False)
        one_line_error(result, "cannot write into /proc")
    if os.geteuid() != 0:  # root writes into a read-only folder anyway
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o555)
        try:
            one_line_error(cli("compile", str(model), "-o", str(locked / "art"), ok=False), str(locked))
        finally:
            locked.chmod(0o755)


def test_compile_onto_a_file_is_refused_before_the_pipeline(made: tuple[Path, Path], tmp_path: Path) -> None:
    model, _ = made
    afile = tmp_path / "afile"
    afile.write_text("x")
    result = cli("compile", str(model), "-o", str(afile), ok=False)  # progress is on: none may show
    one_line_error(result, str(afile), "exists and is not a folder")
    assert afile.read_text() == "x"


def test_run_output_dir_on_a_file_is_refused_before_running(made: tuple[Path, Path], tmp_path: Path) -> None:
    _, artifact = made
    afile = tmp_path / "afile"
    afile.write_text("x")
    result = cli("run", str(artifact), "--output-dir", str(afile), ok=False)
    one_line_error(result, "--output-dir", str(afile))
    assert result.stdout == ""  # the model did not run


def test_run_a_model_points_to_compile(made: tuple[Path, Path], tmp_path: Path) -> None:
    model, _ = made
    err = one_line_error(cli("run", str(model), ok=False), str(model))
    assert "is an ONNX model" in err and f"onnx-aot compile {model} -o DIR" in err
    err = one_line_error(cli("inspect", str(tmp_path / "nowhere"), ok=False), "no such artifact folder")
    assert "onnx-aot compile" in err


def test_input_file_that_is_not_a_plain_array(made: tuple[Path, Path], tmp_path: Path) -> None:
    _, artifact = made
    junk = tmp_path / "junk.npy"
    junk.write_text("junk")
    pickled = tmp_path / "objects.npy"
    np.save(pickled, np.array([{}], dtype=object), allow_pickle=True)
    for path in (junk, pickled):
        result = cli("run", str(artifact), "--input", f"x={path}", ok=False)
        err = one_line_error(result, "--input x", str(path))
        assert "not a plain numpy array file" in err and "allow_pickle" not in err


def test_session_run_takes_one_output_name_as_a_str(made: tuple[Path, Path]) -> None:
    _, artifact = made
    session = Session(artifact)
    feeds = {"x": np.ones((1, 3, 8, 8), np.float32)}
    (y,) = session.run("y", feeds)
    np.testing.assert_array_equal(y, session.run(["y"], feeds)[0])


def test_compare_with_a_model_onnxruntime_rejects(made: tuple[Path, Path], tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    model, artifact = made
    proto = onnx.load(str(model))
    proto.ir_version = 99  # onnxruntime refuses an IR version it does not know
    rejected = tmp_path / "rejected.onnx"
    onnx.save(proto, str(rejected))
    result = cli("bench", str(artifact), "--compare", str(rejected), "--cold-reps", "0", ok=False)
    err = one_line_error(result, str(rejected), "onnxruntime cannot load it")
    assert "IR version" in err or "ir_version" in err.lower()


def test_compare_a_model_compiled_with_bind(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    model = onnx_model(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
         helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])])
    path = tmp_path / "reshape.onnx"
    onnx.save(model, str(path))
    cli("compile", str(path), "-o", str(tmp_path / "art"), "--bind", "shape=3,-1", "-q")
    result = cli("bench", str(tmp_path / "art"), "--compare", str(path), "--runs", "2", "--threads", "1",
                 "--cold-reps", "1", "--json")
    r = json.loads(result.stdout)
    assert r["compare"]["bound_inputs"] == ["shape"]
    assert r["accuracy"]["within_tolerance"] and r["accuracy"]["max_abs_err"] == 0
    assert r["cold"]["onnxruntime"]["load_s"] > 0
    text = cli("bench", str(tmp_path / "art"), "--compare", str(path), "--runs", "2",
               "--cold-reps", "0").stdout
    assert "fed onnxruntime the --bind values of shape" in text


def test_run_reports_the_first_run_and_a_warm_median(made: tuple[Path, Path]) -> None:
    _, artifact = made
    out = cli("run", str(artifact), "--runs", "5").stdout
    assert re.search(r"ran in [0-9.]+ ms the first time; warm runs: median [0-9.]+ ms of 4 ", out), out
    assert "(the first run: one-time setup included" in cli("run", str(artifact)).stdout


def test_compile_progress_names_only_providers_with_nodes(made: tuple[Path, Path], tmp_path: Path) -> None:
    model, _ = made
    err = cli("compile", str(model), "-o", str(tmp_path / "art"), "--golden-cases", "0").stderr
    line = next(line for line in err.splitlines() if "partitioning" in line)
    assert re.search(r"partitioning \d+ nodes: \d+ on c$", line), line


def test_inspect_separates_thousands(made: tuple[Path, Path]) -> None:
    _, artifact = made
    out = cli("inspect", str(artifact)).stdout
    weights = Session(artifact).plan.weights_nbytes
    assert weights >= 1000 and f"weights: {weights:,} bytes" in out


def test_bare_command_prints_the_help_and_exits_2() -> None:
    result = cli(ok=False)
    assert result.returncode == 2
    assert "usage: onnx-aot" in result.stderr and "compile" in result.stderr and "inspect" in result.stderr


def test_every_option_has_help() -> None:
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = [f"{name} {action.dest}" for name, sub in subs.choices.items() for action in sub._actions
               if not action.help]
    assert not missing, missing
    for sub in subs.choices.values():
        assert "usage:" in sub.format_help()  # a stray % in a help text would raise here


def test_cuda_target_without_nvcc_says_so(made: tuple[Path, Path], tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    import compiler.codegen.nvcc
    import compiler.providers.cuda.provider

    def no_nvcc(_options: object) -> None:
        return None

    monkeypatch.setattr(compiler.codegen.nvcc, "find_nvcc", no_nvcc)
    monkeypatch.setattr(compiler.providers.cuda.provider, "find_nvcc", no_nvcc)
    model, _ = made
    assert main(["compile", str(model), "-o", str(tmp_path / "art"), "--target", "cuda",
                 "--golden-cases", "0"]) == 0
    assert "nvcc not found" in capsys.readouterr().err and (tmp_path / "art/kernels/cuda/model.cu").is_file()


def test_run_rebuild_names_the_library(made: tuple[Path, Path], tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ONNX_AOT_RUNTIME_CACHE_DIR", str(tmp_path / "cache"))
    _, artifact = made
    assert main(["run", str(artifact), "--rebuild"]) == 0
    err = capsys.readouterr().err
    assert "--rebuild: running the C kernels built for this CPU" in err and str(tmp_path / "cache") in err
    assert main(["bench", str(artifact), "--rebuild", "--runs", "2", "--cold-reps", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rebuilt"].startswith(str(tmp_path / "cache"))


def test_inspect_text_needs_no_jinja2(made: tuple[Path, Path]) -> None:
    """The HTML page needs jinja2; the text summary does not (a deploy-only install lacks it)."""
    _, artifact = made
    blocked = ("import sys; sys.modules['jinja2'] = None; import compiler.cli as c; "
               "sys.exit(c.main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", blocked, "inspect", str(artifact)], text=True, cwd=REPO,
                          capture_output=True, timeout=120)
    assert done.returncode == 0 and "arena host" in done.stdout, done.stderr


def test_output_files_and_compare_model_are_checked_first(made: tuple[Path, Path], tmp_path: Path) -> None:
    model, artifact = made
    afile = tmp_path / "afile"
    afile.write_text("x")
    result = cli("run", str(artifact), "--profile", str(afile / "p.json"), ok=False)
    one_line_error(result, "--profile", f"{afile} is a file, not a folder")
    assert result.stdout == ""  # refused before running
    result = cli("inspect", str(artifact), "--html", str(tmp_path), ok=False)
    one_line_error(result, "--html", "is a folder, not a file")
    result = cli("bench", str(artifact), "--compare", str(tmp_path / "nowhere.onnx"), ok=False)
    one_line_error(result, "nowhere.onnx", "no such model file")
