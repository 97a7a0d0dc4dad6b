"""Issue 18's bench: a dynamic artifact against static artifacts of exactly one shape.

For each model it compiles one dynamic artifact over a range and, per shape, a static artifact
of exactly that shape, then runs the two alternately on identical feeds (medians) and prints the
latency ratio dynamic / static (issue 18 asks <= 1.10 without --opt-shape), the same for a dynamic
artifact compiled with ``--opt-shape`` at that shape (<= 1.02), the share of steps on the C kernels
in each, and the folder sizes (dynamic without --opt-shape / static; issue 18: <= 1.3). Models:
PP-OCRv4 rec as shipped (``x=1x3x48x32..2048`` at widths 320 and 640), a YOLOv8n-style detector
with its anchors in the graph (``images=1..8x3x320..640x320..640`` at 1x320x320) and a BERT-style
encoder layer (``batch=1..8``, ``seq=1..512`` at (1, 128)) and the MiniLM-size encoder of issue 20
(``tests/support/encoder_model.py``, 6 layers, the same dims, at (1, 128)). ``--real``: instead, every
fetched real model of issue 29's range table (``scripts/fetch_models.py``, ``RealModel.ranges``) at its
static shape and at the range's odd size. Not part of CI, except ``--smoke`` (the encoder layer only, 2 runs).

Usage: python -m scripts.bench_dynamic [--runs N] [--threads N] [--smoke] [--real] [--no-opt-shape]
                                       [MODEL ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from compiler.bench import prepare_environment

prepare_environment()  # before any kernel library loads libgomp

import onnx  # noqa: E402

from compiler import compile_model  # noqa: E402
from compiler.bench import alternate  # noqa: E402
from runtime.session import Session  # noqa: E402
from scripts.bench_zoo import table_head  # noqa: E402
from scripts.fetch_models import MODELS as REAL_MODELS  # noqa: E402
from scripts.fetch_models import fetch  # noqa: E402
from scripts.fetch_models import model_named  # noqa: E402
from tests.support.dynamic_models import bert_model  # noqa: E402
from tests.support.encoder_model import MINILM  # noqa: E402
from tests.support.encoder_model import encoder_feeds  # noqa: E402
from tests.support.encoder_model import encoder_model  # noqa: E402
from tests.support.yolo_model import yolov8n_input  # noqa: E402
from tests.support.yolo_model import yolov8n_model  # noqa: E402

Feeds = Callable[[tuple[int, ...]], dict[str, np.ndarray]]


def _ppocr() -> tuple[Any, dict[str, Any], list[tuple[int, ...]], Feeds]:
    spec = model_named("ppocrv4-rec")
    path = fetch([spec], say=lambda msg: print(msg, file=sys.stderr))[spec.name]
    rng = np.random.default_rng(0)
    return (path, {"shapes": {"x": (1, 3, 48, (32, 2048))}}, [(320,), (640,)],
            lambda s: {"x": rng.standard_normal((1, 3, 48, s[0])).astype(np.float32)})


def _yolo() -> tuple[Any, dict[str, Any], list[tuple[int, ...]], Feeds]:
    model = yolov8n_model(dynamic=True)
    return (model, {"shapes": {"images": ((1, 8), 3, (320, 640), (320, 640))}}, [(1, 320, 320)],
            lambda s: yolov8n_input(model, *s))


def _bert() -> tuple[Any, dict[str, Any], list[tuple[int, ...]], Feeds]:
    rng = np.random.default_rng(0)
    return (bert_model(), {"dims": {"batch": (1, 8), "seq": (1, 512)}}, [(1, 128)],
            lambda s: {"x": rng.standard_normal((*s, 32)).astype(np.float32),
                       "mask": np.ones(s, np.int64)})


def _minilm() -> tuple[Any, dict[str, Any], list[tuple[int, ...]], Feeds]:
    model = encoder_model(**MINILM, dynamic=True)
    return (model, {"dims": {"batch": (1, 8), "seq": (1, 512)}}, [(1, 128)],
            lambda s: encoder_feeds(model, batch=s[0], seq=s[1]))


Maker = Callable[[], tuple[Any, dict[str, Any], list[tuple[int, ...]], Feeds]]


def _real(name: str) -> Maker:
    """A fetched real model over its issue-29 ranges, at its static shape and at the range's odd size
    (``RealModel.ranges.at[2]``); a shape is named by the first input's shape."""
    from tests.support.range_feeds import feeds_at

    def make() -> tuple[Any, dict[str, Any], list[tuple[int, ...]], Feeds]:
        spec = model_named(name)
        assert spec.ranges is not None
        path = fetch([spec], say=lambda msg: print(msg, file=sys.stderr))[spec.name]
        odd = dict(spec.ranges.at[2])
        checks = {tuple(spec.shapes[0][1]): spec.shape_options, tuple(spec.ranges.at[2][0][1]): odd}
        options = {"shapes": spec.ranges.shape_options or None, "dims": spec.ranges.dim_options or None,
                   "binds": spec.bind_options or None}
        return path, options, list(checks), lambda s: feeds_at(spec, checks[s])

    return make


def _ranged_real_models() -> dict[str, Maker]:
    return {m.name: _real(m.name) for m in REAL_MODELS if m.ranges is not None and m.shapes}


MODELS = {"ppocr-rec": _ppocr, "yolov8n": _yolo, "bert-layer": _bert, "minilm": _minilm,
          **_ranged_real_models()}


def _feed_shapes(feeds: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    """Each input at the shape of its feed (a static compile of exactly that shape)."""
    return {name: tuple(a.shape) for name, a in feeds.items()}


def _on_c(artifact: Path) -> str:
    steps = json.loads((artifact / "plan.json").read_text())["steps"]
    return f"{sum(s['provider'] == 'c' for s in steps)}/{len(steps)}"


def _size(artifact: Path) -> int:
    return sum(f.stat().st_size for f in artifact.rglob("*") if f.is_file() and "report" not in f.parts)


def run(name: str, tmp: Path, threads: int | None, runs: int, opt: bool = True) -> list[str]:
    source, options, shapes, feeds_at = MODELS[name]()
    model = onnx.load(source) if isinstance(source, Path) else source
    binds = options.get("binds")
    dynamic = compile_model(model, tmp / f"{name}-dynamic", golden_cases=0, **options)
    dyn_session = Session(dynamic, threads=threads)
    rows = []
    for shape in shapes:
        feeds = feeds_at(shape)
        static = compile_model(model, tmp / f"{name}-{'x'.join(map(str, shape))}", golden_cases=0,
                               shapes=_feed_shapes(feeds), binds=binds)
        st_session = Session(static, threads=threads)
        t_dyn, t_st = alternate(lambda: dyn_session.run(None, feeds),  # noqa: B023
                                lambda: st_session.run(None, feeds), runs, warmup=3)  # noqa: B023
        d, s = float(np.median(t_dyn)) * 1e3, float(np.median(t_st)) * 1e3
        o_text = "-"
        if opt:
            opt_art = compile_model(model, tmp / f"{name}-opt-{'x'.join(map(str, shape))}", golden_cases=0,
                                    opt_shapes=[_feed_shapes(feeds)], **options)
            opt_session = Session(opt_art, threads=threads)
            t_opt, t_st2 = alternate(lambda: opt_session.run(None, feeds),  # noqa: B023
                                     lambda: st_session.run(None, feeds), runs, warmup=3)  # noqa: B023
            o_text = f"{float(np.median(t_opt)) / float(np.median(t_st2)):.3f}"
        rows.append(f"| {name} | {'x'.join(map(str, shape))} | {d:.2f} | {s:.2f} | {d / s:.3f} | {o_text} | "
                    f"{_on_c(dynamic)} | {_on_c(static)} | {_size(dynamic) / _size(static):.2f} |")
        print(rows[-1], flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", metavar="MODEL", help=f"of {', '.join(MODELS)} (default: all)")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None,
                        help="fixed thread count (default: the runtime's adaptive choice)")
    parser.add_argument("--smoke", action="store_true", help="the encoder layer, 2 runs")
    parser.add_argument("--real", action="store_true",
                        help="the fetched real models of issue 29's range table (default: the four above)")
    parser.add_argument("--no-opt-shape", action="store_true", help="skip the --opt-shape compiles")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.models) - set(MODELS))
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    default = [n for n in MODELS if (n in _ranged_real_models()) == args.real]
    models, runs = (["bert-layer"], 2) if args.smoke else (args.models or default, args.runs)
    print(f"# dynamic vs static artifacts, {args.threads or 'adaptive'} thread(s), {runs} alternating runs, "
          f"medians "
          f"(issue 18: ratio <= 1.10, folder <= 1.3)")
    print(table_head("model", "shape", "dynamic ms", "static ms", "dynamic / static",
                     "with --opt-shape / static", "steps on C (dynamic)", "steps on C (static)",
                     "folder dynamic / static"))
    with tempfile.TemporaryDirectory() as tmp:
        for name in models:
            run(name, Path(tmp), args.threads, runs, opt=not args.no_opt_shape)
    return 0


if __name__ == "__main__":
    sys.exit(main())
