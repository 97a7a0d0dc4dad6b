"""The worker process of ``onnx-aot bench``'s cold-start measurements: load time, load + first run,
peak RSS.

Each measurement runs in a fresh Python process (``python -m compiler.bench_cold``), so nothing the
first contender warmed up in the interpreter (imports, the loaded library, allocator pools, ORT's
kernel registry) flatters the second. The operating system's page cache is not dropped (that needs
root): model files, weights and kernel libraries are read from memory in every repetition, for
both runtimes alike -- these are cold-process, warm-disk numbers.

A worker imports numpy and only the runtime it measures (``runtime`` for onnx-aot, ``onnxruntime``
for ORT; never the compiler or onnx), loads the feeds, reads VmRSS (the baseline), then times
session creation and the first run with ``perf_counter``, runs twice more and reads VmHWM (peak
resident set, from /proc/self/status; ``resource.getrusage`` where /proc is missing). It prints one
JSON line. ``compiler.bench.cold_start`` runs the workers alternately (onnx-aot, ORT, onnx-aot,
...) ``reps`` times and reports medians. This module imports nothing of the compiler (nor, at
module level, of the runtime), so a worker's import time is the measured runtime's own.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

__all__ = ["ort_session", "worker_main"]

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


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
