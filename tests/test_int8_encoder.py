"""A MiniLM-shaped encoder quantized by onnxruntime's quantizer compiles and strays as onnxruntime does.

Issue 32's first "done when" point for the encoders: the file ``quantize_dynamic`` writes
(DynamicQuantizeLinear + MatMulInteger) and the QDQ file ``quantize_static`` writes (S8S8, per
channel; ``tests/support/qdq_models.py: quantize_file``) compile with onnx-aot, and each output strays
from the fp32 model (max |difference| / max |fp32 output|, three seeded feeds) by at most 1.25x what
onnxruntime's int8 run of the same file strays, + 0.005. MiniLM's widths (hidden 384, 12 heads, FFN
1536, seq 128) with two layers instead of six, to keep the test to seconds; the six-layer dynamic
file is checked in tests/test_qgemm.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest

from compiler import compile_model
from runtime import Session
from tests.support.encoder_model import MINILM
from tests.support.encoder_model import encoder_feeds
from tests.support.encoder_model import encoder_model
from tests.support.qdq_models import quantize_file
from tests.support.qdq_models import stray

SHAPE = {**MINILM, "layers": 2}


@pytest.mark.parametrize("form", ["dynamic", "qdq"])
def test_minilm_shaped_encoder_int8_strays_as_onnxruntime_does(tmp_path: Path, form: str) -> None:
    fp = encoder_model(**SHAPE)
    onnx.save(fp, tmp_path / "fp.onnx")
    int8 = quantize_file(tmp_path / "fp.onnx", tmp_path / f"{form}.onnx", form,
                         lambda seed: encoder_feeds(fp, seed=seed + 10))
    artifact = compile_model(int8, tmp_path / "a", golden_cases=1)
    plan = json.loads((artifact / "plan.json").read_text(encoding="utf-8"))
    assert any(s["op_type"] in ("QGemm", "QLinearMatMul") for s in plan["steps"]), "no integer GEMM step"
    ours, theirs = Session(artifact, threads=2), ort.InferenceSession(str(int8))
    exact = ort.InferenceSession(str(tmp_path / "fp.onnx"))
    for seed in range(3):
        feeds = encoder_feeds(fp, seed=seed)
        ref = exact.run(None, feeds)
        ort_stray = stray(theirs.run(None, feeds), ref)
        assert ort_stray > 0.0, "onnxruntime's int8 run equals the fp32 model: nothing quantized"
        ours_stray = stray(ours.run(None, feeds), ref)
        assert ours_stray <= 1.25 * ort_stray + 0.005, (seed, ours_stray, ort_stray)
