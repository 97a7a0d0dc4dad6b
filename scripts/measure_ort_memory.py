"""Activation memory of the nine random-weight light-zoo models: onnx-aot's plan next to onnxruntime.

For each model it prints onnx-aot's arena, the lower bound after aliasing and the naive sum (from
compiling the model), then activation memory measured from outside, the same way for every
runtime (docs/memory.md explains why this way):

  a fresh Python process per model and runtime loads the feeds and the model, runs it once (the
  warm-up faults in code pages and memory-mapped weights: file-backed, not activations), releases
  what that run took, returns freed heap pages to the kernel (malloc_trim), resets the kernel's
  peak-RSS counter (writes "5" to /proc/self/clear_refs: VmHWM := VmRSS), reads VmRSS, runs the
  model ``--runs`` times and reads VmHWM. peak - before is what running added to resident memory
  at its highest; the same number for a one-Relu model in the same configuration (fixed per-run
  costs) is subtracted.

Runtimes: onnx-aot (its pooled run context is dropped after the warm-up, so the measured run
allocates its arena afresh); onnxruntime with its CPU arena (the default; the arena keeps what it
takes and cannot be emptied, so a second, fresh session is measured after the warm-up session;
"ORT 1st run" is that session's first run, "ORT arena" the arena after all runs) and without it.
All use sequential execution with ``--threads`` intra-op threads (default 1); onnxruntime gets the
model in the form it optimizes best (``compiler/bench.py: for_onnxruntime``). onnx-aot measured this
way checks the method: it must come out at its planned arena. Linux only (reads /proc/self).

Usage: python -m scripts.measure_ort_memory [--runs N] [--threads N] [--json] [MODEL ...]
Not part of CI (about two minutes for the zoo); tests/test_report.py smoke-tests it on SqueezeNet.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

ENGINES = ("onnx-aot", "ort-arena", "ort-noarena")
KIB = 1024


def _status() -> dict[str, int]:
    """VmRSS and VmHWM of this process, in bytes."""
    out = {}
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * KIB
    if len(out) != 2:
        raise RuntimeError("/proc/self/status has no VmRSS/VmHWM (Linux only)")
    return out


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")  # Linux >= 4.0: reset the peak RSS (VmHWM) to the current RSS
    status = _status()
    if status["VmHWM"] > status["VmRSS"] + 1024 * KIB:  # the counters may lag by a few pages
        raise RuntimeError(f"writing 5 to /proc/self/clear_refs did not reset VmHWM: {status}")


def _trim() -> None:
    """Give freed heap memory back to the kernel, so a later allocation must fault pages in again."""
    gc.collect()
    ctypes.CDLL(None).malloc_trim(0)


def child(engine: str, model: str, feeds_path: str, threads: int, runs: int) -> dict[str, int]:
    """Runs in the fresh process: warm up, then measure ``runs`` runs from a released state (bytes).

    The warm-up run faults in the kernels' code pages (and onnx-aot's memory-mapped weights), which
    are file-backed and not activation memory. Then the activation memory it took is released:
    onnx-aot drops its pooled run context (the arena); onnxruntime without its arena freed it
    already (``_trim`` returns it to the kernel); onnxruntime with its arena cannot empty it (the
    arena-shrinkage run option frees nothing here), so a second, fresh session is measured.
    """
    with np.load(feeds_path) as data:
        feeds = {k: np.ascontiguousarray(data[k]) for k in data.files}
    session: Any
    if engine == "onnx-aot":
        from runtime import Session

        session = Session(model, threads=threads)
        session.run(None, feeds)
        session._pool.clear()  # the next run allocates its run context (arena) afresh
    else:
        import onnxruntime as ort

        def make() -> Any:
            options = ort.SessionOptions()
            options.log_severity_level = 3
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
            options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            options.enable_cpu_mem_arena = engine == "ort-arena"
            return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])

        session = make()
        session.run(None, feeds)
        if engine == "ort-arena":
            del session  # its arena keeps what the warm-up took; measure a fresh session instead
            session = make()
    _trim()
    before = _status()["VmRSS"]
    _reset_peak()
    session.run(None, feeds)
    first = _status()["VmHWM"] - before
    for _ in range(runs - 1):
        session.run(None, feeds)
    after = _status()
    return {"before_rss": before, "first_run_peak": first, "peak": after["VmHWM"] - before,
            "retained": after["VmRSS"] - before}


def _measure(engine: str, model: Path, feeds: Path, threads: int, runs: int) -> dict[str, int]:
    cmd = [sys.executable, "-m", "scripts.measure_ort_memory", "--child", engine, str(model), str(feeds),
           "--threads", str(threads), "--runs", str(runs)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT,
                            env={**_env(), "OMP_NUM_THREADS": str(threads)})
    if result.returncode != 0:
        raise RuntimeError(f"{engine} on {model.name} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def _tiny_model() -> Any:
    import onnx
    from onnx import TensorProto
    from onnx import helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "tiny",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                             ir_version=onnx.IR_VERSION if onnx.IR_VERSION <= 10 else 10)


def _prepare(name: str, model: Any, feeds: dict[str, np.ndarray], tmp: Path,
             ) -> tuple[dict[str, Path], Path, dict[str, int]]:
    """Compile for onnx-aot, save the onnxruntime form and the feeds; the plan's numbers."""
    import onnx

    from compiler import compile_model
    from compiler.bench import for_onnxruntime

    artifact = compile_model(model, tmp / f"{name}.aot")
    ort_path = tmp / f"{name}.onnx"
    onnx.save(for_onnxruntime(model), str(ort_path))
    feeds_path = tmp / f"{name}.npz"
    np.savez(feeds_path, **feeds)  # type: ignore[arg-type]  # the stub reads **feeds as allow_pickle
    plan = json.loads((artifact / "plan.json").read_text(encoding="utf-8"))
    host = [a for a in plan["arenas"] if a["memory_space"] == "host"]
    numbers = {"arena": sum(a["nbytes"] for a in host),
               "lower_bound": sum(a["lower_bound_nbytes"] for a in host),
               "naive": sum(a["naive_nbytes"] for a in host),
               "outputs": sum(int(np.prod(o["shape"])) * np.dtype(o["dtype"]).itemsize
                              for o in plan["outputs"])}
    paths = {"onnx-aot": artifact, "ort-arena": ort_path, "ort-noarena": ort_path}
    return paths, feeds_path, numbers


def _mib(n: float) -> str:
    return f"{n / (1 << 20):.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="zoo model names (default: all nine)")
    parser.add_argument("--runs", type=int, default=10, help="measured runs (default 10)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    parser.add_argument("--json", action="store_true", help="print the raw numbers as JSON too")
    parser.add_argument("--child", nargs=3, metavar=("ENGINE", "MODEL", "FEEDS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        engine, model, feeds = args.child
        print(json.dumps(child(engine, model, feeds, args.threads, args.runs)))
        return 0

    from tests.support.zoo import ZOO
    from tests.support.zoo import dummy_input
    from tests.support.zoo import zoo_model

    names = args.models or list(ZOO)
    unknown = [n for n in names if n not in ZOO]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(ZOO)}")
    start = time.perf_counter()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="measure-ort-memory-") as tmp_name:
        tmp = Path(tmp_name)
        tiny = _tiny_model()
        paths, feeds, _ = _prepare("tiny", tiny, {"x": np.ones((1, 8), np.float32)}, tmp)
        baseline = {e: _measure(e, paths[e], feeds, args.threads, args.runs) for e in ENGINES}
        results["baseline"] = baseline
        print(f"activation memory in MiB; {args.threads} thread(s); peak resident growth over "
              f"{args.runs} runs, minus the same for a one-Relu model (" +
              ", ".join(f"{e} {_mib(baseline[e]['peak'])}" for e in ENGINES) + ")")
        print("| model | arena | lower bound | naive | onnx-aot measured | ORT 1st run | ORT arena "
              "| ORT no arena | ORT arena / arena |")
        print("|---|--:|--:|--:|--:|--:|--:|--:|--:|")
        for name in names:
            t0 = time.perf_counter()
            model = zoo_model(name)
            paths, feeds, numbers = _prepare(name, model, dummy_input(model), tmp)
            measured = {e: _measure(e, paths[e], feeds, args.threads, args.runs) for e in ENGINES}
            net = {e: max(measured[e]["peak"] - baseline[e]["peak"], 0) for e in ENGINES}
            first = max(measured["ort-arena"]["first_run_peak"] - baseline["ort-arena"]["first_run_peak"], 0)
            results[name] = {**numbers, "measured": measured, "net": net, "ort_first_run": first,
                             "seconds": round(time.perf_counter() - t0, 2)}
            ratio = net["ort-arena"] / numbers["arena"] if numbers["arena"] else float("nan")
            print(f"| {name} | {_mib(numbers['arena'])} | {_mib(numbers['lower_bound'])} | "
                  f"{_mib(numbers['naive'])} | {_mib(net['onnx-aot'])} | {_mib(first)} | "
                  f"{_mib(net['ort-arena'])} | {_mib(net['ort-noarena'])} | {ratio:.2f} |", flush=True)
            for path in (tmp / f"{name}.onnx", tmp / f"{name}.npz"):
                path.unlink()
    elapsed = time.perf_counter() - start
    results["seconds"] = round(elapsed, 2)
    if args.json:
        print(json.dumps(results, indent=1))
    print(f"measured {len(names)} model(s) in {elapsed:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
