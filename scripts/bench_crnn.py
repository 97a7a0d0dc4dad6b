"""Issue 21's bench: a CRNN-style recognizer (``tests/support/crnn_model.py``) against onnxruntime.

Builds the model at the issue's dims (1x1x64x256 input, 512 features, bidirectional LSTM with
hidden 512, a 1024 -> 8210 classifier Gemm; seeded random weights), compiles it into a temporary
folder and runs ``compiler.bench.bench`` with ``--compare`` semantics at 1 and 2 threads: runs
alternating with onnxruntime in this process on identical feeds, median latency ratio onnx-aot /
onnxruntime (< 1 is faster) and the max error. ``--busy N`` keeps N other processes spinning on
the machine while it measures (servers are never idle). Slow and it loads the machine: not part
of CI, except ``--smoke`` (small dims, 2 runs).

Usage: python -m scripts.bench_crnn [--runs N] [--threads N ...] [--busy N] [--smoke]
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
from pathlib import Path

import onnx

from compiler.bench import bench
from compiler.bench import prepare_environment
from compiler.driver import compile_model
from scripts.bench_zoo import machine_facts
from tests.support.crnn_model import crnn_model

SMOKE_DIMS = {"height": 32, "width": 64, "features": 64, "hidden": 32, "classes": 50}


def _spin() -> None:
    while True:
        pass


def bench_arguments(doc: str, default_runs: int = 30) -> argparse.Namespace:
    """The options every model bench takes (``--runs``, ``--threads``, ``--busy``, ``--smoke``)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--runs", type=int, default=default_runs,
                        help=f"timed runs per engine (default {default_runs})")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="thread counts (default 1 2)")
    parser.add_argument("--busy", type=int, default=0, help="processes kept spinning meanwhile (default 0)")
    parser.add_argument("--smoke", action="store_true", help="small dims, 2 runs (CI)")
    return parser.parse_args()


def compare_model(model: onnx.ModelProto, name: str, args: argparse.Namespace) -> int:
    """Compile ``model``, then per thread count time it alternating with onnxruntime and print the
    medians, their ratio and the max error (``bench_arguments``' options)."""
    prepare_environment()
    facts = machine_facts()
    print(f"{facts['cpu']} ({facts['cores']} cores; {facts['isa']}), onnxruntime {facts['onnxruntime']}, "
          f"{args.busy} busy process(es)", flush=True)
    runs = 2 if args.smoke else args.runs
    busy = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.busy)]
    with tempfile.TemporaryDirectory(prefix=f"onnx-aot-{name}-") as tmp:
        path = Path(tmp) / f"{name}.onnx"
        onnx.save(model, path)
        artifact = compile_model(path, Path(tmp) / name, golden_cases=0)
        for process in busy:
            process.start()
        try:
            for threads in args.threads:
                r = bench(artifact, compare=path, threads=threads, runs=runs, cold_reps=0)
                lat, acc = r["latency"], r["accuracy"]
                print(f"threads {threads}: onnx-aot {lat['onnx_aot_s'] * 1e3:.2f} ms, onnxruntime "
                      f"{lat['onnxruntime_s'] * 1e3:.2f} ms, ratio {lat['ratio']:.3f}, "
                      f"max abs err {acc['max_abs_err']:.2e}, max rel err {acc['max_rel_err']:.2e} "
                      f"({'within' if acc['within_tolerance'] else 'NOT within'} rtol {acc['rtol']:g} / "
                      f"atol {acc['atol']:g})", flush=True)
        finally:
            for process in busy:
                process.terminate()
    return 0


def main() -> int:
    args = bench_arguments(__doc__)
    return compare_model(crnn_model(**(SMOKE_DIMS if args.smoke else {})), "crnn", args)


if __name__ == "__main__":
    sys.exit(main())
