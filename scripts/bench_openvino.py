"""onnx-aot against OpenVINO (CPU plugin) on the compute-bound light-zoo models (issues 19, 34).

OpenVINO is a benchmark-only peer: it is not a dependency of onnx-aot. Run this script with a
Python that has it (``python -m venv --system-site-packages VENV && VENV/bin/pip install openvino``,
then ``VENV/bin/python -m scripts.bench_openvino``, with onnx-aot's dependencies on PYTHONPATH). For
each model (seeded random weights, as in scripts/bench_zoo.py) it compiles an fp32 and a
``--precision bf16`` artifact, compiles the same ONNX model with OpenVINO twice — at f32
(``INFERENCE_PRECISION_HINT`` f32) and at its default (no precision hint: bf16 where the CPU computes
it natively, what a user who sets only the thread count gets), both with ``PERFORMANCE_HINT`` LATENCY
and ``INFERENCE_NUM_THREADS`` as ``--threads`` — then runs the four in turn on identical feeds. It
prints the medians, our fp32 against OpenVINO f32, our bf16 against OpenVINO's default, our bf16
against our fp32, and each reduced-precision run's error against our fp32 output (max |difference|
over max |fp32 output|), with the geomeans issue 34 states its targets in.

Usage: VENV/bin/python -m scripts.bench_openvino [--runs N] [--threads N] [--smoke] [MODEL ...]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from compiler.bench import prepare_environment

prepare_environment()  # before any kernel library loads libgomp

from compiler import compile_model  # noqa: E402
from compiler.bench import round_robin  # noqa: E402
from runtime.errors import OnnxAotError  # noqa: E402
from runtime.selftest import relative_error  # noqa: E402
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


def _openvino(model_path: Path, threads: int, precision: str | None) -> object:
    """OpenVINO's CPU plugin at ``precision`` ("f32"), or at its own default (``None``: bf16 where
    the CPU computes it natively, as a user who sets only the thread count gets)."""
    import openvino as ov

    config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": str(threads)}
    if precision is not None:
        config["INFERENCE_PRECISION_HINT"] = precision
    return ov.Core().compile_model(str(model_path), "CPU", config)


def _rel_err(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| over max |want| (the error measure of issue 34), OpenVINO's output in our shape."""
    return relative_error(np.asarray(got, want.dtype).reshape(want.shape), want)


def compare(name: str, tmp: Path, threads: int, runs: int) -> dict[str, Any]:
    """Medians of round-robin runs of one zoo model: onnx-aot fp32 and bf16, OpenVINO f32 and its
    default; errors against our fp32 output on the same feeds."""
    import onnx

    model = zoo_model(name)
    onnx_path = tmp / f"{name}.onnx"
    onnx.save(model, onnx_path)
    fp32 = Session(compile_model(model, tmp / name), threads=threads)
    bf16 = Session(compile_model(model, tmp / f"{name}-bf16", precision="bf16"), threads=threads)
    ov_f32 = _openvino(onnx_path, threads, "f32").create_infer_request()  # type: ignore[attr-defined]
    ov_default = _openvino(onnx_path, threads, None)
    hint = ov_default.get_property("INFERENCE_PRECISION_HINT")  # type: ignore[attr-defined]
    ov_default_precision = str(getattr(hint, "get_type_name", lambda: hint)())
    ov_def = ov_default.create_infer_request()  # type: ignore[attr-defined]
    feeds = dummy_input(model)
    want = fp32.run(None, feeds)[0]
    errs = {"ours_bf16_err": _rel_err(bf16.run(None, feeds)[0], want),
            "ov_f32_err": _rel_err(next(iter(ov_f32.infer(feeds).values())), want),
            "ov_default_err": _rel_err(next(iter(ov_def.infer(feeds).values())), want)}
    ms = [float(np.median(t)) * 1e3 for t in round_robin(
        [lambda: fp32.run(None, feeds), lambda: ov_f32.infer(feeds), lambda: bf16.run(None, feeds),
         lambda: ov_def.infer(feeds)], runs, warmup=3)]
    return {"fp32_ms": ms[0], "ov_f32_ms": ms[1], "bf16_ms": ms[2], "ov_default_ms": ms[3],
            "ov_default_precision": ov_default_precision, **errs}


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
          f"{runs} round-robin runs, medians; ratios = onnx-aot / OpenVINO (< 1: onnx-aot faster); "
          f"errors = max |diff| / max |our fp32 output|, same feeds")
    print("| model | ours fp32 ms | OV f32 ms | fp32 / OV f32 | ours bf16 ms | OV default ms (precision) "
          "| bf16 / OV default | bf16 / our fp32 | err ours bf16 | err OV default | err OV f32 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in models:
            r = compare(name, Path(tmp), args.threads, runs)
            rows.append(r)
            print(f"| {name} | {r['fp32_ms']:.2f} | {r['ov_f32_ms']:.2f} | "
                  f"{r['fp32_ms'] / r['ov_f32_ms']:.3f} | {r['bf16_ms']:.2f} | "
                  f"{r['ov_default_ms']:.2f} ({r['ov_default_precision']}) | "
                  f"{r['bf16_ms'] / r['ov_default_ms']:.3f} | {r['bf16_ms'] / r['fp32_ms']:.3f} | "
                  f"{r['ours_bf16_err']:.1e} | {r['ov_default_err']:.1e} | {r['ov_f32_err']:.1e} |",
                  flush=True)
    for label, num, den in (("our fp32 / OpenVINO f32", "fp32_ms", "ov_f32_ms"),
                            ("our bf16 / OpenVINO default", "bf16_ms", "ov_default_ms"),
                            ("our bf16 / our fp32", "bf16_ms", "fp32_ms")):
        print(f"geomean {label}: {geomean([r[num] / r[den] for r in rows]):.3f}")
    errors_ok = sum(r["ours_bf16_err"] <= 1.25 * r["ov_default_err"] + 0.005 for r in rows)
    print(f"bf16 error within 1.25x OpenVINO default's + 0.005 (issue 34): {errors_ok} of {len(rows)} models")
    return 0


if __name__ == "__main__":
    sys.exit(main())
