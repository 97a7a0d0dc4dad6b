"""Latency of the nine random-weight light-zoo models against onnxruntime, in one process.

Runs alternate (onnx-aot, onnxruntime, onnx-aot, ...) with the same inputs and thread count; prints
medians, the latency ratio onnx-aot / onnxruntime (< 1 is faster), and the arena against its
lower bound. Usage: python scripts/bench_zoo.py [--runs N] [--threads N] [--smoke] [MODEL ...]

Fairness: both runtimes' thread pools spin after a run and, when runs alternate on a 2-core
machine, steal the other's core (measured on ResNet-50: onnx-aot 55 ms alone, 116 ms right after an
onnxruntime run). So onnxruntime's intra-op spinning is turned off and OpenMP waits passively
(OMP_WAIT_POLICY=PASSIVE, set before any kernel library loads). onnxruntime gets the model with
initializers removed from the graph inputs, so it can fold and fuse its weights.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before libgomp loads

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from zoo import ZOO, dummy_input, for_onnxruntime, zoo_model  # noqa: E402

from compiler import compile_model  # noqa: E402
from runtime import Session  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(ZOO))
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="2 runs of squeezenet only")
    args = parser.parse_args()
    import onnxruntime as ort

    models = ["squeezenet"] if args.smoke else args.models
    runs = 2 if args.smoke else args.runs
    print(f"{'model':<14}{'onnx-aot ms':>12}{'ORT ms':>10}{'ratio':>8}{'arena/LB':>10}{'max err':>10}")
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in models:
            model = zoo_model(name)
            session = Session(compile_model(model, Path(tmp) / name), threads=args.threads)
            options = ort.SessionOptions()
            options.intra_op_num_threads = args.threads
            options.inter_op_num_threads = 1
            options.log_severity_level = 3
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            ref = ort.InferenceSession(for_onnxruntime(model).SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
            feeds = dummy_input(model)
            ours, theirs = session.run(None, feeds)[0], ref.run(None, feeds)[0]
            err = float(np.max(np.abs(ours - theirs) / (np.abs(theirs) + 1e-3)))
            a, b = [], []
            for _ in range(runs):
                t0 = time.perf_counter()
                session.run(None, feeds)
                a.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                ref.run(None, feeds)
                b.append(time.perf_counter() - t0)
            ma, mb = statistics.median(a), statistics.median(b)
            ratios.append(ma / mb)
            arena = session.plan["arenas"][0]
            print(f"{name:<14}{ma * 1000:>12.2f}{mb * 1000:>10.2f}{ma / mb:>8.2f}"
                  f"{arena['nbytes'] / max(arena['lower_bound_nbytes'], 1):>10.3f}{err:>10.1e}",
                  flush=True)
    geomean = float(np.exp(np.mean(np.log(ratios))))
    print(f"geomean latency ratio onnx-aot / onnxruntime: {geomean:.2f} ({args.threads} threads)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
