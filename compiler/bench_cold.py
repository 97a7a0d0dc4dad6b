"""Cold-start measurements for ``onnx-aot bench``: load time, load + first run, peak RSS.

Each measurement runs in a fresh Python process (``python -m compiler.bench_cold``), so nothing the
first contender warmed up in the interpreter (imports, the loaded library, allocator pools, ORT's
kernel registry) flatters the second. The operating system's page cache is not dropped (that needs
root): model files, weights and kernel libraries are read from memory in every repetition, for
both runtimes alike -- these are cold-process, warm-disk numbers.

A worker imports numpy and only the runtime it measures (``runtime`` for onnx-aot, ``onnxruntime``
for ORT; never the compiler or onnx), loads the feeds, reads VmRSS (the baseline), then times
session creation and the first run with ``perf_counter``, runs twice more and reads VmHWM (peak
resident set, from /proc/self/status; ``resource.getrusage`` where /proc is missing). It prints one
JSON line. ``cold_start`` runs the workers alternately (onnx-aot, ORT, onnx-aot, ...) ``reps``
times and reports medians.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["cold_start", "ort_session", "worker_main"]

_KIB = 1024


def _rss() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process in bytes."""
    found: dict[str, int] = {}
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    found[key] = int(value.split()[0]) * _KIB
    except OSError:
        pass
    if len(found) == 2:
        return found["VmRSS"], found["VmHWM"]
    import resource

    peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * _KIB  # KiB on Linux
    return peak, peak


def ort_session(ort: Any, model: str | bytes, threads: int) -> Any:
    """An onnxruntime CPU session set up as every onnx-aot comparison sets it up: its threads
    spin within a run (its default) and stop when the run returns (``force_spinning_stop``)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "1")
    options.add_session_config_entry("session.force_spinning_stop", "1")
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def worker_main(argv: list[str]) -> int:
    """``python -m compiler.bench_cold {onnx-aot|onnxruntime} PATH FEEDS.npz THREADS``."""
    engine, path, feeds_path, threads_text = argv
    threads = int(threads_text)
    start = time.perf_counter()
    import numpy as np

    if engine == "onnx-aot":
        from runtime import Session
    else:
        import onnxruntime as ort
    import_s = time.perf_counter() - start
    with np.load(feeds_path, allow_pickle=False) as data:
        feeds = {name: data[name] for name in data.files}
    base_rss, _ = _rss()
    t0 = time.perf_counter()
    if engine == "onnx-aot":
        session = Session(path, threads=threads)
        t1 = time.perf_counter()
        session.run(None, feeds)
        t2 = time.perf_counter()
        for _ in range(2):
            session.run(None, feeds)
    else:
        session = ort_session(ort, path, threads)
        t1 = time.perf_counter()
        session.run(None, feeds)
        t2 = time.perf_counter()
        for _ in range(2):
            session.run(None, feeds)
    _, peak = _rss()
    print(json.dumps({"engine": engine, "import_s": import_s, "load_s": t1 - t0, "first_run_s": t2 - t1,
                      "load_first_s": t2 - t0, "base_rss": base_rss, "peak_rss": peak}))
    return 0


def _one(engine: str, path: Path, feeds_path: Path, threads: int) -> dict[str, Any]:
    from compiler.bench import BenchError

    env = dict(os.environ)
    cmd = [sys.executable, "-m", "compiler.bench_cold", engine, str(path), str(feeds_path), str(threads)]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if result.returncode != 0:
        raise BenchError(f"cold-start worker for {engine} on {path} failed (exit {result.returncode}): "
                         f"{result.stderr.strip()[-2000:]}")
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise BenchError(f"cold-start worker for {engine} on {path} printed no result: "
                         f"{result.stdout[-500:]}")
    record: dict[str, Any] = json.loads(lines[-1])
    return record


def cold_start(artifact: Path, ort_model: Path | None, feeds_path: Path, threads: int,
               reps: int) -> dict[str, Any]:
    """Medians over ``reps`` fresh processes per engine, engines alternating; ratios when both ran."""
    samples: dict[str, list[dict[str, Any]]] = {"onnx-aot": []}
    if ort_model is not None:
        samples["onnxruntime"] = []
    for _ in range(reps):
        samples["onnx-aot"].append(_one("onnx-aot", artifact, feeds_path, threads))
        if ort_model is not None:
            samples["onnxruntime"].append(_one("onnxruntime", ort_model, feeds_path, threads))
    out: dict[str, Any] = {"reps": reps}
    keys = ("import_s", "load_s", "first_run_s", "load_first_s", "base_rss", "peak_rss")
    for engine, records in samples.items():
        out[engine] = {key: statistics.median(r[key] for r in records) for key in keys}
    if ort_model is not None:
        ours, theirs = out["onnx-aot"], out["onnxruntime"]
        out["load_ratio"] = ours["load_s"] / theirs["load_s"]
        out["load_first_ratio"] = ours["load_first_s"] / theirs["load_first_s"]
        out["peak_rss_ratio"] = ours["peak_rss"] / theirs["peak_rss"]
    return out


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
