"""A runtime that cannot be crashed and a compiler that never leaves a half-written artifact:
killed compiles, concurrent runs, bad feeds, arena limits, external data, nothing executed from
data."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from functools import partial
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler import compile_model
from compiler.limits import ArenaLimitError
from runtime import Session
from runtime.errors import ArtifactError
from runtime.errors import CompileError
from runtime.errors import InputError
from runtime.errors import OnnxAotError
from runtime.errors import ShapeError
from tests.support.models import onnx_model
from tests.support.models import ort_run
from tests.support.models import small_model

_model = partial(onnx_model, ir_version=8, name="m")

REPO = Path(__file__).resolve().parent.parent


def conv_gemm_model(batch: int = 2) -> onnx.ModelProto:
    """Conv + bias + Relu + Conv + pool + Gemm: C kernels (im2col scratch in the arena) all along."""
    rng = np.random.default_rng(7)
    inits = [
        numpy_helper.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), n)
        for n, s in [
            ("w1", (16, 3, 3, 3)),
            ("b1", (16,)),
            ("w2", (16, 16, 3, 3)),
            ("fc", (10, 16 * 4 * 4)),
            ("fb", (10,)),
        ]
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Add", ["c2", "r1"], ["s"], name="residual"),
        helper.make_node("MaxPool", ["s"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc", "fb"], ["y"], transB=1, name="fc"),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])],
        initializers=inits,
    )


# -- threads ---------------------------------------------------------------------------------------
def test_eight_threads_by_fifty_runs_are_bit_identical(tmp_path: Path) -> None:
    session = Session(compile_model(conv_gemm_model(), tmp_path / "art"), threads=1)
    assert {p.provider for p in session.plan.partitions} == {"c"}
    assert session.plan.arenas[0].nbytes > 0
    threads, runs = 8, 50
    rng = np.random.default_rng(0)
    feeds = [
        [rng.standard_normal((2, 3, 8, 8)).astype(np.float32) for _ in range(runs)] for _ in range(threads)
    ]
    expected = [[session.run(None, {"x": x})[0] for x in per_thread] for per_thread in feeds]
    results: list[list[np.ndarray | None]] = [[None] * runs for _ in range(threads)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads)

    def work(t: int) -> None:
        try:
            barrier.wait()
            for r in range(runs):
                results[t][r] = session.run(None, {"x": feeds[t][r]})[0]
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    assert not errors, errors
    mismatches = sum(
        not np.array_equal(results[t][r], expected[t][r], equal_nan=True)
        for t in range(threads)
        for r in range(runs)
    )
    assert mismatches == 0, f"{mismatches} of {threads * runs} concurrent runs differ"
    np.testing.assert_allclose(
        expected[0][0], ort_run(conv_gemm_model(), {"x": feeds[0][0]})[0], rtol=1e-4, atol=1e-4
    )


# -- bad feeds -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Session:
    return Session(compile_model(small_model(), tmp_path_factory.mktemp("feeds") / "art"))


@pytest.mark.parametrize(
    "feeds, match",
    [
        ({}, "missing input 'x'"),
        ({"x": np.zeros((1, 3, 8, 8), np.float32), "z": np.zeros(1, np.float32)}, "unknown input"),
        ({"x": np.zeros((1, 3, 8, 8), np.float16)}, "dtype float16"),
        ({"x": np.zeros((1, 3, 8, 8), np.int32)}, "dtype int32"),
        ({"x": np.zeros((1, 3, 8, 7), np.float32)}, "shape"),
        ({"x": np.zeros((0, 3, 8, 8), np.float32)}, "shape"),  # empty where the plan is not
        ({"x": np.float32(1.0)}, "shape"),  # 0-d where the plan is 4-d
        ({"x": "not an array"}, "dtype"),
        ([np.zeros((1, 3, 8, 8), np.float32)], "feeds must be a dict"),
    ],
)
def test_bad_feeds_are_input_errors(small: Session, feeds: object, match: str) -> None:
    with pytest.raises(InputError, match=match):
        small.run(None, feeds)  # type: ignore[arg-type]


def test_nan_and_inf_are_computed_through(small: Session) -> None:
    x = np.random.default_rng(3).standard_normal((1, 3, 8, 8)).astype(np.float32)
    x[0, 0, 0, 0] = np.nan
    x[0, 1, 4, 4] = np.inf
    x[0, 2, 7, 7] = -np.inf
    (y,) = small.run(None, {"x": x})
    (ref,) = ort_run(small_model(), {"x": x})
    assert np.array_equal(np.isnan(y), np.isnan(ref)) and np.isnan(y).any()
    finite = np.isfinite(ref)
    np.testing.assert_allclose(y[finite], ref[finite], rtol=1e-4, atol=1e-5)


def test_zero_d_and_empty_feeds(tmp_path: Path) -> None:
    # 0-d inputs (a scalar scale) and inputs with a zero-length dimension run and match onnxruntime.
    model = _model(
        [
            helper.make_node("Mul", ["x", "scale"], ["m"], name="mul"),
            helper.make_node("Relu", ["m"], ["y"], name="relu"),
            helper.make_node("Add", ["e", "e"], ["z"], name="add_empty"),
        ],
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("scale", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("e", TensorProto.FLOAT, [0, 4]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, [0, 4]),
        ],
    )
    session = Session(compile_model(model, tmp_path / "art"))
    assert session.inputs[1].shape == () and session.inputs[2].shape == (0, 4)
    x = np.array([[1, -2, 3], [-4, 5, -6]], np.float32)
    feeds = {"x": x, "scale": np.array(2.0, np.float32), "e": np.zeros((0, 4), np.float32)}
    y, z = session.run(None, feeds)
    np.testing.assert_array_equal(y, np.maximum(x * 2, 0))
    assert z.shape == (0, 4) and z.dtype == np.float32
    with pytest.raises(InputError, match="'scale'"):
        session.run(None, {**feeds, "scale": np.array([2.0], np.float32)})  # 1-d for a 0-d input
    for got, ref in zip(session.run(None, feeds), ort_run(model, feeds), strict=True):
        np.testing.assert_array_equal(got, ref)
    assert session.verify().ok


def test_strided_read_only_and_misaligned_feeds_give_identical_results(small: Session) -> None:
    x = np.random.default_rng(4).standard_normal((1, 3, 8, 8)).astype(np.float32)
    expected = small.run(None, {"x": x})[0]
    wide = np.zeros((1, 3, 8, 16), np.float32)
    wide[..., ::2] = x
    frozen = x.copy()
    frozen.flags.writeable = False
    raw = np.zeros(x.nbytes + 1, np.uint8)
    misaligned = raw[1:].view(np.float32).reshape(x.shape)
    misaligned[...] = x
    for feed in (wide[..., ::2], frozen, np.asfortranarray(x), misaligned, x[::-1, ::-1][::-1, ::-1]):
        np.testing.assert_array_equal(small.run(None, {"x": feed})[0], expected)
    np.testing.assert_array_equal(frozen, x)  # feeds are never written


# -- limits ----------------------------------------------------------------------------------------
def test_max_arena_bytes_fails_at_compile_time_with_the_need(tmp_path: Path) -> None:
    art = compile_model(conv_gemm_model(), tmp_path / "ok")
    need = Session(art).plan.arenas[0].nbytes
    compile_model(conv_gemm_model(), tmp_path / "exact", max_arena_bytes=need)
    with pytest.raises(ArenaLimitError) as info:
        compile_model(conv_gemm_model(), tmp_path / "tight", max_arena_bytes=need - 1)
    assert f"host arena {need:,} bytes" in str(info.value) and isinstance(info.value, CompileError)
    assert info.value.needed == {"host": need}
    assert not (tmp_path / "tight").exists()
    bad_model = tmp_path / "m.onnx"
    onnx.save(conv_gemm_model(), bad_model)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "compiler",
            "compile",
            str(bad_model),
            "-o",
            str(tmp_path / "cli"),
            "--max-arena-bytes",
            "1000",
            "-q",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert result.returncode == 1 and f"{need:,}" in result.stderr and "--max-arena-bytes" in result.stderr


def test_huge_tensors_are_a_shape_error(tmp_path: Path) -> None:
    model = _model(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1 << 20, 1 << 20])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1 << 20, 1 << 20])],
    )
    with pytest.raises(ShapeError, match="'x'.*over the"):
        compile_model(model, tmp_path / "art")


# -- external data ---------------------------------------------------------------------------------
def test_external_data_compile_load_run(tmp_path: Path) -> None:
    model = conv_gemm_model()
    folder = tmp_path / "model"
    folder.mkdir()
    onnx.save_model(
        model,
        folder / "model.onnx",
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="model.weights",
        size_threshold=0,
    )
    assert (folder / "model.weights").stat().st_size > 10_000
    assert onnx.load(folder / "model.onnx", load_external_data=False).graph.initializer[0].data_location == 1
    session = Session(compile_model(folder / "model.onnx", tmp_path / "art"))
    x = np.random.default_rng(5).standard_normal((2, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(
        session.run(None, {"x": x})[0], ort_run(conv_gemm_model(), {"x": x})[0], rtol=1e-4, atol=1e-4
    )  # (save_model turned ``model`` into references)
    assert session.verify().ok
    (folder / "model.weights").unlink()
    with pytest.raises(OnnxAotError, match="model.weights|external data"):
        compile_model(folder / "model.onnx", tmp_path / "art2")


# -- atomic compile --------------------------------------------------------------------------------
KILLER = textwrap.dedent("""
    import os, signal, sys
    import onnx
    from compiler import compile_model
    import compiler.artifact.atomic as atomic
    import compiler.artifact.writer as writer
    stage = {stage!r}
    die = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
    if stage == "before_rename":
        writer.replace_dir = die
    elif stage == "between_renames":  # the fallback without renameat2: out renamed aside, then killed
        atomic._exchange = lambda a, b: False
        real = os.rename
        calls = []
        def rename(a, b):
            calls.append(a)
            real(a, b)
            if len(calls) == 1:
                die()
        atomic.os.rename = rename
    elif stage == "manifest":
        real_dump = writer.dump_json
        def dump(obj):
            if "format_version" in obj and "files" in obj:
                die()
            return real_dump(obj)
        writer.dump_json = dump
    def progress(message):
        if stage != "timer" and message.startswith(stage):
            die()
    compile_model(onnx.load({model!r}), {out!r}, progress=progress)
""")

STAGES = [
    "loading",
    "computing golden",
    "partitioning",
    "planning memory",
    "generating kernels",
    "manifest",
    "before_rename",
    "between_renames",
    "timer",
]


@pytest.mark.parametrize("stage", STAGES)
def test_a_killed_compile_never_leaves_a_folder_that_loads_partially(tmp_path: Path, stage: str) -> None:
    old_model, new_model = small_model(), conv_gemm_model()
    out = tmp_path / "art"
    compile_model(old_model, out)
    old_plan = (out / "plan.json").read_bytes()
    model_path = tmp_path / "new.onnx"
    onnx.save(new_model, model_path)
    script = KILLER.format(stage=stage, model=str(model_path), out=str(out))
    env = dict(os.environ, ONNX_AOT_CACHE_DIR=str(tmp_path / "cache"))  # a cold cache: a slow build
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env=env)
    if stage == "timer":
        time.sleep(1.0)
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=300)
    assert proc.returncode == -signal.SIGKILL
    if out.exists():  # the previous artifact, whole; never the new one half-written
        session = Session(out, verify_weights=True)
        assert (out / "plan.json").read_bytes() == old_plan or list(session.plan.inputs[0].shape) == [
            2,
            3,
            8,
            8,
        ]
        assert session.verify().ok
    else:
        assert stage == "between_renames"
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".art.")]
    for left in leftovers:  # hidden, pid-tagged; never something Session takes for the artifact
        assert left.name.startswith((".art.tmp-", ".art.old-"))
    # the next compile into the same place sweeps what the killed one left behind
    compile_model(new_model, out)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".art.")]
    assert Session(out).verify().ok


def test_recompiling_in_place_never_runs_the_old_library(tmp_path: Path) -> None:
    # dlopen hands back a library already loaded under the same path: a recompiled artifact
    # loaded again in the same process must still get its own new code.
    out = tmp_path / "art"
    first = Session(compile_model(small_model(), out))
    x = np.random.default_rng(8).standard_normal((1, 3, 8, 8)).astype(np.float32)
    before = first.run(None, {"x": x})[0]
    for batch in (2, 3):
        second = Session(compile_model(conv_gemm_model(batch), out))
        xb = np.random.default_rng(batch).standard_normal((batch, 3, 8, 8)).astype(np.float32)
        np.testing.assert_allclose(
            second.run(None, {"x": xb})[0],
            ort_run(conv_gemm_model(batch), {"x": xb})[0],
            rtol=1e-4,
            atol=1e-4,
        )
        assert second.verify().ok
        assert Session(out).verify().ok
    np.testing.assert_array_equal(first.run(None, {"x": x})[0], before)  # the old session still works


def test_a_partial_folder_without_manifest_does_not_load(tmp_path: Path) -> None:
    art = compile_model(small_model(), tmp_path / "art")
    (art / "manifest.json").unlink()
    with pytest.raises(ArtifactError, match="manifest.json"):
        Session(art)


# -- nothing executes from data --------------------------------------------------------------------
FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__", "execfile"}
FORBIDDEN_MODULES = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle", "joblib"}


def test_runtime_has_no_pickle_eval_exec_anywhere() -> None:
    """An AST check (stricter than the regex in test_lint): no import of a pickle-like module, no
    eval/exec/compile/__import__ call, no np.load(allow_pickle=True), in every runtime module."""
    offenders = []
    files = sorted((REPO / "runtime").rglob("*.py"))
    assert len(files) > 20
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Import):
                offenders += [
                    f"{where} import {a.name}"
                    for a in node.names
                    if a.name.split(".")[0] in FORBIDDEN_MODULES
                ]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in FORBIDDEN_MODULES:
                offenders.append(f"{where} from {node.module} import")
            elif isinstance(node, ast.Call):
                fn = node.func
                name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
                if isinstance(fn, ast.Name) and name in FORBIDDEN_CALLS:
                    offenders.append(f"{where} {name}()")
                if name == "load" and any(
                    k.arg == "allow_pickle"
                    and not (isinstance(k.value, ast.Constant) and k.value.value is False)
                    for k in node.keywords
                ):
                    offenders.append(f"{where} load(allow_pickle=...)")
                if (
                    name in ("loads", "load")
                    and isinstance(fn, ast.Attribute)
                    and isinstance(fn.value, ast.Name)
                    and fn.value.id in FORBIDDEN_MODULES
                ):
                    offenders.append(f"{where} {fn.value.id}.{name}")
    assert not offenders, "\n".join(offenders)
    # plan.json and manifest.json are read with json only
    artifact = (REPO / "runtime" / "artifact.py").read_text()
    assert "json.loads" in artifact and "np.load(" not in artifact
