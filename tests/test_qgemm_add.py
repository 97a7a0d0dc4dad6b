"""A QDQ Linear's bias Add and a residual Add in the requantizing QGemm's epilogue
(compiler/passes/fuse_qgemm_add.py, templates/c/qgemm_requant.c.j2).

The graphs are written the way onnxruntime's quantize_static writes a transformer's projection:
DequantizeLinear(x) MatMul DequantizeLinear(per-column int8 W) -> QuantizeLinear / DequantizeLinear,
Add of DequantizeLinear(the bias's own int8 codes) -> QuantizeLinear / DequantizeLinear, then a
residual Add of another activation. fold_qdq makes a QLinearMatMul and two QBinary Adds; the fused
step must give the bits of the unfused integer steps (the C QGemm, then the QBinary kernels) and of
the reference kernels on the fused graph, on the portable and the AVX-512 epilogue, with and
without AMX-INT8, at 1 and 2 threads, and agree with onnxruntime within one output step.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import compiler.passes.manager as manager
from compiler import compile_model
from compiler.driver import import_model
from compiler.ir.evaluate import evaluate
from compiler.passes import optimize
from compiler.passes.base import Pass
from compiler.passes.base import PassResult
from runtime import Session
from runtime.isa import host_cpu_flags
from tests.cpu_targets import host_runs
from tests.support.qdq_models import QdqBuilder

M, K, N = 37, 40, 50  # N: three 16-column vectors and a tail of 2
OUT_SCALE = 0.0391


def _linear(dtype: type, bias_first: bool, both: bool = True) -> onnx.ModelProto:
    """y = (x W + b) + r, every activation between QuantizeLinear / DequantizeLinear (``dtype``);
    ``both``: x W + b is an output too (then the residual Add stays a QBinary)."""
    b = QdqBuilder(seed=3, dtype=dtype)
    z = 0 if dtype == np.int8 else 128
    x = b.qdq("x", 0.0213, z - 5)
    w, _ = b.weight((K, N), axis=1)
    mm = b.qdq(b.node("MatMul", [x, w]), 0.0457, z + 3)
    codes: np.ndarray = (b.rng.integers(-120, 120, N) + z).astype(dtype)  # the bias quantized by itself
    bias = b.node("DequantizeLinear", [b.const(codes, "bias"), b.const(np.float32(0.0031), "bias_scale"),
                                       b.const(np.array(z + 4, dtype), "bias_zp")])
    out = b.qdq(b.node("Add", [bias, mm] if bias_first else [mm, bias]), OUT_SCALE, z - 9)
    res = b.qdq(b.node("Add", [out, b.qdq("r", 0.0302, z + 11)]), 0.0519, z + 2)
    return b.model({"x": (1, M, K), "r": (1, M, N)}, [out, res] if both else [res])


def _gelu_linear(dtype: type) -> onnx.ModelProto:
    """gelu(x W + b) as the quantizer writes an encoder's up-projection: erf, + 1, * x, * 0.5, each
    output between QuantizeLinear / DequantizeLinear."""
    b = QdqBuilder(seed=5, dtype=dtype)
    z = 0 if dtype == np.int8 else 128
    w, _ = b.weight((K, N), axis=1)
    mm = b.qdq(b.node("MatMul", [b.qdq("x", 0.0213, z - 5), w]), 0.0457, z + 3)
    codes: np.ndarray = (b.rng.integers(-120, 120, N) + z).astype(dtype)
    bias = b.node("DequantizeLinear", [b.const(codes, "bias"), b.const(np.float32(0.0031), "bias_scale"),
                                       b.const(np.array(z + 4, dtype), "bias_zp")])
    up = b.qdq(b.node("Add", [bias, mm]), OUT_SCALE, z - 9)
    scaled = b.qdq(b.node("Div", [up, b.const(np.float32(1.4142135), "sqrt2")]), 0.028, z)
    erf = b.qdq(b.node("Erf", [scaled]), 1 / 127, z)
    plus = b.qdq(b.node("Add", [erf, b.const(np.float32(1), "one")]), 2 / 255, z - 128 if z else -128)
    xp = b.qdq(b.node("Mul", [up, plus]), 0.061, z - 40)
    y = b.qdq(b.node("Mul", [xp, b.const(np.float32(0.5), "half")]), 0.0305, z - 20)
    return b.model({"x": (1, M, K)}, [y])


class _Off(Pass):
    name = "fuse_qgemm_add_off"

    def run(self, graph):  # type: ignore[no-untyped-def]
        return PassResult(graph, False)


def _feeds(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": (rng.standard_normal((1, M, K)) * 1.5).astype(np.float32),
            "r": (rng.standard_normal((1, M, N)) * 2).astype(np.float32)}


def _steps(art: Path) -> collections.Counter[str]:
    plan = json.loads((art / "plan.json").read_text(encoding="utf-8"))
    return collections.Counter(s["op_type"] for s in plan["steps"])


def _run(art: Path, feeds: dict[str, np.ndarray], threads: int) -> list[np.ndarray]:
    return Session(art, threads=threads).run(None, feeds)


CASES = [(np.int8, True, True), (np.int8, False, True), (np.uint8, True, True), (np.int8, True, False),
         (np.uint8, False, False)]
IDS = ["s8", "s8_bias_second", "u8", "s8_residual", "u8_residual"]


@pytest.mark.parametrize("cpu", ["x86-64-v2", "x86-64-v4"])
@pytest.mark.parametrize(("dtype", "bias_first", "both"), CASES, ids=IDS)
def test_bias_add_in_the_epilogue_gives_the_unfused_bits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         cpu: str, dtype: type, bias_first: bool,
                                                         both: bool) -> None:
    """The bias Add, and the residual Add after it where the bias's sum has no other use."""
    if not host_runs(cpu):
        pytest.skip(f"this host does not run {cpu} code")
    model = _linear(dtype, bias_first, both)
    fused = compile_model(model, tmp_path / "fused", cpu=cpu, golden_cases=0)
    with monkeypatch.context() as patch:
        patch.setattr(manager, "FuseQGemmAdd", _Off)
        unfused = compile_model(model, tmp_path / "unfused", cpu=cpu, golden_cases=0)
    assert (_steps(unfused)["QBinary"], _steps(fused)["QBinary"]) == (2, int(both)), _steps(fused)
    has_amx = {"amx_tile", "amx_int8"} <= (host_cpu_flags() or set())
    amx = ("1", None) if cpu == "x86-64-v4" and has_amx else (None,)
    for seed in (0, 1):
        feeds = _feeds(seed)
        want = _run(unfused, feeds, 1)
        for no_amx in amx:
            if no_amx is None:
                monkeypatch.delenv("ONNX_AOT_NO_AMX", raising=False)
            else:
                monkeypatch.setenv("ONNX_AOT_NO_AMX", "1")
            for threads in (1, 2):
                got = _run(fused, feeds, threads)
                for k, (g, w) in enumerate(zip(got, want, strict=True)):
                    assert np.array_equal(g, w), (k, seed, threads, no_amx)


@pytest.mark.parametrize(("dtype", "bias_first", "both"), CASES, ids=IDS)
def test_reference_kernel_of_the_fused_step_and_onnxruntime_agree(tmp_path: Path, dtype: type,
                                                                 bias_first: bool, both: bool) -> None:
    """The fused graph on the reference kernels (runtime/kernels/qgemm.py) gives the C bits, and
    onnxruntime's run of the file lies within one output step."""
    model = _linear(dtype, bias_first, both)
    graph = optimize(import_model(model), 3, target="cpu")
    kinds = collections.Counter(node.op_type for node in graph)
    assert kinds["QGemm"] == 1 and kinds["QBinary"] == int(both), kinds
    art = compile_model(model, tmp_path / "a", golden_cases=0)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for seed in (0, 2):
        feeds = _feeds(seed)
        ours = _run(art, feeds, 2)
        for k, (g, w) in enumerate(zip(evaluate(graph, feeds), ours, strict=True)):
            assert np.array_equal(g, w), k
        theirs = sess.run(None, feeds)
        step = OUT_SCALE if both else 0.0519
        assert float(np.max(np.abs(ours[0] - theirs[0]))) <= step * 1.0001


@pytest.mark.parametrize("dtype", [np.int8, np.uint8], ids=["s8", "u8"])
def test_gelu_after_the_projection_is_one_table_in_the_epilogue(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dtype: type) -> None:
    """The GELU's lookup, Mul by that lookup and lookup compose into one table (compose_qbinary),
    which the QGemm applies to its codes: one step, the unfused steps' bits, the reference's."""
    if not host_runs("x86-64-v4"):
        pytest.skip("this host does not run x86-64-v4 code")
    model = _gelu_linear(dtype)
    fused = compile_model(model, tmp_path / "fused", cpu="x86-64-v4", golden_cases=0)
    with monkeypatch.context() as patch:
        patch.setattr(manager, "FuseQGemmAdd", _Off)
        patch.setattr(manager, "ComposeQBinary", _Off)
        unfused = compile_model(model, tmp_path / "unfused", cpu="x86-64-v4", golden_cases=0)
    integer = {"QGemm", "QBinary", "QLookup", "QChannelLookup"}
    assert {k: v for k, v in _steps(fused).items() if k in integer} == {"QGemm": 1}, _steps(fused)
    assert _steps(unfused)["QBinary"] == 2, _steps(unfused)
    graph = optimize(import_model(model), 3, target="cpu")
    for seed in (0, 1):
        feeds = {"x": _feeds(seed)["x"]}
        want = _run(unfused, feeds, 1)[0]
        assert np.array_equal(evaluate(graph, feeds)[0], want)
        for no_amx in ("1", None):
            if no_amx is None:
                monkeypatch.delenv("ONNX_AOT_NO_AMX", raising=False)
            else:
                monkeypatch.setenv("ONNX_AOT_NO_AMX", "1")
            for threads in (1, 2):
                assert np.array_equal(_run(fused, feeds, threads)[0], want), (seed, no_amx, threads)
