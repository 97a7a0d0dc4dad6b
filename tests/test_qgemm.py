"""The C integer GEMM (issue 32): onnx_aot.QGemm, DynamicQuantizeLinear in C, quantize_dynamic's
chain fused, on every int8 dot-product path.

MatMulInteger, QLinearMatMul and DynamicQuantizeLinear must equal the reference kernels and
onnxruntime bit for bit on shapes the tile was not tuned on (odd M / N / K, K not a multiple of 4,
batched A, u8 and s8, per-tensor and per-column), at 1 and 2 threads, on each ``--cpu`` level's path
(x86-64-v2: portable C, -v3: AVX2 pmaddwd, -v4: AVX-512BW pmaddwd) and on the VNNI paths where the
host has them (a build for icelake-server: AVX512-VNNI; alderlake: AVX-VNNI). The fused float
epilogue of quantize_dynamic's chain matches onnxruntime to a rounding of the output (one FMA);
a MiniLM-size encoder quantized by quantize_dynamic strays from the fp32 model at most 1.25x as
far as onnxruntime's int8 run of the same file, + 0.005.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator
from onnxruntime.quantization import QuantType
from onnxruntime.quantization import quantize_dynamic

from compiler import compile_model
from compiler.codegen.options import BuildOptions
from runtime import Session
from runtime.isa import MARCH_FEATURES
from runtime.isa import host_cpu_flags
from runtime.isa import missing_features
from runtime.kernels import get_kernel
from tests.cpu_targets import host_runs
from tests.support.encoder_model import MINILM
from tests.support.encoder_model import encoder_feeds
from tests.support.encoder_model import encoder_model
from tests.support.qgemm_models import dynamic_quantize_model
from tests.support.qgemm_models import integer_feeds
from tests.support.qgemm_models import integer_matmuls

# target -> (how to build it, the text its micro-kernel must contain, what it must not)
TARGETS = {
    "x86-64-v2": ({"cpu": "x86-64-v2"}, "(int32_t)a[0] * b[4 * c]", "madd_epi16"),
    "x86-64-v3": ({"cpu": "x86-64-v3"}, "_mm256_madd_epi16", "vpdpbusd"),
    "x86-64-v4": ({"cpu": "x86-64-v4"}, "_mm512_madd_epi16", "%{vex%}"),  # + VNNI taken at run time
    "icelake-server": ({"build": BuildOptions(isa="icelake-server")}, "vpdpbusd %2, %1, %0", "madd_epi16"),
    "alderlake": ({"build": BuildOptions(isa="alderlake")}, "%{vex%} vpdpbusd", "madd_epi16"),
}


def _runs(target: str) -> bool:
    if target.startswith("x86-64"):
        return host_runs(target)
    flags = host_cpu_flags()
    return flags is not None and not missing_features(MARCH_FEATURES[target], flags)


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray], threads: int = 1) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), options).run(None, feeds)


def _steps(artifact: Path) -> list[tuple[str, str]]:
    plan = json.loads((artifact / "plan.json").read_text())
    return [(s["op_type"], s["provider"]) for s in plan["steps"]]


def _source(artifact: Path) -> str:
    return (artifact / "kernels" / "cpu" / "model.c").read_text()


@pytest.fixture(scope="module")
def integer_artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("qgemm")
    model = integer_matmuls()
    return {t: compile_model(model, root / t, golden_cases=1, **how) for t, (how, _, _) in TARGETS.items()}


@pytest.mark.parametrize("target", list(TARGETS))
def test_integer_matmuls_are_bit_exact_on_every_path(integer_artifacts: dict[str, Path], target: str) -> None:
    artifact = integer_artifacts[target]
    _, has, lacks = TARGETS[target]
    text = _source(artifact)
    assert has in text and lacks not in text, target
    assert _steps(artifact) == [("QGemm", "c")] * 8
    if not _runs(target):
        pytest.skip(f"this host does not run {target} code (the text was checked)")
    model, feeds = integer_matmuls(), integer_feeds()
    want = _ort(model, feeds)
    for threads in (1, 2):
        got = Session(artifact, threads=threads).run(None, feeds)
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert g.dtype == w.dtype and np.array_equal(g, w), f"{target} threads {threads} y{i}"


def test_avx512bw_build_takes_vnni_at_run_time_and_keeps_the_16_bit_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """x86-64-v4 (the default level of an AVX-512 host) has no VNNI flag: its QGemm carries both
    loops and asks the CPU; ONNX_AOT_INT8_NO_VNNI (read at a library's first run) forces pmaddwd."""
    if not host_runs("x86-64-v4"):
        pytest.skip("this host does not run x86-64-v4 code")
    model, feeds = integer_matmuls(), integer_feeds()
    artifact = compile_model(model, tmp_path / "a", cpu="x86-64-v4", golden_cases=0)
    assert '__builtin_cpu_supports("avx512vnni")' in _source(artifact)
    monkeypatch.setenv("ONNX_AOT_INT8_NO_VNNI", "1")
    want = _ort(model, feeds)
    for g, w in zip(Session(artifact, threads=2).run(None, feeds), want, strict=True):
        assert np.array_equal(g, w)


def test_reference_kernels_agree_with_onnxruntime_on_the_same_cases() -> None:
    """The oracle above is onnxruntime; the reference kernels give the same integers."""
    model, feeds = integer_matmuls(), integer_feeds()
    want = _ort(model, feeds)
    for i, node in enumerate(model.graph.node):
        inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        ins = [feeds[name] if name in feeds else inits[name] for name in node.input]
        (got,) = get_kernel(node.op_type)(np, ins, {}, [(want[i].shape, want[i].dtype)])
        assert np.array_equal(got, want[i]), node.name


def test_dynamic_quantize_linear_in_c_is_bit_exact(tmp_path: Path) -> None:
    shapes = ((3, 1000), (7, 13), (64, 384), (5,), (2, 3), (4, 5))
    model = dynamic_quantize_model(shapes)
    rng = np.random.default_rng(3)
    feeds = {"x0": rng.standard_normal(shapes[0]).astype(np.float32) * 3,
             "x1": rng.uniform(0.5, 4, shapes[1]).astype(np.float32),  # all positive: zero point 0
             "x2": rng.standard_normal(shapes[2]).astype(np.float32),
             "x3": -rng.uniform(0.1, 2, shapes[3]).astype(np.float32),  # all negative: zero point 255
             "x4": np.zeros(shapes[4], np.float32),
             "x5": rng.standard_normal(shapes[5]).astype(np.float32)}
    feeds["x5"][1, 2] = np.nan  # (a softmax over an infinite mask gives one): NaN scale, all 0
    feeds["x2"][0, :4] = [0.5, -0.5, 1.5, 2.5]  # ties
    artifact = compile_model(model, tmp_path / "a", cpu="x86-64-v2", golden_cases=1)
    assert {s for s in _steps(artifact)} == {("DynamicQuantizeLinear", "c")}
    want = _ort(model, feeds)
    reference = []
    for i in range(len(shapes)):
        specs = [(shapes[i], np.dtype(np.uint8)), ((), np.dtype(np.float32)), ((), np.dtype(np.uint8))]
        reference += get_kernel("DynamicQuantizeLinear")(np, [feeds[f"x{i}"]], {}, specs)
    for threads in (1, 2):
        got = Session(artifact, threads=threads).run(None, feeds)
        for j, (g, r) in enumerate(zip(got, reference, strict=True)):
            assert np.array_equal(g, r, equal_nan=g.dtype.kind == "f"), f"output {j} (threads {threads})"
            if j < 12:  # all-zero input: onnxruntime's scale is 0, the reference's 1/255; NaN: its own
                assert np.array_equal(g, want[j]), f"output {j} vs onnxruntime"
    assert np.isnan(got[16]) and got[15].max() == 0 == got[17]


def _linear_model(m: int, k: int, n: int, seed: int) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "bias"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, m, k])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, m, n])
    graph = helper.make_graph(nodes, "linear", [x], [y],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "bias")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("cpu", ["x86-64-v2", "x86-64-v4"])
def test_quantize_dynamic_chain_is_one_qgemm_step(tmp_path: Path, cpu: str) -> None:
    """DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul -> Add: one QGemm, A quantized inside.
    Tolerance: the integer sums equal onnxruntime's; the epilogue may fuse its multiply-add into one
    FMA, a rounding of the output (1e-6 of its largest magnitude covers it)."""
    fp = tmp_path / "fp.onnx"
    onnx.save(_linear_model(23, 77, 45, 0), fp)
    quantize_dynamic(str(fp), str(tmp_path / "q.onnx"), weight_type=QuantType.QInt8)
    model = onnx.load(tmp_path / "q.onnx")
    assert {n.op_type for n in model.graph.node} >= {"DynamicQuantizeLinear", "MatMulInteger", "Cast"}
    artifact = compile_model(model, tmp_path / "a", cpu=cpu, golden_cases=1)
    assert _steps(artifact) == [("QGemm", "c")]
    x = {"x": np.random.default_rng(5).standard_normal((2, 23, 77)).astype(np.float32)}
    if not host_runs(cpu):
        pytest.skip(f"this host does not run {cpu} code")
    one, two = (Session(artifact, threads=t).run(None, x)[0] for t in (1, 2))
    assert np.array_equal(one, two)
    # onnx's reference evaluator, and onnxruntime's second run: its first one in this process (after
    # the tests above) once gave another result, 3.2 away, its later runs this one
    session = ort.InferenceSession(model.SerializeToString())
    for want in (ReferenceEvaluator(model).run(None, x)[0], *[session.run(None, x)[0] for _ in range(2)][1:]):
        assert np.abs(one - want).max() <= 1e-6 * np.abs(want).max()


def _stray(y: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(y - ref).max() / np.abs(ref).max())


def test_minilm_quantized_dynamically_strays_as_onnxruntime_does(tmp_path: Path) -> None:
    fp = encoder_model(**MINILM)
    onnx.save(fp, tmp_path / "fp.onnx")
    quantize_dynamic(str(tmp_path / "fp.onnx"), str(tmp_path / "q.onnx"), weight_type=QuantType.QInt8)
    artifact = compile_model(tmp_path / "q.onnx", tmp_path / "a", golden_cases=1)
    steps = _steps(artifact)
    assert steps.count(("QGemm", "c")) == 6 * MINILM["layers"]
    assert not [s for s in steps if s[1] != "c"]
    ours, theirs = Session(artifact, threads=2), ort.InferenceSession(str(tmp_path / "q.onnx"))
    exact = ort.InferenceSession(str(tmp_path / "fp.onnx"))
    for seed in range(3):
        feeds = encoder_feeds(fp, seed=seed)
        (ref,) = exact.run(None, feeds)
        ort_stray = _stray(theirs.run(None, feeds)[0], ref)
        assert _stray(ours.run(None, feeds)[0], ref) <= 1.25 * ort_stray + 0.005, seed


def test_com_microsoft_integer_gemms_import_as_the_chain_and_run_on_qgemm(tmp_path: Path) -> None:
    """DynamicQuantizeMatMul becomes one QGemm (A quantized inside); MatMulIntegerToFloat an int32
    QGemm and its float scaling; both as onnxruntime runs them, to a rounding of the output."""
    rng = np.random.default_rng(4)
    b = rng.integers(-128, 128, (37, 21)).astype(np.int8)
    params = {"b": b, "bs": rng.uniform(0.01, 0.02, 21).astype(np.float32), "bz": np.zeros(21, np.int8),
              "bias": rng.standard_normal(21).astype(np.float32), "as": np.array(0.03, np.float32),
              "az": np.array(120, np.uint8)}
    ms = "com.microsoft"
    nodes = [helper.make_node("DynamicQuantizeMatMul", ["x", "b", "bs", "bz", "bias"], ["y"], domain=ms),
             helper.make_node("MatMulIntegerToFloat", ["xq", "b", "as", "bs", "az", "bz", "bias"], ["y2"],
                              domain=ms)]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 37]),
           helper.make_tensor_value_info("xq", TensorProto.UINT8, [5, 37])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, 21]),
            helper.make_tensor_value_info("y2", TensorProto.FLOAT, [5, 21])]
    inits = [numpy_helper.from_array(v, k) for k, v in params.items()]
    graph = helper.make_graph(nodes, "ms", ins, outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid(ms, 1)])
    artifact = compile_model(model, tmp_path / "a", cpu="x86-64-v2", golden_cases=1)
    assert _steps(artifact)[:2] == [("QGemm", "c"), ("QGemm", "c")] and len(_steps(artifact)) == 4
    feeds = {"x": rng.standard_normal((2, 5, 37)).astype(np.float32),
             "xq": rng.integers(0, 256, (5, 37)).astype(np.uint8)}
    session = ort.InferenceSession(model.SerializeToString())
    want = [session.run(None, feeds) for _ in range(2)][1]
    for got, w in zip(Session(artifact).run(None, feeds), want, strict=True):
        assert np.abs(got - w).max() <= 1e-6 * np.abs(w).max()
