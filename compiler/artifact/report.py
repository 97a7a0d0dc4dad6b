"""The memory report page (report/memory.html): one self-contained page per artifact.

Per arena an SVG chart draws every buffer as a rectangle (x = its lifetime in steps, y = its
offset in the arena; kernel scratch hatched), the live bytes of each step as a curve on the same
byte scale, and the peak step as a band. Each rectangle carries its hover data (tensor, producing
node, op type, shape, dtype, bytes, lifetime) as ``data-*`` attributes and an SVG ``<title>``;
the page's small inline script turns those into a tooltip and then marks ``#page-status`` ready.
Tables repeat what ``onnx-aot inspect`` prints. The data is :func:`runtime.inspection.memory_summary`;
the text lives in ``templates/report/``. No network, no timestamps: the same plan gives the same
bytes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from compiler.codegen.env import render
from runtime.inspection import describe_shape, format_bytes, human_bytes, memory_summary
from runtime.plan_schema import Plan

__all__ = ["render_memory_html"]

PLOT_W = 900.0  # plot area, in SVG user units
PLOT_H = 320.0
LEFT, RIGHT, TOP, BOTTOM = 76.0, 18.0, 26.0, 40.0
MIN_RECT_H = 0.75  # tiny buffers stay visible and hoverable
TOP_BUFFERS = 10
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#ff9da7", "#9c755f",
           "#e15759", "#86bcb6")  # colours by the producing step's op type; scratch is hatched grey


@dataclass(frozen=True)
class Tick:
    pos: str
    label: str


@dataclass(frozen=True)
class BufferRect:
    id: str
    kind: str  # "tensor" | "scratch"
    x: str
    y: str
    w: str
    h: str
    fill: str
    tensor: str
    values: str  # JSON list of every tensor sharing the buffer
    producer: str
    op_type: str
    producer_step: int
    shape: str  # JSON list, "" for scratch
    dtype: str  # "" for scratch
    nbytes: int
    offset: int
    first_step: int
    last_step: int
    title: str


@dataclass(frozen=True)
class Row:
    cells: tuple[str, ...]
    numeric: tuple[bool, ...]
    mark: bool = False


@dataclass(frozen=True)
class Fact:
    label: str
    value: str


@dataclass(frozen=True)
class LegendItem:
    label: str
    fill: str


@dataclass(frozen=True)
class ArenaChart:
    index: int
    space: str
    facts: tuple[Fact, ...]
    width: str
    height: str
    plot_x: str
    plot_y: str
    plot_w: str
    plot_h: str
    plot_bottom: str
    plot_right: str
    x_ticks: tuple[Tick, ...]
    y_ticks: tuple[Tick, ...]
    rects: tuple[BufferRect, ...]
    live_path: str
    peak_step: int
    peak_x: str
    peak_w: str
    peak_label: str
    peak_label_x: str
    peak_dot_x: str
    peak_dot_y: str
    legend: tuple[LegendItem, ...]
    peak_title: str
    peak_rows: tuple[Row, ...]
    largest_title: str
    largest_rows: tuple[Row, ...]


@dataclass(frozen=True)
class MemoryPage:
    name: str
    intro: str
    arenas: tuple[ArenaChart, ...]
    buffer_header: tuple[str, ...]
    buffer_numeric: tuple[bool, ...]
    step_header: tuple[str, ...]
    step_numeric: tuple[bool, ...]
    step_rows: tuple[Row, ...]


def _f(x: float) -> str:
    """Coordinates with two decimals: short, and the same bytes on every run."""
    text = f"{x:.2f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


def _nice_step(span: float, target: int) -> float:
    """A 1/2/5 x 10^k step giving about ``target`` intervals over ``span``."""
    raw = max(span / max(target, 1), 1e-12)
    base = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * base >= raw:
            return float(m * base)
    return float(10 * base)


def _byte_ticks(top: int) -> list[tuple[float, str]]:
    unit, scale = "B", 1
    for name, s in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if top >= s:
            unit, scale = name, s
            break
    step = _nice_step(top / scale, 5)
    ticks = []
    k = 0
    while k * step * scale <= top * (1 + 1e-9):
        value = k * step
        label = f"{value:g} {unit}" if k else "0"
        ticks.append((value * scale, label))
        k += 1
    return ticks


def _step_ticks(n: int) -> list[int]:
    step = max(int(_nice_step(max(n - 1, 1), 10)), 1)
    return list(range(0, n, step))


def _rows(buffers: list[dict[str, Any]]) -> tuple[Row, ...]:
    rows = []
    for b in buffers:
        tensor = b["root"] if b["kind"] == "tensor" else f"scratch of step {b['first_step']}"
        others = [v for v in b["values"] if v != b["root"]]
        if others:
            tensor += " (shared with " + ", ".join(others) + ")"
        rows.append(Row((format_bytes(b["offset"]), format_bytes(b["nbytes"]),
                         f"{b['first_step']}–{b['last_step']}", describe_shape(b), tensor,
                         f"{b['producer']} ({b['op_type']}, step {b['producer_step']})"),
                        (True, True, True, False, False, False)))
    return tuple(rows)


def _title(b: dict[str, Any]) -> str:
    lifetime = f"steps {b['first_step']}–{b['last_step']} ({b['last_step'] - b['first_step'] + 1} steps)"
    if b["kind"] == "scratch":
        head = f"scratch of step {b['first_step']}: {b['producer']} ({b['op_type']})"
        shape = "raw bytes"
    else:
        head = f"{b['root']} from {b['producer']} ({b['op_type']}, step {b['producer_step']})"
        shape = f"{b['dtype']} {b['shape']}"
    others = [v for v in b["values"] if v != b["root"]]
    also = f"\nshares memory with {', '.join(others)}" if others else ""
    return (f"{head}\n{shape}, {format_bytes(b['nbytes'])} bytes at offset {format_bytes(b['offset'])}"
            f"\n{lifetime}{also}")


def _chart(index: int, space: str, arena: dict[str, Any], steps: list[dict[str, Any]],
           colors: dict[str, str]) -> ArenaChart:
    n = max(len(steps), 1)
    top = max(arena["arena_nbytes"], arena["peak_live_nbytes"], 1)
    sx, sy = PLOT_W / n, PLOT_H / top
    bottom = TOP + PLOT_H

    def y_of(nbytes: float) -> float:
        return bottom - nbytes * sy

    rects = []
    for b in arena["buffers"]:
        h = max(b["nbytes"] * sy, MIN_RECT_H)
        scratch = b["kind"] == "scratch"
        rects.append(BufferRect(
            id=b["id"], kind=b["kind"], x=_f(LEFT + b["first_step"] * sx),
            y=_f(y_of(b["offset"]) - h), w=_f((b["last_step"] - b["first_step"] + 1) * sx), h=_f(h),
            fill=f"url(#hatch-{index})" if scratch else colors[b["op_type"]],
            tensor=b["root"] or "", values=json.dumps(b["values"], ensure_ascii=False),
            producer=b["producer"], op_type=b["op_type"], producer_step=b["producer_step"],
            shape="" if scratch else json.dumps(b["shape"]), dtype="" if scratch else b["dtype"],
            nbytes=b["nbytes"], offset=b["offset"], first_step=b["first_step"],
            last_step=b["last_step"], title=_title(b)))

    live = [s["live_by_arena"][space] for s in steps]
    path = [f"M{_f(LEFT)},{_f(y_of(live[0]) if live else bottom)}"]
    for t, v in enumerate(live):
        path.append(f"V{_f(y_of(v))}H{_f(LEFT + (t + 1) * sx)}")
    peak = arena["peak_step"]
    peak_live = arena["peak_live_nbytes"]
    peak_name = f"{steps[peak]['name']} ({steps[peak]['op_type']})" if steps else "-"
    size, lb, naive = arena["arena_nbytes"], arena["lower_bound_nbytes"], arena["naive_nbytes"]
    facts = (
        Fact("arena", f"{format_bytes(size)} B ({human_bytes(size)})"),
        Fact("lower bound", f"{format_bytes(lb)} B ({human_bytes(lb)}); arena / lower bound "
                            f"{arena['arena_over_lower_bound']:.3f}×"),
        Fact("naive sum", f"{format_bytes(naive)} B ({human_bytes(naive)}); saving "
                          f"{format_bytes(arena['saving_nbytes'])} B, "
                          f"{arena['saving_fraction'] * 100:.1f}% less ({arena['naive_over_arena']:.2f}× "
                          "smaller)"),
        Fact("peak", f"step {peak}, {peak_name}: {format_bytes(peak_live)} B live in "
                     f"{len(arena['peak_buffers'])} buffers"),
        Fact("buffers", f"{arena['buffer_count']} ({arena['buffer_count'] - arena['scratch_count']} "
                        f"tensors, {arena['scratch_count']} scratch); alignment {arena['alignment']}; "
                        f"strategy {arena['strategy']}"),
    )
    used = sorted({b["op_type"] for b in arena["buffers"] if b["kind"] == "tensor"})
    legend = tuple(LegendItem(op, colors[op]) for op in used) + (
        LegendItem("scratch (one step)", f"url(#hatch-{index})"),)
    by_id = {b["id"]: b for b in arena["buffers"]}
    peak_x = LEFT + peak * sx
    return ArenaChart(
        index=index, space=space, facts=facts,
        width=_f(LEFT + PLOT_W + RIGHT), height=_f(TOP + PLOT_H + BOTTOM),
        plot_x=_f(LEFT), plot_y=_f(TOP), plot_w=_f(PLOT_W), plot_h=_f(PLOT_H), plot_bottom=_f(bottom),
        plot_right=_f(LEFT + PLOT_W),
        x_ticks=tuple(Tick(_f(LEFT + (t + 0.5) * sx), str(t)) for t in _step_ticks(len(steps))),
        y_ticks=tuple(Tick(_f(y_of(v)), label) for v, label in _byte_ticks(top)),
        rects=tuple(rects), live_path="".join(path), peak_step=peak, peak_x=_f(peak_x),
        peak_w=_f(max(sx, 1.0)), peak_label=f"peak: step {peak}, {human_bytes(peak_live)}",
        peak_label_x=_f(min(max(peak_x + sx / 2, LEFT + 70), LEFT + PLOT_W - 70)),
        peak_dot_x=_f(peak_x + sx / 2), peak_dot_y=_f(y_of(peak_live)), legend=legend,
        peak_title=f"Live at the peak: step {peak}, {peak_name}, {format_bytes(peak_live)} bytes",
        peak_rows=_rows([by_id[i] for i in arena["peak_buffers"]]),
        largest_title=f"Largest buffers ({len(arena['largest_buffers'])} of {arena['buffer_count']})",
        largest_rows=_rows([by_id[i] for i in arena["largest_buffers"]]),
    )


def render_memory_html(plan: Plan, report: dict[str, Any]) -> str:
    """The page for ``plan`` and ``report`` (report/memory.json's data)."""
    summary = memory_summary(plan, report, top=TOP_BUFFERS)
    steps = summary["steps"]
    ops = sorted({b["op_type"] for a in summary["arenas"].values() for b in a["buffers"]})
    colors = {op: PALETTE[k % len(PALETTE)] for k, op in enumerate(ops)}
    charts = tuple(_chart(k, space, arena, steps, colors)
                   for k, (space, arena) in enumerate(summary["arenas"].items()))
    spaces = list(summary["arenas"])
    peaks = {a["peak_step"] for a in summary["arenas"].values()}
    step_rows = tuple(
        Row((str(s["index"]), *(format_bytes(s["live_by_arena"][sp]) for sp in spaces),
             str(s["live_buffers"]), format_bytes(s["scratch_nbytes"]), s["op_type"], s["name"],
             s["provider"]), (True, *(True for _ in spaces), True, True, False, False, False),
            mark=s["index"] in peaks)
        for s in steps)
    n_buffers = sum(a["buffer_count"] for a in summary["arenas"].values())
    intro = (f"{len(steps)} steps, {n_buffers} buffers in {len(charts)} arena(s). Each rectangle is one "
             "buffer: x spans the steps it is live, y its byte range in the arena. The line is the "
             "bytes live at each step; no arena can be smaller than its highest point (the lower "
             "bound). Hover a rectangle for its tensor.")
    page = MemoryPage(
        name=plan.name, intro=intro, arenas=charts,
        buffer_header=("offset", "bytes", "steps", "shape", "tensor", "produced by"),
        buffer_numeric=(True, True, True, False, False, False),
        step_header=("step", *(f"live {sp}" for sp in spaces), "buffers", "scratch", "op", "name",
                     "provider"),
        step_numeric=(True, *(True for _ in spaces), True, True, False, False, False),
        step_rows=step_rows,
    )
    return render("report/memory.html.j2", page)
