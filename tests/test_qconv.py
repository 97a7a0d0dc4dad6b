"""The C integer convolutions: QLinearConv / ConvInteger lowered to ``onnx_aot.PackedQConv``
(compiler/passes/pack_qconv_weights.py, compiler/providers/c/qconv.py, templates/c/qconv*.c.j2).

Every case is a shape no model here was tuned on (odd channel counts, 1x1 / 3x3 / 5x5, strides 2,
asymmetric pads, dilation, groups, depthwise and a channel multiplier, 1-D, u8 and s8 X, u8 and s8
W, per-tensor and per-channel, weight zero points 0 and not, with and without a bias, int8 and
uint8 Y). All cases are one graph of independent nodes, compiled for this machine's default level
(x86-64-v4 / -v3: the portable tile), for ``native`` (the AVX512-VNNI tile where the host has it)
and run on the portable x86-64-v2 build too; each output must equal the reference kernels'
(runtime/kernels/quantize.py, what opt level 0 runs) bit for bit on 1 and 2 threads, and
onnxruntime's wherever onnxruntime runs the case.
"""

from __future__ import annotations

import json
import platform
import re
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx import numpy_helper
from onnx.backend.test.case.node import collect_testcases

from compiler import compile_model
from runtime import Session
from runtime.isa import MARCH_FEATURES
from runtime.isa import TEST_FLAGS_ENV
from tests.cpu_targets import host_runs
from tests.support.qconv_models import QConvCase
from tests.support.qconv_models import qconv_feed
from tests.support.qconv_models import qconv_model

CASES = {
    "stem3x3": QConvCase(c=3, m=5, hw=(11, 9)),
    "s8x": QConvCase(c=5, m=7, x="int8", y="int8"),
    "pw": QConvCase(c=19, m=13, hw=(6, 5), kernel=(1, 1), pads=(0, 0, 0, 0), w_zero=False),
    "k5s2": QConvCase(c=5, m=7, hw=(13, 10), kernel=(5, 5), strides=(2, 2), pads=(2, 1, 2, 1)),
    "dil2": QConvCase(c=4, m=6, hw=(10, 11), dilations=(2, 2), pads=(2, 2, 2, 2)),
    "groups": QConvCase(c=9, m=12, hw=(9, 9), strides=(2, 2), group=3, x="int8"),
    "dw": QConvCase(c=7, m=7, group=7, hw=(10, 13)),
    "dw5s2": QConvCase(c=6, m=6, group=6, hw=(11, 12), kernel=(5, 5), strides=(2, 2),
                       pads=(2, 2, 2, 2), x="int8", y="int8"),
    "multiplier": QConvCase(c=4, m=8, group=4, pads=(0, 1, 0, 1)),
    "wide": QConvCase(c=33, m=70, hw=(14, 15), w_zero=False),
    "u8w": QConvCase(c=6, m=9, w="uint8", per_channel=False, bias=False),
    "line": QConvCase(c=5, m=6, hw=(17,), kernel=(3,), strides=(1,), pads=(1, 2), dilations=(1,)),
    "int": QConvCase(c=5, m=6, integer=True, per_channel=False),
    "int_pw_s8": QConvCase(c=11, m=9, hw=(7, 7), kernel=(1, 1), pads=(0, 0, 0, 0), x="int8",
                           integer=True),
    "int_dw": QConvCase(c=5, m=5, group=5, integer=True, strides=(2, 2)),
    # the depthwise loop's bands and column phases (qconv_depthwise.c.j2): dilation, uneven strides
    # and pads with a multiplier, a plane over several bands, a kernel too long for float sums
    "dw_dil": QConvCase(c=5, m=5, group=5, hw=(12, 11), dilations=(2, 2), pads=(2, 2, 2, 2), w="uint8"),
    "dw_s23": QConvCase(c=3, m=6, group=3, hw=(13, 17), kernel=(3, 4), strides=(2, 3), pads=(1, 0, 2, 1),
                        x="int8"),
    "dw_bands": QConvCase(c=2, m=2, group=2, hw=(60, 100), batch=1, x="int8", y="int8"),
    # stride 2 unpadded: the packing's even bytes 16 at a time, X's last byte the run's last read
    "pw_s2": QConvCase(c=21, m=10, hw=(13, 41), kernel=(1, 1), strides=(2, 2), pads=(0, 0, 0, 0), x="int8",
                       batch=1),
    # one panel, its channel blocks over several items: packed once first by "prepack", in ranges of
    # k (the last range shorter), or in one item where the pixel sums over k follow (weight zero points)
    "split": QConvCase(c=40, m=50, hw=(13, 13), strides=(2, 2), batch=1, x="int8", y="int8", w_zero=False),
    "split_wz": QConvCase(c=13, m=20, hw=(5, 6), batch=1),
    # requantizing scales over 1 (the vector store's float64 rounding path, not its int32 one)
    "big_scale": QConvCase(c=3, m=4, hw=(5, 6), y_scale=2e-5, per_channel=False, bias=False),
    "dw_big_scale": QConvCase(c=3, m=3, group=3, hw=(5, 6), y_scale=2e-5),
    "dw_long": QConvCase(c=2, m=2, group=2, hw=(300,), kernel=(260,), strides=(1,), pads=(3, 2),
                         dilations=(1,), w="uint8"),
}


def _merged(cases: dict[str, QConvCase]) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """One model running every case on its own input (names prefixed by the case's)."""
    nodes, inputs, outputs, inits = [], [], [], []
    feeds: dict[str, np.ndarray] = {}
    for seed, (name, case) in enumerate(cases.items()):
        g = qconv_model(case, seed).graph
        rename = {v: f"{name}_{v}" for v in [*g.input[0:1], *g.output[0:1]] for v in [v.name]}
        rename.update({t.name: f"{name}_{t.name}" for t in g.initializer})
        for node in g.node:
            new = helper.make_node(node.op_type, [rename[i] for i in node.input],
                                   [rename[o] for o in node.output], name=f"{name}_conv")
            new.attribute.extend(node.attribute)
            nodes.append(new)
        for t in g.initializer:
            t.name = rename[t.name]
            inits.append(t)
        for src, dst in ((g.input[0], inputs), (g.output[0], outputs)):
            v = onnx.ValueInfoProto()
            v.CopyFrom(src)
            v.name = rename[src.name]
            dst.append(v)
        feeds[f"{name}_x"] = qconv_feed(case, seed + 100)["x"]
    graph = helper.make_graph(nodes, "qconv_cases", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), feeds


def _run(art: Path, feeds: dict[str, np.ndarray], threads: int) -> dict[str, np.ndarray]:
    session = Session(art, threads=threads)
    return dict(zip([o.name for o in session.outputs], session.run(None, feeds), strict=True))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    model, feeds = _merged(CASES)
    root = tmp_path_factory.mktemp("qconv")
    arts = {"default": compile_model(model, root / "default"),
            "native": compile_model(model, root / "native", cpu="native"),
            "reference": compile_model(model, root / "reference", opt_level=0)}
    expected = _run(arts["reference"], feeds, 1)
    return {"arts": arts, "feeds": feeds, "expected": expected}


def _same(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    for name, want in expected.items():
        assert got[name].dtype == want.dtype, name
        np.testing.assert_array_equal(got[name], want, err_msg=name)


def test_every_conv_runs_packed_in_c(built: dict[str, object]) -> None:
    for key in ("default", "native"):
        plan = json.loads((built["arts"][key] / "plan.json").read_text())  # type: ignore[index]
        assert [(s["op_type"], s["provider"]) for s in plan["steps"]] == [("PackedQConv", "c")] * len(CASES)
    plan = json.loads((built["arts"]["reference"] / "plan.json").read_text())  # type: ignore[index]
    assert {s["provider"] for s in plan["steps"]} == {"reference"}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("build", ["default", "native"])
def test_bit_exact_with_the_reference(built: dict[str, object], build: str, threads: int) -> None:
    _same(_run(built["arts"][build], built["feeds"], threads), built["expected"])  # type: ignore[arg-type,index]


def test_16_bit_tiles_of_an_avx512bw_build_are_bit_exact(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """An AVX-512BW build (x86-64-v4, the default level of an AVX-512 host) takes vpdpbusd where the
    CPU has VNNI and AMX-INT8 where it has the tiles: ONNX_AOT_INT8_NO_VNNI and ONNX_AOT_NO_AMX (read
    at a library's first run, hence a build of its own) keep the pmaddwd tiles, which VNNI and AMX
    hosts would otherwise never run."""
    if not host_runs("x86-64-v4"):
        pytest.skip("this host does not run x86-64-v4 code")
    model, feeds = _merged(CASES)
    art = compile_model(model, tmp_path / "v4", cpu="x86-64-v4", golden_cases=0)
    assert '__builtin_cpu_supports("avx512vnni")' in (art / "kernels" / "cpu" / "model.c").read_text()
    monkeypatch.setenv("ONNX_AOT_INT8_NO_VNNI", "1")
    monkeypatch.setenv("ONNX_AOT_NO_AMX", "1")
    reference = compile_model(model, tmp_path / "reference", opt_level=0, golden_cases=0)
    _same(_run(art, feeds, 2), _run(reference, feeds, 1))


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 CPU builds")
def test_portable_build_is_bit_exact(built: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TEST_FLAGS_ENV, " ".join(MARCH_FEATURES["x86-64-v2"]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        session = Session(built["arts"]["default"], threads=2)  # type: ignore[index]
    assert session.cpu_build is not None and session.cpu_build.march == "x86-64-v2"
    got = dict(zip([o.name for o in session.outputs], session.run(None, built["feeds"]), strict=True))  # type: ignore[arg-type]
    _same(got, built["expected"])  # type: ignore[arg-type]


@pytest.mark.parametrize("name", list(CASES))
def test_matches_onnxruntime_where_it_runs(built: dict[str, object], name: str) -> None:
    ort = pytest.importorskip("onnxruntime")
    case = CASES[name]
    seed = list(CASES).index(name)
    try:
        session = ort.InferenceSession(qconv_model(case, seed).SerializeToString())
        (want,) = session.run(None, {"x": built["feeds"][f"{name}_x"]})  # type: ignore[index]
    except Exception as exc:  # onnxruntime lacks some (s8 X with s8 W, per-channel ConvInteger)
        pytest.skip(f"onnxruntime does not run it: {str(exc)[:80]}")
    got = _run(built["arts"]["native"], built["feeds"], 2)[f"{name}_y"]  # type: ignore[arg-type,index]
    np.testing.assert_array_equal(got, want)


NODE_CASES = ("test_qlinearconv", "test_convinteger_with_padding", "test_convinteger_without_padding")


@pytest.mark.parametrize("case", NODE_CASES)
def test_node_suite_case_on_the_c_kernel(case: str, tmp_path: Path) -> None:
    """ONNX's node test, its inputs but X made initializers (as a quantized model has them), so
    the C kernel runs it: the expected output bit for bit."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # other cases' generators divide by zero
        (test,) = [t for t in collect_testcases(None) if t.name == case]
    model = onnx.ModelProto()
    model.CopyFrom(test.model)
    arrays, (want,) = ([np.asarray(a) for a in part] for part in test.data_sets[0])
    graph = model.graph
    x_name = graph.input[0].name
    for value, array in zip(list(graph.input)[1:], arrays[1:], strict=True):
        graph.initializer.append(numpy_helper.from_array(array, value.name))
    keep = [v for v in graph.input if v.name == x_name]
    del graph.input[:]
    graph.input.extend(keep)
    art = compile_model(model, tmp_path / "art")
    plan = json.loads((art / "plan.json").read_text())
    assert [(s["op_type"], s["provider"]) for s in plan["steps"]] == [("PackedQConv", "c")]
    (got,) = Session(art, threads=2).run(None, {x_name: arrays[0]})
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("cpu", ["x86-64-v4"])
def test_generated_code(cpu: str, tmp_path: Path) -> None:
    """The text of the x86-64-v4 build: each conv's work is one pool job (the packing runs inside the
    GEMM's items, or its AMX-INT8 alternative) plus the padded copy where it pads; the four
    dot-product paths (AMX tiles, VNNI, pmaddwd, portable) and the vector
    requantizing store are there (its int32 rounding where the scales are small, its float64 one for
    "big"); the depthwise kernel has its own loop (float FMAs) and no scratch."""
    cases = {"pw": QConvCase(c=64, m=32, hw=(28, 28), kernel=(1, 1), pads=(0, 0, 0, 0), batch=1),
             "k3": QConvCase(c=16, m=32, hw=(28, 28), batch=1),
             "dw": QConvCase(c=32, m=32, group=32, hw=(28, 28), batch=1),
             "big": QConvCase(c=16, m=32, hw=(28, 28), batch=1, y_scale=2e-5),
             "deep": QConvCase(c=64, m=64, hw=(7, 7), batch=1, w_zero=False),
             "s2": QConvCase(c=64, m=32, hw=(56, 56), kernel=(1, 1), strides=(2, 2), pads=(0, 0, 0, 0),
                             batch=1)}
    model, _ = _merged(cases)
    art = compile_model(model, tmp_path / "art", cpu=cpu)
    source = (art / "kernels" / "cpu" / "model.c").read_text()
    plan = json.loads((art / "plan.json").read_text())
    calls = re.findall(r"/\* step (\d+): .*?\*/\s*(k_[0-9a-f]{16})\(", source, re.S)
    kernels = {int(i): name for i, name in calls}
    jobs, prepacks = {}, {}
    for step in plan["steps"]:
        name = kernels[step["index"]]
        body = source[source.index(f"void {name}(") :]
        body = body[: body.index("\n}\n")]
        # the AMX-INT8 loop is the GEMM job's alternative, taken where the CPU has the tiles
        amx = re.search(r"if \(onnx_aot_amx_usable\(ONNX_AOT_AMX_INT8\)\) \{.*?return;\n  \}", body, re.S)
        jobs[step["name"]] = (body.count("onnx_aot_parallel("), amx is not None)
        prepacks[step["name"]] = "_prepack_task" in body
    # x86-64-v4 has no AVX512-VNNI: the GEMM job has its vpdpbusd twin, taken where the CPU has it
    # (an AMD Zen 4 or an Intel without AMX ran the pmaddwd tiles at 0.45x the speed before)
    # "deep" (one panel of 49 pixels, 11 channel blocks): its panel packed once ("prepack"), not per
    # item (its padded copy too small for the pool: a direct call)
    assert jobs == {"pw_conv": (3, True), "k3_conv": (4, True), "dw_conv": (1, False), "big_conv": (4, True),
                    "deep_conv": (4, True), "s2_conv": (3, True)}
    assert source.count('__builtin_cpu_supports("avx512vnni")') == 5
    assert len(re.findall(r"void k_[0-9a-f]{16}_gemm_vnni\(", source)) == 5
    assert [name for name, yes in prepacks.items() if yes] == ["deep_conv"]
    scratch = {s["name"] for s in plan["steps"] if s.get("scratch")}
    assert scratch == {"pw_conv", "k3_conv", "big_conv", "deep_conv", "s2_conv"}
    # (_mm256_maskz_loadu_epi8: the stride-2 packing's 16 bytes at a time)
    for text in ("vpdpbusd", "_mm256_maskz_loadu_epi8", "_mm512_madd_epi16", "_mm512_roundscale_pd",
                 "_store16(", "rint(", "tdpbsud", "_mm512_add_round_pd", "_mm512_fmadd_ps"):
        assert text in source, text
    assert "_mm512_maddubs" not in source  # pmaddubsw's 16-bit sums saturate
