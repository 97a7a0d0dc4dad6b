"""Post-training static int8 quantization inside the compiler (``--quantize int8 --calibration``).

``compile_model(..., quantize="int8", calibration="DATA.npz")`` quantizes the fp32 model before
the compile proper: the calibration feeds (``feeds.py``) run through the fp32 model on the
reference kernels (``observe.py``), which gives each quantized tensor its range (minmax, entropy
or percentile); the model is rewritten into the QDQ form onnxruntime's ``quantize_static`` writes
(S8S8, per-channel weights: ``prepare.py``, ``qdq_plan.py``, ``qdq_writer.py``) and that model is
compiled, so the QDQ passes (``compiler/passes/fold_qdq*.py``) give it the same integer steps
(PackedQConv, QGemm, QBinary, ...) a QDQ file gets. The manifest's compile options record the
scheme, method and number of samples (``inspect`` shows them); the built artifact's error against
the fp32 model on the calibration feeds is measured, reported and recorded
(``compiler/accuracy/int8.py``; ``--max-error`` bounds it).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import replace
from typing import Any

import numpy as np
import onnx

from compiler.quantize.feeds import CalibrationError
from compiler.quantize.feeds import load_feeds
from compiler.quantize.observe import METHODS
from compiler.quantize.observe import observe
from compiler.quantize.prepare import prepare_model
from compiler.quantize.qdq_plan import QdqPlan
from compiler.quantize.qdq_plan import plan_qdq
from compiler.quantize.qdq_writer import write_qdq
from runtime.errors import CompileError

__all__ = ["CalibrationError", "METHODS", "SCHEMES", "Quantized", "check_options", "quantize_model"]

SCHEMES = ("int8",)
Calibration = str | os.PathLike[str] | Mapping[str, np.ndarray]


@dataclass
class Quantized:
    """The QDQ model to compile, the manifest's record of it, and the calibration feeds with the
    fp32 model's outputs on them (for the error measured after the compile)."""

    model: onnx.ModelProto
    record: dict[str, Any]
    feeds: list[dict[str, np.ndarray]]
    reference: list[list[np.ndarray]]
    prepared: onnx.ModelProto  # the fp32 model as planned, its ranges, the tensor names after import
    ranges: Mapping[str, tuple[float, float]]
    names: frozenset[str]
    steps: tuple[int, ...] = ()  # the nodes (of ``prepared``) computed on quantized operands

    def step_name(self, k: int) -> str:
        node = self.prepared.graph.node[k]
        return node.name or f"{node.op_type} #{k}"

    def variant(self, skip: frozenset[int]) -> Quantized:
        """The same calibration with the nodes ``skip`` left float (``--max-error``)."""
        plan = _kept(plan_qdq(self.prepared, skip), self.names)
        return replace(self, model=write_qdq(self.prepared, plan, self.ranges), steps=tuple(plan.steps))


def _kept(plan: QdqPlan, names: frozenset[str]) -> QdqPlan:
    """``plan`` without the tensors the import renamed (they stay float)."""
    plan.own = [n for n in plan.own if n in names]
    plan.same = {k: v for k, v in plan.same.items() if v in plan.own}
    return plan


def check_options(quantize: str | None, calibration: Calibration | None, method: str, precision: str) -> None:
    """``CompileError`` for options that do not go together, before any work."""
    if quantize is None:
        if calibration is not None:
            raise CompileError("--calibration is only read with --quantize int8")
        return
    if quantize not in SCHEMES:
        raise CompileError(f"--quantize must be one of {', '.join(SCHEMES)}, got {quantize!r}")
    if calibration is None:
        raise CompileError("--quantize int8 needs --calibration DATA.npz (one array of samples per input "
                           "name): static quantization picks the activation scales from those feeds")
    if method not in METHODS:
        raise CompileError(f"--calibration-method must be one of {', '.join(METHODS)}, got {method!r}")
    if precision != "fp32":
        raise CompileError(f"--quantize int8 does not combine with --precision {precision}: the int8 steps "
                           f"compute in integers; the steps left float run in fp32")


def quantize_model(model: str | os.PathLike[str] | onnx.ModelProto, calibration: Calibration, method: str,
                   import_args: Mapping[str, Any], say: Callable[[str], None]) -> Quantized:
    """``model`` calibrated on ``calibration`` and rewritten into QDQ form; ``import_args``: the
    compile's ``shapes`` / ``binds`` / ``dims`` / ``values`` (the calibration runs at those)."""
    from compiler.frontend.importer import import_model
    from compiler.memory_policy import memory_policy

    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(os.fspath(model))
    prepared = prepare_model(proto)
    graph = import_model(prepared, **import_args)
    if memory_policy(graph).dims:  # symbolic dims
        raise CalibrationError("--quantize needs static input shapes (the calibration runs at one shape): "
                               "bind the model's symbolic dims with --shape or --dim N")
    inputs = {v.name: (tuple(int(d) for d in v.shape or ()), np.dtype(v.dtype)) for v in graph.inputs}
    feeds = load_feeds(calibration, inputs, bound=sorted(import_args.get("binds") or {}))
    plan = plan_qdq(prepared)
    names = frozenset({v.name for v in graph.inputs} | {v.name for n in graph.nodes for v in n.outputs})
    lost = [n for n in plan.own if n not in names]
    if lost:  # (the importer keeps the ONNX tensor names; one it renamed stays float)
        say(f"--quantize: {len(lost)} tensor(s) left float, not found after import: {', '.join(lost[:5])}")
        plan = _kept(plan, names)
    say(f"quantizing int8: {len(plan.own)} activation ranges to calibrate on {len(feeds)} feed(s), "
        f"{len(plan.weights)} weights per channel")
    # the tensors at another's scale get a range too: with that one's step left float (--max-error)
    # they are quantized on their own
    observed = observe(graph, feeds, set(plan.own) | (set(plan.same) & names), method, say)
    record = {"scheme": "int8", "method": method, "samples": len(feeds),
              "activations": "int8 per tensor, asymmetric", "weights": "int8 per output channel, symmetric",
              "quantized_tensors": len(plan.own) + len(plan.same)}
    return Quantized(write_qdq(prepared, plan, observed.ranges), record, feeds, observed.outputs, prepared,
                     observed.ranges, names, tuple(plan.steps))
