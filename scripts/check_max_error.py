"""``--max-error`` on the light zoo, measured on feeds the compile never saw (issue 34, item 3).

For each model (``tests/support/zoo.py: zoo_model``, seeded random weights) and each bound it
compiles ``--precision bf16 --max-error E`` (the compile chooses its steps on the two golden feeds,
seeds 0 and 1), then runs the artifact on held-out feeds -- four more uniform [-1, 1) feeds of the
same generator at seeds 1000..1003, and the zoo's standard-normal ``dummy_input`` (seeds 0, 1) --
against onnxruntime on the fp32 model (the oracle), and prints per row: the steps left in bf16 of
the bf16 candidates, the error the compile recorded, the error on the held-out feeds (max |bf16 -
fp32| / max |fp32| per feed, the largest), and whether the bound holds there.

``--int8 N`` checks ``--quantize int8 --calibration`` instead: the zoo's standard-normal feeds at
seeds 0..N-1 calibrate and choose the steps, seeds 100..103 are held out (the model as
``for_onnxruntime`` writes it: initializers not listed as inputs).

Usage: python -m scripts.check_max_error [--bounds 0.01,0.002] [--int8 N] [MODEL ...]
(run it under the CPU lock)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from compiler.bench import prepare_environment

prepare_environment()  # before any kernel library loads libgomp

from compiler import compile_model  # noqa: E402
from compiler.bench import for_onnxruntime  # noqa: E402
from compiler.bench import import_onnxruntime  # noqa: E402
from runtime.selftest import generate_input  # noqa: E402
from runtime.selftest import relative_error  # noqa: E402
from runtime.session import Session  # noqa: E402
from scripts.bench_zoo import COMPUTE_BOUND  # noqa: E402
from tests.support.zoo import dummy_input  # noqa: E402
from tests.support.zoo import zoo_model  # noqa: E402

HELD_OUT_SEEDS = (1000, 1001, 1002, 1003)


def held_out_feeds(session: Session) -> list[dict[str, np.ndarray]]:
    """Uniform feeds at seeds the golden cases do not use, and the zoo's normal ones."""
    return [{s.name: generate_input("uniform", s.dtype, tuple(int(d) for d in s.shape), (seed << 16) + k)
             for k, s in enumerate(session.inputs)} for seed in HELD_OUT_SEEDS]


def check(name: str, bound: float, workdir: Path, int8: int) -> dict[str, object]:
    """One row: compile ``name`` with the bound, measure it on the held-out feeds."""
    ort = import_onnxruntime()
    model = zoo_model(name) if not int8 else for_onnxruntime(zoo_model(name))
    start = time.perf_counter()
    if int8:
        calibration = [dummy_input(model, seed) for seed in range(int8)]
        stacked = {k: np.stack([f[k] for f in calibration]) for k in calibration[0]}
        out = compile_model(model, workdir / f"{name}-{bound:g}", quantize="int8", calibration=stacked,
                            max_error=bound)
    else:
        out = compile_model(model, workdir / f"{name}-{bound:g}", precision="bf16", max_error=bound)
    seconds = time.perf_counter() - start
    record = json.loads((out / "manifest.json").read_text())["accuracy"]
    session = Session(out, threads=2)
    reference = ort.InferenceSession(for_onnxruntime(model).SerializeToString(),
                                     providers=["CPUExecutionProvider"])
    feeds = ([dummy_input(model, seed) for seed in range(100, 104)] if int8 else
             held_out_feeds(session) + [dummy_input(model, seed) for seed in (0, 1)])
    worst = 0.0
    for feed in feeds:
        for got, ref in zip(session.run(None, feed), reference.run(None, feed), strict=True):
            worst = max(worst, relative_error(np.asarray(got), np.asarray(ref)))
    return {"model": name, "bound": bound, "reduced": record["steps_reduced"], "total": record["steps_total"],
            "recorded": max(record["outputs"].values()), "held_out": worst, "feeds": len(feeds),
            "holds": worst < bound, "compile_s": seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(COMPUTE_BOUND))
    parser.add_argument("--bounds", default="0.01,0.002")
    parser.add_argument("--int8", type=int, default=0, metavar="N",
                        help="check --quantize int8 with N calibration feeds instead of bf16")
    args = parser.parse_args(argv)
    bounds = [float(b) for b in args.bounds.split(",")]
    rows = []
    kind = "int8 steps" if args.int8 else "bf16 steps"
    print(f"{'model':<14} {'bound':>6} {kind:>10} {'recorded':>9} {'held-out':>9} {'holds':>5} "
          f"{'compile':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            for bound in bounds:
                row = check(name, bound, Path(tmp), args.int8)
                rows.append(row)
                print(f"{name:<14} {bound:>6g} {row['reduced']:>4}/{row['total']:<5} "
                      f"{row['recorded']:>9.2e} {row['held_out']:>9.2e} {'yes' if row['holds'] else 'NO':>5} "
                      f"{row['compile_s']:>7.1f}s", flush=True)
    held = all(r["holds"] for r in rows)
    holding = sum(bool(r["holds"]) for r in rows)
    print(f"the bound holds on the held-out feeds in {holding} of {len(rows)} rows")
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
