"""The memory-plan inspection report: ``onnx-aot inspect`` (text, --json, --html) and the page.

The numbers are checked against plan.json and report/memory.json of a compiled SqueezeNet; the page
is parsed as served and, when Debian's ``chromium`` is installed, loaded in a real headless browser
(its DOM after the page's script ran must hold one rectangle per buffer with the right hover data).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from onnx import TensorProto
from onnx import helper

from compiler import compile_model
from compiler.artifact.report import render_memory_html
from runtime.errors import ArtifactError
from runtime.inspection import memory_summary
from runtime.plan_schema import FORMAT_VERSION
from runtime.plan_schema import Plan
from tests.support.commands import cli
from tests.support.zoo import light_model_path

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def squeezenet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_model(light_model_path("squeezenet"), tmp_path_factory.mktemp("report") / "sq")


def _load(art: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    plan = json.loads((art / "plan.json").read_text(encoding="utf-8"))
    report = json.loads((art / "report" / "memory.json").read_text(encoding="utf-8"))
    return plan, report


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


# ------------------------------------------------------------------------------ inspect --json


def test_inspect_json_extends_memory_json_and_matches_plan(squeezenet: Path) -> None:
    plan, report = _load(squeezenet)
    data = json.loads(cli("inspect", str(squeezenet), "--json").stdout)
    assert set(data) == {"arenas", "steps", "weights"}
    weights = data.pop("weights")  # weights.bin vs the image (tests/test_narrow_weights.py): none narrow
    assert weights["image_nbytes"] == weights["file_nbytes"] == plan["weights_nbytes"]
    assert weights["stored_narrow"] == 0

    def superset(extended: Any, stored: Any, where: str) -> None:  # fields added, none changed
        if isinstance(stored, dict):
            for key, value in stored.items():
                assert key in extended, f"{where}.{key} missing"
                superset(extended[key], value, f"{where}.{key}")
        elif isinstance(stored, list):
            assert len(extended) == len(stored), where
            for k, (a, b) in enumerate(zip(extended, stored, strict=True)):
                superset(a, b, f"{where}[{k}]")
        else:
            assert extended == stored, where

    superset(data, report, "memory.json")
    live = [s["live_nbytes"] for s in data["steps"]]
    assert [s["index"] for s in data["steps"]] == list(range(len(plan["steps"])))
    values = plan["values"]
    for record in plan["arenas"]:
        arena = data["arenas"][record["memory_space"]]
        size, lb, naive = record["nbytes"], record["lower_bound_nbytes"], record["naive_nbytes"]
        assert arena["arena_nbytes"] == size
        assert (arena["lower_bound_nbytes"], arena["naive_nbytes"]) == (lb, naive)
        assert arena["strategy"] == record["strategy"]
        assert arena["saving_nbytes"] == naive - size
        assert arena["saving_fraction"] == pytest.approx(1 - size / naive, abs=1e-6)
        assert arena["arena_over_lower_bound"] == pytest.approx(size / lb, abs=1e-6)
        # one arena here: the peak step's live bytes are the largest of any step, and the bound
        assert arena["peak_live_nbytes"] == max(live) == live[arena["peak_step"]] == lb
        plan_buffers = {b["id"]: b for b in plan["buffers"] if b["arena"] == record["memory_space"]}
        assert [b["id"] for b in arena["buffers"]] == list(plan_buffers)
        at_peak = [b for b in arena["buffers"] if b["first_step"] <= arena["peak_step"] <= b["last_step"]]
        assert sorted(arena["peak_buffers"]) == sorted(b["id"] for b in at_peak)
        assert sum(b["aligned_nbytes"] for b in at_peak) == arena["peak_live_nbytes"]
        by_id = {b["id"]: b for b in arena["buffers"]}
        sizes = [by_id[i]["nbytes"] for i in arena["largest_buffers"]]
        assert len(sizes) == 10 and sizes == sorted(sizes, reverse=True)
        assert sizes[0] == max(b["nbytes"] for b in arena["buffers"])
        for b in arena["buffers"]:
            record_b = plan_buffers[b["id"]]
            step = plan["steps"][b["producer_step"]]
            assert (b["producer"], b["op_type"]) == (step["name"], step["op_type"])
            if b["kind"] == "scratch":
                assert record_b["values"] == [] and b["first_step"] == b["last_step"] == b["producer_step"]
                assert step["scratch"] == {"offset": b["offset"], "nbytes": b["nbytes"]}
            else:
                assert b["values"] == record_b["values"] and b["root"] in step["outputs"]
                assert b["root"] == (b["id"] if b["id"] in b["values"] else b["tensor"])
                value = values[b["root"]]
                assert (b["dtype"], b["shape"]) == (value["dtype"], value["shape"])
    assert any(b["kind"] == "scratch" for a in data["arenas"].values() for b in a["buffers"])


# ------------------------------------------------------------------------------ inspect (text)


def test_inspect_text_shows_bounds_peak_largest_and_every_step(squeezenet: Path) -> None:
    plan, report = _load(squeezenet)
    out = cli("inspect", str(squeezenet)).stdout
    arena = report["arenas"]["host"]
    size, lb, naive = arena["arena_nbytes"], arena["lower_bound_nbytes"], arena["naive_nbytes"]
    assert f"arena host: {size:,} bytes" in out
    assert re.search(rf"\n  lower bound +{lb:,} B ", out) and re.search(rf"\n  naive sum +{naive:,} B ", out)
    assert f"saving {naive - size:,} B ({(naive - size) / naive * 100:.1f}% less than naive" in out
    assert f"arena / lower bound {size / lb:.3f}x" in out
    peak = arena["peak_step"]
    step = plan["steps"][peak]
    assert f"peak at step {peak} ({step['name']}, {step['op_type']}): {lb:,} bytes live" in out
    peak_section = out.split("peak at step")[1].split("largest buffers")[0]
    for b in arena["buffers"]:  # every tensor live at the peak, with its shape and producer
        if b["first_step"] <= peak <= b["last_step"]:
            if b["id"].startswith("scratch/"):
                assert f"scratch of step {b['first_step']}" in peak_section
            else:
                shape = ",".join(str(d) for d in plan["values"][b["id"]]["shape"])
                assert f"float32[{shape}]" in peak_section and f" {b['id']}" in peak_section
            assert f"{b['nbytes']:,}" in peak_section
    assert "largest buffers (10 of" in out
    table = out.split("live bytes per step")[1].splitlines()[2:]
    assert len(table) == len(report["steps"])
    for line, s in zip(table, report["steps"], strict=True):
        cells = line.split()
        assert cells[0] == str(s["index"]) and cells[1] == f"{s['live_nbytes']:,}"
        assert s["name"] in cells
    assert table[peak].split()[3].endswith("*")
    for word in ("steps:", "partition 0: c", "input  data_0"):  # the artifact facts stay
        assert word in out


def test_inspect_steps_and_top_limit_the_tables(squeezenet: Path) -> None:
    _, report = _load(squeezenet)
    out = cli("inspect", str(squeezenet), "--steps", "5", "--top", "3").stdout
    assert "largest buffers (3 of" in out
    head, *rows = out.split("live bytes per step")[1].splitlines()
    assert "the 5 fullest of" in head
    shown = [int(r.split()[0]) for r in rows[1:]]
    fullest = sorted(range(len(report["steps"])), key=lambda t: (-report["steps"][t]["live_nbytes"], t))[:5]
    assert shown == sorted(fullest)
    assert "fullest" not in cli("inspect", str(squeezenet), "--steps", "0").stdout.split("live bytes")[0]
    assert cli("inspect", str(squeezenet), "--steps", "-1", ok=False).returncode == 2


def test_inspect_errors_are_one_line(tmp_path: Path, squeezenet: Path) -> None:
    result = cli("inspect", str(tmp_path / "nowhere"), ok=False)
    assert result.returncode == 1 and "no such artifact" in result.stderr and "Traceback" not in result.stderr
    result = cli("inspect", str(squeezenet), "--html", str(tmp_path / "no" / "dir" / "p.html"), ok=False)
    assert result.returncode == 1 and "cannot write" in result.stderr and "Traceback" not in result.stderr


# ------------------------------------------------------------------------------ the page


class PageDom(HTMLParser):
    """The buffer rectangles (per chart), the status marker and every tag and attribute seen."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.charts: dict[str, dict[str, str]] = {}
        self.rects: dict[str, list[dict[str, str]]] = {}
        self.status: dict[str, str] = {}
        self.tags: set[str] = set()
        self.attrs: list[tuple[str, str]] = []
        self._chart: str | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.tags.add(tag)
        self.attrs += list(a.items())
        if tag == "svg" and "chart" in a.get("class", "").split():
            self._chart = a["data-arena"]
            self.charts[self._chart] = a
            self.rects[self._chart] = []
        elif tag == "rect" and "buf" in a.get("class", "").split():
            assert self._chart is not None, "a buffer rectangle outside a chart"
            self.rects[self._chart].append(a)
        elif a.get("id") == "page-status":
            self.status = a

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self._chart = None


def check_rects(dom: PageDom, plan: dict[str, Any]) -> None:
    """Exactly one rectangle per buffer of the plan, per arena, with the right hover data."""
    producer = {out: s for s in plan["steps"] for out in s["outputs"]}
    assert set(dom.rects) == {a["memory_space"] for a in plan["arenas"]}
    for space, rects in dom.rects.items():
        buffers = [b for b in plan["buffers"] if b["arena"] == space]
        assert len(rects) == len(buffers) == int(dom.charts[space]["data-buffers"])
        for rect, b in zip(rects, buffers, strict=True):
            assert rect["data-id"] == b["id"]
            numbers = ("data-offset", "data-nbytes", "data-first-step", "data-last-step")
            expected = [b["offset"], b["nbytes"], b["first_step"], b["last_step"]]
            assert [int(rect[k]) for k in numbers] == expected
            if b["values"]:
                tensor = b["id"] if b["id"] in b["values"] else b["values"][0]  # the root
                step = producer[tensor]
                assert rect["data-kind"] == "tensor" and rect["data-tensor"] == tensor
                assert json.loads(rect["data-values"]) == b["values"]
                assert rect["data-dtype"] == plan["values"][tensor]["dtype"]
                assert json.loads(rect["data-shape"]) == plan["values"][tensor]["shape"]
            else:
                step = plan["steps"][b["first_step"]]
                assert rect["data-kind"] == "scratch" and rect["data-shape"] == ""
                assert "scratch" in rect["class"].split()
            assert (rect["data-producer"], rect["data-op-type"], int(rect["data-producer-step"])) \
                == (step["name"], step["op_type"], step["index"])
            assert float(rect["width"]) > 0 and float(rect["height"]) > 0


def test_html_option_writes_the_artifacts_page(squeezenet: Path, tmp_path: Path) -> None:
    page = tmp_path / "page.html"
    result = cli("inspect", str(squeezenet), "--html", str(page), "--json")
    assert f"wrote {page}" in result.stderr and json.loads(result.stdout)["arenas"]
    assert page.read_bytes() == (squeezenet / "report" / "memory.html").read_bytes()
    plan, report = _load(squeezenet)
    assert render_memory_html(Plan.from_json(plan), report) == \
        render_memory_html(Plan.from_json(plan), report)  # deterministic


def test_page_is_self_contained_with_one_rect_per_buffer(squeezenet: Path) -> None:
    plan, report = _load(squeezenet)
    text = (squeezenet / "report" / "memory.html").read_text(encoding="utf-8")
    dom = PageDom(text)
    check_rects(dom, plan)
    assert not {"link", "img", "iframe", "object", "embed"} & dom.tags
    assert not [a for a in dom.attrs if a[0] in ("src", "href")]
    lowered = text.lower()
    for needle in ("http:", "https:", "//cdn", "@import", "url(http", "fetch(", "xmlhttprequest"):
        assert needle not in lowered, needle
    assert dom.status["data-ready"] == "no"  # until the script has run
    peak = report["arenas"]["host"]["peak_step"]
    assert dom.charts["host"]["data-peak-step"] == str(peak) and f"peak: step {peak}" in text
    assert text.count('class="live"') == len(plan["arenas"])


def _chromium() -> str | None:
    return os.environ.get("ONNX_AOT_CHROMIUM") or shutil.which("chromium")


@pytest.mark.skipif(_chromium() is None, reason="no chromium on PATH (optional, installed outside the venv: "
                    "apt-get install chromium; .ci/run does; or set $ONNX_AOT_CHROMIUM): the browser "
                    "test of the memory page needs it")
def test_page_in_headless_chromium(squeezenet: Path, tmp_path: Path) -> None:
    plan, _ = _load(squeezenet)
    page = squeezenet / "report" / "memory.html"
    cmd = [str(_chromium()), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
           "--dump-dom", page.resolve().as_uri() + "#selftest"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    console = [line for line in result.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert not console, console  # no script errors, no console output at all
    dom = PageDom(result.stdout)
    assert dom.status.get("data-ready") == "ok", dom.status  # the script ran to its end
    check_rects(dom, plan)
    assert "<title>" not in result.stdout.split("<svg", 1)[1]  # the tooltip replaced the titles
    # the self-test hovered the first rectangle; its tooltip names everything the issue asks for
    first = dom.rects["host"][0]
    tip = dom.status["data-tooltip"]
    shape = ", ".join(str(d) for d in json.loads(first["data-shape"]))
    for part in (f"tensor: {first['data-tensor']}",
                 f"node: {first['data-producer']} ({first['data-op-type']})",
                 f"shape: {first['data-dtype']} [{shape}]", f"bytes: {int(first['data-nbytes']):,}",
                 f"lifetime: steps {first['data-first-step']}–{first['data-last-step']}"):
        assert part in tip, (part, tip)


# ------------------------------------------------------------------------------ hand-made plans


def _hand_plan() -> tuple[dict[str, Any], dict[str, Any]]:
    """Three steps over two arenas: a tensor, an in-place alias of it, scratch, one device buffer."""
    def step(t: int, name: str, op: str, outs: list[str], scratch: dict[str, int] | None) -> dict[str, Any]:
        return {"index": t, "name": name, "op_type": op, "domain": "", "provider": "c", "partition": 0,
                "onnx_nodes": [name], "inputs": [], "outputs": outs, "attrs": {}, "scratch": scratch}

    def arena(space: str, strategy: str) -> dict[str, Any]:
        return {"memory_space": space, "nbytes": 256, "alignment": 64, "lower_bound_nbytes": 256,
                "naive_nbytes": 320, "strategy": strategy}

    def buffer(name: str, space: str, values: list[str]) -> dict[str, Any]:
        return {"id": name, "arena": space, "offset": 0, "nbytes": 64, "first_step": 0, "last_step": 2,
                "values": values}

    steps = [step(0, "conv", "Conv", ["a"], {"offset": 128, "nbytes": 100}),
             step(1, "relu", "Relu", ["b"], None),
             step(2, "gpu", "MatMul", ["d"], None)]
    values = {n: {"dtype": "float32", "shape": [2, 8], "location": ["arena", 0, "host"]} for n in "abd"}
    plan = {"format_version": FORMAT_VERSION, "name": "hand", "symbols": [], "assumptions": [], "inputs": [],
            "outputs": [], "constants": [],
            "weights_nbytes": 0, "arenas": [arena("host", "s"), arena("dev", "t")],
            "buffers": [buffer("a", "host", ["a", "b"]), buffer("scratch/0", "host", []),
                        buffer("d", "dev", ["d"])],
            "values": values, "steps": steps,
            "partitions": [{"index": 0, "provider": "c", "runner": "c", "memory_space": "host",
                            "entry": "onnx_aot_partition_0", "first_step": 0, "last_step": 2, "ext": [],
                            "library": "kernels/cpu/model.so"}],
            "onnx_nodes": {}}
    host = {"arena_nbytes": 256, "lower_bound_nbytes": 256, "naive_nbytes": 320, "alignment": 64,
            "peak_step": 0, "buffers": [
                {"id": "a", "tensor": "a", "offset": 0, "nbytes": 64, "first_step": 0, "last_step": 2},
                {"id": "scratch/0", "tensor": "scratch/0", "offset": 128, "nbytes": 100, "first_step": 0,
                 "last_step": 0}]}
    dev = {"arena_nbytes": 64, "lower_bound_nbytes": 64, "naive_nbytes": 64, "alignment": 64,
           "peak_step": 2, "buffers": [{"id": "d", "tensor": "d", "offset": 0, "nbytes": 64,
                                        "first_step": 2, "last_step": 2}]}
    live = [192, 64, 128]
    report = {"arenas": {"host": host, "dev": dev},
              "steps": [{"index": t, "name": s["name"], "op_type": s["op_type"], "provider": "c",
                         "live_nbytes": live[t]} for t, s in enumerate(steps)]}
    return plan, report


def test_summary_of_a_hand_made_plan() -> None:
    plan, report = _hand_plan()
    data = memory_summary(Plan.from_json(plan), report, top=1)
    host, dev = data["arenas"]["host"], data["arenas"]["dev"]
    assert [b["kind"] for b in host["buffers"]] == ["tensor", "scratch"]
    assert host["buffers"][0]["values"] == ["a", "b"] and host["buffers"][0]["producer"] == "conv"
    assert host["buffers"][1]["aligned_nbytes"] == 128 and host["buffers"][1]["dtype"] is None
    assert host["peak_live_nbytes"] == 192 and host["peak_buffers"] == ["a", "scratch/0"]
    assert host["largest_buffers"] == ["scratch/0"] and host["saving_nbytes"] == 64
    assert dev["peak_live_nbytes"] == 64 and dev["strategy"] == "t"
    assert [s["live_by_arena"] for s in data["steps"]] == [{"host": 192, "dev": 0}, {"host": 64, "dev": 0},
                                                           {"host": 64, "dev": 64}]
    assert [s["scratch_nbytes"] for s in data["steps"]] == [100, 0, 0]
    dom = PageDom(render_memory_html(Plan.from_json(plan), report))
    assert {k: len(v) for k, v in dom.rects.items()} == {"host": 2, "dev": 1}
    plan["buffers"].pop()
    with pytest.raises(ArtifactError, match="'d'"):
        memory_summary(Plan.from_json(plan), report)


def test_page_escapes_names() -> None:
    plan, report = _hand_plan()
    odd = 'x"<script>alert(1)</script>&'
    plan["values"][odd] = plan["values"].pop("a")
    plan["steps"][0]["outputs"] = [odd]
    plan["buffers"][0]["values"] = [odd, "b"]
    report["arenas"]["host"]["buffers"][0]["tensor"] = odd
    text = render_memory_html(Plan.from_json(plan), report)
    assert "<script>alert" not in text
    dom = PageDom(text)
    rect = dom.rects["host"][0]
    assert rect["data-tensor"] == odd and json.loads(rect["data-values"])[0] == odd


# ------------------------------------------------------------------------------ compile option, script


def test_compile_plan_budget_option(tmp_path: Path) -> None:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "r",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    path = tmp_path / "r.onnx"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    path.write_bytes(model.SerializeToString())
    cli("compile", str(path), "-o", str(tmp_path / "a"), "--plan-budget-ms", "5", "-q")
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["options"]["plan_budget_ms"] == 5.0
    for bad in ("-1", "soon", "inf"):
        result = cli("compile", str(path), "-o", str(tmp_path / "b"), "--plan-budget-ms", bad, ok=False)
        assert result.returncode == 2 and "plan" in result.stderr


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(),
                    reason="the script measures resident memory through Linux's /proc")
def test_measure_ort_memory_smoke() -> None:
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "scripts.measure_ort_memory", "squeezenet",
                             "--runs", "2", "--json"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| squeezenet |" in result.stdout and time.perf_counter() - start < 60
    raw = json.loads(result.stdout[result.stdout.index("\n{") + 1:result.stdout.rindex("}") + 1])
    sq = raw["squeezenet"]
    # the method checked on onnx-aot itself: what it measures is the arena the plan says
    assert abs(sq["net"]["onnx-aot"] - sq["arena"]) <= 0.2 * sq["arena"] + (1 << 20), sq
    assert sq["net"]["ort-arena"] > 0
