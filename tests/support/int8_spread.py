"""How far onnxruntime strays from itself on a dynamically quantized model: the yardstick for ours.

A dynamically quantized model (DynamicQuantizeLinear + MatMulInteger, per-tensor scales over the
whole batch) is chaotic at large shapes: one float rounding difference flips one quantized value,
that moves a scale or a zero point further on, and every later activation moves a step. Measured on
the flan-t5-small int8 decoder at batch 10, decoder length 33, encoder length 512: onnxruntime's own
top-1 tokens agree at 70% of the positions (logits up to 9.7 apart) between the encoder states as
given and the same states nudged by one ulp. No engine that does not reproduce onnxruntime's float
summation order bit for bit can match it closer than that, so the check of such a model is relative:
our output strays from onnxruntime's by at most 1.25x what onnxruntime strays from itself (plus the
model's own tolerance), and our top-1 tokens agree with its at least as often as its own do.

The T5 encoder has no float input to nudge; there the same holds for its weights: with one
layer-norm weight of its first block raised by one ulp, onnxruntime's output at batch 10 x 512
moves by 0.96 (max |output| 0.97) at one token, where ours strays 0.88 (found by a per-partition
check: every step of the artifact agrees with onnxruntime's on the artifact's own inputs).

``self_spread`` runs onnxruntime on the feeds with every float input nudged by one ulp away from
zero, on the model with every float weight nudged the same way, and at its basic and no graph
optimizations, and returns the worst spread per output.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Spread", "self_spread"]


@dataclass(frozen=True)
class Spread:
    """Per output: onnxruntime's largest |difference| from itself, and the smallest share of
    positions whose top-1 (argmax over the last axis) stayed the same."""

    max_abs: tuple[float, ...]
    top1_agreement: tuple[float, ...]


def _session(path: Path | bytes, level: Any) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = level
    model = path if isinstance(path, bytes) else str(path)
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def _nudged(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    floats = {k: v for k, v in feeds.items() if v.dtype.kind == "f"}
    if not floats:
        return None
    away = {k: np.nextafter(v, np.copysign(np.inf, v).astype(v.dtype)).astype(v.dtype)
            for k, v in floats.items()}
    return {**feeds, **away}


def _nudged_weights(path: Path) -> bytes:
    """The model at ``path`` with every float initializer moved one ulp away from zero."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    for k, tensor in enumerate(model.graph.initializer):
        array = numpy_helper.to_array(tensor)
        if array.dtype.kind == "f" and array.size:
            moved = np.nextafter(array, np.copysign(np.inf, array).astype(array.dtype)).astype(array.dtype)
            model.graph.initializer[k].CopyFrom(numpy_helper.from_array(moved, tensor.name))
    return bytes(model.SerializeToString())


def self_spread(path: Path, feeds: Mapping[str, np.ndarray], reference: list[np.ndarray]) -> Spread:
    """onnxruntime's spread around its own outputs ``reference`` (full optimizations) on ``feeds``."""
    import onnxruntime as ort

    levels = ort.GraphOptimizationLevel
    runs = []
    nudged = _nudged(feeds)
    if nudged is not None:
        runs.append(_session(path, levels.ORT_ENABLE_ALL).run(None, nudged))
    runs.append(_session(_nudged_weights(path), levels.ORT_ENABLE_ALL).run(None, dict(feeds)))
    for level in (levels.ORT_ENABLE_BASIC, levels.ORT_DISABLE_ALL):
        runs.append(_session(path, level).run(None, dict(feeds)))
    max_abs, agree = [], []
    for k, ref in enumerate(reference):
        max_abs.append(max(float(np.abs(np.asarray(r[k], np.float64) - ref).max(initial=0.0)) for r in runs))
        agree.append(min(float((np.argmax(r[k], -1) == np.argmax(ref, -1)).mean()) for r in runs))
    return Spread(tuple(max_abs), tuple(agree))
