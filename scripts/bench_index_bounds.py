"""Issue 29 item 5's cost check: the checked C Gather (out-of-range indices are an error) against
the unchecked one, on a MiniLM-size encoder with BERT's embeddings in front.

The model: ``input_ids`` / ``token_type_ids`` (1, seq) gathered from a 30522 x 384 word table and
a 2 x 384 type table, plus the position table, LayerNorm, then ``tests/support/encoder_model.py``'s
MiniLM layers (6 x 384, 12 heads, FFN 1536). ``--embeddings-only`` stops after the LayerNorm (the
Gathers' share of the run is then large). The "before" artifact is compiled by another checkout
(``--before-src``: e.g. a ``git worktree`` of the branch point), in a subprocess with that
checkout first on the path; both artifacts then run in this process, alternating round by round
(``--rounds`` rounds of ``--runs`` runs each, the median of each round), on identical feeds.
Prints the median over rounds of after / before per-round medians, and its spread. Run it under
the shared CPU lock (``flock /tmp/onnx-aot-cpu.lock ...``).

Usage: python -m scripts.bench_index_bounds --before-src PATH [--threads 2 1] [--rounds N]
                                            [--runs N] [--seq N] [--embeddings-only]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler.bench import prepare_environment
from compiler.driver import compile_model
from tests.support.encoder_model import MINILM
from tests.support.encoder_model import encoder_model

VOCAB = 30522


def bert_model(seq: int, embeddings_only: bool) -> onnx.ModelProto:
    """MiniLM's encoder with embeddings (the encoder's ``hidden_states`` input becomes the
    embeddings' LayerNorm output), seeded weights."""
    hidden = MINILM["hidden"]
    enc = encoder_model(**MINILM, seq=seq)
    rng = np.random.default_rng(11)
    tables = {"words": (VOCAB, hidden), "types": (2, hidden), "positions": (1, seq, hidden)}
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.05).astype(np.float32), n)
             for n, s in tables.items()]
    inits += [numpy_helper.from_array(np.ones(hidden, np.float32), "emb.gamma"),
              numpy_helper.from_array(np.zeros(hidden, np.float32), "emb.beta")]
    out = "emb" if embeddings_only else "hidden_states"
    nodes = [helper.make_node("Gather", ["words", "input_ids"], ["w"], name="/embeddings/word_embeddings"),
             helper.make_node("Gather", ["types", "token_type_ids"], ["t"], name="/embeddings/token_type"),
             helper.make_node("Add", ["w", "t"], ["wt"], name="/embeddings/add"),
             helper.make_node("Add", ["wt", "positions"], ["wtp"], name="/embeddings/add_pos"),
             helper.make_node("LayerNormalization", ["wtp", "emb.gamma", "emb.beta"], [out],
                              name="/embeddings/LayerNorm", axis=-1, epsilon=1e-12)]
    ids = [helper.make_tensor_value_info(n, TensorProto.INT64, [1, seq])
           for n in ("input_ids", "token_type_ids")]
    if embeddings_only:
        graph = helper.make_graph(nodes, "embeddings", ids,
                                  [helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, seq, hidden])],
                                  initializer=inits)
    else:
        g = enc.graph
        graph = helper.make_graph(nodes + list(g.node), "bert", ids + [g.input[1]], list(g.output),
                                  initializer=inits + list(g.initializer))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def feeds_for(model: onnx.ModelProto, seq: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds: dict[str, np.ndarray] = {"input_ids": rng.integers(0, VOCAB, (1, seq)).astype(np.int64),
             "token_type_ids": (np.arange(seq) >= seq // 2).reshape(1, seq).astype(np.int64)}
    if any(i.name == "attention_mask" for i in model.graph.input):
        feeds["attention_mask"] = (np.arange(seq) < seq * 3 // 4).reshape(1, seq)
    return feeds


def compile_before(src: Path, model_path: Path, out: Path) -> None:
    code = ("import sys; from compiler.driver import compile_model; "
            "compile_model(sys.argv[1], sys.argv[2], golden_cases=0)")
    env = {**os.environ, "PYTHONPATH": str(src)}
    subprocess.run([sys.executable, "-c", code, str(model_path), str(out)], cwd=src, env=env, check=True)


def alternate(paths: dict[str, Path], feeds: dict[str, np.ndarray], threads: int, rounds: int,
              runs: int) -> dict[str, list[float]]:
    """Per-round median seconds of each artifact, the artifacts alternating within each round."""
    from runtime import Session

    sessions = {k: Session(p, threads=threads) for k, p in paths.items()}
    for s in sessions.values():
        for _ in range(3):
            s.run(None, feeds)
    got: dict[str, list[float]] = {k: [] for k in sessions}
    for r in range(rounds):
        order = list(sessions) if r % 2 == 0 else list(reversed(sessions))
        for k in order:
            times = []
            for _ in range(runs):
                t0 = time.perf_counter()
                sessions[k].run(None, feeds)
                times.append(time.perf_counter() - t0)
            got[k].append(statistics.median(times))
    return got


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before-src", type=Path, required=True, help="the checkout compiling the baseline")
    parser.add_argument("--threads", type=int, nargs="+", default=[2, 1])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--embeddings-only", action="store_true")
    args = parser.parse_args()
    prepare_environment()
    with tempfile.TemporaryDirectory(prefix="onnx-aot-index-bounds-") as tmp:
        model = bert_model(args.seq, args.embeddings_only)
        model_path = Path(tmp) / "model.onnx"
        onnx.save(model, model_path)
        paths = {"before": Path(tmp) / "before", "after": Path(tmp) / "after"}
        compile_before(args.before_src, model_path, paths["before"])
        compile_model(model_path, paths["after"], golden_cases=0)
        for k, p in paths.items():
            checked = "onnx_aot_fail(" in (p / "kernels" / "cpu" / "model.c").read_text()
            print(f"{k}: {p.name} artifact, checked C Gather: {checked}", flush=True)
        feeds = feeds_for(model, args.seq)
        from runtime import Session

        a, b = (Session(p).run(None, feeds)[0] for p in (paths["before"], paths["after"]))
        np.testing.assert_array_equal(a, b)
        for threads in args.threads:
            got = alternate(paths, feeds, threads, args.rounds, args.runs)
            ratios = [x / y for x, y in zip(got["after"], got["before"], strict=True)]
            print(f"{'embeddings' if args.embeddings_only else 'minilm'} seq {args.seq} threads {threads}: "
                  f"before {statistics.median(got['before']) * 1e3:.3f} ms, after "
                  f"{statistics.median(got['after']) * 1e3:.3f} ms, after/before median "
                  f"{statistics.median(ratios):.4f} (rounds {min(ratios):.3f}..{max(ratios):.3f})",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
