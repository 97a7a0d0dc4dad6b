"""Two builds of one model against each other and onnxruntime, alternating in this one process.

For each (OLD, NEW, MODEL.onnx) triple it loads both artifact folders (compiled from the same
model by two trees of this project, e.g. before and after a change) and onnxruntime on the model,
and times them in turn -- old, new, onnxruntime, old, ... -- on identical seeded feeds at the same
thread count, with the pause after every run that ``compiler.bench`` uses (both runtimes spin only
within a run). It prints per model the medians, old / ORT, new / ORT and new / old, each build's
max relative error against onnxruntime, and the geomeans over the models.

The runtime of this tree loads both folders; an older artifact loads if its format version is
still read (``runtime/plan_schema.py: OLDEST_FORMAT_VERSION``) and its library follows ABI 1.

Usage: python -m scripts.bench_compare_builds [--runs N] [--threads N] OLD NEW MODEL.onnx [OLD NEW MODEL ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

from compiler.bench import prepare_environment

prepare_environment()  # before any kernel library loads libgomp

import onnx  # noqa: E402

from compiler.bench import error_stats  # noqa: E402
from compiler.bench import for_onnxruntime  # noqa: E402
from compiler.bench import import_onnxruntime  # noqa: E402
from compiler.bench import round_robin  # noqa: E402
from compiler.bench_cold import ort_session  # noqa: E402
from runtime import Session  # noqa: E402
from runtime.cli import random_feeds  # noqa: E402
from runtime.errors import OnnxAotError  # noqa: E402


def compare(old: Path, new: Path, model: Path, threads: int, runs: int) -> dict[str, float]:
    """Medians (seconds) of the three engines' alternating runs and each build's error vs ORT."""
    ort = import_onnxruntime()
    sessions = [Session(old, threads=threads), Session(new, threads=threads)]
    feeds = random_feeds(sessions[1])
    ref = ort_session(ort, for_onnxruntime(onnx.load(str(model))).SerializeToString(), threads)
    names = [s.name for s in sessions[1].outputs]
    expected = ref.run(names, feeds)
    errors = [error_stats(s.run(None, feeds), expected)["max_rel_err"] for s in sessions]
    runners = [lambda s=s: s.run(None, feeds) for s in sessions] + [lambda: ref.run(names, feeds)]
    times = round_robin(runners, runs, warmup=3)
    t_old, t_new, t_ort = (statistics.median(t) for t in times)
    return {"old_s": t_old, "new_s": t_new, "ort_s": t_ort, "old_err": errors[0], "new_err": errors[1]}


def geomean(values: list[float]) -> float:
    return float(np.exp(np.mean(np.log(values))))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("triples", nargs="+", type=Path, help="OLD NEW MODEL.onnx, repeated")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if len(args.triples) % 3:
        raise SystemExit("bench_compare_builds: give OLD NEW MODEL.onnx triples")
    print(f"{'model':<16}{'old ms':>9}{'new ms':>9}{'ORT ms':>9}{'old/ORT':>9}{'new/ORT':>9}{'new/old':>9}"
          f"{'old err':>10}{'new err':>10}", flush=True)
    ratios: dict[str, list[float]] = {"old/ORT": [], "new/ORT": [], "new/old": []}
    for i in range(0, len(args.triples), 3):
        old, new, model = args.triples[i:i + 3]
        try:
            r = compare(old, new, model, args.threads, args.runs)
        except OnnxAotError as exc:
            print(f"{model.stem:<16}failed: {exc}", flush=True)
            continue
        row = [r["old_s"] / r["ort_s"], r["new_s"] / r["ort_s"], r["new_s"] / r["old_s"]]
        for key, value in zip(ratios, row, strict=True):
            ratios[key].append(value)
        print(f"{model.stem:<16}{r['old_s'] * 1e3:>9.2f}{r['new_s'] * 1e3:>9.2f}{r['ort_s'] * 1e3:>9.2f}"
              + "".join(f"{v:>9.3f}" for v in row) + f"{r['old_err']:>10.1e}{r['new_err']:>10.1e}",
              flush=True)
    if ratios["new/old"]:
        print(f"{'geomean':<43}" + "".join(f"{geomean(v):>9.3f}" for v in ratios.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
