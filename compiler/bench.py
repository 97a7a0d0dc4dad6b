"""``onnx-aot bench``: latency of an artifact, optionally against onnxruntime on the same inputs.

What it measures (docs/performance.md explains the method and its fairness settings):

* **latency**: ``runs`` runs after ``warmup`` runs, medians. With ``--compare MODEL.onnx`` the runs
  alternate in this one process -- onnx-aot, onnxruntime, onnx-aot, ... -- on identical feeds and
  thread counts, so both see the same machine phases; the ratio is onnx-aot / onnxruntime (< 1 is
  faster). Both thread pools spin within a run and stop after it, so neither steals the other's
  core: onnxruntime with ``session.force_spinning_stop`` (its spinning ends when ``run`` returns),
  onnx-aot with the runtime's bounded OpenMP spin (~0.3 ms, ``runtime/providers/c.py``), and a
  ``PAUSE_S`` pause after every run covers that tail.
* **accuracy** (with ``--compare``): max abs and max relative error of every output against
  onnxruntime's on the same feeds, and whether they agree within rtol 1e-3 / atol 1e-4 (the zoo
  tests' tolerance).
* **cold start** (``cold_start``; the worker process is ``compiler/bench_cold.py``): session
  creation, creation + first run and peak RSS, each in a fresh process per repetition, engines
  alternating; medians.
* **runtime overhead** (``--overhead``): per run, ``Session.run``'s wall time minus the time the
  kernels themselves report (the C entry's per-step ``clock_gettime`` buffer, the reference
  provider's per-step ``perf_counter``), split into the Python side (outside the entry calls:
  feed checks, output allocation, run context, pointer filling) and the call boundary (ctypes and
  the entry's own dispatch).

onnxruntime gets the model in the form it optimizes best: an older (IR < 4) model that lists its
initializers as graph inputs is given to it with those inputs removed (``for_onnxruntime``),
because onnxruntime treats such initializers as overridable inputs and folds and fuses none of them.
onnxruntime stays optional: ``--compare`` without it is a ``BenchError``, and so is a model it
refuses (its message's first line, no traceback). Inputs the artifact was compiled with ``--bind``
(the manifest's options "binds") are fed to onnxruntime with those values.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

import numpy as np

from compiler.bench_cold import ort_session
from runtime.cli import feeds_with
from runtime.cli import random_feeds
from runtime.errors import OnnxAotError

if TYPE_CHECKING:
    import onnx

    from runtime import Session

__all__ = ["BenchError", "bench", "bound_feeds", "for_onnxruntime", "format_report", "import_onnxruntime",
           "initializers_as_inputs", "measure_overhead", "round_robin", "prepare_environment", "random_feeds",
           "cold_start",
           "RTOL", "ATOL"]

RTOL = 1e-3
ATOL = 1e-4


class BenchError(OnnxAotError):
    """A benchmark cannot run: onnxruntime missing, a model that does not match the artifact..."""


# A pause after every timed run, longer than the runtime's OpenMP spin tail (~0.3 ms), so the
# next run -- of either runtime -- starts on idle cores.
PAUSE_S = 0.002


def prepare_environment() -> None:
    """The runtime's bounded OpenMP spinning, set before any kernel library loads libgomp."""
    from runtime.providers import c as _c  # noqa: F401  (importing it bounds the spinning)


def import_onnxruntime() -> Any:
    """The onnxruntime module, or a ``BenchError`` saying how to get it."""
    try:
        import onnxruntime
    except ImportError as exc:
        raise BenchError(f"--compare needs onnxruntime, which is not installed here ({exc}); "
                         "install it with: pip install onnxruntime") from None
    return onnxruntime


def initializers_as_inputs(model: onnx.ModelProto) -> list[str]:
    """Names of initializers the model also lists as graph inputs (what IR < 4 models must do)."""
    inits = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name in inits]


def for_onnxruntime(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same model in the form onnxruntime optimizes best.

    IR-3 models list initializers as graph inputs; onnxruntime then treats them as overridable
    inputs (no constant folding, no Conv+BatchNorm fusion), which would make it look slower than
    it is. Comparisons drop those inputs and declare IR version 4+ (at most 10, which it accepts).
    """
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = {t.name for t in out.graph.initializer}
    keep = [i for i in out.graph.input if i.name not in inits]
    del out.graph.input[:]
    out.graph.input.extend(keep)
    out.ir_version = min(max(out.ir_version, 4), 10)
    return out


def error_stats(ours: list[np.ndarray], theirs: list[np.ndarray]) -> dict[str, Any]:
    """Max abs error, max relative error |a - b| / (|b| + ATOL), agreement within RTOL/ATOL."""
    max_abs = max_rel = 0.0
    within = True
    for a, b in zip(ours, theirs, strict=True):
        a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a64.shape != b64.shape:
            raise BenchError(f"output shapes differ: onnx-aot {a64.shape}, onnxruntime {b64.shape}")
        if a64.size == 0:
            continue
        diff = np.abs(a64 - b64)
        max_abs = max(max_abs, float(np.max(diff)))
        max_rel = max(max_rel, float(np.max(diff / (np.abs(b64) + ATOL))))
        within = within and bool(np.allclose(a64, b64, rtol=RTOL, atol=ATOL, equal_nan=True))
    return {"max_abs_err": max_abs, "max_rel_err": max_rel, "within_tolerance": within,
            "rtol": RTOL, "atol": ATOL}


def alternate(first: Callable[[], object], second: Callable[[], object] | None, runs: int,
              warmup: int) -> tuple[list[float], list[float]]:
    """Wall times of ``first`` and ``second`` called alternately (A B A B ...), warm-up excluded."""
    if second is None:
        return round_robin([first], runs, warmup)[0], []
    times = round_robin([first, second], runs, warmup)
    return times[0], times[1]


def round_robin(runners: list[Callable[[], object]], runs: int, warmup: int) -> list[list[float]]:
    """Wall times of each of ``runners`` called in turn (A B C A B C ...), warm-up excluded, with
    the pause that lets the next run start on idle cores."""
    times: list[list[float]] = [[] for _ in runners]
    for i in range(warmup + runs):
        for run, kept in zip(runners, times, strict=True):
            t0 = time.perf_counter()
            run()
            t1 = time.perf_counter()
            if i >= warmup:
                kept.append(t1 - t0)
            time.sleep(PAUSE_S)
    return times


class _Probe:
    """Stands in for one partition's call while overhead is measured: passes a timing buffer the
    kernels fill with each step's wall time and times the call itself."""

    def __init__(self, kind: str, part: Any, nsteps: int) -> None:
        self.kind = kind
        self.part = part
        self.timings = np.zeros(max(nsteps, 1), np.float64)
        self.addr = self.timings.ctypes.data
        self.attr = "entry" if kind == "c" else "run"
        self.had_attr = self.attr in vars(part)
        self.original = getattr(part, self.attr)
        self.wall_ns = 0

    def c_call(self, ext: Any, arena: int, weights: int, _timings: int) -> None:
        t0 = time.perf_counter_ns()
        self.original(ext, arena, weights, self.addr)
        self.wall_ns += time.perf_counter_ns() - t0

    def ref_call(self, arenas: Any, ext: Any, _timings: Any = None) -> None:
        t0 = time.perf_counter_ns()
        self.original(arenas, ext, self.timings)
        self.wall_ns += time.perf_counter_ns() - t0

    def install(self) -> None:
        setattr(self.part, self.attr, self.c_call if self.kind == "c" else self.ref_call)

    def remove(self) -> None:
        if self.had_attr:
            setattr(self.part, self.attr, self.original)
        else:
            delattr(self.part, self.attr)

    def take(self) -> tuple[float, float]:
        """(seconds inside the kernels, seconds inside the call) since the last take; resets."""
        kernels, wall = float(self.timings.sum()), self.wall_ns * 1e-9
        self.timings.fill(0.0)
        self.wall_ns = 0
        return kernels, wall


def measure_overhead(session: Session, feeds: dict[str, np.ndarray], runs: int,
                     warmup: int = 3) -> dict[str, Any]:
    """Per-run runtime overhead of ``session.run`` on ``feeds`` (medians over ``runs`` runs)."""
    parts = getattr(session, "_partitions", None)
    records = session.plan.partitions
    if not isinstance(parts, list) or len(parts) != len(records):
        raise BenchError("overhead: runtime.Session no longer keeps its partitions in _partitions; "
                         "update compiler/bench.py: measure_overhead")
    probes = []
    for (kind, part), record in zip(parts, records, strict=True):
        if kind not in ("c", "reference"):
            raise BenchError(f"overhead: partition {record.index} runs on {kind!r}; the overhead "
                             "measurement covers host (C and reference) partitions")
        nsteps = len(record.step_range)
        probes.append(_Probe(kind, part, nsteps))
    total: list[float] = []
    outside: list[float] = []
    boundary: list[float] = []
    kernels: list[float] = []
    for probe in probes:
        probe.install()
    try:
        for i in range(warmup + runs):
            t0 = time.perf_counter_ns()
            session.run(None, feeds)
            wall = (time.perf_counter_ns() - t0) * 1e-9
            taken = [p.take() for p in probes]
            if i < warmup:
                continue
            k = sum(t[0] for t in taken)
            calls = sum(t[1] for t in taken)
            total.append(wall)
            kernels.append(k)
            outside.append(wall - calls)
            boundary.append(calls - k)
    finally:
        for probe in probes:
            probe.remove()
    overhead = [t - k for t, k in zip(total, kernels, strict=True)]
    run_median = statistics.median(total)
    median = statistics.median(overhead)
    return {"runs": runs, "run_s": run_median, "kernels_s": statistics.median(kernels),
            "overhead_s": median, "outside_entries_s": statistics.median(outside),
            "call_boundary_s": statistics.median(boundary), "overhead_fraction": median / run_median}


def _ort_model(compare: Path, tmp: Path,
               binds: dict[str, Any]) -> tuple[Path, list[str], dict[str, np.ndarray]]:
    """The model file onnxruntime gets, the initializer inputs removed for it, and the values of
    the inputs the artifact was compiled with ``--bind`` (converted as the compiler converts them)."""
    import onnx

    try:
        model = onnx.load(str(compare))
    except Exception as exc:  # OSError, protobuf's DecodeError and friends
        raise BenchError(f"--compare: cannot read {compare}: {exc}") from None
    bound = bound_feeds(model, binds)
    removed = initializers_as_inputs(model)
    if not removed and model.ir_version >= 4:
        return compare, [], bound
    path = tmp / "for_onnxruntime.onnx"
    onnx.save(for_onnxruntime(model), str(path))
    return path, removed, bound


def bound_feeds(model: onnx.ModelProto, binds: dict[str, Any]) -> dict[str, np.ndarray]:
    """``binds`` (the manifest's options "binds": input -> values) as feeds of ``model``, each of
    the input's declared element type and shape, the same conversion ``--bind`` made."""
    if not binds:
        return {}
    import onnx
    from onnx import numpy_helper

    from compiler.frontend.loader import bind_input_values

    inputs_only = onnx.ModelProto()  # the conversion reads only the graph inputs: skip the weights
    inputs_only.graph.input.extend(model.graph.input)
    bound = bind_input_values(inputs_only, binds)
    return {t.name: numpy_helper.to_array(t) for t in bound.graph.initializer if t.name in binds}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _ort_load(ort: Any, path: Path, compare: Path, threads: int) -> Any:
    """onnxruntime's session on ``path``, or a ``BenchError`` with the first line of its refusal."""
    try:
        return ort_session(ort, str(path), threads)
    except Exception as exc:  # onnxruntime raises its own exception types (Fail, InvalidGraph...)
        raise BenchError(f"--compare {compare}: onnxruntime cannot load it: {_first_line(exc)}") from None


def _check_io(session: Session, ref: Any, compare: Path, bound: dict[str, np.ndarray]) -> None:
    ours = {s.name for s in session.inputs}
    theirs = {i.name for i in ref.get_inputs()} - set(bound)
    if ours != theirs:
        raise BenchError(f"--compare {compare}: its inputs {sorted(theirs)} are not the artifact's "
                         f"{sorted(ours)}" + (f" (bound with --bind: {sorted(bound)})" if bound else ""))
    missing = [s.name for s in session.outputs if s.name not in {o.name for o in ref.get_outputs()}]
    if missing:
        raise BenchError(f"--compare {compare}: has no output(s) {missing} that the artifact has")


def _manifest_binds(artifact: Path) -> dict[str, Any]:
    """The values the artifact was compiled with ``--bind`` (its manifest's options)."""
    manifest = json.loads((artifact / "manifest.json").read_text(encoding="utf-8"))
    binds: dict[str, Any] = (manifest.get("options") or {}).get("binds") or {}
    return binds


def _one(engine: str, path: Path, feeds_path: Path, threads: int) -> dict[str, Any]:
    env = dict(os.environ)
    cmd = [sys.executable, "-m", "compiler.bench_cold", engine, str(path), str(feeds_path), str(threads)]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if result.returncode != 0:
        raise BenchError(f"cold-start worker for {engine} on {path} failed (exit {result.returncode}): "
                         f"{result.stderr.strip()[-2000:]}")
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise BenchError(f"cold-start worker for {engine} on {path} printed no result: "
                         f"{result.stdout[-500:]}")
    record: dict[str, Any] = json.loads(lines[-1])
    return record


def cold_start(artifact: Path, ort_model: Path | None, feeds_path: Path, threads: int,
               reps: int, *, ort_feeds_path: Path | None = None) -> dict[str, Any]:
    """Medians over ``reps`` fresh processes per engine, engines alternating; ratios when both ran.

    ``ort_feeds_path`` holds onnxruntime's feeds when they differ (inputs bound with ``--bind``)."""
    samples: dict[str, list[dict[str, Any]]] = {"onnx-aot": []}
    if ort_model is not None:
        samples["onnxruntime"] = []
    for _ in range(reps):
        samples["onnx-aot"].append(_one("onnx-aot", artifact, feeds_path, threads))
        if ort_model is not None:
            samples["onnxruntime"].append(_one("onnxruntime", ort_model, ort_feeds_path or feeds_path,
                                               threads))
    out: dict[str, Any] = {"reps": reps}
    keys = ("import_s", "load_s", "first_run_s", "load_first_s", "base_rss", "peak_rss")
    for engine, records in samples.items():
        out[engine] = {key: statistics.median(r[key] for r in records) for key in keys}
    if ort_model is not None:
        ours, theirs = out["onnx-aot"], out["onnxruntime"]
        out["load_ratio"] = ours["load_s"] / theirs["load_s"]
        out["load_first_ratio"] = ours["load_first_s"] / theirs["load_first_s"]
        out["peak_rss_ratio"] = ours["peak_rss"] / theirs["peak_rss"]
    return out


def _setup_compare(ort: Any, session: Session, artifact: Path, compare: Path, feeds: dict[str, np.ndarray],
                   tmp: Path, result: dict[str, Any]
                   ) -> tuple[Path, dict[str, np.ndarray], Callable[[], object]]:
    """``--compare``: onnxruntime's model written under ``tmp`` and loaded, its inputs and outputs
    checked against the artifact's, the model's facts and the accuracy of one run of each engine
    put in ``result``; returns (that model's path, onnxruntime's feeds, one onnxruntime run)."""
    ort_path, removed, bound = _ort_model(compare, tmp, _manifest_binds(artifact))
    ref = _ort_load(ort, ort_path, compare, session.threads)
    _check_io(session, ref, compare, bound)
    ort_feeds = {**feeds, **bound}
    names = [s.name for s in session.outputs]
    result["compare"] = {"model": str(compare), "onnxruntime": str(ort.__version__),
                         "initializer_inputs_removed": len(removed), "bound_inputs": sorted(bound)}
    try:
        expected = ref.run(names, ort_feeds)
    except Exception as exc:  # onnxruntime's own exception types
        raise BenchError(f"--compare {compare}: onnxruntime cannot run it: "
                         f"{_first_line(exc)}") from None
    result["accuracy"] = error_stats(session.run(None, feeds), expected)

    def ref_run() -> object:
        return ref.run(names, ort_feeds)

    return ort_path, ort_feeds, ref_run


def _latency(a: list[float], b: list[float]) -> dict[str, Any]:
    """The medians (and extremes) of the alternating runs' times, with the ratio where both ran."""
    latency: dict[str, Any] = {"onnx_aot_s": statistics.median(a), "onnx_aot_min_s": min(a),
                               "onnx_aot_max_s": max(a)}
    if b:
        latency.update(onnxruntime_s=statistics.median(b), onnxruntime_min_s=min(b),
                       onnxruntime_max_s=max(b), ratio=statistics.median(a) / statistics.median(b))
    return latency


def _cold(artifact: Path, ort_path: Path | None, feeds: dict[str, np.ndarray],
          ort_feeds: dict[str, np.ndarray], tmp: Path, threads: int, reps: int) -> dict[str, Any]:
    """``cold_start`` on the feeds saved under ``tmp`` (onnxruntime's apart where they differ)."""
    feeds_path = tmp / "feeds.npz"
    np.savez(feeds_path, **feeds)  # type: ignore[arg-type]
    ort_feeds_path = feeds_path
    if ort_feeds is not feeds:
        ort_feeds_path = tmp / "ort_feeds.npz"
        np.savez(ort_feeds_path, **ort_feeds)  # type: ignore[arg-type]
    return cold_start(artifact, ort_path, feeds_path, threads, reps, ort_feeds_path=ort_feeds_path)


def bench(artifact: str | os.PathLike[str], *, compare: str | os.PathLike[str] | None = None,
          threads: int | None = None, runs: int = 20, warmup: int = 3, cold_reps: int = 5,
          overhead: bool = False, seed: int = 0, rebuild: bool = False,
          inputs: Mapping[str, np.ndarray] | None = None) -> dict[str, Any]:
    """Benchmark ``artifact`` (see the module docstring); returns a JSON-ready dict.

    ``inputs`` (``--input NAME=file.npy``) are fed instead of random data to the inputs they name,
    to both engines (token ids a vocabulary must hold, real images, a shape in a range).

    ``rebuild`` runs the in-process session on the C kernels rebuilt for this CPU (built, or
    found in the cache, before the load is timed); cold-start processes load the artifact as is.
    """
    prepare_environment()
    from runtime import Session

    ort: Any = import_onnxruntime() if compare is not None else None
    artifact = Path(artifact)
    if rebuild:
        Session(artifact, threads=1, rebuild=True)  # compile now, outside the timed load
    start = time.perf_counter()
    session = Session(artifact, threads=threads, rebuild=rebuild)
    result: dict[str, Any] = {"artifact": str(artifact), "threads": session.threads, "runs": max(runs, 1),
                              "warmup": max(warmup, 0), "load_in_process_s": time.perf_counter() - start}
    if rebuild:
        built = session.cpu_build.rebuilt if session.cpu_build is not None else None
        result["rebuilt"] = str(built) if built is not None else None
    feeds = feeds_with(session, dict(inputs or {}), seed)
    result["given_inputs"] = sorted(inputs or {})
    with tempfile.TemporaryDirectory(prefix="onnx-aot-bench-") as tmp_name:
        tmp = Path(tmp_name)
        ort_path: Path | None = None
        ref_run: Callable[[], object] | None = None
        ort_feeds = feeds
        if compare is not None:
            ort_path, ort_feeds, ref_run = _setup_compare(ort, session, artifact, Path(compare), feeds, tmp,
                                                          result)
        a, b = alternate(lambda: session.run(None, feeds), ref_run, max(runs, 1), max(warmup, 0))
        result["latency"] = _latency(a, b)
        if overhead:
            # at least ~1 s of runs (at most 2,000): tiny models need many for a stable median
            n = max(runs, min(2000, int(1.0 / max(result["latency"]["onnx_aot_s"], 1e-6))))
            result["overhead"] = measure_overhead(session, feeds, n)
        if cold_reps > 0:
            result["cold"] = _cold(artifact, ort_path, feeds, ort_feeds, tmp, session.threads, cold_reps)
    return result


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f} ms" if seconds < 0.01 else f"{seconds * 1000:.2f} ms"


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


def format_report(r: dict[str, Any]) -> str:
    """The human-readable form of ``bench``'s result."""
    lat = r["latency"]
    lines = [f"{r['artifact']}: threads {r['threads']}, {r['runs']} runs after {r['warmup']} warm-up"
             + (", alternating with onnxruntime in this process" if "ratio" in lat else "")]
    if "rebuilt" in r:
        lines.append(f"  rebuilt         in-process runs on {r['rebuilt']}" if r["rebuilt"] else
                     "  rebuilt         nothing (the artifact has no C build); it runs as compiled")
    cmp_ = r.get("compare")
    if cmp_:
        note = (f"; {cmp_['initializer_inputs_removed']} initializers listed as graph inputs were "
                "removed for onnxruntime (IR < 4 form) so it can fold its weights"
                if cmp_["initializer_inputs_removed"] else "")
        if cmp_.get("bound_inputs"):
            note += f"; fed onnxruntime the --bind values of {', '.join(cmp_['bound_inputs'])}"
        lines.append(f"  compared with onnxruntime {cmp_['onnxruntime']} on {cmp_['model']}{note}")
    text = (f"  latency         median onnx-aot {_ms(lat['onnx_aot_s'])} (min {_ms(lat['onnx_aot_min_s'])}, "
            f"max {_ms(lat['onnx_aot_max_s'])})")
    lines.append(text)
    if "ratio" in lat:
        lines.append(f"                  median onnxruntime {_ms(lat['onnxruntime_s'])} "
                     f"(min {_ms(lat['onnxruntime_min_s'])}); latency ratio onnx-aot / onnxruntime "
                     f"{lat['ratio']:.3f}")
    acc = r.get("accuracy")
    if acc:
        verdict = "within" if acc["within_tolerance"] else "NOT within"
        lines.append(f"  accuracy        max abs err {acc['max_abs_err']:.3g}, max rel err "
                     f"{acc['max_rel_err']:.3g} (|a-b|/(|b|+{acc['atol']:g})) vs onnxruntime: {verdict} "
                     f"rtol {acc['rtol']:g} / atol {acc['atol']:g}")
    cold = r.get("cold")
    if cold:
        ours, theirs = cold["onnx-aot"], cold.get("onnxruntime")
        head = f"  cold start      median of {cold['reps']} fresh processes per engine"
        lines.append(head + (", alternating" if theirs else ""))
        rows = (("session creation", "load_s", "load_ratio"),
                ("creation + 1st run", "load_first_s", "load_first_ratio"))
        for label, key, ratio in rows:
            line = f"    {label:<20}onnx-aot {_ms(ours[key])}"
            if theirs:
                line += f", onnxruntime {_ms(theirs[key])}, ratio {cold[ratio]:.3f}"
            lines.append(line)
        line = (f"    {'peak RSS':<20}onnx-aot {_mib(ours['peak_rss'])} "
                f"(after imports {_mib(ours['base_rss'])})")
        if theirs:
            line += (f", onnxruntime {_mib(theirs['peak_rss'])} (after imports {_mib(theirs['base_rss'])}), "
                     f"ratio {cold['peak_rss_ratio']:.3f}")
        lines.append(line)
    ov = r.get("overhead")
    if ov:
        lines.append(f"  overhead        {ov['overhead_s'] * 1e6:.1f} us per run = "
                     f"{ov['overhead_fraction'] * 100:.2f}% of the run (median of {ov['runs']}: run "
                     f"{_ms(ov['run_s'])}, kernels {_ms(ov['kernels_s'])}; outside the entry calls "
                     f"{ov['outside_entries_s'] * 1e6:.1f} us, call boundary "
                     f"{ov['call_boundary_s'] * 1e6:.1f} us)")
    return "\n".join(lines) + "\n"
