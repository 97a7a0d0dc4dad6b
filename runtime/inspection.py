"""Read a compiled memory plan back as a report: arenas against their bounds, the peak, the buffers.

:func:`memory_summary` joins ``report/memory.json`` (arenas, buffers with offsets and lifetimes,
live bytes per step) with ``plan.json`` (the step that produced each tensor, its shape and dtype)
into one JSON-ready dict: memory.json's schema with fields added, never removed or renamed.
``onnx-aot inspect`` prints it as text (:func:`format_text`) or as JSON, and the HTML page
(``compiler/artifact/report.py``) draws the same dict, so the three never disagree. This is the
runtime's side (numpy only): a deploy machine without the compiler can inspect an artifact.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtime.accuracy import accuracy_line
from runtime.accuracy import accuracy_record
from runtime.artifact import load_artifact
from runtime.contract import CONV_NHWC
from runtime.contract import PACKED_GEMM
from runtime.contract import op_name
from runtime.contract import round_up
from runtime.dynamic import describe_spec
from runtime.dynamic import interface
from runtime.errors import ArtifactError
from runtime.plan_schema import Plan
from runtime.plan_schema import PlanBuffer
from runtime.plan_schema import PlanStep
from runtime.plan_schema import PlanValue
from runtime.symbolic import to_json

__all__ = ["MEMORY_JSON", "Inspection", "inspect_artifact", "memory_summary", "format_text",
           "format_bytes", "human_bytes"]

MEMORY_JSON = "report/memory.json"
BAR_WIDTH = 30


@dataclass(frozen=True)
class Inspection:
    """An artifact's plan and memory report, read and verified, with the summary built from them."""

    path: Path
    manifest: dict[str, Any]
    plan: Plan
    report: dict[str, Any]  # report/memory.json as stored
    summary: dict[str, Any]  # memory_summary(plan, report)


def inspect_artifact(path: str | os.PathLike[str], *, top: int = 10) -> Inspection:
    """Load the artifact at ``path`` (verifying its manifest) and summarize its memory plan."""
    art = load_artifact(path)
    report_path = art.file(MEMORY_JSON)
    try:
        report = json.loads(report_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ArtifactError(f"{report_path}: the memory report is missing (an optional part: onnx-aot "
                            "strip removes it); inspect the artifact as compiled") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{report_path}: the memory report is not valid JSON ({exc})") from None
    if not isinstance(report, dict) or not isinstance(report.get("arenas"), dict) \
            or not isinstance(report.get("steps"), list):
        raise ArtifactError(f"{report_path}: not a memory report (expected 'arenas' and 'steps')")
    summary = {**memory_summary(art.plan, report, top=top), "weights": weights_summary(art.path, art.manifest,
                                                                                       art.plan)}
    precision = precision_summary(art.manifest, art.plan)
    if precision != {"precision": "fp32", "bf16_steps": []}:  # (an fp32 artifact's JSON as before)
        summary["precision"] = precision
    quantized = quantize_record(art.manifest)
    if quantized is not None:
        summary["quantize"] = quantized
    accuracy = accuracy_record(art.manifest)
    if accuracy is not None:
        summary["accuracy"] = accuracy
    if "precision" in summary or quantized is not None or accuracy is not None:
        summary["step_precision"] = step_precisions(art.plan)
    return Inspection(art.path, art.manifest, art.plan, report, summary)


def weights_summary(root: Path, manifest: Mapping[str, Any], plan: Plan) -> dict[str, Any]:
    """The weights' bytes: the image the kernels read, weights.bin's (smaller where constants are
    stored narrow, runtime/narrow_weights.py) and the model file's, when the manifest has it."""
    source = manifest.get("source")
    model = source.get("nbytes") if isinstance(source, Mapping) else None
    file_nbytes = (root / "weights.bin").stat().st_size
    return {"image_nbytes": plan.weights_nbytes, "file_nbytes": file_nbytes, "constants": len(plan.constants),
            "stored_narrow": sum(c.stored is not None for c in plan.constants),
            "model_nbytes": model if isinstance(model, int) else None,
            "file_to_model": round(file_nbytes / model, 4) if isinstance(model, int) and model else None}


def _weights_line(weights: Mapping[str, Any]) -> str:
    line = f"weights: {format_bytes(weights['image_nbytes'])} bytes in {weights['constants']} constants"
    if weights["stored_narrow"]:
        line += (f"; weights.bin {format_bytes(weights['file_nbytes'])} bytes ({weights['stored_narrow']} "
                 f"stored narrow, widened at load)")
    if weights["model_nbytes"] is not None:
        line += (f"; the model file {format_bytes(weights['model_nbytes'])} bytes (weights.bin "
                 f"{weights['file_to_model']:.2f}x of it)")
    return line


def bf16_steps(plan: Plan) -> list[PlanStep]:
    """The steps of ``--precision bf16``: the GEMMs that compute in bf16 (``amx_bf16_steps``) and
    those that read a constant stored as bfloat16 codes (widened to fp32 at load)."""
    bf16 = {c.offset for c in plan.constants if c.stored is not None and c.stored.dtype == "bfloat16"}
    amx = {step.index for step in amx_bf16_steps(plan)}
    def reads_codes(name: str | None) -> bool:
        return name is not None and plan.values[name].location.kind == "weights" \
            and plan.values[name].location.offset in bf16

    return [step for step in plan.steps if step.index in amx or any(map(reads_codes, step.inputs))]


def amx_bf16_steps(plan: Plan) -> list[PlanStep]:
    """The PackedGemm and ConvNhwc steps whose weights are bfloat16 codes in the AMX layout
    (runtime/kernels/amx_pack.py): bf16 products, fp32 sums, on AMX-BF16 where the CPU has it
    (else the weights widened per run and fp32 products)."""
    return [step for step in plan.steps
            if step.op_type in (op_name(PACKED_GEMM), op_name(CONV_NHWC)) and len(step.inputs) > 1
            and step.inputs[1] is not None and plan.values[step.inputs[1]].dtype == np.uint16]


def step_precisions(plan: Plan) -> dict[str, str]:
    """Each step's compute precision: ``bf16`` (reads bf16 weights), ``int8`` (reads int8 / uint8
    operands), else ``fp32``."""
    bf16 = {step.index for step in bf16_steps(plan)}
    narrow = (np.dtype(np.int8), np.dtype(np.uint8))

    def precision(step: PlanStep) -> str:
        if step.index in bf16:
            return "bf16"
        if any(name is not None and plan.values[name].dtype in narrow for name in step.inputs):
            return "int8"
        return "fp32"

    return {step.name: precision(step) for step in plan.steps}


def _step_precision_line(plan: Plan) -> str:
    counts: dict[str, int] = {}
    for precision in step_precisions(plan).values():
        counts[precision] = counts.get(precision, 0) + 1
    return "steps by precision: " + ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())) + \
        " (inspect --json: step_precision, per step)"


def precision_summary(manifest: Mapping[str, Any], plan: Plan) -> dict[str, Any]:
    """The compile's ``--precision`` (fp32 unless the manifest records another) and the names of
    the steps that read bf16 weights (``inspect --json``'s ``precision``, present unless that is
    fp32 and none)."""
    options = manifest.get("options")
    precision = options.get("precision", "fp32") if isinstance(options, Mapping) else "fp32"
    return {"precision": precision, "bf16_steps": [step.name for step in bf16_steps(plan)]}


def quantize_record(manifest: Mapping[str, Any]) -> dict[str, Any] | None:
    """The compile's ``--quantize`` record (scheme, calibration method, samples), if it had one."""
    options = manifest.get("options")
    record = options.get("quantize") if isinstance(options, Mapping) else None
    return dict(record) if isinstance(record, Mapping) else None


def quantize_line(manifest: Mapping[str, Any]) -> str | None:
    """``quantized: int8 (...)``: how ``--quantize`` calibrated the artifact, or None."""
    record = quantize_record(manifest)
    if record is None:
        return None
    return (f"quantized: {record.get('scheme')} (post-training static, --calibration-method "
            f"{record.get('method')}, {record.get('samples')} calibration samples; activations "
            f"{record.get('activations')}, weights {record.get('weights')})")


def precision_line(manifest: Mapping[str, Any], plan: Plan) -> str:
    """``precision: ...``: the compile's ``--precision`` and the steps that read bf16 weights."""
    precision = precision_summary(manifest, plan)["precision"]
    steps = bf16_steps(plan)
    if not steps:  # (a bf16 compile of a graph without packed GEMMs)
        return f"precision: {precision} (no step reads weights stored as bf16)"
    amx = {step.index for step in amx_bf16_steps(plan)}
    parts = [_steps_text(f"{len(amx)} steps compute in bf16 (bf16 products, fp32 sums, on AMX-BF16 where "
                         "the CPU has it; else in fp32 on the bf16 weights)",
                         [s for s in steps if s.index in amx]),
             _steps_text(f"{len(steps) - len(amx)} steps read bf16 weights, widened to fp32 at load",
                         [s for s in steps if s.index not in amx])]
    return f"precision: {precision}: " + "; ".join(p for p in parts if p)


def _steps_text(head: str, steps: list[PlanStep]) -> str:
    if not steps:
        return ""
    ops: dict[str, int] = {}
    for step in steps:
        ops[step.op_type] = ops.get(step.op_type, 0) + 1
    return (f"{head} (" + ", ".join(f"{k} x{v}" for k, v in sorted(ops.items())) + "): "
            + ", ".join(step.name for step in steps[:8]) + (", ..." if len(steps) > 8 else ""))


def memory_summary(plan: Plan, report: dict[str, Any], *, top: int = 10) -> dict[str, Any]:
    """memory.json's data with what a reader needs added.

    Every buffer gains ``kind`` ("tensor" or "scratch"), ``root`` (the tensor filling it),
    ``values`` (every tensor sharing it: views, in-place results, Concat inputs written into their
    slices), the root's ``dtype`` and ``shape``, its producing step (``producer``, ``op_type``,
    ``producer_step``; for scratch, the step it serves) and ``aligned_nbytes``. Every arena gains
    its saving against the naive sum, its ratio to the lower bound, its ``strategy``, the bytes
    live at its peak step, and the ids of the buffers live there and of the ``top`` largest. Every
    step gains its live bytes per arena, its live buffer count and its scratch bytes.
    """
    steps = plan.steps
    n = len(report["steps"])
    if n != len(steps):
        raise ArtifactError(f"memory report lists {n} steps but plan.json has {len(steps)}")
    producer = {name: step for step in steps for name in step.outputs}
    plan_buffers = {b.id: b for b in plan.buffers}
    strategy = {a.memory_space: a.strategy for a in plan.arenas}

    arenas: dict[str, Any] = {}
    live_by_arena: list[dict[str, int]] = [{} for _ in range(n)]
    live_count = [0] * n
    for space, arena in report["arenas"].items():
        if space not in strategy:
            raise ArtifactError(f"memory report lists arena {space!r}, which plan.json does not have")
        alignment = arena["alignment"]
        buffers = [_buffer_entry(buf, plan_buffers, producer, plan.values, steps, alignment)
                   for buf in arena["buffers"]]
        live = [0] * n
        for buf in buffers:
            for t in range(buf["first_step"], buf["last_step"] + 1):
                live[t] += buf["aligned_nbytes"]
                live_count[t] += 1
        for t in range(n):
            live_by_arena[t][space] = live[t]
        arenas[space] = _arena_entry(arena, buffers, live, strategy[space], top)

    out_steps = []
    for t, step in enumerate(report["steps"]):
        entry = dict(step)
        scratch = steps[t].scratch
        entry.update({"live_by_arena": live_by_arena[t], "live_buffers": live_count[t],
                      "scratch_nbytes": scratch.nbytes if scratch is not None else 0})
        out_steps.append(entry)
    return {"arenas": arenas, "steps": out_steps}


def _arena_entry(arena: dict[str, Any], buffers: list[dict[str, Any]], live: list[int], strategy: str,
                 top: int) -> dict[str, Any]:
    """memory.json's arena record with its ``buffers`` summarized and the figures of
    :func:`memory_summary` added (``live``: its live bytes per step)."""
    peak = arena["peak_step"]
    at_peak = sorted((b for b in buffers if b["first_step"] <= peak <= b["last_step"]),
                     key=lambda b: (b["offset"], b["id"]))
    largest = sorted(buffers, key=lambda b: (-b["nbytes"], b["first_step"], b["id"]))[:max(top, 0)]
    size, lb, naive = arena["arena_nbytes"], arena["lower_bound_nbytes"], arena["naive_nbytes"]
    entry = dict(arena)
    entry["buffers"] = buffers
    entry.update({
        "strategy": strategy,
        "buffer_count": len(buffers),
        "scratch_count": sum(1 for b in buffers if b["kind"] == "scratch"),
        "saving_nbytes": naive - size,
        "saving_fraction": round((naive - size) / naive, 6) if naive else 0.0,
        "naive_over_arena": round(naive / size, 6) if size else 1.0,
        "arena_over_lower_bound": round(size / lb, 6) if lb else 1.0,
        "peak_live_nbytes": live[peak] if live else 0,
        "peak_buffers": [b["id"] for b in at_peak],
        "largest_buffers": [b["id"] for b in largest],
    })
    return entry


def _buffer_entry(buf: dict[str, Any], plan_buffers: Mapping[str, PlanBuffer],
                  producer: Mapping[str, PlanStep], values: Mapping[str, PlanValue],
                  steps: Sequence[PlanStep], alignment: int) -> dict[str, Any]:
    record = plan_buffers.get(buf["id"])
    if record is None:
        raise ArtifactError(f"memory report lists buffer {buf['id']!r}, which plan.json does not have")
    entry = dict(buf)
    names = list(record.values)
    if not names:  # kernel scratch: no tensor, live for the one step it serves
        step = steps[buf["first_step"]]
        entry.update({"kind": "scratch", "root": None, "values": [], "dtype": None, "shape": None})
    else:
        # the tensor that fills the buffer: its root (the buffer's id), which a Concat writing in
        # place produces after the inputs written into its slices; memory.json's "tensor" is the
        # first value written
        root = buf["id"] if buf["id"] in names else buf["tensor"]
        found = producer.get(root)
        if found is None or root not in values:
            raise ArtifactError(f"buffer {buf['id']!r}: plan.json has no producing step or record "
                                f"for its tensor {root!r}")
        step = found
        entry.update({"kind": "tensor", "root": root, "values": names, "dtype": values[root].dtype.name,
                      "shape": [to_json(d) for d in values[root].shape]})
    entry.update({"producer": step.name, "op_type": step.op_type, "producer_step": step.index,
                  "aligned_nbytes": round_up(buf["nbytes"], alignment)})
    return entry


# ---------------------------------------------------------------------------------------- text


def format_bytes(n: int) -> str:
    """``4491776`` -> ``4,491,776``."""
    return f"{n:,}"


def human_bytes(n: float) -> str:
    """``4491776`` -> ``4.28 MiB`` (binary units, three significant figures)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def describe_shape(buf: dict[str, Any]) -> str:
    """``float32[1,64,111,111]`` for a tensor, ``scratch`` for kernel scratch."""
    if buf["kind"] == "scratch":
        return "scratch"
    return f"{buf['dtype']}[{','.join(str(d) for d in buf['shape'])}]"


def _table(rows: Sequence[Sequence[str]], right: Sequence[bool], indent: str) -> list[str]:
    """Columns padded to their widest cell (right-aligned where asked); the last is not padded."""
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [cell.rjust(widths[k]) if right[k] else cell.ljust(widths[k])
                 for k, cell in enumerate(row[:-1])]
        lines.append((indent + "  ".join([*cells, row[-1]])).rstrip())
    return lines


def _buffer_rows(buffers: list[dict[str, Any]]) -> list[str]:
    rows = [("offset", "bytes", "steps", "shape", "tensor", "produced by")]
    for b in buffers:
        tensor = b["root"] if b["kind"] == "tensor" else f"scratch of step {b['first_step']}"
        if len(b["values"]) > 1:
            more = len(b["values"]) - 1
            tensor += f" (+{more} alias{'es' if more > 1 else ''})"
        rows.append((format_bytes(b["offset"]), format_bytes(b["nbytes"]),
                     f"{b['first_step']}-{b['last_step']}", describe_shape(b), tensor,
                     f"{b['producer']} ({b['op_type']}, step {b['producer_step']})"))
    return _table(rows, (True, True, False, False, False, False), "      ")


def _precision_lines(manifest: Mapping[str, Any], plan: Plan) -> list[str]:
    """The precision line, and the quantization line where the compile quantized the model."""
    quantized = quantize_line(manifest)
    accuracy = accuracy_line(manifest)
    lines = [precision_line(manifest, plan)] + ([quantized] if quantized is not None else [])
    if quantized is not None or accuracy is not None or bf16_steps(plan):
        lines.append(_step_precision_line(plan))
    return lines + ([accuracy] if accuracy is not None else [])


def format_text(ins: Inspection, *, steps: int | None = None) -> str:
    """The ``onnx-aot inspect`` text: artifact facts, then per arena its numbers, peak and largest
    buffers, then the live bytes of each step (only the ``steps`` fullest ones when given)."""
    plan, summary = ins.plan, ins.summary
    lines = [f"artifact {ins.path}  (compiled by onnx-aot {ins.manifest['compiler']['version']} "
             f"from {ins.manifest['source']['file']})"]
    inputs, outputs = interface(plan)
    lines += [f"  input  {s.name}: {describe_spec(s)}" for s in inputs]
    lines += [f"  output {s.name}: {describe_spec(s)}" for s in outputs]
    if plan.symbols:
        lines.append("symbols: " + ", ".join(f"{s.name} in {s.min}..{s.max}"
                                             + (f" (the value of input {s.input!r})" if s.input else "")
                                             for s in plan.symbols)
                     + " (a dynamic plan: buffers placed per binding at run time; arenas at the max binding)")
    lines.append(_weights_line(summary["weights"]) if "weights" in summary else
                 f"weights: {format_bytes(plan.weights_nbytes)} bytes in {len(plan.constants)} constants")
    lines += _precision_lines(ins.manifest, plan)
    providers: dict[str, int] = {}
    ops: dict[str, int] = {}
    for step in plan.steps:
        providers[step.provider] = providers.get(step.provider, 0) + 1
        ops[step.op_type] = ops.get(step.op_type, 0) + 1
    lines.append(f"steps: {len(plan.steps)} (" + ", ".join(f"{k}: {v}" for k, v in providers.items())
                 + ")")
    lines += [f"  partition {p.index}: {p.provider}, steps {p.first_step}-{p.last_step}, "
              f"entry {p.entry}" for p in plan.partitions]
    lines.append("ops: " + ", ".join(f"{k} x{v}" for k, v in sorted(ops.items())))

    for space, arena in summary["arenas"].items():
        by_id = {b["id"]: b for b in arena["buffers"]}
        size, lb, naive = arena["arena_nbytes"], arena["lower_bound_nbytes"], arena["naive_nbytes"]
        width = len(format_bytes(max(size, lb, naive)))
        lines += [
            "",
            f"arena {space}: {format_bytes(size)} bytes ({human_bytes(size)}), {arena['buffer_count']} "
            f"buffers ({arena['buffer_count'] - arena['scratch_count']} tensors, "
            f"{arena['scratch_count']} scratch), alignment {arena['alignment']}, "
            f"strategy {arena['strategy']}",
            f"  arena        {format_bytes(size):>{width}} B",
            f"  lower bound  {format_bytes(lb):>{width}} B   arena / lower bound "
            f"{arena['arena_over_lower_bound']:.3f}x",
            f"  naive sum    {format_bytes(naive):>{width}} B   saving "
            f"{format_bytes(arena['saving_nbytes'])} B "
            f"({arena['saving_fraction'] * 100:.1f}% less than naive, "
            f"{arena['naive_over_arena']:.2f}x smaller)",
        ]
        if summary["steps"]:
            peak = summary["steps"][arena["peak_step"]]
            lines.append(f"  peak at step {peak['index']} ({peak['name']}, {peak['op_type']}): "
                         f"{format_bytes(arena['peak_live_nbytes'])} bytes live in "
                         f"{len(arena['peak_buffers'])} buffers")
            if arena["peak_buffers"]:
                lines += _buffer_rows([by_id[i] for i in arena["peak_buffers"]])
        if arena["largest_buffers"]:
            lines.append(f"  largest buffers ({len(arena['largest_buffers'])} of {arena['buffer_count']}):")
            lines += _buffer_rows([by_id[i] for i in arena["largest_buffers"]])

    lines += ["", *_step_lines(summary, steps)]
    return "\n".join(lines) + "\n"


def _step_lines(summary: dict[str, Any], limit: int | None) -> list[str]:
    rows_in = summary["steps"]
    if not rows_in:
        return ["live bytes per step: no steps"]
    spaces = list(summary["arenas"])
    peaks = {a["peak_step"] for a in summary["arenas"].values()}
    shown = list(range(len(rows_in)))
    head = "live bytes per step (arena buffers live during the step; * = peak step of an arena)"
    if limit is not None and limit < len(rows_in):
        fullest = sorted(shown, key=lambda t: (-rows_in[t]["live_nbytes"], t))[:max(limit, 0)]
        shown = sorted(fullest)
        head = (f"live bytes per step, the {len(shown)} fullest of {len(rows_in)} "
                f"(* = peak step of an arena)")
    top = max(max(s["live_nbytes"] for s in rows_in), 1)
    rows = [("step", *(f"live {s}" for s in spaces), "buffers", "", "op", "name", "provider")]
    for t in shown:
        s = rows_in[t]
        bar = "#" * round(BAR_WIDTH * s["live_nbytes"] / top)
        rows.append((str(t), *(format_bytes(s["live_by_arena"][sp]) for sp in spaces),
                     str(s["live_buffers"]), bar.ljust(BAR_WIDTH) + ("*" if t in peaks else " "),
                     s["op_type"], s["name"], s["provider"]))
    right = (True, *(True for _ in spaces), True, False, False, False, False)
    return [head + ":", *_table(rows, right, "  ")] if shown else [head + ": none shown"]
