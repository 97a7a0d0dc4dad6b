"""Issues 22 and 31's bench: speed with other work on the machine, at fixed and default thread counts.

For each model it compiles an artifact once and, under each load kind in turn, runs it alternating
run by run with onnxruntime (``session.force_spinning_stop``) on identical feeds, at each thread
setting: a fixed count (``Session(dir, threads=n)`` against ``intra_op_num_threads=n``) or
``default`` (the runtime's own choice, ``runtime/threads.py``, against onnxruntime at ``--threads``).
Load kinds, each one extra process started before and killed after its measurements:
``none``; ``spin`` (a busy loop at normal priority); ``nice`` (the same at ``nice 19``); ``duty``
(busy 5 ms, asleep 5 ms, in 10 ms periods). Every row gives the median and p99 of both engines
and their ratios onnx-aot / onnxruntime, and, for loaded rows, our median against our idle median
at the same setting (``/ idle``) from the same process -- the machine this runs on is shared, so the
ratios are what to read. ``--repeats`` measures each loaded case that many times (issue 31 asks
every repeat of ``spin`` at 2 threads <= 1.10x onnxruntime's median, p99 <= 1.5x its p99).

Models: ``squeezenet`` and ``resnet50`` (random-weight zoo), ``yolov8n`` (Ultralytics' export as the
tests build it), ``nudenet`` (NudeNet 3.4.2's YOLOv8n at 320, ``scripts.fetch_models``: a download
on first use), ``minilm`` (the MiniLM-size encoder of tests/support/encoder_model.py, seq 128) and
``gru`` (one GRU as PyTorch exports ``nn.GRU(256, 512)``: linear_before_reset 1, seq 100, batch 1 --
a hundred small steps, each one pool job).
Not part of CI, except ``--smoke`` (SqueezeNet, 2 runs, no load, threads 1 and default).

Usage: python -m scripts.bench_busy [--models a,b] [--loads none,spin,nice,duty]
                                    [--settings 1,2,default] [--runs N] [--repeats N] [--smoke]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from compiler.bench import prepare_environment

prepare_environment()  # before any kernel library loads libgomp

from compiler import compile_model  # noqa: E402
from compiler.bench import alternate  # noqa: E402
from compiler.bench import for_onnxruntime  # noqa: E402
from compiler.bench import import_onnxruntime  # noqa: E402
from runtime.session import Session  # noqa: E402
from scripts.bench_zoo import table_head  # noqa: E402

LOADS = ("none", "spin", "nice", "duty")
MODELS = ("resnet50", "nudenet", "minilm")
SETTINGS = ("1", "2", "default")
_SPIN = "while True: pass"
_DUTY = ("import time\nwhile True:\n    t = time.perf_counter() + 0.005\n"
         "    while time.perf_counter() < t: pass\n    time.sleep(0.005)")


def _model(name: str) -> tuple[object, dict[str, np.ndarray]]:
    """The ONNX model and seeded feeds of one bench model name (the feeds' shapes are the ones
    compiled)."""
    if name in ("yolov8n",):
        from tests.support.yolo_model import yolov8n_input
        from tests.support.yolo_model import yolov8n_model
        model = yolov8n_model()
        return model, yolov8n_input(model)
    if name == "nudenet":
        import onnx

        from scripts.fetch_models import fetch
        from scripts.fetch_models import model_named
        path = fetch([model_named("nudenet-320n")])["nudenet-320n"]
        images = np.random.default_rng(0).random((1, 3, 320, 320), dtype=np.float32)
        return onnx.load(str(path)), {"images": images}
    if name == "gru":
        from tests.test_dynamic_recurrent_pad import recurrent_export
        x = np.random.default_rng(0).standard_normal((100, 1, 256)).astype(np.float32)
        return recurrent_export("GRU", 256, 512, "forward", linear_before_reset=1), {"x": x}
    if name == "minilm":
        from tests.support.encoder_model import MINILM
        from tests.support.encoder_model import encoder_feeds
        from tests.support.encoder_model import encoder_model
        model = encoder_model(**MINILM, seq=128)
        return model, encoder_feeds(model)
    from tests.support.zoo import dummy_input
    from tests.support.zoo import zoo_model
    model = zoo_model(name)
    return model, dummy_input(model)


@contextlib.contextmanager
def load(kind: str) -> Iterator[None]:
    """One extra process of the load ``kind`` for the duration of the block (none for "none")."""
    if kind == "none":
        yield
        return
    code = _DUTY if kind == "duty" else _SPIN
    nice = (lambda: os.nice(19)) if kind == "nice" else None
    process = subprocess.Popen([sys.executable, "-c", code], preexec_fn=nice)
    try:
        yield
    finally:
        process.kill()
        process.wait()


def _stats(times: list[float]) -> tuple[float, float]:
    """Median and p99 in milliseconds."""
    return float(np.median(times)) * 1e3, float(np.percentile(times, 99)) * 1e3


class Case:
    """One model's compiled artifact, its sessions per thread setting and onnxruntime's per count."""

    def __init__(self, name: str, tmp: Path, default_threads: int) -> None:
        model, self.feeds = _model(name)
        self.name = name
        shapes = {k: v.shape for k, v in self.feeds.items()} if name in ("nudenet", "gru") else None
        self.out = compile_model(model, tmp / name, golden_cases=0, shapes=shapes)  # type: ignore[arg-type]
        self.model = for_onnxruntime(model).SerializeToString()  # type: ignore[arg-type]
        self.default_threads = default_threads
        self._ort: dict[int, object] = {}
        self._ours: dict[str, Session] = {}
        self.idle: dict[str, float] = {}

    def onnxruntime(self, threads: int) -> Callable[[], object]:
        if threads not in self._ort:
            ort = import_onnxruntime()
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            options.add_session_config_entry("session.force_spinning_stop", "1")
            self._ort[threads] = ort.InferenceSession(self.model, options, providers=["CPUExecutionProvider"])
        session = self._ort[threads]
        return lambda: session.run(None, self.feeds)  # type: ignore[attr-defined]

    def ours(self, setting: str) -> Callable[[], object]:
        if setting not in self._ours:
            self._ours[setting] = Session(self.out) if setting == "default" else Session(self.out,
                                                                                          threads=int(setting))
        session = self._ours[setting]
        return lambda: session.run(None, self.feeds)

    def row(self, kind: str, setting: str, runs: int) -> str:
        """One table row: both engines alternating ``runs`` times at ``setting`` under load ``kind``."""
        threads = self.default_threads if setting == "default" else int(setting)
        t_ours, t_ort = alternate(self.ours(setting), self.onnxruntime(threads), runs, 3)
        (m, p), (om, op) = _stats(t_ours), _stats(t_ort)
        if kind == "none":
            self.idle[setting] = m
        idle = self.idle.get(setting)
        vs_idle = f"{m / idle:.2f}" if idle and kind != "none" else "-"
        return (f"| {self.name} | {kind} | {setting} | {m:.2f} | {p:.2f} | {om:.2f} | {op:.2f} | "
                f"{m / om:.3f} | {p / op:.3f} | {vs_idle} |")


HEAD = ("model", "load", "threads", "onnx-aot median ms", "onnx-aot p99 ms", "onnxruntime median ms",
        "onnxruntime p99 ms", "median / ORT", "p99 / ORT", "median / idle")


def _list(text: str, allowed: tuple[str, ...] | None) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if allowed is not None and t not in allowed]
    if bad:
        raise SystemExit(f"bench_busy: unknown {', '.join(bad)} (known: {', '.join(allowed or ())})")
    return items


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS),
                        help="comma list of resnet50, nudenet, minilm, gru, yolov8n, squeezenet")
    parser.add_argument("--loads", default=",".join(LOADS), help="comma list of none, spin, nice, duty")
    parser.add_argument("--settings", default=",".join(SETTINGS), help="thread counts and/or 'default'")
    parser.add_argument("--runs", type=int, default=200, help="alternating runs per row")
    parser.add_argument("--repeats", type=int, default=1, help="measurements of each loaded case")
    parser.add_argument("--threads", type=int, default=2, help="onnxruntime's count against 'default'")
    parser.add_argument("--smoke", action="store_true", help="SqueezeNet, 2 runs, no load")
    args = parser.parse_args(argv)
    if args.smoke:
        models, loads, settings, runs, repeats = ["squeezenet"], ["none"], ["1", "default"], 2, 1
    else:
        models = _list(args.models, ("resnet50", "nudenet", "minilm", "gru", "yolov8n", "squeezenet"))
        loads, settings = _list(args.loads, LOADS), _list(args.settings, None)
        runs, repeats = args.runs, args.repeats
    if "none" in loads:
        loads = ["none"] + [k for k in loads if k != "none"]  # the idle baseline first
    print(f"# {runs} alternating runs per row; onnxruntime at the row's thread count ('default': "
          f"{args.threads}); {os.cpu_count()} cores; loads in this order: {', '.join(loads)}")
    print(table_head(*HEAD))
    with tempfile.TemporaryDirectory() as tmp:
        for name in models:
            case = Case(name, Path(tmp), args.threads)
            for kind in loads:
                for _ in range(1 if kind == "none" else repeats):
                    with load(kind):
                        for setting in settings:
                            print(case.row(kind, setting, runs), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
