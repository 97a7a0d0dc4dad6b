"""Weights kept at the width the model ships them in (issue 29 item 6; docs/architecture.md,
"Narrow weights").

A MiniLM-size encoder (hidden 384, 12 heads, FFN 1536; two of its six layers, seq 128) whose
MatMul weights are int8 + Cast * scale, int8 + DequantizeLinear per axis (int8 and uint8 codes),
or fp16 + Cast (``tests/support/narrow_models.py``): weights.bin at most 1.1x the model file, the
weights image widened at load byte for byte the one a ``--wide-weights`` compile stores, outputs
as onnxruntime's, the golden self-test passing. A model without narrow weights compiles exactly
as before (plan format 3, weights.bin the image). The runtime refuses stored records that do not
fit, naming the field.
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

from compiler import compile_model
from compiler.ir.narrow import cast_codes
from runtime import Session
from runtime.artifact import load_artifact
from runtime.errors import ArtifactError
from runtime.inspection import format_text
from runtime.inspection import inspect_artifact
from runtime.plan_schema import NARROW_FORMAT_VERSION
from runtime.plan_schema import OLDEST_FORMAT_VERSION
from tests.support.encoder_model import MINILM
from tests.support.encoder_model import encoder_feeds
from tests.support.encoder_model import encoder_model
from tests.support.narrow_models import narrowed
from tests.support.rehash import write_plan

KINDS = ("cast", "dq", "dq_uint8", "fp16")
SIZE = {**MINILM, "layers": 2}


@pytest.fixture(scope="module")
def encoders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path, Path]]:
    """kind -> (model file, artifact, the --wide-weights artifact of the same model)."""
    root = tmp_path_factory.mktemp("narrow")
    base = encoder_model(**SIZE)
    out = {}
    for kind in KINDS:
        path = root / f"{kind}.onnx"
        onnx.save(narrowed(base, kind), path)
        out[kind] = (path, compile_model(path, root / kind),
                     compile_model(path, root / f"{kind}-wide", narrow_weights=False))
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_weights_stay_narrow_and_widen_to_the_folded_bytes(encoders: dict, kind: str) -> None:
    model, art, wide = encoders[kind]
    weights = (art / "weights.bin").stat().st_size
    assert weights <= 1.1 * model.stat().st_size
    assert (wide / "weights.bin").stat().st_size > (1.9 if kind == "fp16" else 3.9) * weights
    plan = json.loads((art / "plan.json").read_text())
    assert plan["format_version"] == NARROW_FORMAT_VERSION
    stored = [c for c in plan["constants"] if "stored" in c]
    assert len(stored) == 6 * SIZE["layers"]  # q, k, v, attention out, FFN up, FFN down
    widths = {"fp16": {"float16"}, "dq_uint8": {"uint8"}}.get(kind, {"int8"})
    assert {c["stored"]["dtype"] for c in stored} == widths
    assert json.loads((wide / "plan.json").read_text())["format_version"] == OLDEST_FORMAT_VERSION
    # bit for bit the folded float32 weights: the same image, hence the same outputs
    assert load_artifact(art).weights.tobytes() == (wide / "weights.bin").read_bytes()


@pytest.mark.parametrize("kind", KINDS)
def test_outputs_match_onnxruntime_and_the_self_test(encoders: dict, kind: str) -> None:
    model, art, wide = encoders[kind]
    feeds = encoder_feeds(onnx.load(model))
    session = Session(art)
    got = session.run(None, feeds)[0]
    options = ort.SessionOptions()
    if kind.startswith("dq"):  # its optimizer runs DQ + MatMul its own way (0.04 off the plain graph)
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
    np.testing.assert_array_equal(got, Session(wide).run(None, feeds)[0])
    assert session.verify().verified


def test_inspect_reports_weights_against_the_model_file(encoders: dict) -> None:
    model, art, _ = encoders["cast"]
    ins = inspect_artifact(art)
    weights = ins.summary["weights"]
    assert weights["model_nbytes"] == model.stat().st_size
    assert weights["file_nbytes"] == (art / "weights.bin").stat().st_size < weights["image_nbytes"]
    assert weights["stored_narrow"] == 12 and weights["file_to_model"] <= 1.1
    assert f"{weights['stored_narrow']} stored narrow" in format_text(ins)
    assert "stored narrow in weights.bin" in (art / "kernels/cpu/model.h").read_text()


def test_a_model_without_narrow_weights_compiles_as_before(tmp_path: Path) -> None:
    model = tmp_path / "fp32.onnx"
    onnx.save(encoder_model(**{**SIZE, "layers": 1}), model)
    art = compile_model(model, tmp_path / "a")
    wide = compile_model(model, tmp_path / "b", narrow_weights=False)
    plan = json.loads((art / "plan.json").read_text())
    assert plan["format_version"] == OLDEST_FORMAT_VERSION
    assert all("stored" not in c for c in plan["constants"])
    assert plan["weights_nbytes"] == (art / "weights.bin").stat().st_size
    for rel in ("plan.json", "weights.bin", "kernels/cpu/model.c"):
        assert (art / rel).read_bytes() == (wide / rel).read_bytes(), rel


def _conv_model() -> onnx.ModelProto:
    """Cast(int8) * per-channel scale -> Conv -> bias Add, the PP-OCRv6 form (an NHWC-packed conv)."""
    rng = np.random.default_rng(1)
    q = rng.integers(-127, 128, (32, 16, 1, 1)).astype(np.int8)
    scale = (rng.random((32, 1, 1, 1)) * 0.02).astype(np.float32)
    bias = rng.standard_normal((1, 32, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Cast", ["q"], ["wc"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["wc", "s"], ["w"]),
             helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1]),
             helper.make_node("Add", ["c", "b"], ["y"])]
    graph = helper.make_graph(nodes, "conv",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 12, 12])],
                              [numpy_helper.from_array(q, "q"), numpy_helper.from_array(scale, "s"),
                               numpy_helper.from_array(bias, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_packed_convolution_keeps_its_int8_weights(tmp_path: Path) -> None:
    model = tmp_path / "conv.onnx"
    onnx.save(_conv_model(), model)
    art = compile_model(model, tmp_path / "art", cpu="x86-64-v2")
    plan = json.loads((art / "plan.json").read_text())
    (stored,) = [c for c in plan["constants"] if "stored" in c]
    assert stored["stored"]["dtype"] == "int8" and len(stored["shape"]) == 6  # the NHWC panels
    assert stored["stored"]["scale"]["shape"] == [1, 2, 1, 1, 1, 16]  # (panel, lane): the channel
    assert {s["op_type"] for s in plan["steps"]} >= {"ConvNhwc"}
    x = np.random.default_rng(2).standard_normal((1, 16, 12, 12)).astype(np.float32)
    want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(Session(art).run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("damage", "message"), [
    (lambda s: s.update(offset=10**9), "stored 147456 bytes of int8 at 1000000000 do not hold"),
    (lambda s: s["scale"].update(shape=[1, 2, 3]), "stored.scale shape [1, 2, 3] does not broadcast"),
    (lambda s: s.update(dtype="int4"), "stored.dtype must be one of"),
])
def test_a_stored_record_that_does_not_fit_is_an_artifact_error(encoders: dict, tmp_path: Path,
                                                                 damage: object, message: str) -> None:
    art = tmp_path / "art"
    art.mkdir()
    for f in encoders["cast"][1].rglob("*"):
        if f.is_file():
            (art / f.relative_to(encoders["cast"][1])).parent.mkdir(parents=True, exist_ok=True)
            (art / f.relative_to(encoders["cast"][1])).write_bytes(f.read_bytes())
    plan = json.loads((art / "plan.json").read_text())
    record = next(c for c in plan["constants"] if "stored" in c)
    assert record["stored"]["nbytes"] == 147456 and "scale" in record["stored"]  # a 384 x 384 weight
    damage(record["stored"])  # type: ignore[operator]
    write_plan(art, plan)
    with pytest.raises(ArtifactError, match=message.replace("[", r"\[").replace("]", r"\]")):
        Session(art)


def test_stored_constants_need_format_version_4(encoders: dict, tmp_path: Path) -> None:
    plan = json.loads((encoders["cast"][1] / "plan.json").read_text())
    from runtime.plan_schema import Plan

    with pytest.raises(ArtifactError, match="need plan format version 4"):
        Plan.from_json({**plan, "format_version": 3})


@pytest.mark.parametrize(("values", "width", "exact"), [
    ([0.0, 3.0, -128.0, 127.0], "int8", True),
    ([-0.0, 1.0], "int8", False),  # -0.0 is no int8: the round trip gives +0.0
    ([0.5, 1.0], "int8", False),
    ([128.0, 1.0], "int8", False),
    ([np.nan, 1.0], "int8", False),
    ([0.099975586, 65504.0], "float16", True),
    ([0.1, 1.0], "float16", False),
    ([70000.0, 1.0], "float16", False),
])
def test_cast_codes_take_only_exact_round_trips(values: list[float], width: str, exact: bool) -> None:
    array = np.array(values * 128, np.float32)
    codes = cast_codes(array, np.dtype(width))
    assert (codes is not None) == exact
    if codes is not None:
        assert codes.astype(np.float32).tobytes() == array.tobytes()
