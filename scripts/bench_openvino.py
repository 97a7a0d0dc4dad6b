"""onnx-aot against OpenVINO (CPU plugin, f32) on the compute-bound light-zoo models (issue 19).

OpenVINO is a benchmark-only peer: it is not a dependency of onnx-aot. Run this script with a
Python that has it (``python -m venv --system-site-packages VENV && VENV/bin/pip install openvino``,
then ``VENV/bin/python -m scripts.bench_openvino``). For each model (seeded random weights, as in
scripts/bench_zoo.py) it compiles an artifact, compiles the same ONNX model with OpenVINO
(``INFERENCE_PRECISION_HINT`` f32, ``PERFORMANCE_HINT`` LATENCY, ``INFERENCE_NUM_THREADS`` as
``--threads``), checks both outputs agree, then runs them alternately on identical feeds and prints
the medians and the ratio openvino / onnx-aot (> 1: onnx-aot is faster) and the geomean.

Usage: VENV/bin/python -m scripts.bench_openvino [--runs N] [--threads N] [--smoke] [MODEL ...]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from compiler.bench import prepare_environment

prepare_environment()  # before any kernel library loads libgomp

from compiler import compile_model  # noqa: E402
from compiler.bench import alternate  # noqa: E402
from runtime.errors import OnnxAotError  # noqa: E402
from runtime.session import Session  # noqa: E402
from scripts.bench_zoo import COMPUTE_BOUND  # noqa: E402
from scripts.bench_zoo import geomean  # noqa: E402
from scripts.bench_zoo import machine_facts  # noqa: E402
from tests.support.zoo import dummy_input  # noqa: E402
from tests.support.zoo import zoo_model  # noqa: E402


class BenchSetupError(OnnxAotError):
    """OpenVINO is missing or refused the model."""


def _openvino_version() -> str:
    try:
        import openvino as ov
    except ImportError:
        raise BenchSetupError("OpenVINO is not installed in this Python: run this script with a benchmark "
                              "venv that has `pip install openvino` (see the module docstring)") from None
    return str(ov.__version__)


def _openvino(model_path: Path, threads: int) -> object:
    import openvino as ov

    config = {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY",
              "INFERENCE_NUM_THREADS": str(threads)}
    return ov.Core().compile_model(str(model_path), "CPU", config)


def compare(name: str, tmp: Path, threads: int, runs: int) -> dict[str, float]:
    """Medians of alternating runs of one zoo model, and the largest output difference."""
    import onnx

    model = zoo_model(name)
    onnx_path = tmp / f"{name}.onnx"
    onnx.save(model, onnx_path)
    session = Session(compile_model(model, tmp / name), threads=threads)
    compiled = _openvino(onnx_path, threads)
    feeds = dummy_input(model)
    request = compiled.create_infer_request()  # type: ignore[attr-defined]
    ours = session.run(None, feeds)[0]
    theirs = np.asarray(next(iter(request.infer(feeds).values())))
    err = float(np.abs(ours - theirs.reshape(ours.shape)).max() / max(np.abs(theirs).max(), 1e-30))
    t_ours, t_ov = alternate(lambda: session.run(None, feeds), lambda: request.infer(feeds), runs, warmup=3)
    return {"onnx_aot_ms": float(np.median(t_ours)) * 1e3, "openvino_ms": float(np.median(t_ov)) * 1e3,
            "ratio": float(np.median(t_ov) / np.median(t_ours)), "rel_err": err}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(COMPUTE_BOUND))
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="squeezenet, 2 runs")
    args = parser.parse_args(argv)
    models, runs = (["squeezenet"], 2) if args.smoke else (args.models, args.runs)
    facts = machine_facts()
    try:
        version = _openvino_version()
    except BenchSetupError as exc:
        print(f"bench_openvino: {exc}", file=sys.stderr)
        return 2
    print(f"# onnx-aot vs OpenVINO {version}: {facts['cpu']} ({facts['isa']}), {args.threads} thread(s), "
          f"{runs} alternating runs, medians; ratio = openvino / onnx-aot (> 1: onnx-aot faster)")
    print("| model | onnx-aot ms | OpenVINO ms | ratio | max rel diff |")
    print("|---|---|---|---|---|")
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in models:
            r = compare(name, Path(tmp), args.threads, runs)
            ratios.append(r["ratio"])
            print(f"| {name} | {r['onnx_aot_ms']:.2f} | {r['openvino_ms']:.2f} | {r['ratio']:.3f} | "
                  f"{r['rel_err']:.1e} |", flush=True)
    print(f"geomean openvino / onnx-aot: {geomean(ratios):.3f} (issue 19's goal: >= 1.10)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
