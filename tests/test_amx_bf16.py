"""``--precision bf16``'s PackedGemm and ConvNhwc on AMX-BF16 (templates/c/gemm_amx.c.j2, conv_amx.c.j2).

Gemm + bias + Relu cases with M, N and K not multiples of the tiles (16 / 32 rows, 32 columns,
32 k), compiled for ``--cpu x86-64-v3`` (tests/cpu_targets.py: every x86-64 host runs it; the
build carries the AMX loop as inline asm and takes it where the CPU has AMX-BF16):

- the AMX path computes bf16(x) . bf16(w) in fp32 sums: equal to that product (float64 numpy) up
  to fp32 summation (1e-5 of the output's scale), bit for bit the same at 1 and 2 threads, and
  within bf16's rounding bound of the fp32 model (each of x and w moves by at most 2**-9 of itself:
  |err| <= (2 u + u**2) |x| . |w|);
- the fallback (``$ONNX_AOT_NO_AMX=1``, what a CPU without AMX-BF16 runs) is the fp32 product on
  the bf16 weights, the same at 1 and 2 threads;
- the golden self-test (verify) passes on either path; the generated text carries the tile loop
  and the fp32 build of the same model does not;
- convolutions (Conv + residual Add + Relu, NCHW in and out: the NHWC region between) of both AMX
  paths, windows gathered (C not a multiple of 32, or output rows under 7 wide: padding, stride,
  1x1 of two images) and taps read in place (C = 32 / 64: 3x3 and 5x5 with padding, odd sizes,
  stride 2), and windows gathered block by block (several taps: a 7x7 stride-2 stem of 3 channels,
  3x3 of 16 and 48), against onnxruntime on the bf16-rounded weights (and, on AMX, inputs) with the same
  checks; on the vdpbf16ps path the windows read in place from a bf16 image wherever C is even
  (a dilated 3x3 of 34 channels too, odd pixel counts: the last block's rows past them), gathered
  block by block for the 3-channel stem and the 1x1s of a small B, through scratch for a strided
  1x1.
AMX runs skip with the reason where the CPU lacks AMX-BF16.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler import compile_model
from runtime import Session
from runtime.artifact import load_artifact
from runtime.inspection import amx_bf16_steps
from runtime.isa import host_cpu_flags

CPU = "x86-64-v3"  # (tests/cpu_targets.py) runs on every x86-64 host the suite supports
CASES = {"tails": (45, 70, 120), "k_tail": (17, 33, 250), "exact": (64, 64, 64), "wide": (100, 300, 250)}
U = 2.0 ** -9


def _model(m: int, k: int, n: int) -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(m * 7 + k)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["y0"], name="fc"),
             helper.make_node("Relu", ["y0"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "gemm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), w, bias


def _bf16(a: np.ndarray) -> np.ndarray:
    return a.astype(ml_dtypes.bfloat16).astype(np.float32)


# the three paths a bf16 kernel takes at run time, by the environment it reads each run
# ($ONNX_AOT_BF16_DOT=1 takes the vdpbf16ps path wherever the CPU has it, even where it measures
# slower than fp32, as on Intel's; =0 never)
PATHS = {"amx": {}, "dpbf16": {"ONNX_AOT_NO_AMX": "1", "ONNX_AOT_BF16_DOT": "1"},
         "fallback": {"ONNX_AOT_NO_AMX": "1", "ONNX_AOT_BF16_DOT": "0"}}


def _use_path(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Skips where this CPU cannot take ``path``; else sets the environment that selects it."""
    flags = host_cpu_flags() or set()
    if path == "amx" and not {"amx_tile", "amx_bf16"} <= flags:
        pytest.skip("this CPU has no AMX-BF16 (the tile path is not taken here)")
    if path == "dpbf16" and "avx512_bf16" not in flags:
        pytest.skip("this CPU has no AVX512_BF16 (the vdpbf16ps path is not taken here)")
    for name in ("ONNX_AOT_NO_AMX", "ONNX_AOT_BF16_DOT"):
        if name in PATHS[path]:
            monkeypatch.setenv(name, PATHS[path][name])
        else:
            monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def arts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, np.ndarray, np.ndarray]]:
    root = tmp_path_factory.mktemp("amx_bf16")
    out = {}
    for name, (m, k, n) in CASES.items():
        model, w, bias = _model(m, k, n)
        out[name] = (compile_model(model, root / name, cpu=CPU, precision="bf16"), w, bias)
    return out


def _runs(art: Path, x: np.ndarray) -> list[np.ndarray]:
    return [Session(art, threads=threads).run(None, {"x": x})[0] for threads in (1, 2)]


@pytest.mark.parametrize("path", ["amx", "dpbf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_bf16_products_in_fp32_sums(arts: dict, case: str, path: str,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    _use_path(path, monkeypatch)
    art, w, bias = arts[case]
    m, k, _ = CASES[case]
    x = np.random.default_rng(3).standard_normal((m, k)).astype(np.float32)
    one, two = _runs(art, x)
    assert np.array_equal(one, two), "threads 1 and 2 differ"
    exact = np.maximum(_bf16(x).astype(np.float64) @ _bf16(w) + bias, 0)
    scale = np.abs(x).astype(np.float64) @ np.abs(w) + np.abs(bias)
    assert (np.abs(one - exact) <= 1e-5 * scale + 1e-6).all()
    fp32 = np.maximum(x.astype(np.float64) @ w + bias, 0)
    err = np.abs(one - fp32)
    bound = (2 * U + U * U) * (np.abs(x).astype(np.float64) @ np.abs(w)) + 1e-5 * scale
    print(f"{case}: {path} max |err| / max |y| {err.max() / np.abs(fp32).max():.3g}, "
          f"worst err / bound {(err / bound).max():.3f}")
    assert (err <= bound).all() and err.max() > 0
    assert Session(art).verify().ok


@pytest.mark.parametrize("case", list(CASES))
def test_fallback_is_fp32_on_the_bf16_weights(arts: dict, case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _use_path("fallback", monkeypatch)
    art, w, bias = arts[case]
    m, k, _ = CASES[case]
    x = np.random.default_rng(4).standard_normal((m, k)).astype(np.float32)
    one, two = _runs(art, x)
    assert np.array_equal(one, two), "threads 1 and 2 differ"
    np.testing.assert_allclose(one, np.maximum(x @ _bf16(w) + bias, 0), rtol=1e-4, atol=1e-4)
    assert Session(art).verify().ok


def test_the_steps_and_the_text(arts: dict, tmp_path: Path) -> None:
    art = arts["tails"][0]
    assert [s.op_type for s in amx_bf16_steps(load_artifact(art).plan)] == ["PackedGemm"]
    text = (art / "kernels" / "cpu" / "model.c").read_text()
    assert "tdpbf16ps" in text and "onnx_aot_amx_usable(ONNX_AOT_AMX_BF16)" in text
    assert "_mm512_dpbf16_ps" in text and "onnx_aot_dpbf16_usable()" in text
    model = _model(*CASES["tails"])[0]
    fp32 = compile_model(model, tmp_path / "fp32", cpu=CPU)
    assert "tdpbf16ps" not in (fp32 / "kernels" / "cpu" / "model.c").read_text()
    # half the weight bytes: B's 70 x 120 floats (k padded to 96, columns to 128) as bf16 codes
    assert (art / "weights.bin").stat().st_size < (fp32 / "weights.bin").stat().st_size


def test_the_gate_times_sixteen_chains(arts: dict) -> None:
    """The run-time gate compares throughput: each build's chains function issues sixteen
    independent vdpbf16ps and sixteen fp32 FMAs a round. At -O3 a sink of one accumulator let the
    compiler keep one chain of each, timing latency (6 against 4 cycles on AMD Zen 4: 1.33x, under
    the 1.5x bar, so Zen 4 ran the fp32 fallback though vdpbf16ps does 2.0x there)."""
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("no objdump here to read the built kernels")
    libs = sorted((arts["tails"][0] / "kernels" / "cpu").rglob("model.so"))
    assert libs
    for lib in libs:
        text = subprocess.run([objdump, "-d", "--no-show-raw-insn", str(lib)], capture_output=True,
                              text=True, check=True).stdout
        counts = {"vdpbf16ps": 0, "vfmadd": 0}
        inside = False
        for line in text.splitlines():
            if line.endswith(">:"):
                inside = "<onnx_aot_dpbf16_chains" in line
            elif inside:
                for op in counts:
                    counts[op] += op in line and "zmm" in line
        assert counts["vdpbf16ps"] >= 16 and counts["vfmadd"] >= 16, (lib, counts)


# conv cases: (N, C, H, W, M, kernel, stride, pad); "taps" ones have C % 32 == 0 and outputs >= 7 wide
# (each with K x M >= min_pixel_products, or K >= min_deep_k into M >= min_deep_m, bf16_cost.RULES["amx"]:
# "gather_deep", 144 x 48, "small_1x1", 64 x 64, "stem_7x7" (3 channels: stem_min_taps); smaller
# convs stay fp32). FUSED:
# the windows gathered block by block (conv_amx_fused.c.j2: not read in place, B in cache)
FUSED = {"gather_pad", "gather_1x1", "gather_s2", "gather_deep", "stem_7x7", "small_1x1"}
CONVS = {"gather_pad": (1, 16, 9, 9, 96, 3, 1, 1), "gather_1x1": (2, 40, 7, 7, 330, 1, 1, 0),
         "gather_deep": (1, 16, 15, 13, 48, 3, 1, 1), "stem_7x7": (1, 3, 29, 31, 64, 7, 2, 3),
         "small_1x1": (1, 64, 12, 10, 64, 1, 1, 0),
         "gather_s2": (1, 48, 14, 14, 40, 3, 2, 1), "taps_3x3": (2, 32, 13, 17, 48, 3, 1, 1),
         "taps_5x5": (1, 64, 20, 14, 48, 5, 1, 2), "taps_s2": (1, 32, 30, 27, 50, 3, 2, 1),
         "gather_dilated": (1, 34, 11, 13, 40, 3, 1, 2, 2), "taps_1x1_s2": (1, 64, 15, 13, 64, 1, 2, 0)}
# (a ninth field: the dilation.) The vdpbf16ps path reads the windows in place from a bf16 image
# ("dpbfc": C even, not a 1x1 of fp32 input that is strided or gathered block by block), else
# gathers them block by block ("dpbfg", where the AMX path does) or through scratch ("amxa" + "dpbf")


def _in_place(name: str) -> bool:
    """The vdpbf16ps path of case ``name`` reads its windows in place (see above)."""
    c, k, s = CONVS[name][1], CONVS[name][5], CONVS[name][6]
    return c % 2 == 0 and not (k == 1 and (s > 1 or name in FUSED))


def _conv_model(case: tuple[int, ...], w: np.ndarray) -> onnx.ModelProto:
    n, c, h, wd, m, k, s, p = case[:8]
    d = case[8] if len(case) > 8 else 1
    oh, ow = (h + 2 * p - d * (k - 1) - 1) // s + 1, (wd + 2 * p - d * (k - 1) - 1) // s + 1
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", kernel_shape=[k, k],
                              strides=[s, s], pads=[p] * 4, dilations=[d, d]),
             helper.make_node("Add", ["c", "z"], ["s"], name="residual"),
             helper.make_node("Relu", ["s"], ["y"], name="relu")]
    bias = np.linspace(-1, 1, m, dtype=np.float32)
    io = [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
          for name, shape in (("x", [n, c, h, wd]), ("z", [n, m, oh, ow]), ("y", [n, m, oh, ow]))]
    graph = helper.make_graph(nodes, "conv", io[:2], io[2:],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def conv_arts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, onnx.ModelProto, Any]]:
    root = tmp_path_factory.mktemp("amx_conv")
    out = {}
    for name, case in CONVS.items():
        n, c, _, _, m, k = case[:6]
        w = (np.random.default_rng(m).standard_normal((m, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
        model = _conv_model(case, w)
        out[name] = (compile_model(model, root / name, cpu=CPU, precision="bf16"), model, w)
    return out


def _ort(model: onnx.ModelProto, w: np.ndarray, feeds: dict[str, np.ndarray]) -> np.ndarray:
    import onnxruntime as ort

    rounded = onnx.ModelProto()
    rounded.CopyFrom(model)
    rounded.graph.initializer[0].CopyFrom(numpy_helper.from_array(_bf16(w), "w"))
    session = ort.InferenceSession(rounded.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("case", list(CONVS))
def test_conv_on_each_path(conv_arts: dict, case: str, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _use_path(path, monkeypatch)
    amx = path != "fallback"  # both bf16 paths round the input
    art, model, w = conv_arts[case]
    rng = np.random.default_rng(5)
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    feeds = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
    one, two = (Session(art, threads=threads).run(None, feeds)[0] for threads in (1, 2))
    assert np.array_equal(one, two), "threads 1 and 2 differ"
    want = _ort(model, w, {**feeds, "x": _bf16(feeds["x"])} if amx else feeds)
    np.testing.assert_allclose(one, want, rtol=1e-4, atol=1e-4)
    assert Session(art).verify().ok
    plan = load_artifact(art).plan
    assert [s.op_type for s in amx_bf16_steps(plan)] == ["ConvNhwc"]
    text = (art / "kernels" / "cpu" / "model.c").read_text()
    assert ("_amxtap_task" in text) == case.startswith("taps") and "zp" in text  # the residual fused
    assert ("_amxg_task" in text) == (case in FUSED)
    in_place = _in_place(case)
    assert ("_dpbfc_task" in text) == in_place
    assert ("_dpbfg_task" in text) == (case in FUSED and not in_place)
