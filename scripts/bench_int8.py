"""Issue 32's int8 bench: quantized models against onnxruntime on the same file, and against our fp32.

Builds the float models -- the random-weight light zoo's ResNet-50, SqueezeNet, DenseNet-121,
ShuffleNet and Inception v1 (``tests/support/zoo.py``, converted to opset 13 first), a MiniLM-size
and a BERT-base-size encoder (``tests/support/encoder_model.py``, seq 128) -- and quantizes each
with onnxruntime's own quantizer (``tests/support/qdq_models.py: quantize_file``): the CNNs as QDQ
(S8S8 per channel) and QOperator (U8S8), the encoders dynamically (``quantize_dynamic``) and as QDQ.
Each file and its float model are compiled by onnx-aot (default level, C target) and run at
``--threads`` (2): each row gives, from runs alternating in this process (medians), our int8 time
against onnxruntime's on the same file (``/ ORT``) and against our fp32 artifact (``/ fp32``), and
the stray of each engine's int8 run from the fp32 model (onnxruntime's fp32 run): max |difference| /
max |fp32 output| over the outputs and three seeded feeds, with issue 32's rule (ours <= 1.25x
onnxruntime's + 0.005). ``steps`` counts the artifact's integer steps (QLinearConv, QLinearMatMul,
MatMulInteger, ...) and its steps on the reference kernels. ``--preprocess`` runs onnxruntime's
recommended ``quant_pre_process`` first (BatchNormalization folded into the Conv before
quantization; without it the quantizer quantizes each BatchNormalization on its own). A file that
onnx-aot (or onnxruntime) cannot compile or run is a row saying why. ``--profile`` prints, after
each int8 row, our per-step profile summed by op type and the slowest steps
(``scripts/bench_encoder.py: profile_feeds``).

The machine is shared: quote ratios (both engines alternate run by run, with the fairness settings
of scripts/bench_zoo.py), not times. Slow (minutes): not part of CI, except ``--smoke`` (SqueezeNet
and a two-layer encoder, each in its forms, 2 runs).

Usage: python -m scripts.bench_int8 [--models resnet50,squeezenet,...,minilm,bert_base]
                                    [--forms qdq,qoperator,dynamic] [--preprocess] [--profile]
                                    [--runs N] [--threads N] [--cpu TARGET] [--smoke] [--json FILE]
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from compiler.bench import prepare_environment

prepare_environment()  # before any kernel library loads libgomp

import onnx  # noqa: E402

from compiler import compile_model  # noqa: E402
from compiler.bench import alternate  # noqa: E402
from compiler.bench import for_onnxruntime  # noqa: E402
from compiler.bench import import_onnxruntime  # noqa: E402
from compiler.bench_cold import ort_session  # noqa: E402
from runtime.session import Session  # noqa: E402
from scripts.bench_encoder import SMOKE as SMOKE_ENCODER  # noqa: E402
from scripts.bench_encoder import profile_feeds  # noqa: E402
from scripts.bench_zoo import geomean  # noqa: E402
from scripts.bench_zoo import machine_facts  # noqa: E402
from scripts.bench_zoo import table_head  # noqa: E402
from tests.support.encoder_model import BERT_BASE  # noqa: E402
from tests.support.encoder_model import MINILM  # noqa: E402
from tests.support.encoder_model import encoder_feeds  # noqa: E402
from tests.support.encoder_model import encoder_model  # noqa: E402
from tests.support.qdq_models import quantize_file  # noqa: E402
from tests.support.qdq_models import stray  # noqa: E402
from tests.support.zoo import dummy_input  # noqa: E402
from tests.support.zoo import zoo_model  # noqa: E402

CNNS = ("resnet50", "squeezenet", "densenet121", "shufflenet", "inception_v1")
ENCODERS = {"minilm": MINILM, "bert_base": BERT_BASE, "encoder_smoke": SMOKE_ENCODER}
FORMS = {"cnn": ("qdq", "qoperator"), "encoder": ("dynamic", "qdq")}
INTEGER_OPS = ("QLinearConv", "QLinearMatMul", "MatMulInteger", "ConvInteger", "DynamicQuantizeLinear",
               "QLinearAdd", "QLinearMul", "QLinearConcat", "QLinearAveragePool", "QLinearGlobalAveragePool",
               "QLinearSigmoid", "QLinearLeakyRelu", "QLinearSoftmax", "QGemm", "MatMulIntegerToFloat",
               "DynamicQuantizeMatMul", "QBinary", "QLookup", "QAveragePool", "QGlobalAveragePool",
               "QSoftmax", "PackedQConv", "QLSTM", "QLinearWhere")
SEEDS = (0, 1, 2)


@dataclass(frozen=True)
class Float:
    """One float model: its name, file, seeded feeds, quantized forms."""

    name: str
    path: Path
    feeds: Callable[[int], dict[str, np.ndarray]]
    forms: tuple[str, ...]


def float_model(name: str, tmp: Path) -> Float:
    if name in ENCODERS:
        model = encoder_model(**ENCODERS[name])
        forms = FORMS["encoder"]
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = onnx.version_converter.convert_version(for_onnxruntime(zoo_model(name)), 13)
        forms = FORMS["cnn"]
    path = tmp / f"{name}.fp32.onnx"
    onnx.save(model, str(path))
    if name in ENCODERS:
        return Float(name, path, lambda seed: encoder_feeds(model, seed), forms)
    return Float(name, path, lambda seed: dummy_input(model, seed), forms)


def _why(exc: BaseException) -> str:
    """The exception's type and message on one line (cut at 240 characters)."""
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return f"{type(exc).__name__}: {text}"[:240]


def _steps(artifact: Path) -> str:
    """The artifact's integer steps and its steps on the reference kernels, e.g. "26 int / 1 ref"."""
    plan = json.loads((artifact / "plan.json").read_text(encoding="utf-8"))
    steps = plan["steps"]
    ints = sum(1 for s in steps if s["op_type"] in INTEGER_OPS)
    ref = collections.Counter(s["op_type"] for s in steps if s["provider"] == "reference")
    where = ", ".join(f"{op} {n}" for op, n in sorted(ref.items()))
    return f"{ints} int / {sum(ref.values())} ref" + (f" ({where})" if where else "")


def _ratio(a: list[float], b: list[float]) -> tuple[float, float, float]:
    ma, mb = statistics.median(a), statistics.median(b)
    return ma, mb, ma / mb


def bench_form(fp: Float, form: str, ours_fp32: Session, ort: Any, tmp: Path, args: argparse.Namespace,
               reference: list[list[np.ndarray]]) -> dict[str, Any]:
    """One quantized file: quantize, compile, stray, alternating timings; a failure is a row."""
    row: dict[str, Any] = {"model": fp.name, "form": form}
    path = tmp / f"{fp.name}.{form}.onnx"
    stage = "quantize"
    try:
        quantize_file(fp.path, path, form, fp.feeds, preprocess=args.preprocess)
        stage = "onnxruntime"
        theirs = ort_session(ort, str(path), args.threads)
        stage = "compile"
        artifact = compile_model(str(path), tmp / f"{fp.name}.{form}", cpu=args.cpu)
        stage = "run"
        ours = Session(artifact, threads=args.threads)
        names = [s.name for s in ours.outputs]
        row["steps"] = _steps(artifact)
        strays = [(stray(ours.run(None, fp.feeds(s)), ref), stray(theirs.run(names, fp.feeds(s)), ref))
                  for s, ref in zip(SEEDS, reference, strict=True)]
        row["stray_ours"], row["stray_ort"] = max(a for a, _ in strays), max(b for _, b in strays)
        row["stray_ok"] = all(a <= 1.25 * b + 0.005 for a, b in strays)
        feeds = fp.feeds(0)
        a, b = alternate(lambda: ours.run(None, feeds), lambda: theirs.run(names, feeds), args.runs, 3)
        row["ours_s"], row["ort_s"], row["vs_ort"] = _ratio(a, b)
        a, c = alternate(lambda: ours.run(None, feeds), lambda: ours_fp32.run(None, feeds), args.runs, 3)
        row["fp32_s"] = statistics.median(c)
        row["vs_fp32"] = statistics.median(a) / row["fp32_s"]
        if args.profile:
            row["profile"] = profile_feeds(artifact, feeds, args.threads, args.runs)
    except Exception as exc:  # any engine's failure is this row's result, never the bench's end
        row["failed"] = f"{stage}: {_why(exc)}"
    return row


def bench_model(name: str, ort: Any, tmp: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    fp = float_model(name, tmp)
    forms = [f for f in fp.forms if f in args.forms]
    try:
        fp32_folder = compile_model(str(fp.path), tmp / f"{name}.fp32", cpu=args.cpu)
        ours_fp32 = Session(fp32_folder, threads=args.threads)
        fp32_ref = ort_session(ort, str(fp.path), args.threads)
        names = [s.name for s in ours_fp32.outputs]
        reference = [fp32_ref.run(names, fp.feeds(seed)) for seed in SEEDS]
    except Exception as exc:  # the float model itself: every form's row says so
        return [{"model": name, "form": f, "failed": f"fp32: {_why(exc)}"} for f in forms]
    return [bench_form(fp, form, ours_fp32, ort, tmp, args, reference) for form in forms]


def format_row(r: dict[str, Any]) -> str:
    if "failed" in r:
        return f"| {r['model']} | {r['form']} | failed: {r['failed']} |" + " |" * 7
    ok = "" if r["stray_ok"] else " (over 1.25x + 0.005)"
    cells = [r["model"], r["form"], f"{r['ours_s'] * 1e3:.2f}", f"{r['ort_s'] * 1e3:.2f}",
             f"{r['vs_ort']:.3f}", f"{r['fp32_s'] * 1e3:.2f}", f"{r['vs_fp32']:.3f}",
             f"{r['stray_ours']:.4f}", f"{r['stray_ort']:.4f}{ok}", r["steps"]]
    return "| " + " | ".join(cells) + " |"


def summary(rows: list[dict[str, Any]]) -> list[str]:
    done = [r for r in rows if "failed" not in r]
    lines = [f"{len(done)} of {len(rows)} files compiled and ran"]
    if done:
        vs_ort = geomean([r["vs_ort"] for r in done])
        lines.append(f"geomean int8 / onnxruntime on the same file: {vs_ort:.3f} (issue 32's target <= 0.70)")
        lines.append(f"geomean our int8 / our fp32: {geomean([r['vs_fp32'] for r in done]):.3f} "
                     f"(target <= 0.60)")
        slower = [f"{r['model']} {r['form']}" for r in done if r["vs_fp32"] > 1.0]
        lines.append("no int8 file slower than our fp32" if not slower
                     else f"slower than our fp32: {', '.join(slower)}")
        over = [f"{r['model']} {r['form']}" for r in done if not r["stray_ok"]]
        lines.append("every file strays within 1.25x onnxruntime's + 0.005" if not over
                     else f"stray over 1.25x onnxruntime's + 0.005: {', '.join(over)}")
    return lines


def _list(text: str, allowed: tuple[str, ...]) -> list[str]:
    items = [t for t in text.split(",") if t]
    bad = [t for t in items if t not in allowed]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {', '.join(allowed)}")
    return items


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    models = (*CNNS, *ENCODERS)
    parser.add_argument("--models", type=lambda t: _list(t, models), default=[*CNNS, "minilm", "bert_base"],
                        help=f"comma-separated, from {', '.join(models)}")
    parser.add_argument("--forms", type=lambda t: _list(t, ("qdq", "qoperator", "dynamic")),
                        default=["qdq", "qoperator", "dynamic"])
    parser.add_argument("--preprocess", action="store_true",
                        help="onnxruntime's quant_pre_process before quantizing (folds BatchNormalization)")
    parser.add_argument("--profile", action="store_true",
                        help="after each int8 row, our per-step profile by op type and the slowest steps")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cpu", default=None, metavar="TARGET",
                        help="compile both artifacts for this --cpu target (x86-64-v3: the AVX2 kernels "
                             "an AVX2-only host runs, no VNNI); default: the host")
    parser.add_argument("--smoke", action="store_true", help="SqueezeNet and a tiny encoder, 2 runs")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="also save every row")
    args = parser.parse_args(argv)
    if args.smoke:
        args.models, args.runs = ["squeezenet", "encoder_smoke"], 2
    ort = import_onnxruntime()
    facts = machine_facts()
    print(f"{facts['cpu']} ({facts['cores']} cores; {facts['isa']}), onnxruntime {facts['onnxruntime']}, "
          f"{args.threads} threads", flush=True)
    print(table_head("model", "form", "int8 ms", "ORT int8 ms", "/ ORT", "our fp32 ms", "/ fp32",
                     "stray ours", "stray ORT", "steps"), flush=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-int8-") as tmp_name:
        for name in args.models:
            for row in bench_model(name, ort, Path(tmp_name), args):
                rows.append(row)
                print(format_row(row), flush=True)
                if "profile" in row:
                    print(row["profile"], flush=True)
    print("\n".join(summary(rows)))
    if args.json is not None:
        args.json.write_text(json.dumps({"machine": facts, "rows": rows}, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
