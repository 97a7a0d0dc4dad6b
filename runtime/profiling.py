"""Per-step profiling: ``Session(path, profile=True)`` and ``end_profiling()`` -> Chrome-trace JSON.

Every provider reports step wall times into a float64 buffer indexed by the step's position in
its partition: the C entry fills it itself (``clock_gettime`` around each step, one NULL test per
step when not profiling), the reference provider times each kernel call with ``perf_counter``,
the CUDA provider records an event pair per launch. A step's start time is its partition's start
(taken on the host) plus the durations of the steps before it.

The file is what onnxruntime's profiler and chrome://tracing read: a JSON array of complete
("ph": "X") events with microsecond ``ts`` / ``dur``; one "Node" event per step per run, named
after the step (the ONNX node it came from; ``args.onnx_nodes`` lists every ONNX node fused into
it) plus one "Session" event ``model_run`` per run. ``slowest_steps`` summarizes a trace.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runtime.plan_schema import Plan

__all__ = ["Profiler", "RunRecord", "StepStat", "load_trace", "slowest_steps", "format_slowest"]


class RunRecord:
    """One run's timings: (partition index, start ns, step seconds) per partition."""

    __slots__ = ("index", "tid", "start_ns", "end_ns", "parts")

    def __init__(self, index: int, start_ns: int) -> None:
        self.index = index
        self.tid = threading.get_ident()
        self.start_ns = start_ns
        self.end_ns = start_ns
        self.parts: list[tuple[int, int, np.ndarray]] = []

    def partition(self, index: int, start_ns: int, timings: np.ndarray) -> None:
        self.parts.append((index, start_ns, timings.copy()))


class Profiler:
    """Collects ``RunRecord``s for one session and writes them as Chrome-trace JSON."""

    def __init__(self, plan: Plan, path: Path) -> None:
        self.name = plan.name or Path(path).name
        self.origin_ns = time.perf_counter_ns()
        self.started = time.strftime("%Y-%m-%d_%H-%M-%S")
        self.partitions = [plan.partition_steps(record) for record in plan.partitions]
        self._buffers = [np.zeros(max(len(part), 1), np.float64) for part in self.partitions]
        self.runs: list[RunRecord] = []
        self._lock = threading.Lock()
        self._local = threading.local()

    @staticmethod
    def now() -> int:
        return time.perf_counter_ns()

    def timings(self, partition: int) -> np.ndarray:
        """A zeroed per-thread timing buffer for ``partition`` (one float64 per step)."""
        buffers: list[np.ndarray] | None = getattr(self._local, "buffers", None)
        if buffers is None:
            buffers = [np.zeros_like(b) for b in self._buffers]
            self._local.buffers = buffers
        out = buffers[partition]
        out.fill(0.0)
        return out

    def begin_run(self) -> RunRecord:
        with self._lock:
            index = len(self.runs)
            record = RunRecord(index, time.perf_counter_ns())
            self.runs.append(record)
        return record

    def end_run(self, record: RunRecord) -> None:
        record.end_ns = time.perf_counter_ns()

    def events(self) -> list[dict[str, Any]]:
        pid = os.getpid()
        out: list[dict[str, Any]] = []
        for run in self.runs:
            out.append({"cat": "Session", "pid": pid, "tid": run.tid, "ph": "X", "name": "model_run",
                        "ts": _us(run.start_ns - self.origin_ns),
                        "dur": _us(run.end_ns - run.start_ns),
                        "args": {"run": run.index, "model": self.name}})
            for index, start_ns, seconds in run.parts:
                t = start_ns - self.origin_ns
                for local, step in enumerate(self.partitions[index]):
                    dur = int(round(float(seconds[local]) * 1e9))
                    out.append({"cat": "Node", "pid": pid, "tid": run.tid, "ph": "X", "name": step.name,
                                "ts": _us(t), "dur": _us(dur),
                                "args": {"op_name": step.op_type, "provider": step.provider,
                                         "step": step.index, "partition": index, "run": run.index,
                                         "onnx_nodes": list(step.onnx_nodes)}})
                    t += dur
        return out

    def write(self, path: str | os.PathLike[str] | None = None) -> Path:
        default = f"onnx_aot_profile_{_safe(self.name)}_{self.started}.json"
        target = Path(path) if path is not None else Path(default)
        with self._lock:
            events = self.events()
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(events, indent=0) + "\n", encoding="utf-8")
        return target


def _us(ns: int) -> float:
    return round(ns / 1000.0, 3)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "model"


@dataclass(frozen=True)
class StepStat:
    name: str
    op_type: str
    provider: str
    step: int
    calls: int
    total_us: float

    @property
    def mean_us(self) -> float:
        return self.total_us / self.calls if self.calls else 0.0


def load_trace(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The events of a Chrome-trace file (a JSON array, or an object with ``traceEvents``)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if isinstance(data, dict):
        data = data.get("traceEvents", [])
    return [e for e in data if isinstance(e, dict)]


def slowest_steps(events: list[dict[str, Any]], top: int = 10) -> list[StepStat]:
    """The ``top`` steps with the most total time over every run in ``events``."""
    totals: dict[int, list[Any]] = {}
    for e in events:
        if e.get("cat") != "Node":
            continue
        args = e.get("args", {})
        key = int(args.get("step", -1))
        entry = totals.setdefault(key, [e["name"], args.get("op_name", ""), args.get("provider", ""), 0, 0.0])
        entry[3] += 1
        entry[4] += float(e.get("dur", 0.0))
    stats = [StepStat(v[0], v[1], v[2], k, v[3], v[4]) for k, v in totals.items()]
    stats.sort(key=lambda s: (-s.total_us, s.step))
    return stats[:max(top, 0)]


def format_slowest(events: list[dict[str, Any]], top: int = 10) -> str:
    """A text table of ``slowest_steps`` with each step's share of all step time."""
    everything = sum(float(e.get("dur", 0.0)) for e in events if e.get("cat") == "Node") or 1.0
    rows = [f"{'step':>5}  {'mean ms':>9}  {'share':>6}  {'provider':<9} {'op':<18} name"]
    for s in slowest_steps(events, top):
        rows.append(f"{s.step:>5}  {s.mean_us / 1000:>9.4f}  {100 * s.total_us / everything:>5.1f}%  "
                    f"{s.provider:<9} {s.op_type:<18} {s.name}")
    return "\n".join(rows) + "\n"
