"""Issue 34's ``--quantize int8`` bench: our calibration against onnxruntime's ``quantize_static``.

For each float model (``scripts/bench_int8.py: float_model``: the random-weight light zoo's
ResNet-50 at opset 13, the MiniLM-size encoder, seq 128) and each calibration method, the model is
compiled with ``--quantize int8`` on ``--samples`` (32) seeded calibration feeds, and onnxruntime's
``quantize_static`` (QDQ, S8S8, per channel, its ``quant_pre_process`` first) quantizes it on the
same feeds with the same method (``tests/support/ort_quantize.py``). Each row: the error against
the fp32 model (max |int8 - fp32| / max |fp32|, onnxruntime's fp32 run, on three feeds not used to
calibrate) of ours and of onnxruntime's int8 model (issue 34: ours <= 1.25x theirs), the latency of
our int8 artifact over our fp32 artifact (runs alternating in this process, medians; issue 34:
<= 0.55 on a VNNI host), and the compile time with calibration. The machine is shared: quote
ratios, run it under the CPU lock.

Usage: python -m scripts.bench_quantize [--models resnet50,minilm] [--methods minmax,entropy,percentile]
                                        [--samples 32] [--runs 20] [--threads 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from compiler.bench import prepare_environment

prepare_environment()  # before any kernel library loads libgomp

from compiler import compile_model  # noqa: E402
from compiler.bench import alternate  # noqa: E402
from compiler.bench import import_onnxruntime  # noqa: E402
from compiler.bench_cold import ort_session  # noqa: E402
from runtime.session import Session  # noqa: E402
from scripts.bench_int8 import Float  # noqa: E402
from scripts.bench_int8 import _list  # noqa: E402
from scripts.bench_int8 import _steps  # noqa: E402
from scripts.bench_int8 import float_model  # noqa: E402
from scripts.bench_zoo import machine_facts  # noqa: E402
from scripts.bench_zoo import table_head  # noqa: E402
from tests.support.ort_quantize import ort_quantized  # noqa: E402
from tests.support.qdq_models import stray  # noqa: E402

MODELS = ("resnet50", "minilm", "squeezenet", "encoder_smoke")
METHODS = ("minmax", "entropy", "percentile")
HELD_OUT = (1000, 1001, 1002)


def bench_method(fp: Float, method: str, fp32: Session, ort: Any, tmp: Path, args: argparse.Namespace,
                 reference: list[list[np.ndarray]]) -> dict[str, Any]:
    """One model and method: our quantized compile, onnxruntime's, errors, alternating timings."""
    row: dict[str, Any] = {"model": fp.name, "method": method, "samples": args.samples}
    calibration = [fp.feeds(seed) for seed in range(args.samples)]
    arrays = {name: np.stack([f[name] for f in calibration]) for name in calibration[0]}
    start = time.perf_counter()
    artifact = compile_model(str(fp.path), tmp / f"{fp.name}.{method}", quantize="int8", calibration=arrays,
                             calibration_method=method, golden_cases=1)
    row["compile_s"] = time.perf_counter() - start
    row["steps"] = _steps(artifact)
    theirs = ort_session(ort, str(ort_quantized(fp.path, tmp / f"{fp.name}.{method}.ort.onnx", calibration,
                                                method)), args.threads)
    ours = Session(artifact, threads=args.threads)
    names = [s.name for s in ours.outputs]
    held = [fp.feeds(seed) for seed in HELD_OUT]
    row["error_ours"] = max(stray(ours.run(None, f), r) for f, r in zip(held, reference, strict=True))
    row["error_ort"] = max(stray(theirs.run(names, f), r) for f, r in zip(held, reference, strict=True))
    row["error_ratio"] = row["error_ours"] / row["error_ort"] if row["error_ort"] else float("inf")
    feeds = held[0]
    a, b = alternate(lambda: ours.run(None, feeds), lambda: fp32.run(None, feeds), args.runs, 3)
    row["int8_s"], row["fp32_s"] = statistics.median(a), statistics.median(b)
    row["vs_fp32"] = row["int8_s"] / row["fp32_s"]
    return row


def bench_model(name: str, ort: Any, tmp: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    fp = float_model(name, tmp)
    fp32 = Session(compile_model(str(fp.path), tmp / f"{name}.fp32", golden_cases=1), threads=args.threads)
    exact = ort_session(ort, str(fp.path), args.threads)
    names = [s.name for s in fp32.outputs]
    reference = [exact.run(names, fp.feeds(seed)) for seed in HELD_OUT]
    return [bench_method(fp, method, fp32, ort, tmp, args, reference) for method in args.methods]


def format_row(r: dict[str, Any]) -> str:
    cells = [r["model"], r["method"], str(r["samples"]), f"{r['error_ours']:.4f}", f"{r['error_ort']:.4f}",
             f"{r['error_ratio']:.2f}", f"{r['int8_s'] * 1e3:.2f}", f"{r['fp32_s'] * 1e3:.2f}",
             f"{r['vs_fp32']:.3f}", f"{r['compile_s']:.0f}", r["steps"]]
    return "| " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=lambda t: _list(t, MODELS), default=["resnet50", "minilm"],
                        help=f"comma-separated, from {', '.join(MODELS)}")
    parser.add_argument("--methods", type=lambda t: _list(t, METHODS), default=["minmax"],
                        help=f"comma-separated, from {', '.join(METHODS)} (default minmax)")
    parser.add_argument("--samples", type=int, default=32, help="calibration feeds (default 32)")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="also save every row")
    args = parser.parse_args(argv)
    ort = import_onnxruntime()
    facts = machine_facts()
    print(f"{facts['cpu']} ({facts['cores']} cores; {facts['isa']}), onnxruntime {facts['onnxruntime']}, "
          f"{args.threads} threads", flush=True)
    print(table_head("model", "method", "feeds", "error ours", "error ORT", "ours / ORT", "int8 ms",
                     "our fp32 ms", "int8 / fp32", "compile s", "steps"), flush=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-quantize-") as tmp_name:
        for name in args.models:
            for row in bench_model(name, ort, Path(tmp_name), args):
                rows.append(row)
                print(format_row(row), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps({"machine": facts, "rows": rows}, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
