"""``--precision bf16``: BatchNorm (+ Mul / Add) + Relu ahead of a 1x1 conv done in the conv's input
pass (compiler/passes/fuse_conv_prescale.py, templates/c/gemm_amx.c.j2's ``*_row_pre``).

DenseNet's form: x -> BatchNormalization -> Mul / Add by per-channel constants -> Relu -> Conv 1x1
(+ bias), compiled for ``--cpu x86-64-v3`` (tests/cpu_targets.py). The FusedElementwise goes (the
conv's S / T inputs hold the folded affine); on AMX-BF16 the result is bf16(relu(x * S + T)) .
bf16(w) in fp32 sums, within bf16's rounding bound of the fp32 model; so on the vdpbf16ps path
(``$ONNX_AOT_NO_AMX=1``, ``$ONNX_AOT_BF16_DOT=1``); the fallback (``$ONNX_AOT_NO_AMX=1``,
``$ONNX_AOT_BF16_DOT=0``) is the fp32 conv of relu(x * S + T) on the bf16 weights; both bit for
bit the same at 1 and 2 threads, and the golden self-test passes. A padded 3x3 conv keeps its
FusedElementwise (a padded pixel is 0, not T).
"""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler import compile_model
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.passes.fuse_conv_prescale import affine_of
from runtime import Session
from runtime.artifact import load_artifact
from runtime.contract import AOT_DOMAIN
from runtime.contract import FUSED_ELEMENTWISE
from runtime.contract import op_name
from runtime.inspection import amx_bf16_steps
from runtime.isa import host_cpu_flags

CPU = "x86-64-v3"  # (tests/cpu_targets.py) runs on every x86-64 host the suite supports
U = 2.0 ** -9
# (N, C, H, W, M): K x M >= bf16_cost.RULES["amx"].min_pixel_products; C not a multiple of 32 in one
# "big_b": B over gemm_bf16.ROWS_OUTER_MAX_B, so rounded in its own pass (gemm_amx.c.j2's "amxa"), the
# others gathered block by block (conv_amx_fused.c.j2)
CASES = {"one_image": (1, 96, 9, 11, 160), "two_images": (2, 72, 7, 5, 200), "big_b": (1, 512, 3, 5, 600)}


def _params(c: int, m: int, k: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(c + m)
    p = {"w": rng.standard_normal((m, c, k, k)) / np.sqrt(c * k * k), "b": rng.standard_normal(m),
         "scale": rng.uniform(0.5, 1.5, c), "shift": rng.standard_normal(c), "mean": rng.standard_normal(c),
         "var": rng.uniform(0.5, 2, c), "s2": rng.uniform(0.5, 2, (1, c, 1, 1)),
         "t2": rng.standard_normal((1, c, 1, 1))}
    return {name: v.astype(np.float32) for name, v in p.items()}


def _model(case: tuple[int, ...], k: int = 1) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    n, c, h, w, m = case
    p = _params(c, m, k)
    bn = ["x", "scale", "shift", "mean", "var"]
    nodes = [helper.make_node("BatchNormalization", bn, ["bn"], name="bn"),
             helper.make_node("Mul", ["bn", "s2"], ["sc"], name="mul"),
             helper.make_node("Add", ["sc", "t2"], ["sh"], name="add"),
             helper.make_node("Relu", ["sh"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w", "b"], ["y"], name="conv", kernel_shape=[k, k],
                              pads=[k // 2] * 4)]
    io = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, h, w]),
          helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, m, h, w])]
    graph = helper.make_graph(nodes, "prescale", io[:1], io[1:],
                              [numpy_helper.from_array(v, name) for name, v in p.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), p


def _pre(x: np.ndarray, p: dict[str, np.ndarray]) -> np.ndarray:
    """relu(BN(x) * s2 + t2) in float64, NCHW."""
    ch = (1, -1, 1, 1)
    bn = ((x - p["mean"].reshape(ch)) / np.sqrt(p["var"].reshape(ch).astype(np.float64) + 1e-5)
          * p["scale"].reshape(ch) + p["shift"].reshape(ch))
    return np.maximum(bn * p["s2"] + p["t2"], 0)


def _conv1x1(a: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    y = np.einsum("nchw,mc->nmhw", a.astype(np.float64), w[:, :, 0, 0].astype(np.float64))
    return y if b is None else y + b.reshape(1, -1, 1, 1)


@pytest.fixture(scope="module")
def arts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bf16_prescale")
    return {name: compile_model(_model(case)[0], root / name, cpu=CPU, precision="bf16")
            for name, case in CASES.items()}


def _bf16(a: np.ndarray) -> np.ndarray:
    return a.astype(ml_dtypes.bfloat16).astype(np.float32)


@pytest.mark.parametrize("path", ["amx", "dpbf16", "fallback"])
@pytest.mark.parametrize("case", list(CASES))
def test_prescaled_conv_on_both_paths(arts: dict, case: str, path: str,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    flags = host_cpu_flags()
    if path == "amx" and (flags is None or not {"amx_tile", "amx_bf16"} <= flags):
        pytest.skip("this CPU has no AMX-BF16 (the tile path is not taken here)")
    if path == "dpbf16" and (flags is None or "avx512_bf16" not in flags):
        pytest.skip("this CPU has no AVX512_BF16 (the vdpbf16ps path is not taken here)")
    # the paths bf16 products take (amx, dpbf16: bf16 A in fp32 sums) and the fp32 fallback
    amx = path != "fallback"
    if path == "amx":
        monkeypatch.delenv("ONNX_AOT_NO_AMX", raising=False)
    else:
        monkeypatch.setenv("ONNX_AOT_NO_AMX", "1")
    monkeypatch.setenv("ONNX_AOT_BF16_DOT", "1" if path == "dpbf16" else "0")
    art = arts[case]
    n, c, h, w, m = CASES[case]
    p = _model(CASES[case])[1]
    plan = load_artifact(art).plan
    assert [s.op_type for s in plan.steps if s.op_type in ("FusedElementwise", "ConvNhwc")] == ["ConvNhwc"]
    assert ("_amxg_task" in (art / "kernels" / "cpu" / "model.c").read_text()) == (case != "big_b")
    x = np.random.default_rng(6).standard_normal((n, c, h, w)).astype(np.float32)
    one, two = (Session(art, threads=threads).run(None, {"x": x})[0] for threads in (1, 2))
    assert np.array_equal(one, two), "threads 1 and 2 differ"
    a, wb = _pre(x, p), _bf16(p["w"])
    fp32 = _conv1x1(a, p["w"], p["b"])
    scale = _conv1x1(np.abs(a), np.abs(p["w"]), np.abs(p["b"]))
    if amx:  # bf16 rounding of the activations and the weights: each moves by at most 2**-9 of itself
        err = np.abs(one - fp32)
        bound = (2 * U + U * U) * _conv1x1(np.abs(a), np.abs(p["w"]), None) + 2e-5 * scale
        print(f"{case}: max |err| / max |y| {err.max() / np.abs(fp32).max():.3g}, worst / bound "
              f"{(err / bound).max():.3f}")
        assert (err <= bound).all() and err.max() > 0
    else:
        assert (np.abs(one - _conv1x1(a, wb, p["b"])) <= 2e-5 * scale + 1e-6).all()
    assert Session(art).verify().ok


def test_a_padded_conv_keeps_its_elementwise(tmp_path: Path) -> None:
    art = compile_model(_model((1, 32, 9, 9, 48), k=3)[0], tmp_path / "pad", cpu=CPU, precision="bf16")
    ops = [s.op_type for s in load_artifact(art).plan.steps]
    assert "FusedElementwise" in ops and "ConvNhwc" in ops


def _fe(program: list[dict], consts: list[np.ndarray]) -> Node:
    g = Graph("t")
    x = g.make_value("x", np.dtype(np.float32), (1, 2, 2, 3))
    inputs = [x, *(g.add_constant(f"c{i}", c) for i, c in enumerate(consts))]
    return Node(op_name(FUSED_ELEMENTWISE), inputs, [g.make_value("y", np.dtype(np.float32), (1, 2, 2, 3))],
                attrs={"program": program}, domain=AOT_DOMAIN)


def test_affine_of_folds_mul_add_relu_only() -> None:
    s, t = np.array([2, 3, 4], np.float32).reshape(1, 1, 1, 3), np.array([1, -1, 0.5], np.float32)
    ok = _fe([{"op": "Mul", "args": ["i1", "i0"]}, {"op": "Add", "args": ["t0", "i2"]},
              {"op": "Relu", "args": ["t1"]}], [s, t])
    got = affine_of(ok, 3)
    assert got is not None
    np.testing.assert_array_equal(got[0], [2, 3, 4])
    np.testing.assert_array_equal(got[1], [1, -1, 0.5])
    assert got[2] == 1
    assert affine_of(_fe([{"op": "Sub", "args": ["i0", "i1"]}], [s]), 3) is None
    relu_first = [{"op": "Relu", "args": ["i0"]}, {"op": "Mul", "args": ["t0", "i1"]}]
    assert affine_of(_fe(relu_first, [s]), 3) is None
    full = np.ones((1, 2, 2, 3), np.float32)  # not per channel
    assert affine_of(_fe([{"op": "Mul", "args": ["i0", "i1"]}], [full]), 3) is None


def test_a_prescaled_conv_put_back_in_fp32_stays_on_c(tmp_path: Path) -> None:
    """``--max-error`` putting the prescaled conv back in fp32: its affine goes back ahead of it as
    Mul, Add and Relu steps (compiler/accuracy/bf16.py), so every step stays on the C kernels, and
    the result is the fp32 model's."""
    model, p = _model(CASES["one_image"])
    art = compile_model(model, tmp_path / "restored", cpu=CPU, precision="bf16", max_error=1e-5)
    plan = load_artifact(art).plan
    assert {s.provider for s in plan.steps} == {"c"}, [(s.op_type, s.provider) for s in plan.steps]
    kinds = [s.op_type for s in plan.steps]
    assert "ConvNhwc" in kinds and not amx_bf16_steps(plan), kinds
    n, c, h, w, _ = CASES["one_image"]
    x = np.random.default_rng(7).standard_normal((n, c, h, w)).astype(np.float32)
    got = Session(art).run(None, {"x": x})[0]
    want = _conv1x1(_pre(x, p), p["w"], p["b"])
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
