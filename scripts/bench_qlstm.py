"""Issue 32's int8 LSTM: an LSTM quantized by ``quantize_dynamic`` (DynamicQuantizeLSTM) on our C
kernel (onnx_aot.QLSTM) against onnxruntime on the same file, and against both engines' fp32 LSTM.

Each shape (seq, batch, input, hidden, directions) is built as torch exports nn.LSTM
(tests/support/lstm_models.py), quantized per channel, compiled at the default level for this
machine, and run at ``--threads``: four sessions alternating run by run (compiler.bench.alternate,
onnxruntime set up as every comparison here sets it up), medians. Also the error of our int8 run
against onnxruntime's int8 run (max abs; onnxruntime on one thread, second run: see
tests/test_qlstm.py) and each int8 run's stray from the fp32 model. The machine is shared: quote the
ratios, not the times.

Usage: python -m scripts.bench_qlstm [--runs N] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort

from compiler import compile_model
from compiler.bench import alternate
from compiler.bench import prepare_environment
from compiler.bench_cold import ort_session
from runtime import Session
from tests.support.lstm_models import lstm_feeds
from tests.support.lstm_models import lstm_model
from tests.support.lstm_models import quantized_lstm

SHAPES = {"vad-like (100, 1, 64, 128, fwd)": (100, 1, 64, 128, False),
          "tagger (50, 8, 256, 256, bidir)": (50, 8, 256, 256, True)}


def _stray(y: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(y - ref).max() / np.abs(ref).max())


def bench_shape(name: str, shape: tuple[int, int, int, int, bool], runs: int, threads: int,
                root: Path) -> str:
    seq, batch, size, hidden, bidirectional = shape
    fp = lstm_model(seq, batch, size, hidden, bidirectional=bidirectional, seed=1)
    q = quantized_lstm(fp, root, per_channel=True)
    ours_q = Session(compile_model(q, root / "q", golden_cases=1), threads=threads)
    ours_f = Session(compile_model(fp, root / "f", golden_cases=1), threads=threads)
    ort_q = ort_session(ort, q.SerializeToString(), threads)
    ort_f = ort_session(ort, fp.SerializeToString(), threads)
    feeds = lstm_feeds(fp, 0)
    one = ort_session(ort, q.SerializeToString(), 1)
    one.run(None, feeds)
    want, exact = one.run(None, feeds), ort_f.run(None, feeds)
    got = ours_q.run(None, feeds)
    err = max(float(np.abs(g - w).max()) for g, w in zip(got, want, strict=True))
    stray = (max(_stray(g, r) for g, r in zip(got, exact, strict=True)),
             max(_stray(w, r) for w, r in zip(want, exact, strict=True)))
    t_oq, t_rq = alternate(lambda: ours_q.run(None, feeds), lambda: ort_q.run(None, feeds), runs, 3)
    t_of, t_rf = alternate(lambda: ours_f.run(None, feeds), lambda: ort_f.run(None, feeds), runs, 3)
    m = {k: statistics.median(v) * 1e3 for k, v in (("oq", t_oq), ("rq", t_rq), ("of", t_of), ("rf", t_rf))}
    ratios = (m["oq"] / m["rq"], m["of"] / m["rf"], m["oq"] / m["of"], m["rq"] / m["rf"])
    return (f"| {name} | {m['oq']:.3f} | {m['rq']:.3f} | " + " | ".join(f"{v:.2f}" for v in ratios)
            + f" | {err:.1e} | {stray[0]:.4f} / {stray[1]:.4f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    prepare_environment()
    print("| LSTM (seq, batch, input, hidden) | ours int8 ms | ORT int8 ms | int8 ours / ORT "
          "| fp32 ours / ORT | ours int8 / fp32 | ORT int8 / fp32 | max err vs ORT | stray ours / ORT |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, shape in SHAPES.items():
        with tempfile.TemporaryDirectory() as tmp:
            print(bench_shape(name, shape, args.runs, args.threads, Path(tmp)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
