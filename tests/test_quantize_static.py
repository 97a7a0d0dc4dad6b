"""``--quantize int8 --calibration``: post-training static quantization inside the compiler.

A small CNN (Conv + BatchNormalization + Relu, MaxPool, a residual Add + Relu, GlobalAveragePool,
Flatten, Gemm: the way exporters write it) and a small encoder-like MatMul graph (MatMul + bias
Add, attention MatMuls, Softmax, LayerNormalization, GELU) are quantized by the compiler on seeded
calibration feeds and compiled: the artifact runs integer steps (PackedQConv / QGemm), and its error
against the fp32 model (max |int8 - fp32| / max |fp32|, on feeds not used to calibrate) is at most
1.25x what onnxruntime's ``quantize_static`` (QDQ, S8S8, per channel, its ``quant_pre_process``
first, the same feeds and method) reaches, + 0.005, for each of the three methods. Bad calibration
data and options fail with the project's errors, naming the input or the file.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler import compile_model
from compiler.quantize import CalibrationError
from runtime import Session
from runtime.errors import CompileError
from tests.support.encoder_model import encoder_feeds
from tests.support.encoder_model import encoder_model
from tests.support.ort_quantize import ort_quantized
from tests.support.qdq_models import stray

SAMPLES = 8


def small_cnn(seed: int = 0) -> onnx.ModelProto:
    """Conv-BN-Relu, MaxPool, Conv-BN + residual Add + Relu, GlobalAveragePool, Flatten, Gemm."""
    rng = np.random.default_rng(seed)
    inits: list[onnx.TensorProto] = []

    def const(name: str, array: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(array.astype(np.float32), name))
        return name

    def conv_bn(name: str, x: str, c_in: int, c_out: int, k: int) -> list[onnx.NodeProto]:
        w = const(f"{name}.w", rng.standard_normal((c_out, c_in, k, k)) / np.sqrt(c_in * k * k))
        bn = [const(f"{name}.{p}", v) for p, v in (("g", rng.uniform(0.5, 1.5, c_out)),
                                                    ("b", rng.uniform(-0.2, 0.2, c_out)),
                                                    ("m", rng.uniform(-0.2, 0.2, c_out)),
                                                    ("v", rng.uniform(0.5, 1.5, c_out)))]
        return [helper.make_node("Conv", [x, w], [f"{name}.c"], name=f"/{name}/Conv", pads=[k // 2] * 4),
                helper.make_node("BatchNormalization", [f"{name}.c", *bn], [f"{name}.bn"],
                                 name=f"/{name}/BN")]

    nodes = [*conv_bn("c1", "image", 3, 16, 3),
             helper.make_node("Relu", ["c1.bn"], ["r1"], name="/r1/Relu"),
             helper.make_node("MaxPool", ["r1"], ["p1"], name="/p1/MaxPool", kernel_shape=[2, 2],
                              strides=[2, 2]),
             *conv_bn("c2", "p1", 16, 16, 3),
             helper.make_node("Add", ["c2.bn", "p1"], ["res"], name="/res/Add"),
             helper.make_node("Relu", ["res"], ["r2"], name="/r2/Relu"),
             helper.make_node("GlobalAveragePool", ["r2"], ["gap"], name="/gap/GlobalAveragePool"),
             helper.make_node("Flatten", ["gap"], ["flat"], name="/flat/Flatten"),
             helper.make_node("Gemm", ["flat", const("fc.w", rng.standard_normal((10, 16)) / 4),
                                       const("fc.b", rng.standard_normal(10) * 0.1)], ["logits"],
                              name="/fc/Gemm", transB=1)]
    image = helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 16, 16])
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])
    graph = helper.make_graph(nodes, "cnn", [image], [logits], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def cnn_feeds(seed: int) -> dict[str, np.ndarray]:
    return {"image": np.random.default_rng(seed).standard_normal((1, 3, 16, 16)).astype(np.float32)}


ENCODER = {"layers": 1, "hidden": 64, "heads": 4, "ffn": 128, "seq": 16}


def test_the_placement_is_onnxruntimes_qdq_form() -> None:
    """BatchNormalization folded; the Relus kept after their Conv / Add with their outputs quantized;
    MaxPool and Flatten at their inputs' scales; weights per output channel, int32 biases."""
    from compiler.quantize.prepare import prepare_model
    from compiler.quantize.qdq_plan import plan_qdq

    prepared = prepare_model(small_cnn())
    assert [n.op_type for n in prepared.graph.node] == ["Conv", "Relu", "MaxPool", "Conv", "Add", "Relu",
                                                        "GlobalAveragePool", "Flatten", "Gemm"]
    plan = plan_qdq(prepared)
    assert plan.own == ["image", "r1", "c2.bn", "r2", "gap", "logits"]
    assert plan.same == {"p1": "r1", "flat": "gap"}
    assert plan.weights == {(0, 1): 0, (3, 1): 0, (8, 1): 0}  # Gemm transB=1: axis 0 of B
    assert plan.biases == {(0, 2): ("image", 1), (3, 2): ("p1", 1), (8, 2): ("flat", 1)}


def small_encoder() -> onnx.ModelProto:
    return encoder_model(**ENCODER, seed=3)


CASES = {"cnn": (small_cnn, lambda model, seed: cnn_feeds(seed), "PackedQConv"),
         "encoder": (lambda: small_encoder(), lambda model, seed: encoder_feeds(model, seed=seed), "QGemm")}


def stacked(feeds: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The calibration file's arrays: each input's samples along a new leading axis."""
    return {name: np.stack([f[name] for f in feeds]) for name in feeds[0]}


@pytest.mark.parametrize("method", ["minmax", "entropy", "percentile"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_quantized_compile_strays_no_more_than_onnxruntime(tmp_path: Path, case: str, method: str) -> None:
    import onnxruntime as ort

    build, feeds_of, integer_op = CASES[case]
    model = build()
    onnx.save(model, tmp_path / "fp.onnx")
    calibration = [feeds_of(model, seed) for seed in range(SAMPLES)]
    np.savez(tmp_path / "cal.npz", **stacked(calibration))
    lines: list[str] = []
    artifact = compile_model(tmp_path / "fp.onnx", tmp_path / "a", quantize="int8",
                             calibration=tmp_path / "cal.npz", calibration_method=method, golden_cases=1,
                             progress=lines.append)
    assert any(line.startswith("int8 error against fp32") for line in lines), lines[-3:]
    assert sum("calibrating" in line for line in lines) == SAMPLES * (1 if method == "minmax" else 2)
    plan = json.loads((artifact / "plan.json").read_text(encoding="utf-8"))
    assert integer_op in {s["op_type"] for s in plan["steps"]}, sorted({s["op_type"] for s in plan["steps"]})
    manifest = json.loads((artifact / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["options"]["quantize"]["method"] == method
    assert manifest["options"]["quantize"]["samples"] == SAMPLES
    theirs = ort.InferenceSession(str(ort_quantized(tmp_path / "fp.onnx", tmp_path / "ort.onnx", calibration,
                                                    method)))
    exact, ours = ort.InferenceSession(str(tmp_path / "fp.onnx")), Session(artifact)
    held_out = [feeds_of(model, 100 + seed) for seed in range(3)]
    ref = [exact.run(None, f) for f in held_out]
    ort_stray = max(stray(theirs.run(None, f), r) for f, r in zip(held_out, ref, strict=True))
    our_stray = max(stray(ours.run(None, f), r) for f, r in zip(held_out, ref, strict=True))
    assert ort_stray > 0.0, "onnxruntime's int8 model equals the fp32 one: nothing quantized"
    assert our_stray <= 1.25 * ort_stray + 0.005, (our_stray, ort_stray)


def test_the_calibration_file_may_leave_out_a_batch_dim_of_1(tmp_path: Path) -> None:
    model = small_cnn()
    images = np.stack([cnn_feeds(seed)["image"][0] for seed in range(2)])  # (2, 3, 16, 16)
    np.savez(tmp_path / "cal.npz", image=images)
    artifact = compile_model(model, tmp_path / "a", quantize="int8", calibration=tmp_path / "cal.npz",
                             golden_cases=1)
    manifest = json.loads((artifact / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["options"]["quantize"]["samples"] == 2


BAD_DATA = {
    "missing": ({"other": np.zeros((2, 1, 3, 16, 16), np.float32)},
                "holds arrays for no input of the model: other"),
    "no image": ({}, "no array for input 'image'"),
    "shape": ({"image": np.zeros((2, 1, 3, 8, 8), np.float32)}, "input 'image' has shape (1, 3, 16, 16)"),
    "few": ({"image": np.zeros((0, 1, 3, 16, 16), np.float32)}, "0 samples; at least 1"),
    "nan": ({"image": np.stack([np.zeros((1, 3, 16, 16)), np.full((1, 3, 16, 16), np.nan)])
             .astype(np.float32)}, "sample 1 holds NaN or Inf"),
    "dtype": ({"image": np.zeros((2, 1, 3, 16, 16), np.int64)}, "input 'image' is float32, its array int64"),
}


@pytest.mark.parametrize("bad", sorted(BAD_DATA))
def test_bad_calibration_data_is_refused_naming_the_input_and_file(tmp_path: Path, bad: str) -> None:
    arrays, message = BAD_DATA[bad]
    path = tmp_path / "cal.npz"
    np.savez(path, **arrays)
    with pytest.raises(CalibrationError, match=re.escape(message)) as caught:
        compile_model(small_cnn(), tmp_path / "a", quantize="int8", calibration=path)
    assert str(path) in str(caught.value)
    assert not (tmp_path / "a").exists()


def test_a_calibration_file_that_is_not_npz_is_refused(tmp_path: Path) -> None:
    (tmp_path / "cal.npz").write_text("not a zip", encoding="utf-8")
    with pytest.raises(CalibrationError, match="cal.npz: cannot read it as .npz"):
        compile_model(small_cnn(), tmp_path / "a", quantize="int8", calibration=tmp_path / "cal.npz")
    with pytest.raises(CalibrationError, match="no such file"):
        compile_model(small_cnn(), tmp_path / "a", quantize="int8", calibration=tmp_path / "none.npz")


@pytest.mark.parametrize(("options", "message"), [
    ({"quantize": "int8"}, "--quantize int8 needs --calibration DATA.npz"),
    ({"quantize": "int8", "calibration": {}, "precision": "bf16"}, "does not combine with --precision bf16"),
    ({"quantize": "int4", "calibration": {}}, "--quantize must be one of int8"),
    ({"quantize": "int8", "calibration": {}, "calibration_method": "kl"},
     "--calibration-method must be one of"),
    ({"calibration": {}}, "--calibration is only read with --quantize int8"),
])
def test_options_that_do_not_go_together_are_refused(tmp_path: Path, options: dict, message: str) -> None:
    with pytest.raises(CompileError, match=re.escape(message)):
        compile_model(small_cnn(), tmp_path / "a", **options)


def test_the_command_line_quantizes_and_inspect_shows_how(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from compiler.cli import main

    onnx.save(small_cnn(), tmp_path / "fp.onnx")
    np.savez(tmp_path / "cal.npz", image=np.stack([cnn_feeds(seed)["image"] for seed in range(3)]))
    assert main(["compile", str(tmp_path / "fp.onnx"), "-o", str(tmp_path / "b"), "--quantize", "int8"]) == 1
    assert "--quantize int8 needs --calibration" in capsys.readouterr().err
    assert main(["compile", str(tmp_path / "fp.onnx"), "-o", str(tmp_path / "a"), "--quantize", "int8",
                 "--calibration", str(tmp_path / "cal.npz"), "--calibration-method", "percentile",
                 "--golden-cases", "1"]) == 0
    err = capsys.readouterr().err
    assert "calibrating (percentile): feed 3/3, pass 2/2" in err
    assert "int8 error against fp32 on the 3 calibration feed(s)" in err and "logits 0.0" in err
    assert main(["inspect", str(tmp_path / "a")]) == 0
    assert "quantized: int8 (post-training static, --calibration-method percentile, 3 calibration samples" \
        in capsys.readouterr().out
