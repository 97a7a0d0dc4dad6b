"""Run ONNX's node test suite through ``compiler.backend`` and report (optionally into docs).

    python -m scripts.conformance                      # whole suite, summary + per-case lines
    python -m scripts.conformance --filter 'conv|pool' # a subset
    python -m scripts.conformance --write-docs docs/conformance.md

Each case runs in a worker process (``--jobs`` of them) with a time limit, so a crash or a hang is
recorded against its case instead of ending the run. Every case ends in one of:

- ``pass``           outputs match the case's reference within its tolerances;
- ``not supported``  onnx-aot refused the model with its own UnsupportedOpError;
- ``expected``       a failure listed in tests/support/conformance_expected.py, with its reason;
- ``FAIL``           anything else: wrong numbers, another error, a raw exception, a crash or a
                     hang. The script exits 1 when there is any.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing as mp
import os
import re
import sys
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ORT_PASSED = 1345  # onnxruntime 1.31 through onnxruntime.backend, same harness, this machine


@dataclass(frozen=True)
class Outcome:
    case: str
    status: str  # pass | not supported | expected | FAIL | skip
    detail: str
    seconds: float


# -- running one case -------------------------------------------------------------------------
_CLASS: Any = None


def _case_class() -> Any:
    global _CLASS
    if _CLASS is None:
        import warnings

        import onnx.backend.test

        import compiler.backend

        with warnings.catch_warnings():  # onnx's case generators overflow casts on purpose
            warnings.simplefilter("ignore", RuntimeWarning)
            suite = onnx.backend.test.BackendTest(compiler.backend, "conformance")
        _CLASS = suite.test_cases["OnnxBackendNodeModelTest"]
    return _CLASS


def case_names() -> list[str]:
    """Every node case of the installed onnx, as the harness names them ("test_abs_cpu")."""
    cls = _case_class()
    return sorted(n for n in dir(cls) if n.startswith("test_") and n.endswith("_cpu"))


def run_case(name: str) -> tuple[str, str]:
    """Run one case in this process: (status, detail). Never raises."""
    from runtime.errors import OnnxAotError
    from runtime.errors import UnsupportedOpError
    from tests.support.conformance_expected import EXPECTED_FAILURES

    cls = _case_class()
    try:
        getattr(cls(name), name)()
    except UnsupportedOpError as exc:
        return "not supported", _one_line(exc)
    except Exception as exc:  # classified below; the whole point is to catch everything
        if type(exc).__name__ == "SkipTest":
            return "skip", _one_line(exc)
        if isinstance(exc, AssertionError):
            detail = "wrong result: " + _one_line(exc)
        elif isinstance(exc, OnnxAotError):
            detail = f"{type(exc).__name__}: {_one_line(exc)}"
        else:
            detail = f"raw {type(exc).__name__}: {_one_line(exc)} at {_where(exc)}"
        base = name[:-len("_cpu")]
        if base in EXPECTED_FAILURES:
            return "expected", EXPECTED_FAILURES[base]
        return "FAIL", detail
    return "pass", ""


def _one_line(exc: BaseException) -> str:
    text = " | ".join(ln.strip() for ln in str(exc).strip().splitlines() if ln.strip())
    return text[:300] or type(exc).__name__


def _where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    return f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"


def _worker(conn: Connection) -> None:
    import warnings

    warnings.simplefilter("ignore")
    while True:
        name = conn.recv()
        if name is None:
            return
        start = time.perf_counter()
        status, detail = run_case(name)
        conn.send((status, detail, time.perf_counter() - start))


# -- the pool ---------------------------------------------------------------------------------
class _Slot:
    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.conn: Connection | None = None
        self.proc: Any = None
        self.case: str | None = None
        self.started = 0.0

    def ensure(self) -> None:
        if self.proc is None or not self.proc.is_alive():
            parent, child = self.ctx.Pipe()
            self.proc = self.ctx.Process(target=_worker, args=(child,), daemon=True)
            self.proc.start()
            child.close()
            self.conn = parent

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.join()
        self.proc = None
        self.conn = None


def run_cases(names: list[str], jobs: int, timeout: float, progress: bool) -> list[Outcome]:
    """Run ``names`` over ``jobs`` worker processes; a case over ``timeout`` seconds is a hang."""
    ctx = mp.get_context("fork")
    _case_class()  # build the test class once, before forking
    slots = [_Slot(ctx) for _ in range(max(1, jobs))]
    pending = list(reversed(names))
    results: dict[str, Outcome] = {}
    while pending or any(s.case for s in slots):
        for slot in slots:
            if slot.case is None and pending:
                slot.ensure()
                slot.case = pending.pop()
                slot.started = time.perf_counter()
                assert slot.conn is not None
                slot.conn.send(slot.case)
        for slot in slots:
            if slot.case is None:
                continue
            assert slot.conn is not None
            elapsed = time.perf_counter() - slot.started
            outcome: Outcome | None = None
            try:
                if slot.conn.poll(0.01):
                    status, detail, seconds = slot.conn.recv()
                    outcome = Outcome(slot.case, status, detail, seconds)
            except (EOFError, OSError):
                code = slot.proc.exitcode if slot.proc is not None else None
                outcome = Outcome(slot.case, "FAIL", f"crash: worker exited with {code}", elapsed)
                slot.kill()
            if outcome is None and elapsed > timeout:
                outcome = Outcome(slot.case, "FAIL", f"hang: no result after {timeout:.0f} s", elapsed)
                slot.kill()
            if outcome is not None:
                results[outcome.case] = outcome
                slot.case = None
                if progress:
                    done = len(results)
                    print(f"[{done}/{len(names)}] {outcome.case}: {outcome.status}"
                          + (f" ({outcome.detail})" if outcome.status == "FAIL" else ""),
                          file=sys.stderr, flush=True)
    for slot in slots:
        if slot.conn is not None:
            try:
                slot.conn.send(None)
            except OSError:
                pass
        if slot.proc is not None:
            slot.proc.join(timeout=5)
            if slot.proc.is_alive():
                slot.proc.kill()
    return [results[n] for n in names]


# -- the report -------------------------------------------------------------------------------
def case_ops() -> dict[str, str]:
    """The op each node case tests, by case name ("test_abs" -> "Abs").

    A single-node case tests its node's op; a multi-node case (an ``_expanded`` function body or
    a small graph) is credited to the op of its unexpanded twin or, failing that, to the op whose
    name the case name starts with.
    """
    import onnx
    from onnx.backend.test.loader import load_model_tests

    ops: dict[str, str] = {}
    models: dict[str, list[str]] = {}
    for case in load_model_tests(kind="node"):
        model = case.model  # onnx >= 1.17 builds node cases in memory
        if model is None:
            model = onnx.load(os.path.join(case.model_dir, "model.onnx"), load_external_data=False)
        models[case.name] = [n.op_type for n in model.graph.node]
    for name, op_types in models.items():
        twin = re.sub(r"_expanded(_ver\d+)?$", "", name)
        candidates = models.get(twin, op_types) if twin != name else op_types
        if len(set(candidates)) == 1:
            ops[name] = candidates[0]
            continue
        flat = name[len("test_"):].replace("_", "").lower()
        matching = [op for op in set(candidates) if flat.startswith(op.lower())]
        ops[name] = max(matching, key=len) if matching else (candidates[0] if candidates else "?")
    return ops


def render_markdown(outcomes: list[Outcome], ops: dict[str, str]) -> str:
    import onnx

    counts = collections.Counter(o.status for o in outcomes)
    table: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for o in outcomes:
        table[ops.get(o.case[:-len("_cpu")], "?")][o.status] += 1
    lines = [
        "# ONNX conformance: the node test suite",
        "",
        "Generated by `python -m scripts.conformance --write-docs docs/conformance.md`; do not edit by",
        "hand. Every node case of the installed onnx runs through `compiler.backend` (compile into a",
        "temporary artifact, run it with `runtime.Session`, compare with the case's outputs at the",
        "case's tolerances), each in a worker process with a time limit.",
        "",
        "Graph inputs whose *values* the compiler needs (shapes, axes, pads, sizes, `k`) are",
        "compile-time inputs: the backend compiles at the first run with them bound to the case's",
        "values, as `onnx-aot compile --bind` does. An input read only as a Loop's trip count or first",
        "condition is a *value symbol* instead (`--value`, trip counts 0..1024; docs/dynamic-shapes.md):",
        "test_loop11 compiles once for every trip count in range; the `test_range_*_expanded` cases,",
        "whose trip count is computed from their inputs, bind them. An If's condition is not one:",
        "test_if compiles once and runs a conditional step that picks the branch at run time.",
        "Sequences and optionals are static (docs/ops.md): a sequence input's elements are fed as",
        "tensor inputs (one artifact per length and shapes); a Loop carrying a sequence binds its trip",
        "count, an If yielding an optional its condition.",
        "",
        f"onnx {onnx.__version__}, {len(outcomes)} node cases:",
        "",
        "| result | cases |",
        "|---|---:|",
        f"| passed | {counts['pass']} |",
        f"| not supported (UnsupportedOpError) | {counts['not supported']} |",
        f"| expected failures (listed below) | {counts['expected']} |",
        f"| skipped by the harness | {counts['skip']} |",
        f"| unexpected failures | {counts['FAIL']} |",
        "",
        f"For comparison, onnxruntime 1.31 passes {ORT_PASSED} of them through the same harness",
        "(`onnxruntime.backend`) on the same machine.",
        "",
        "## Per op",
        "",
        "A case is credited to the op it tests (`_expanded` cases to the op whose function body they",
        "run).",
        "",
        "| op | cases | passed | not supported | expected failure | unexpected |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for op in sorted(table, key=str.lower):
        c = table[op]
        total = sum(c.values())
        lines.append(f"| {op} | {total} | {c['pass']} | {c['not supported']} | {c['expected']} | "
                     f"{c['FAIL']} |")
    expected = [o for o in outcomes if o.status == "expected"]
    if expected:
        lines += ["", "## Expected failures", "", "| case | reason |", "|---|---|"]
        lines += [f"| {o.case[:-len('_cpu')]} | {o.detail} |" for o in expected]
    failed = [o for o in outcomes if o.status == "FAIL"]
    if failed:
        lines += ["", "## Unexpected failures", "", "| case | what happened |", "|---|---|"]
        lines += [f"| {o.case[:-len('_cpu')]} | {o.detail.replace('|', '/')} |" for o in failed]
    reasons = collections.Counter(_reason(o.detail) for o in outcomes if o.status == "not supported")
    lines += ["", "## Why cases are not supported", "", "| reason | cases |", "|---|---:|"]
    lines += [f"| {r} | {n} |" for r, n in sorted(reasons.items(), key=lambda x: (-x[1], x[0]))]
    return "\n".join(lines) + "\n"


def _reason(detail: str) -> str:
    """A not-supported message without case-specific names, for grouping."""
    m = re.search(r"use ops onnx-aot does not support: \| .*\((\S+)\)", detail)
    if m:
        return f"op {m.group(1)}"
    m = re.search(r"unsupported element type (\S+)", detail)
    if m:
        return f"element type {m.group(1)}"
    if "is not a tensor" in detail or "supports tensor values only" in detail:
        return "sequence / optional / map values"
    text = re.sub(r"'[^']*'", "'…'", detail)
    return text[:120]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--filter", default=None, help="only cases whose name matches this regex")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per case before a hang")
    parser.add_argument("--write-docs", metavar="FILE", help="write the Markdown report here")
    parser.add_argument("--quiet", action="store_true", help="no per-case progress on stderr")
    args = parser.parse_args(argv)

    names = case_names()
    if args.filter:
        pattern = re.compile(args.filter)
        names = [n for n in names if pattern.search(n)]
    if not names:
        print("no node case matches", file=sys.stderr)
        return 2
    start = time.perf_counter()
    outcomes = run_cases(names, args.jobs, args.timeout, progress=not args.quiet)
    elapsed = time.perf_counter() - start
    counts = collections.Counter(o.status for o in outcomes)
    for o in outcomes:
        if o.status == "FAIL":
            print(f"FAIL {o.case}: {o.detail}")
    print(f"{len(outcomes)} node cases in {elapsed:.0f} s: {counts['pass']} passed, "
          f"{counts['not supported']} not supported, {counts['expected']} expected failures, "
          f"{counts['skip']} skipped, {counts['FAIL']} unexpected failures "
          f"(onnxruntime 1.31: {ORT_PASSED} passed)")
    if args.write_docs:
        if args.filter:
            print("--write-docs needs the whole suite (no --filter)", file=sys.stderr)
            return 2
        Path(args.write_docs).write_text(render_markdown(outcomes, case_ops()))
        print(f"wrote {args.write_docs}")
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
