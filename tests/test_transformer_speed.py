"""Issue 20: transformer encoders (``tests/support/encoder_model.py``, the form PyTorch exports)
compiled for the C target: every linear layer is one packed Gemm with its bias in the epilogue, the
attention of a layer one MultiHeadAttention step, and the model agrees with onnxruntime (rtol 1e-3 /
atol 1e-4) at every x86-64 level. Odd sizes (hidden 120 and FFN 248: a tail panel; head 30, seq 20)
put the kernels on their tail paths.
``scripts/bench_encoder.py`` measures the speed; its smoke run is here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler.driver import compile_model
from runtime import Session
from tests.cpu_targets import host_runs
from tests.cpu_targets import level_params
from tests.support.encoder_model import encoder_feeds
from tests.support.encoder_model import encoder_model
from tests.support.models import ort_run

SMALL = {"layers": 2, "hidden": 120, "heads": 4, "ffn": 248, "seq": 20}


def _steps(artifact: Path) -> list[dict[str, object]]:
    return list(json.loads((artifact / "plan.json").read_text())["steps"])


@pytest.mark.parametrize("level", level_params())
def test_encoder_matches_onnxruntime_at_every_level(level: str, tmp_path: Path) -> None:
    model = encoder_model(**SMALL)
    out = compile_model(model, tmp_path / "enc", cpu=level, golden_cases=0)
    steps = _steps(out)
    assert {s["provider"] for s in steps} == {"c"}
    linear = [s for s in steps if s["op_type"] == "PackedGemm"]
    assert len(linear) == 6 * SMALL["layers"]  # q, k, v, output, FFN up and down: each with its bias Add
    assert all(any(str(n).endswith("/Add") for n in s["onnx_nodes"]) for s in linear)  # type: ignore[attr-defined]
    assert not any(s["op_type"] in ("MatMul", "Transpose", "Softmax") for s in steps)
    assert len([s for s in steps if s["op_type"] == "MultiHeadAttention"]) == SMALL["layers"]
    if not host_runs(level):
        return
    feeds = encoder_feeds(model)
    (got,) = Session(out).run(None, feeds)
    (want,) = ort_run(model, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("level", level_params())
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_rows_run_on_vectors_at_every_level(op: str, level: str, tmp_path: Path) -> None:
    """Softmax along a contiguous last axis: vexp over whole vectors, sexp for the tail (37 = 2 x 16
    + 5), a -inf (masked) entry, a row of large values, a NaN (its row all NaN, as numpy's);
    LogSoftmax the same way."""
    x = np.random.default_rng(1).standard_normal((6, 37)).astype(np.float32) * 4
    x[2] += 80.0
    x[1, 3], x[3, 20] = -np.inf, np.nan
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"], axis=-1)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    out = compile_model(model, tmp_path / "s", cpu=level, golden_cases=0)
    source = (out / "kernels" / "cpu" / "model.c").read_text()
    assert "vexp(vload(xp + l) - m)" in source and "sexp(xp[t] - mx)" in source
    if not host_runs(level):
        return
    (got,) = Session(out).run(None, {"x": x})
    shifted = x.astype(np.float64) - x.max(axis=1, keepdims=True)
    lse = np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    want = shifted - lse if op == "LogSoftmax" else np.exp(shifted - lse)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _attention_model(b: int, sq: int, sk: int, h: int, d: int, dv: int,
                     mask: tuple[int, ...] | None) -> onnx.ModelProto:
    """softmax(Q K^T * 0.3 (+ mask)) V over heads split from (b, s, h * d) inputs, PyTorch's form."""
    nodes = [helper.make_node("Reshape", [f"{n}2", f"{n}_shape"], [f"{n}h"]) for n in "qkv"]
    nodes += [helper.make_node("Transpose", ["qh"], ["qt"], perm=[0, 2, 1, 3]),
              helper.make_node("Transpose", ["kh"], ["kt"], perm=[0, 2, 3, 1]),
              helper.make_node("Transpose", ["vh"], ["vt"], perm=[0, 2, 1, 3]),
              helper.make_node("MatMul", ["qt", "kt"], ["s"]),
              helper.make_node("Mul", ["s", "scale"], ["scaled" if mask else "masked"])]
    if mask:
        nodes.append(helper.make_node("Add", ["m", "scaled"], ["masked"]))
    nodes += [helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "vt"], ["c"]),
              helper.make_node("Transpose", ["c"], ["y"], perm=[0, 2, 1, 3])]
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info(n, f, shape)
              for n, shape in (("q2", [b, sq, h * d]), ("k2", [b, sk, h * d]), ("v2", [b, sk, h * dv]))]
    if mask:
        inputs.append(helper.make_tensor_value_info("m", f, list(mask)))
    inits = [numpy_helper.from_array(np.array(shape, np.int64), f"{n}_shape")
             for n, shape in (("q", [b, sq, h, d]), ("k", [b, sk, h, d]), ("v", [b, sk, h, dv]))]
    inits.append(numpy_helper.from_array(np.array(0.3, np.float32), "scale"))
    outputs = [helper.make_tensor_value_info("y", f, [b, sq, h, dv])]
    graph = helper.make_graph(nodes, "attention", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("level", level_params())
@pytest.mark.parametrize(("b", "sq", "sk", "h", "d", "dv", "mask"), [
    (2, 5, 19, 3, 8, 12, (2, 1, 5, 19)),  # a mask per batch and query row; tail rows, tail panel of V
    (1, 13, 3, 2, 20, 4, None),  # fewer keys than a vector: the scalar softmax
    (1, 40, 70, 2, 16, 16, (1, 70)),  # two panels of keys, a per-key mask broadcast over everything else
])
def test_fused_attention_at_every_level(level: str, b: int, sq: int, sk: int, h: int, d: int, dv: int,
                                        mask: tuple[int, ...] | None, tmp_path: Path) -> None:
    """The eight attention steps become one MultiHeadAttention step (K^T packed in scratch, scores on
    the GEMM tile, the softmax per row in L1, V read in place); it agrees with numpy."""
    model = _attention_model(b, sq, sk, h, d, dv, mask)
    out = compile_model(model, tmp_path / "a", cpu=level, golden_cases=0)
    assert [s["op_type"] for s in _steps(out) if s["op_type"] != "Reshape"] == ["MultiHeadAttention"]
    if not host_runs(level):
        return
    rng = np.random.default_rng(3)
    feeds = {"q2": rng.standard_normal((b, sq, h * d)), "k2": rng.standard_normal((b, sk, h * d)),
             "v2": rng.standard_normal((b, sk, h * dv))}
    if mask:
        feeds["m"] = np.where(rng.random(mask) < 0.2, -10000.0, rng.standard_normal(mask))
    feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
    (got,) = Session(out).run(None, feeds)
    q, k, v = (feeds[n].astype(np.float64).reshape(b, -1, h, e).transpose(0, 2, 1, 3)
               for n, e in (("q2", d), ("k2", d), ("v2", dv)))
    scores = q @ k.transpose(0, 1, 3, 2) * 0.3 + (feeds["m"].astype(np.float64) if mask else 0.0)
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
    want = (probs / probs.sum(axis=-1, keepdims=True) @ v).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_bench_encoder_script_smoke() -> None:
    command = [sys.executable, "-m", "scripts.bench_encoder", "--smoke", "--model", "minilm",
               "--threads", "1", "--profile"]
    repo = Path(__file__).resolve().parents[1]
    result = subprocess.run(command, capture_output=True, text=True, cwd=repo, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "minilm threads 1: onnx-aot" in result.stdout and "ratio" in result.stdout
    assert "within tolerance True" in result.stdout and "PackedGemm" in result.stdout
