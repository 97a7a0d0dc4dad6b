"""Compile the light ResNet-50 shipped in the onnx package, run it, print a short summary."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from compiler import compile_model
from compiler.driver import stderr_progress
from runtime import Session

ROOT = Path(__file__).resolve().parent.parent

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def main() -> int:
    model = LIGHT / "light_resnet50.onnx"
    out = ROOT / "artifacts" / "resnet50"
    start = time.perf_counter()
    compile_model(model, out, progress=stderr_progress)
    compile_s = time.perf_counter() - start

    start = time.perf_counter()
    session = Session(out)
    load_ms = (time.perf_counter() - start) * 1000
    spec = session.inputs[0]
    n = int(np.prod(spec.shape))
    x = (np.arange(n).reshape(spec.shape) / n).astype(np.float32)  # onnx's own test input
    (y,) = session.run(None, {spec.name: x})
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        session.run(None, {spec.name: x})
        times.append(time.perf_counter() - t0)
    expected = numpy_helper.to_array(onnx.load_tensor(str(LIGHT / "light_resnet50_output_0.pb")))
    matches = np.allclose(y, expected, rtol=1e-3, atol=1e-7)

    plan = session.plan
    providers: dict[str, int] = {}
    for step in plan.steps:
        providers[step.provider] = providers.get(step.provider, 0) + 1
    print(f"\nResNet-50 (light, from the onnx package) -> {out.relative_to(ROOT)}")
    print(f"  compile      {compile_s:.1f} s; {len(plan.steps)} steps "
          f"({', '.join(f'{k}: {v}' for k, v in providers.items())}), "
          f"{len(plan.partitions)} partition(s)")
    print(f"  input        {spec.name} {spec.dtype} {list(spec.shape)}")
    print(f"  output       {session.outputs[0].name} {y.dtype} {list(y.shape)}; "
          f"top-5 classes {np.argsort(y.reshape(-1))[::-1][:5].tolist()}, "
          f"first values {np.round(y.reshape(-1)[:3], 6).tolist()}")
    print(f"  reference    matches the shipped light_resnet50_output_0.pb: {'yes' if matches else 'NO'}")
    print(f"  latency      median {statistics.median(times) * 1000:.2f} ms over {len(times)} runs "
          f"({session.threads} threads); session load {load_ms:.1f} ms")
    for arena in plan.arenas:
        lb = arena.lower_bound_nbytes
        print(f"  arena        {arena.memory_space}: {arena.nbytes / 2**20:.2f} MiB; lower bound "
              f"{lb / 2**20:.2f} MiB ({arena.nbytes / max(lb, 1):.3f}x); naive "
              f"{arena.naive_nbytes / 2**20:.2f} MiB")
    print(f"  weights      {plan.weights_nbytes / 2**20:.2f} MiB")
    return 0 if matches else 1


if __name__ == "__main__":
    sys.exit(main())
