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
from runtime.inspection import describe_shape
from runtime.inspection import format_bytes
from runtime.inspection import human_bytes
from runtime.inspection import memory_summary
from runtime.plan_schema import Plan

__all__ = ["render_memory_html"]

PLOT_W = 900.0  # plot area, in SVG user units
PLOT_H = 320.0
LEFT, RIGHT, TOP, BOTTOM = 76.0, 18.0, 26.0, 40.0
MIN_RECT_H = 0.75  # tiny buffers stay visible and hoverable
TOP_BUFFERS = 10
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#ff9da7", "#9c755f",
           "#e15759", "#86bcb6")  # colours by the producing step's op type; scratch is hatched grey


def _f(x: float) -> str:
    """Coordinates with two decimals: short, and the same bytes on every run."""
    text = f"{x:.2f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


@dataclass(frozen=True)
class Frame:
    """The SVG canvas and the plot rectangle inside it: the same for every arena."""

    width: str
    height: str
    left: str
    top: str
    plot_w: str
    plot_h: str
    right: str
    bottom: str


FRAME = Frame(width=_f(LEFT + PLOT_W + RIGHT), height=_f(TOP + PLOT_H + BOTTOM), left=_f(LEFT), top=_f(TOP),
              plot_w=_f(PLOT_W), plot_h=_f(PLOT_H), right=_f(LEFT + PLOT_W), bottom=_f(TOP + PLOT_H))


@dataclass(frozen=True)
class Tick:
    pos: str  # x of a step tick, y of a byte tick
    label: str


@dataclass(frozen=True)
class BufferRect:
    """One buffer's rectangle and its hover data (the ``data-*`` attributes and the title)."""

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
class PeakBand:
    """The peak step: a band over the plot, a label above it, a dot on the live curve."""

    step: int
    x: str
    w: str
    label: str
    label_x: str
    dot_x: str
    dot_y: str


@dataclass(frozen=True)
class Row:
    cells: tuple[str, ...]
    mark: bool = False  # a peak step in the steps table


@dataclass(frozen=True)
class Table:
    title: str
    header: tuple[str, ...]
    numeric: tuple[bool, ...]  # per column: right-aligned
    rows: tuple[Row, ...]


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
    """One arena's section: its facts, the chart, the legend and the two buffer tables."""

    index: int
    space: str
    facts: tuple[Fact, ...]
    x_ticks: tuple[Tick, ...]
    y_ticks: tuple[Tick, ...]
    rects: tuple[BufferRect, ...]
    live_path: str
    peak: PeakBand
    legend: tuple[LegendItem, ...]
    tables: tuple[Table, ...]  # the buffers live at the peak, the largest buffers


@dataclass(frozen=True)
class MemoryPage:
    """The page: one section per arena, then the steps table."""

    name: str
    intro: str
    frame: Frame
    arenas: tuple[ArenaChart, ...]
    steps: Table


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


BUFFER_HEADER = ("offset", "bytes", "steps", "shape", "tensor", "produced by")
BUFFER_NUMERIC = (True, True, True, False, False, False)


@dataclass(frozen=True)
class _Scale:
    """One arena's steps and bytes in SVG user units: x counts steps from the plot's left edge,
    y counts bytes up from its bottom edge."""

    step_w: float
    byte_h: float

    def x(self, step: float) -> float:
        return LEFT + step * self.step_w

    def y(self, nbytes: float) -> float:
        return TOP + PLOT_H - nbytes * self.byte_h


def _buffer_table(title: str, buffers: list[dict[str, Any]]) -> Table:
    rows = []
    for b in buffers:
        tensor = b["root"] if b["kind"] == "tensor" else f"scratch of step {b['first_step']}"
        others = [v for v in b["values"] if v != b["root"]]
        if others:
            tensor += " (shared with " + ", ".join(others) + ")"
        rows.append(Row((format_bytes(b["offset"]), format_bytes(b["nbytes"]),
                         f"{b['first_step']}–{b['last_step']}", describe_shape(b), tensor,
                         f"{b['producer']} ({b['op_type']}, step {b['producer_step']})")))
    return Table(title, BUFFER_HEADER, BUFFER_NUMERIC, tuple(rows))


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


def _rect(b: dict[str, Any], scale: _Scale, fill: str) -> BufferRect:
    h = max(b["nbytes"] * scale.byte_h, MIN_RECT_H)
    scratch = b["kind"] == "scratch"
    return BufferRect(
        id=b["id"], kind=b["kind"], x=_f(scale.x(b["first_step"])), y=_f(scale.y(b["offset"]) - h),
        w=_f((b["last_step"] - b["first_step"] + 1) * scale.step_w), h=_f(h), fill=fill,
        tensor=b["root"] or "", values=json.dumps(b["values"], ensure_ascii=False),
        producer=b["producer"], op_type=b["op_type"], producer_step=b["producer_step"],
        shape="" if scratch else json.dumps(b["shape"]), dtype="" if scratch else b["dtype"],
        nbytes=b["nbytes"], offset=b["offset"], first_step=b["first_step"],
        last_step=b["last_step"], title=_title(b))


def _live_path(live: list[int], scale: _Scale) -> str:
    """The live bytes of each step as a staircase over the steps."""
    path = [f"M{FRAME.left},{_f(scale.y(live[0])) if live else FRAME.bottom}"]
    for t, v in enumerate(live):
        path.append(f"V{_f(scale.y(v))}H{_f(scale.x(t + 1))}")
    return "".join(path)


def _peak(arena: dict[str, Any], scale: _Scale) -> PeakBand:
    step, live = arena["peak_step"], arena["peak_live_nbytes"]
    x = scale.x(step)
    middle = x + scale.step_w / 2
    return PeakBand(step=step, x=_f(x), w=_f(max(scale.step_w, 1.0)),
                    label=f"peak: step {step}, {human_bytes(live)}",
                    label_x=_f(min(max(middle, LEFT + 70), LEFT + PLOT_W - 70)),
                    dot_x=_f(middle), dot_y=_f(scale.y(live)))


def _facts(arena: dict[str, Any], peak_name: str) -> tuple[Fact, ...]:
    size, lb, naive = arena["arena_nbytes"], arena["lower_bound_nbytes"], arena["naive_nbytes"]
    return (
        Fact("arena", f"{format_bytes(size)} B ({human_bytes(size)})"),
        Fact("lower bound", f"{format_bytes(lb)} B ({human_bytes(lb)}); arena / lower bound "
                            f"{arena['arena_over_lower_bound']:.3f}×"),
        Fact("naive sum", f"{format_bytes(naive)} B ({human_bytes(naive)}); saving "
                          f"{format_bytes(arena['saving_nbytes'])} B, "
                          f"{arena['saving_fraction'] * 100:.1f}% less ({arena['naive_over_arena']:.2f}× "
                          "smaller)"),
        Fact("peak", f"step {arena['peak_step']}, {peak_name}: {format_bytes(arena['peak_live_nbytes'])} "
                     f"B live in {len(arena['peak_buffers'])} buffers"),
        Fact("buffers", f"{arena['buffer_count']} ({arena['buffer_count'] - arena['scratch_count']} "
                        f"tensors, {arena['scratch_count']} scratch); alignment {arena['alignment']}; "
                        f"strategy {arena['strategy']}"),
    )


def _chart(index: int, space: str, arena: dict[str, Any], steps: list[dict[str, Any]],
           colors: dict[str, str]) -> ArenaChart:
    top = max(arena["arena_nbytes"], arena["peak_live_nbytes"], 1)
    scale = _Scale(PLOT_W / max(len(steps), 1), PLOT_H / top)
    hatch = f"url(#hatch-{index})"
    peak = arena["peak_step"]
    peak_name = f"{steps[peak]['name']} ({steps[peak]['op_type']})" if steps else "-"
    used = sorted({b["op_type"] for b in arena["buffers"] if b["kind"] == "tensor"})
    by_id = {b["id"]: b for b in arena["buffers"]}
    return ArenaChart(
        index=index, space=space, facts=_facts(arena, peak_name),
        x_ticks=tuple(Tick(_f(scale.x(t + 0.5)), str(t)) for t in _step_ticks(len(steps))),
        y_ticks=tuple(Tick(_f(scale.y(v)), label) for v, label in _byte_ticks(top)),
        rects=tuple(_rect(b, scale, hatch if b["kind"] == "scratch" else colors[b["op_type"]])
                    for b in arena["buffers"]),
        live_path=_live_path([s["live_by_arena"][space] for s in steps], scale),
        peak=_peak(arena, scale),
        legend=tuple(LegendItem(op, colors[op]) for op in used) + (LegendItem("scratch (one step)", hatch),),
        tables=(_buffer_table(f"Live at the peak: step {peak}, {peak_name}, "
                              f"{format_bytes(arena['peak_live_nbytes'])} bytes",
                              [by_id[i] for i in arena["peak_buffers"]]),
                _buffer_table(f"Largest buffers ({len(arena['largest_buffers'])} of {arena['buffer_count']})",
                              [by_id[i] for i in arena["largest_buffers"]])),
    )


def _steps_table(steps: list[dict[str, Any]], spaces: list[str], peaks: set[int]) -> Table:
    """Every step's live bytes per arena, its buffers and scratch; the peak steps marked."""
    return Table(
        title=f"Live bytes per step ({len(steps)} steps; peak steps highlighted)",
        header=("step", *(f"live {sp}" for sp in spaces), "buffers", "scratch", "op", "name", "provider"),
        numeric=(True, *(True for _ in spaces), True, True, False, False, False),
        rows=tuple(Row((str(s["index"]), *(format_bytes(s["live_by_arena"][sp]) for sp in spaces),
                        str(s["live_buffers"]), format_bytes(s["scratch_nbytes"]), s["op_type"], s["name"],
                        s["provider"]), mark=s["index"] in peaks)
                   for s in steps),
    )


def render_memory_html(plan: Plan, report: dict[str, Any]) -> str:
    """The page for ``plan`` and ``report`` (report/memory.json's data)."""
    summary = memory_summary(plan, report, top=TOP_BUFFERS)
    steps, arenas = summary["steps"], summary["arenas"]
    ops = sorted({b["op_type"] for a in arenas.values() for b in a["buffers"]})
    colors = {op: PALETTE[k % len(PALETTE)] for k, op in enumerate(ops)}
    charts = tuple(_chart(k, space, arena, steps, colors) for k, (space, arena) in enumerate(arenas.items()))
    n_buffers = sum(a["buffer_count"] for a in arenas.values())
    intro = (f"{len(steps)} steps, {n_buffers} buffers in {len(charts)} arena(s). Each rectangle is one "
             "buffer: x spans the steps it is live, y its byte range in the arena. The line is the "
             "bytes live at each step; no arena can be smaller than its highest point (the lower "
             "bound). Hover a rectangle for its tensor.")
    steps_table = _steps_table(steps, list(arenas), {a["peak_step"] for a in arenas.values()})
    page = MemoryPage(name=plan.name, intro=intro, frame=FRAME, arenas=charts, steps=steps_table)
    return render("report/memory.html.j2", page)
