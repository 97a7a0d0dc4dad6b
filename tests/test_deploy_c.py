"""Running an artifact from C without Python: kernels/cpu/model.h and the documented program
(docs/examples/run_model.c, the same text as in docs/deploy.md), built with the system compiler
against a compiled zoo model's header and library."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto
from onnx import helper

from compiler import compile_model
from runtime import Session
from runtime import load_plan

REPO = Path(__file__).resolve().parent.parent
PROGRAM = REPO / "docs" / "examples" / "run_model.c"
CC = shutil.which("cc") or shutil.which("gcc")
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler (cc/gcc) on PATH")


def build(artifact: Path, out: Path) -> subprocess.CompletedProcess[str]:
    kernels = artifact / "kernels" / "cpu"
    assert CC is not None
    return subprocess.run([CC, "-O2", "-std=c11", "-Wall", "-Wextra", "-Werror", "-I", str(kernels),
                           str(PROGRAM), str(kernels / "model.so"), f"-Wl,-rpath,{kernels}", "-o", str(out)],
                          capture_output=True, text=True, timeout=120)


def test_docs_show_the_same_program() -> None:
    doc = (REPO / "docs" / "deploy.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```c\n(.*?)```", doc, re.S)
    assert PROGRAM.read_text(encoding="utf-8") in blocks


def test_model_header_lists_sizes_shapes_and_entries(zoo) -> None:
    artifact = zoo.artifact("squeezenet")
    header = (artifact / "kernels" / "cpu" / "model.h").read_text()
    info = load_plan(artifact)
    manifest = (artifact / "manifest.json").read_text()
    assert '"kernels/cpu/model.h"' in manifest  # listed with size and sha256 like every file
    assert f"#define ONNX_AOT_ARENA_BYTES {info.arenas['host']}u" in header
    assert f"#define ONNX_AOT_WEIGHTS_BYTES {info.weights_nbytes}u" in header
    assert "#define ONNX_AOT_RUNNABLE_FROM_C 1" in header
    spec = info.inputs[0]
    assert f"{{ {', '.join(map(str, spec.shape))} }}" in header
    row = f'{{ "{spec.name}", "float32", {len(spec.shape)}, onnx_aot_input_shape_0, {spec.nbytes}u }}'
    assert row in header
    plan_entries = [p.entry for p in Session(artifact).plan.partitions]
    for entry in plan_entries:
        signature = f"int {entry}(void* const* ext, char* arena, const char* weights, double* step_seconds);"
        assert signature in header


@needs_cc
def test_documented_c_program_runs_a_zoo_model_without_python(zoo, tmp_path: Path) -> None:
    name = "squeezenet"
    artifact = zoo.artifact(name)
    assert load_plan(artifact).runnable_from_c
    exe = tmp_path / "run_model"
    result = build(artifact, exe)
    assert result.returncode == 0, result.stderr
    session = Session(artifact)
    feeds = zoo.feeds(name, seed=2)
    inputs = []
    for k, spec in enumerate(session.inputs):
        file = tmp_path / f"in{k}.bin"
        np.ascontiguousarray(feeds[spec.name]).tofile(file)
        inputs.append(str(file))
    outputs = [str(tmp_path / f"out{k}.bin") for k in range(len(session.outputs))]
    run = subprocess.run([str(exe), str(artifact / "weights.bin"), *inputs, *outputs],
                         capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    expected = session.run(None, feeds)
    for spec, file, want in zip(session.outputs, outputs, expected, strict=True):
        got = np.fromfile(file, dtype=spec.dtype).reshape(spec.shape)
        # the same kernels on the same data; only OpenMP's split of a reduction could differ
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    usage = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and session.inputs[0].name in usage.stderr


@needs_cc
def test_artifact_with_python_steps_refuses_to_build_from_c(tmp_path: Path) -> None:
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("Trilu", ["a"], ["y"], upper=1, name="upper")]
    graph = helper.make_graph(nodes, "mixed",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)
    artifact = compile_model(model, tmp_path / "mixed")
    assert not load_plan(artifact).runnable_from_c
    header = (artifact / "kernels" / "cpu" / "model.h").read_text()
    assert "#define ONNX_AOT_RUNNABLE_FROM_C 0" in header and "reference provider" in header
    result = build(artifact, tmp_path / "never")
    assert result.returncode != 0
    assert "cannot run from C alone" in result.stderr and "upper (Trilu)" in result.stderr
