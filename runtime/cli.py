"""``python -m runtime run | verify | inspect | strip | serve | export-triton DIR``: the commands a
deploy machine needs (the last two: ``runtime/serving/cli.py``).

A deploy-only install (README, "Deploy-only install": numpy and this package, no compiler) runs
these; ``onnx-aot run | verify | inspect | strip`` are the same commands (``compiler/cli.py`` adds
these parsers and calls these functions), so both print the same lines and the same errors. A
mistake a user can make is one ``onnx-aot: error:`` line (exit 1), found before any work is done
where it can be: an artifact argument that is a model or names nothing, an output folder or file
that cannot be written, an input file that is not a plain ``.npy``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from runtime.artifact import artifact_problem
from runtime.errors import InputError
from runtime.errors import OnnxAotError
from runtime.serving.cli import SERVING_COMMANDS
from runtime.serving.cli import add_serving_commands
from runtime.serving.cli import run_serving_command

__all__ = ["CommandError", "main", "add_runtime_commands", "run_runtime_command", "check_artifact_arg",
           "check_output_folder", "check_output_file", "folder_problem", "random_feeds", "feeds_with",
           "parse_input_arg", "read_input", "count_arg",
           "positive_arg", "parse_arg", "report_error", "THREADS_HELP", "ARTIFACT_HELP", "REBUILD_HELP"]

REBUILD_HELP = ("compile the shipped C source for this CPU (-march=native; needs cc) into "
                "~/.cache/onnx-aot/runtime ($ONNX_AOT_RUNTIME_CACHE_DIR) and run that library")
ARTIFACT_HELP = "the artifact folder that 'onnx-aot compile MODEL.onnx -o DIR' wrote"
THREADS_HELP = ("OpenMP threads for the C kernels (default: all cores or one per run, whichever "
                "measures faster: one on a busy machine)")


class CommandError(OnnxAotError):
    """A command-line argument names a file or folder that cannot be used (checked before any work)."""


def parse_arg(text: str, convert: Callable[[str], Any], what: str) -> Any:
    try:
        return convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None


def count_arg(text: str, least: int = 0) -> int:
    value = int(parse_arg(text, int, "a whole number"))
    if value < least:
        raise argparse.ArgumentTypeError(f"expected a number >= {least}, got {value}")
    return value


def positive_arg(text: str) -> int:
    return count_arg(text, 1)


def parse_input_arg(text: str) -> tuple[str, str]:
    name, sep, path = text.rpartition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=file.npy, got {text!r}")
    return name, path


def check_artifact_arg(text: str) -> None:
    """An ARTIFACT argument that is a model or a file, or names nothing: a one-line error that
    says how to make an artifact."""
    problem = artifact_problem(Path(text))
    if problem is not None:
        raise CommandError(problem)


def folder_problem(path: Path, *, replaced: bool) -> str | None:
    """Why the folder ``path`` cannot be written (None when it can), found without writing it.

    ``replaced``: the folder is written next to itself and renamed into place (an artifact), so
    its parent must be writable and an existing folder must be an artifact; otherwise files are
    written into the folder itself."""
    path = base = path.absolute()
    try:
        if path.exists() and not path.is_dir():
            return "exists and is not a folder"
        if replaced and path.is_dir() and any(path.iterdir()) and not (path / "manifest.json").is_file():
            return "folder exists, is not empty and holds no artifact; not overwriting it"
        base = path.parent if replaced else path
        while not base.exists():
            base = base.parent
        if not base.is_dir():
            return f"{base} is a file, not a folder"
        os.rmdir(tempfile.mkdtemp(prefix=".onnx-aot-probe-", dir=base))
    except OSError as exc:
        return f"cannot write into {base} ({exc.strerror or exc})"
    return None


def check_output_folder(text: str, option: str, *, replaced: bool, label: str | None = None) -> None:
    """Refuse an output folder that cannot be written, before any work is done (``folder_problem``);
    ``label`` is the argument to name when it is not ``text`` (a file in that folder)."""
    problem = folder_problem(Path(text), replaced=replaced)
    if problem is None:
        return
    if label is not None and problem == "exists and is not a folder":
        problem = f"{Path(text).absolute()} is a file, not a folder"
    raise CommandError(f"{option} {label or text}: {problem}")


def check_output_file(text: str, option: str) -> None:
    """Refuse an output file (``--profile``, ``--html``) that cannot be written, before any work."""
    if Path(text).is_dir():
        raise CommandError(f"{option} {text}: is a folder, not a file")
    check_output_folder(str(Path(text).absolute().parent), option, replaced=False, label=text)


def read_input(name: str, path: str) -> np.ndarray:
    try:
        loaded = np.load(path, allow_pickle=False)
    except OSError as exc:
        raise InputError(f"--input {name}: cannot read {path}: {exc.strerror or exc}") from None
    except ValueError:
        raise InputError(f"--input {name}: {path} is not a plain numpy array file (.npy as "
                         "numpy.save writes it, holding no Python objects)") from None
    if not isinstance(loaded, np.ndarray):
        loaded.close()
        raise InputError(f"--input {name}: {path} is a .npz archive; give one .npy file per input")
    return loaded


def random_feeds(session: Any, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs for ``session``: normal floats, random bools, integers in [0, 10); a dynamic
    dim (``None`` in the spec's shape) at the low end of its range, and a value symbol's input
    (``--value``) at the low end of its values."""
    rng = np.random.default_rng(seed)
    feeds = {}
    lows = {s.input: s.min for s in getattr(getattr(session, "plan", None), "symbols", ()) if s.input}
    for spec in session.inputs:
        shape = spec.shape if spec.ranges is None else tuple(lo for lo, _ in spec.ranges)
        if spec.name in lows:
            feeds[spec.name] = np.full(shape, lows[spec.name], spec.dtype)
        elif spec.dtype.kind == "f":
            feeds[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
        elif spec.dtype.kind == "b":
            feeds[spec.name] = rng.integers(0, 2, shape).astype(bool)
        else:
            feeds[spec.name] = rng.integers(0, 10, shape).astype(spec.dtype)
    return feeds


def feeds_with(session: Any, given: dict[str, np.ndarray], seed: int = 0) -> dict[str, np.ndarray]:
    """``random_feeds`` with the arrays of ``--input`` in place of their inputs; an ``--input`` that
    names no input of the artifact is an InputError listing the inputs."""
    feeds = random_feeds(session, seed)
    for name, array in given.items():
        if name not in feeds:
            raise InputError(f"--input names {name!r}, which is not an input ({', '.join(sorted(feeds))})")
        feeds[name] = array
    return feeds


def _add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run an artifact and print its outputs (random inputs unless given)")
    p.add_argument("artifact", help=ARTIFACT_HELP)
    p.add_argument("--input", action="append", type=parse_input_arg, default=[], metavar="NAME=FILE.npy",
                   help="feed an input from a .npy file (random data for inputs not given)")
    p.add_argument("--output-dir", metavar="DIR", help="save each output as NAME.npy in this folder "
                                                       "(checked before the model runs)")
    p.add_argument("--threads", type=positive_arg, default=None, metavar="N", help=THREADS_HELP)
    p.add_argument("--seed", type=int, default=0, help="seed for random inputs (default 0)")
    p.add_argument("--profile", metavar="OUT.json", default=None,
                   help="record every step's wall time, write Chrome-trace JSON (chrome://tracing, "
                        "Perfetto) to OUT.json and print the ten slowest steps")
    p.add_argument("--runs", type=positive_arg, default=1, metavar="N",
                   help="run N times (default 1) and report the first run and the median of the "
                        "others; with --profile every run is recorded")
    p.add_argument("--rebuild", action="store_true", help=REBUILD_HELP)


def _add_inspect(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("inspect", help="the memory plan: arenas, peak step, largest buffers, live bytes")
    p.add_argument("artifact", help=ARTIFACT_HELP)
    p.add_argument("--top", type=count_arg, default=10, metavar="N",
                   help="how many of the largest buffers to list (default 10)")
    p.add_argument("--steps", type=count_arg, default=None, metavar="N",
                   help="list only the N steps with the most live bytes (default: every step)")
    p.add_argument("--json", action="store_true",
                   help="print the same data as JSON (report/memory.json with fields added)")
    return p


def _add_verify(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify", help="rerun the artifact's golden self-test cases on this machine "
                                      "(exit 1 on a mismatch or when it cannot verify)")
    p.add_argument("artifact", help=ARTIFACT_HELP)
    p.add_argument("--threads", type=positive_arg, default=None, metavar="N", help=THREADS_HELP)
    p.add_argument("--verify-weights", action="store_true", help="hash weights.bin fully first")


def _add_strip(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("strip", help="remove the artifact's optional parts (memory report, portable "
                                     "CPU build, golden cases) for deployment; hashes stay valid")
    p.add_argument("artifact", help=ARTIFACT_HELP)


def add_runtime_commands(sub: argparse._SubParsersAction) -> dict[str, argparse.ArgumentParser]:
    """Add run, inspect, verify and strip to ``sub``; returns the inspect parser by name (the
    compiler adds ``--html`` to it)."""
    _add_run(sub)
    inspect = _add_inspect(sub)
    _add_verify(sub)
    _add_strip(sub)
    add_serving_commands(sub)  # serve, export-triton (Ray imported only to serve)
    return {"inspect": inspect}


def run_runtime_command(args: argparse.Namespace) -> int:
    """Run the runtime command ``args.command`` (its artifact argument checked first)."""
    check_artifact_arg(args.artifact)
    if args.command in SERVING_COMMANDS:
        return run_serving_command(args)
    if args.command == "run":
        return _run(args)
    if args.command == "verify":
        return _verify(args)
    if args.command == "strip":
        return _strip(args)
    return _inspect(args)


def _run(args: argparse.Namespace) -> int:
    from runtime.session import Session

    if args.output_dir:
        check_output_folder(args.output_dir, "--output-dir", replaced=False)
    if args.profile is not None:
        check_output_file(args.profile, "--profile")
    given = {name: read_input(name, path) for name, path in args.input}
    session = Session(args.artifact, threads=args.threads, profile=args.profile is not None,
                      rebuild=args.rebuild)
    if args.rebuild:
        _say_rebuilt(session.cpu_build)
    feeds = feeds_with(session, given, args.seed)
    for spec in session.inputs:
        if spec.ranges is not None:
            from runtime.dynamic import describe_spec

            chosen = f"given: {list(given[spec.name].shape)}" if spec.name in given else \
                f"random at {list(feeds[spec.name].shape)}"
            print(f"input {spec.name}: {describe_spec(spec)} ({chosen})")
    times = []
    for _ in range(args.runs):
        start = time.perf_counter()
        outputs = session.run(None, feeds)
        times.append(time.perf_counter() - start)
    for spec, array in zip(session.outputs, outputs, strict=True):
        head = np.array2string(array.reshape(-1)[:5], precision=5, separator=", ")
        print(f"{spec.name}: {array.dtype} {list(array.shape)} first values {head}")
    print(_timing_line(times))
    if args.profile is not None:
        from runtime.profiling import format_slowest
        from runtime.profiling import load_trace

        trace = session.end_profiling(args.profile)
        print(f"profile: {trace} (Chrome-trace JSON); the ten slowest steps:")
        sys.stdout.write(format_slowest(load_trace(trace), 10))
    if args.output_dir:
        out = Path(args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        for spec, array in zip(session.outputs, outputs, strict=True):
            safe = spec.name.replace("/", "_").replace("\\", "_")
            np.save(out / f"{safe}.npy", array)
        print(f"saved {len(outputs)} output(s) to {out}")
    return 0


def _say_rebuilt(build: Any) -> None:
    """What ``--rebuild`` did: the library this CPU now runs, or why nothing was rebuilt."""
    if build is None or build.rebuilt is None:
        print("onnx-aot: --rebuild: the artifact has no C build to rebuild; it runs as compiled",
              file=sys.stderr)
    else:
        print(f"onnx-aot: --rebuild: running the C kernels built for this CPU (-march=native): "
              f"{build.rebuilt}", file=sys.stderr)


def _timing_line(times: list[float]) -> str:
    """The first (cold) run, then the median of the warm ones: the first includes one-time costs."""
    first = f"ran in {times[0] * 1000:.2f} ms"
    if len(times) == 1:
        return first + " (the first run: one-time setup included; --runs N for warm timings)"
    warm = times[1:]
    return (f"{first} the first time; warm runs: median {statistics.median(warm) * 1000:.3f} ms of "
            f"{len(warm)} (min {min(warm) * 1000:.3f} ms, max {max(warm) * 1000:.3f} ms)")


def _verify(args: argparse.Namespace) -> int:
    from runtime.accuracy import accuracy_record
    from runtime.accuracy import verify_note
    from runtime.artifact import MANIFEST
    from runtime.session import Session

    session = Session(args.artifact, threads=args.threads, verify_weights=args.verify_weights)
    report = session.verify(raise_on_mismatch=False)
    print(report.summary())
    manifest = json.loads((session.path / MANIFEST).read_text(encoding="utf-8"))
    note = verify_note(accuracy_record(manifest)) if report.skipped is None else None
    if note is not None:
        print(note)
    return 0 if report.ok and report.skipped is None else 1


def _inspect(args: argparse.Namespace) -> int:
    from runtime.inspection import format_text
    from runtime.inspection import inspect_artifact

    ins = inspect_artifact(args.artifact, top=args.top)
    if args.json:
        print(json.dumps(ins.summary, indent=1, ensure_ascii=False))
    else:
        sys.stdout.write(format_text(ins, steps=args.steps))
    return 0


def _strip(args: argparse.Namespace) -> int:
    from runtime.strip import strip_artifact

    removed, freed = strip_artifact(args.artifact)
    if not removed:
        print(f"{args.artifact}: nothing to strip (no optional parts left)")
    else:
        print(f"{args.artifact}: removed {len(removed)} optional file(s), {freed:,} bytes: "
              + ", ".join(removed))
    return 0


def report_error(exc: BaseException) -> int:
    """Print ``exc`` (one of ours, or an OSError from a file the command reads or writes) as the
    one ``onnx-aot: error:`` line; the exit status."""
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"onnx-aot: error: {where}{exc.strerror or exc}", file=sys.stderr)
    else:
        print(f"onnx-aot: error: {exc}", file=sys.stderr)
    return 1


def main(argv: Sequence[str] | None = None, prog: str = "python -m runtime") -> int:
    parser = argparse.ArgumentParser(prog=prog, description="Run, verify, inspect or strip an "
                                     "artifact folder that onnx-aot compiled (numpy only).")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_runtime_commands(sub)
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:
        parser.print_help(sys.stderr)
        return 2
    args = parser.parse_args(argv)
    try:
        return run_runtime_command(args)
    except (OnnxAotError, OSError) as exc:
        return report_error(exc)
    except KeyboardInterrupt:
        print("onnx-aot: interrupted", file=sys.stderr)
        return 130
