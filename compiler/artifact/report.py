"""The memory report page (report/memory.html): an SVG of buffers over steps, self-contained.

Each buffer is a rectangle (x = its lifetime in steps, y = its offset in the arena) with a
tooltip naming the tensor; a polyline shows the live bytes per step. The data comes from
report/memory.json; the page text lives in templates/report/memory.html.j2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from compiler.codegen.env import render

__all__ = ["render_memory_html"]

WIDTH = 960
HEIGHT = 360


@dataclass(frozen=True)
class Rect:
    x: float
    y: float
    w: float
    h: float
    title: str


@dataclass(frozen=True)
class ArenaView:
    space: str
    arena_nbytes: int
    lower_bound_nbytes: int
    naive_nbytes: int
    rects: tuple[Rect, ...]
    live_points: str


@dataclass(frozen=True)
class MemoryPage:
    name: str
    steps: int
    width: int
    height: int
    arenas: tuple[ArenaView, ...]


def render_memory_html(plan: dict[str, Any], report: dict[str, Any]) -> str:
    n = max(len(report["steps"]), 1)
    producers = {out: step["name"] + " (" + step["op_type"] + ")"
                 for step in plan["steps"] for out in step["outputs"]}
    views = []
    for space, arena in report["arenas"].items():
        top = max(arena["arena_nbytes"], 1)
        sx, sy = WIDTH / n, HEIGHT / top
        rects = []
        for buf in arena["buffers"]:
            title = (f"{buf['tensor']} from {producers.get(buf['tensor'], 'scratch')}: "
                     f"{buf['nbytes']} bytes at {buf['offset']}, steps {buf['first_step']}-"
                     f"{buf['last_step']}")
            rects.append(Rect(round(buf["first_step"] * sx, 2), round(buf["offset"] * sy, 2),
                              round((buf["last_step"] - buf["first_step"] + 1) * sx, 2),
                              round(max(buf["nbytes"] * sy, 0.5), 2), title))
        live = [0] * n
        for buf in arena["buffers"]:
            for t in range(buf["first_step"], buf["last_step"] + 1):
                live[t] += buf["nbytes"]
        points = " ".join(f"{round((t + 0.5) * sx, 2)},{round(HEIGHT - live[t] * sy, 2)}"
                          for t in range(len(report["steps"])))
        views.append(ArenaView(space, arena["arena_nbytes"], arena["lower_bound_nbytes"],
                               arena["naive_nbytes"], tuple(rects), points))
    page = MemoryPage(plan["name"], len(report["steps"]), WIDTH, HEIGHT, tuple(views))
    return render("report/memory.html.j2", page)
