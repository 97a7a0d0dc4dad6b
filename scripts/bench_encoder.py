"""Issue 20's bench: BERT-base-size and MiniLM-size encoders (``tests/support/encoder_model.py``)
against onnxruntime.

Builds each model (batch 1, seq 128, seeded random weights, the form PyTorch exports), compiles it
into a temporary folder and runs ``compiler.bench.bench`` with ``--compare`` semantics at each
thread count: runs alternating with onnxruntime in this process on identical feeds, the median
latency ratio onnx-aot / onnxruntime (< 1 is faster) and the max error. ``--repeat N`` repeats each
measurement (the machine is shared: quote the spread). ``--profile`` adds onnx-aot's per-step
profile (``Session(profile=True)``) summed by op type, and the slowest steps. Slow: not part of
CI, except ``--smoke`` (two small layers, 2 runs).

Usage: python -m scripts.bench_encoder [--model bert minilm] [--threads 2 1] [--runs N] [--repeat N]
                                       [--profile] [--smoke] [--seq N] [--cpu LEVEL]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

from compiler.bench import bench
from compiler.bench import prepare_environment
from compiler.driver import compile_model
from runtime.profiling import format_slowest
from scripts.bench_zoo import machine_facts
from tests.support.encoder_model import BERT_BASE
from tests.support.encoder_model import MINILM
from tests.support.encoder_model import encoder_feeds
from tests.support.encoder_model import encoder_model

SIZES = {"bert": BERT_BASE, "minilm": MINILM}
SMOKE = {"layers": 2, "hidden": 64, "heads": 4, "ffn": 128}


def profile(artifact: Path, model: onnx.ModelProto, threads: int, runs: int) -> str:
    """Per-step times of ``runs`` runs: the total by op type (ms per run) and the slowest steps."""
    return profile_feeds(artifact, encoder_feeds(model), threads, runs)


def profile_feeds(artifact: Path, feeds: dict[str, np.ndarray], threads: int, runs: int) -> str:
    """``profile`` on given feeds (any model)."""
    from runtime import Session

    session = Session(artifact, threads=threads, profile=True)
    for _ in range(runs):
        session.run(None, feeds)
    with tempfile.TemporaryDirectory(prefix="onnx-aot-profile-") as tmp:
        events = json.loads(Path(session.end_profiling(Path(tmp) / "trace.json")).read_text())
    by_op: collections.Counter[str] = collections.Counter()
    for e in events:
        if e.get("cat") == "Node":
            by_op[str(e.get("args", {}).get("op_name", "?"))] += float(e.get("dur", 0.0))
    total = sum(by_op.values()) or 1.0
    lines = [f"  {op:<28} {us / runs / 1000:8.3f} ms  {100 * us / total:5.1f}%"
             for op, us in by_op.most_common()]
    return "\n".join([f"  steps total {total / runs / 1000:.3f} ms per run (threads {threads})", *lines,
                      format_slowest(events, 12)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", nargs="+", choices=sorted(SIZES), default=["bert", "minilm"])
    parser.add_argument("--runs", type=int, default=20, help="timed runs per engine (default 20)")
    parser.add_argument("--repeat", type=int, default=1, help="measurements per model and thread count")
    parser.add_argument("--threads", type=int, nargs="+", default=[2, 1], help="thread counts (default 2 1)")
    parser.add_argument("--profile", action="store_true", help="print onnx-aot's per-step profile")
    parser.add_argument("--smoke", action="store_true", help="two small layers, 2 runs (CI)")
    parser.add_argument("--seq", type=int, default=128, help="sequence length (default 128)")
    parser.add_argument("--cpu", default=None,
                        help="the C kernels' target (x86-64-v3, ...; default: this machine's level)")
    args = parser.parse_args()
    prepare_environment()
    facts = machine_facts()
    print(f"{facts['cpu']} ({facts['cores']} cores; {facts['isa']}), onnxruntime {facts['onnxruntime']}",
          flush=True)
    runs = 2 if args.smoke else args.runs
    with tempfile.TemporaryDirectory(prefix="onnx-aot-encoder-") as tmp:
        for name in args.model:
            model = encoder_model(**(SMOKE if args.smoke else SIZES[name]), seq=args.seq)
            path = Path(tmp) / f"{name}.onnx"
            onnx.save(model, path)
            artifact = compile_model(path, Path(tmp) / name, golden_cases=0, cpu=args.cpu)
            for threads in args.threads:
                for _ in range(max(args.repeat, 1)):
                    r = bench(artifact, compare=path, threads=threads, runs=runs, cold_reps=0)
                    lat, acc = r["latency"], r["accuracy"]
                    print(f"{name} threads {threads}: onnx-aot {lat['onnx_aot_s'] * 1e3:.2f} ms, onnxruntime "
                          f"{lat['onnxruntime_s'] * 1e3:.2f} ms, ratio {lat['ratio']:.3f}, "
                          f"max abs err {acc['max_abs_err']:.2e}, "
                          f"within tolerance {acc['within_tolerance']}", flush=True)
                if args.profile:
                    print(profile(artifact, model, threads, runs), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
