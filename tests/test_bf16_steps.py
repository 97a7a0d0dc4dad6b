"""Which convs of a ``--precision bf16`` compile run bf16, per ``--cpu`` target (issue 34;
compiler/passes/bf16_cost.py, compiler/precision.py: bf16_engine).

Five convs built with onnx.helper: a 3x3 64 -> 64 at 56x56 (Winograd's 4x4 tiles), a 3x3
512 -> 512 at 7x7 (2x2 tiles), a 7x7 / 2 stem of 3 channels, and at 14x14 (4x4 tiles, few of
them) a 3x3 256 -> 256 and a 3x3 128 -> 32. On an AMX-BF16 target (sapphirerapids), and on one
naming no bf16 unit (x86-64-v3, AVX2), the rules are those measured on AMX: all five bf16, no
Winograd. On an AVX512_BF16 target without AMX (cooperlake, as a Zen 4 is) the 56x56 one and the
14x14 128 -> 32 keep fp32 Winograd, the 14x14 256 -> 256 (K x M from 2^18), the 7x7 one and the
stem go bf16 -- and ``inspect`` says so per step. x86-64-v4 (AVX-512, no bf16 in the level) follows the build
machine's unit where it is that machine's level. On a host with AVX512_BF16, the golden
self-test records the bf16 error of such a build, and ``--max-error`` moves its bf16 step back.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler import compile_model
from compiler.codegen.options import BuildOptions
from compiler.frontend.importer import import_model
from compiler.passes import optimize
from compiler.precision import bf16_engine
from runtime import Session
from runtime.artifact import load_artifact
from runtime.contract import CONV_NHWC
from runtime.contract import WINOGRAD_CONV_NHWC
from runtime.inspection import step_precisions
from runtime.isa import MARCH_FEATURES
from runtime.isa import TEST_FLAGS_ENV
from runtime.isa import host_cpu_flags

CONVS = {"c56": (64, 64, 3, 56, 1), "c7": (512, 512, 3, 7, 1), "stem": (3, 64, 7, 224, 2),
         "c14": (256, 256, 3, 14, 1), "d14": (128, 32, 3, 14, 1)}  # C, M, k, H, s
DPBF16 = {"c56": "winograd", "c7": "bf16", "stem": "bf16", "c14": "bf16", "d14": "winograd"}


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes, inputs, outputs, inits = [], [], [], []
    for name, (c, m, k, h, s) in CONVS.items():
        w = (rng.standard_normal((m, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"{name}_w"))
        nodes.append(helper.make_node("Conv", [f"{name}_x", f"{name}_w"], [f"{name}_y"], name=name,
                                      kernel_shape=[k, k], pads=[k // 2] * 4, strides=[s, s]))
        inputs.append(helper.make_tensor_value_info(f"{name}_x", TensorProto.FLOAT, [1, c, h, h]))
        outputs.append(helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [1, m, h // s, h // s]))
    graph = helper.make_graph(nodes, "bf16_steps", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _forms(isa: str) -> dict[str, str]:
    """Each conv's form after a bf16 compile's passes for ``isa``: winograd, bf16 or fp32 (direct)."""
    engine, _why = bf16_engine(BuildOptions(isa=isa))
    graph = optimize(import_model(_model()), 3, target="cpu", precision="bf16", bf16_engine=engine)
    forms = {}
    for node in graph:
        if node.name in CONVS:
            w = node.input(1)
            assert w is not None
            bf16 = node.kind == CONV_NHWC and w.dtype == np.uint16
            forms[node.name] = "winograd" if node.kind == WINOGRAD_CONV_NHWC else "bf16" if bf16 else "fp32"
    return forms


@pytest.mark.parametrize("isa", ["sapphirerapids", "x86-64-v3"])
def test_amx_target_and_one_without_bf16_keep_the_amx_rules(isa: str) -> None:
    assert _forms(isa) == dict.fromkeys(CONVS, "bf16"), isa


def test_avx512_bf16_target_without_amx_keeps_winograd_where_it_wins() -> None:
    assert bf16_engine(BuildOptions(isa="cooperlake"))[0] == "dpbf16"
    assert _forms("cooperlake") == DPBF16


@pytest.mark.parametrize(("host", "engine"),
                         [("znver4", "dpbf16"), ("sapphirerapids", "amx"), ("x86-64-v4", "amx")])
def test_the_level_target_follows_the_build_machines_unit(monkeypatch: pytest.MonkeyPatch, host: str,
                                                          engine: str) -> None:
    monkeypatch.setenv(TEST_FLAGS_ENV, " ".join(MARCH_FEATURES[host]))
    assert bf16_engine(BuildOptions(isa="x86-64-v4"))[0] == engine, host


def test_inspect_shows_the_winograd_steps_fp32(tmp_path: Path) -> None:
    said: list[str] = []
    out = compile_model(_model(), tmp_path / "art", build=BuildOptions(isa="cooperlake"), precision="bf16",
                        golden_cases=0, run_check=False, progress=said.append)  # (the host may lack BF16)
    assert any("bf16 steps chosen for vdpbf16ps" in line for line in said), said
    precisions = step_precisions(load_artifact(out).plan)
    expected = {name: "fp32" if form == "winograd" else form for name, form in DPBF16.items()}
    assert {name: precisions[name] for name in CONVS} == expected


@pytest.mark.skipif("avx512_bf16" not in (host_cpu_flags() or ()), reason="runs a cooperlake build")
def test_max_error_and_the_golden_record_under_the_vdpbf16ps_rules(tmp_path: Path) -> None:
    build = BuildOptions(isa="cooperlake")
    free = compile_model(_model(), tmp_path / "free", build=build, precision="bf16")
    record = json.loads((free / "manifest.json").read_text())["accuracy"]
    assert record["steps_total"] == record["steps_reduced"] == 3 and record["restored_to_fp32"] == []
    bf16 = {name for name, form in DPBF16.items() if form == "bf16"}
    assert all((1e-4 < error < 0.02) if name.removesuffix("_y") in bf16 else error < 1e-4
               for name, error in record["outputs"].items()), record  # (the bf16 rounding)
    bounded = compile_model(_model(), tmp_path / "bounded", build=build, precision="bf16", max_error=1e-4)
    record = json.loads((bounded / "manifest.json").read_text())["accuracy"]
    assert sorted(record["restored_to_fp32"]) == sorted(bf16) and record["steps_reduced"] == 0, record
    assert set(step_precisions(load_artifact(bounded).plan).values()) == {"fp32"}
    assert Session(bounded).verify().ok
