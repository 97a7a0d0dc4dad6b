"""Compile ResNet-50 with seeded random weights, run it, check it against onnxruntime, summarize.

The light ResNet-50 shipped in the onnx package has constant weights (every one 0.02), so its
output ignores the input: a uniform softmax that looks broken. The demo gives it seeded random
weights first (``tests/support/zoo.py``, the zoo the end-to-end tests use), keeps the final
Softmax, and feeds a seeded input; the class probabilities it prints are then far from uniform.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx

from compiler import compile_model
from compiler.bench import for_onnxruntime
from compiler.driver import stderr_progress
from runtime import Session
from tests.support.zoo import random_weight_model

ROOT = Path(__file__).resolve().parent.parent
SEED = 0


def _onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray | None:
    """onnxruntime's output for the same model and feeds (None when it is not installed)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(for_onnxruntime(model).SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, feeds)[0])


def main() -> int:
    model = random_weight_model("resnet50", seed=SEED)
    out = ROOT / "artifacts" / "resnet50"
    start = time.perf_counter()
    compile_model(model, out, progress=stderr_progress)
    compile_s = time.perf_counter() - start

    start = time.perf_counter()
    session = Session(out)
    load_ms = (time.perf_counter() - start) * 1000
    spec = session.inputs[0]
    x = np.random.default_rng(SEED).standard_normal(spec.shape).astype(np.float32)
    (y,) = session.run(None, {spec.name: x})
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        session.run(None, {spec.name: x})
        times.append(time.perf_counter() - t0)
    expected = _onnxruntime(model, {spec.name: x})
    matches = expected is None or bool(np.allclose(y, expected, rtol=1e-3, atol=1e-5))

    plan = session.plan
    providers: dict[str, int] = {}
    for step in plan.steps:
        providers[step.provider] = providers.get(step.provider, 0) + 1
    probs = y.reshape(-1)
    top = np.argsort(probs)[::-1][:5]
    print(f"\nResNet-50 (the onnx package's light model, seeded random weights) -> {out.relative_to(ROOT)}")
    print(f"  compile      {compile_s:.1f} s; {len(plan.steps)} steps "
          f"({', '.join(f'{k}: {v}' for k, v in providers.items())}), "
          f"{len(plan.partitions)} partition(s)")
    print(f"  input        {spec.name} {spec.dtype} {list(spec.shape)} (seeded normal)")
    print(f"  output       {session.outputs[0].name} {y.dtype} {list(y.shape)} (softmax); top-5 classes "
          + ", ".join(f"{int(k)}: {probs[k]:.4f}" for k in top)
          + f"; smallest {probs.min():.2e}")
    if expected is None:
        print("  reference    onnxruntime is not installed: not compared")
    else:
        err = float(np.max(np.abs(y - expected)))
        print(f"  reference    matches onnxruntime on the same input: {'yes' if matches else 'NO'} "
              f"(max abs difference {err:.2e})")
    print(f"  latency      median {statistics.median(times) * 1000:.2f} ms over {len(times)} runs "
          f"({session.threads} threads); session load {load_ms:.1f} ms")
    for arena in plan.arenas:
        lb = arena.lower_bound_nbytes
        print(f"  arena        {arena.memory_space}: {arena.nbytes / 2**20:.2f} MiB; lower bound "
              f"{lb / 2**20:.2f} MiB ({arena.nbytes / max(lb, 1):.3f}x); naive "
              f"{arena.naive_nbytes / 2**20:.2f} MiB")
    print(f"  weights      {plan.weights_nbytes / 2**20:.2f} MiB")
    print(f"  next         onnx-aot verify {out.relative_to(ROOT)}; onnx-aot inspect {out.relative_to(ROOT)}")
    return 0 if matches else 1


if __name__ == "__main__":
    sys.exit(main())
