"""The ``onnx-aot`` command line: compile | run | bench | inspect | verify.

``python -m compiler`` is the same program. Errors of the project's own types print one clear
line (exit 1); usage errors exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from compiler.frontend.dims import placeholders
from compiler.frontend.dims import shape_arg
from compiler.version import __version__
from runtime.errors import InputError
from runtime.errors import OnnxAotError

__all__ = ["CommandError", "main", "parse_bind", "parse_shape"]


class CommandError(OnnxAotError):
    """A command-line argument names a file or folder that cannot be used (checked before any work)."""


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``NAME=1x3x224x224`` -> ("NAME", (1, 3, 224, 224)); the name may contain '='-free text.

    Every dim must be a whole number >= 0 (the compiler checks it against the model): a name such
    as ``N`` or a -1 pasted from a model's declared shape is refused with the text to use instead.
    """
    name, sep, dims = text.rpartition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=D0xD1x..., got {text!r}")
    parts = [d.strip() for d in re.split("[xX]", dims)] if dims.strip() else []
    sizes = [int(d) if re.fullmatch("[0-9]+", d) else None for d in parts]
    if None in sizes:
        k = sizes.index(None)
        what = "a negative size" if re.fullmatch("-[0-9]+", parts[k]) else "not a number"
        raise argparse.ArgumentTypeError(
            f"--shape {text}: dim {k} is {parts[k]!r}, {what}; every dim must be a number >= 0 (the "
            f"size to compile for), e.g. {shape_arg(name, placeholders(sizes))}")
    return name, tuple(int(d) for d in parts)


def parse_bind(text: str) -> tuple[str, np.ndarray]:
    """``NAME=1,2,3`` -> ("NAME", array([1, 2, 3])); ``NAME=@values.npy`` loads the array.

    Numbers are read as integers when they all are, else as floats; the compiler converts them to
    the input's declared type and shape.
    """
    name, sep, values = text.rpartition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=V0,V1,... or NAME=@FILE.npy, got {text!r}")
    if values.startswith("@"):
        try:
            return name, np.load(values[1:], allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise argparse.ArgumentTypeError(f"--bind {name}: cannot read {values[1:]!r}: {exc}") from None
    items = [v.strip() for v in values.split(",") if v.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"--bind {name}: no values given")
    try:
        return name, np.array([int(v) for v in items], dtype=np.int64)
    except ValueError:
        pass
    try:
        return name, np.array([float(v) for v in items], dtype=np.float64)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--bind {name}: values must be numbers, got {values!r}") from None


def _parse_input(text: str) -> tuple[str, str]:
    name, sep, path = text.rpartition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=file.npy, got {text!r}")
    return name, path


def _parse(text: str, convert: Callable[[str], Any], what: str) -> Any:
    try:
        return convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None


def _count(text: str, least: int = 0) -> int:
    value = int(_parse(text, int, "a whole number"))
    if value < least:
        raise argparse.ArgumentTypeError(f"expected a number >= {least}, got {value}")
    return value


def _positive(text: str) -> int:
    return _count(text, 1)


def _budget(text: str) -> float:
    value = float(_parse(text, float, "milliseconds"))
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"the planning budget must be a finite number >= 0, got {text}")
    return value


REBUILD_HELP = ("compile the shipped C source for this CPU (-march=native; needs cc) into "
                "~/.cache/onnx-aot/runtime ($ONNX_AOT_RUNTIME_CACHE_DIR) and run that library")


ARTIFACT_HELP = "the artifact folder that 'onnx-aot compile MODEL.onnx -o DIR' wrote"
THREADS_HELP = "OpenMP threads for the C kernels (default: all cores)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="onnx-aot",
        description="Ahead-of-time compiler for ONNX models: compile a model into an artifact "
                    "folder, then run it with the small runtime.",
    )
    parser.add_argument("--version", action="version", version=f"onnx-aot {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_compile, _add_run, _add_bench, _add_inspect, _add_verify):
        add(sub)
    return parser


def _add_compile(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compile", help="compile MODEL.onnx into an artifact folder")
    p.add_argument("model", help="path to the .onnx file")
    p.add_argument("-o", "--output", required=True, help="artifact folder to write")
    p.add_argument("-O", dest="opt_level", type=int, choices=[0, 1, 2, 3], default=3,
                   help="optimization level (default 3: level 2 plus the NHWC layout on the CPU target)")
    p.add_argument("--target", default="cpu", choices=["cpu", "cuda"],
                   help="cpu: C kernels (default); cuda: generated CUDA kernels built with nvcc when "
                        "present (run with cupy), reference kernels on the device for the rest")
    p.add_argument("--shape", action="append", type=parse_shape, default=[], metavar="NAME=DIMS",
                   help="bind an input's shape, e.g. --shape input=1x3x224x224 (repeatable)")
    p.add_argument("--bind", action="append", type=parse_bind, default=[], metavar="NAME=VALUES",
                   help="make an input a constant with these values, for inputs that carry shapes, "
                        "axes, pads or sizes, e.g. --bind shape=1,-1 or --bind pads=@pads.npy "
                        "(repeatable)")
    p.add_argument("--plan-budget-ms", type=_budget, default=None, metavar="MS",
                   help="time the memory planner may search for a smaller arena than its default "
                        "heuristic gives (milliseconds)")
    p.add_argument("--max-arena-bytes", type=_count, default=None, metavar="N",
                   help="fail the compile when the memory plan needs more than N arena bytes "
                        "(the error gives the need per memory space)")
    p.add_argument("--no-winograd", dest="winograd", action="store_false",
                   help="run 3x3 stride-1 convolutions directly, not as Winograd F(4x4/2x2, 3x3) "
                        "(which at -O2 and up is faster; a NaN or Inf input can turn the other "
                        "outputs of its tile NaN)")
    p.add_argument("--golden-cases", type=_count, default=2, metavar="N",
                   help="seeded self-test cases stored for 'onnx-aot verify' (default 2, 0: none)")
    p.add_argument("--cpu", default=None, choices=["native", "x86-64-v2", "x86-64-v3", "x86-64-v4"],
                   help="the C kernels' target (default: this machine's x86-64 level; 'native' "
                        "elsewhere); x86-64 artifacts also carry a portable x86-64-v2 build, which "
                        "the runtime falls back to on a CPU that lacks the target's features")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")


def _add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run an artifact once and print its outputs")
    p.add_argument("artifact", help=ARTIFACT_HELP)
    p.add_argument("--input", action="append", type=_parse_input, default=[], metavar="NAME=FILE.npy",
                   help="feed an input from a .npy file (random data for inputs not given)")
    p.add_argument("--output-dir", metavar="DIR", help="save each output as NAME.npy in this folder "
                                                       "(checked before the model runs)")
    p.add_argument("--threads", type=_positive, default=None, metavar="N", help=THREADS_HELP)
    p.add_argument("--seed", type=int, default=0, help="seed for random inputs (default 0)")
    p.add_argument("--profile", metavar="OUT.json", default=None,
                   help="record every step's wall time, write Chrome-trace JSON (chrome://tracing, "
                        "Perfetto) to OUT.json and print the ten slowest steps")
    p.add_argument("--runs", type=_positive, default=1, metavar="N",
                   help="run N times (default 1) and report the first run and the median of the "
                        "others; with --profile every run is recorded")
    p.add_argument("--rebuild", action="store_true", help=REBUILD_HELP)


def _add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="median latency of an artifact, optionally against onnxruntime "
                                     "(alternating runs), cold start, peak RSS, runtime overhead")
    p.add_argument("artifact", help=ARTIFACT_HELP)
    p.add_argument("--runs", type=_positive, default=20, metavar="N",
                   help="timed runs per engine (default 20)")
    p.add_argument("--warmup", type=_count, default=3, metavar="N",
                   help="untimed runs per engine before them (default 3)")
    p.add_argument("--threads", type=_positive, default=None, metavar="N", help=THREADS_HELP)
    p.add_argument("--compare", metavar="MODEL.onnx", default=None,
                   help="also run onnxruntime on MODEL.onnx in this process, runs alternating, same "
                        "feeds and threads: latency ratio onnx-aot / onnxruntime and max errors "
                        "(inputs compiled with --bind get their bound values)")
    p.add_argument("--cold-reps", type=_count, default=5, metavar="N",
                   help="session creation, creation + first run and peak RSS, each measured in N fresh "
                        "processes per engine (engines alternating; medians; 0: skip; default 5)")
    p.add_argument("--overhead", action="store_true",
                   help="the runtime's own time per run: Session.run minus the kernels' step times")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--rebuild", action="store_true", help=REBUILD_HELP + " (the in-process runs)")


def _add_inspect(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="the memory plan: arenas, peak step, largest buffers, live bytes")
    p.add_argument("artifact", help=ARTIFACT_HELP)
    p.add_argument("--top", type=_count, default=10, metavar="N",
                   help="how many of the largest buffers to list (default 10)")
    p.add_argument("--steps", type=_count, default=None, metavar="N",
                   help="list only the N steps with the most live bytes (default: every step)")
    p.add_argument("--json", action="store_true",
                   help="print the same data as JSON (report/memory.json with fields added)")
    p.add_argument("--html", metavar="FILE",
                   help="also write the memory page (as report/memory.html) to FILE")


def _add_verify(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify", help="rerun the artifact's golden self-test cases on this machine "
                                      "(exit 1 on a mismatch)")
    p.add_argument("artifact", help=ARTIFACT_HELP)
    p.add_argument("--threads", type=_positive, default=None, metavar="N", help=THREADS_HELP)
    p.add_argument("--verify-weights", action="store_true", help="hash weights.bin fully first")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:  # bare ``onnx-aot``: the help, as a usage error
        parser.print_help(sys.stderr)
        return 2
    args = parser.parse_args(argv)
    try:
        return _dispatch(args)
    except OnnxAotError as exc:
        print(f"onnx-aot: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a file the command reads or writes (disk full, permissions, ...)
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"onnx-aot: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("onnx-aot: interrupted", file=sys.stderr)
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "compile":
        return _compile(args)
    check_artifact_arg(args.artifact)
    if args.command == "run":
        return _run(args)
    if args.command == "bench":
        return _bench(args)
    if args.command == "verify":
        from runtime.verify import main as verify_main

        return verify_main([args.artifact, *(["--threads", str(args.threads)] if args.threads else []),
                            *(["--verify-weights"] if args.verify_weights else [])])
    return _inspect(args)


def check_artifact_arg(text: str) -> None:
    """An ARTIFACT argument that is a model or a file, or names nothing: a one-line error that
    says how to make an artifact."""
    path = Path(text)
    if path.is_dir():
        return
    if path.is_file():
        if path.suffix.lower() == ".onnx":
            raise CommandError(f"{text} is an ONNX model, not an artifact folder; compile it first "
                               f"with: onnx-aot compile {text} -o DIR")
        raise CommandError(f"{text} is a file, not an artifact folder (the folder that "
                           "'onnx-aot compile MODEL.onnx -o DIR' writes)")
    raise CommandError(f"{text}: no such artifact folder (make one with: onnx-aot compile "
                       f"MODEL.onnx -o {text})")


def check_output_file(text: str, option: str) -> None:
    """Refuse an output file (``--profile``, ``--html``) that cannot be written, before any work."""
    if Path(text).is_dir():
        raise CommandError(f"{option} {text}: is a folder, not a file")
    check_output_folder(str(Path(text).absolute().parent), option, replaced=False, label=text)


def check_output_folder(text: str, option: str, *, replaced: bool, label: str | None = None) -> None:
    """Refuse an output folder that cannot be written, before any work is done.

    ``replaced``: the folder is written next to itself and renamed into place (``compile -o``), so
    its parent must be writable; otherwise files are written into the folder itself. ``label``
    is the argument to name when it is not ``text`` (a file in that folder).
    """
    path = base = Path(text).absolute()
    label = label or text
    try:
        if path.exists() and not path.is_dir():
            raise CommandError(f"{option} {label}: " + ("exists and is not a folder" if label == text
                                                        else f"{path} is a file, not a folder"))
        if replaced and path.is_dir() and any(path.iterdir()) and not (path / "manifest.json").is_file():
            raise CommandError(f"{option} {label}: folder exists, is not empty and holds no artifact; "
                               "not overwriting it")
        base = path.parent if replaced else path
        while not base.exists():
            base = base.parent
        if not base.is_dir():
            raise CommandError(f"{option} {label}: {base} is a file, not a folder")
        os.rmdir(tempfile.mkdtemp(prefix=".onnx-aot-probe-", dir=base))
    except OSError as exc:
        raise CommandError(f"{option} {label}: cannot write into {base} ({exc.strerror or exc})") from None


def _compile(args: argparse.Namespace) -> int:
    from compiler.driver import compile_model
    from compiler.driver import stderr_progress

    shapes = dict(args.shape)
    check_output_folder(args.output, "-o", replaced=True)
    if args.target == "cuda" and not args.quiet:
        from compiler.codegen.nvcc import find_nvcc
        from compiler.codegen.options import BuildOptions

        if find_nvcc(BuildOptions()) is None:
            print("onnx-aot: nvcc not found (PATH, /usr/local/cuda/bin): the CUDA kernels ship as "
                  "source only; the runtime compiles them with NVRTC on the first load", file=sys.stderr)
    start = time.perf_counter()
    out = compile_model(args.model, args.output, opt_level=args.opt_level, target=args.target,
                        shapes=shapes, binds=dict(args.bind),
                        progress=None if args.quiet else stderr_progress,
                        plan_budget_ms=args.plan_budget_ms, max_arena_bytes=args.max_arena_bytes,
                        golden_cases=args.golden_cases, cpu=args.cpu, winograd=args.winograd)
    if not args.quiet:
        print(f"compiled {args.model} -> {out} in {time.perf_counter() - start:.2f} s")
    return 0


def _read_input(name: str, path: str) -> np.ndarray:
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


def _run(args: argparse.Namespace) -> int:
    from compiler.bench import random_feeds
    from runtime import Session

    if args.output_dir:
        check_output_folder(args.output_dir, "--output-dir", replaced=False)
    if args.profile is not None:
        check_output_file(args.profile, "--profile")
    given = {name: _read_input(name, path) for name, path in args.input}
    session = Session(args.artifact, threads=args.threads, profile=args.profile is not None,
                      rebuild=args.rebuild)
    if args.rebuild:
        _say_rebuilt(session.cpu_build)
    feeds = random_feeds(session, args.seed)
    names = {s.name for s in session.inputs}
    for name, array in given.items():
        if name not in names:
            raise InputError(f"--input names {name!r}, which is not an input ({', '.join(sorted(names))})")
        feeds[name] = array
    times = []
    for _ in range(args.runs):
        start = time.perf_counter()
        outputs = session.run(None, feeds)
        times.append(time.perf_counter() - start)
    for spec, array in zip(session.outputs, outputs, strict=True):
        flat = array.reshape(-1)
        head = np.array2string(flat[:5], precision=5, separator=", ")
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


def _bench(args: argparse.Namespace) -> int:
    from compiler.bench import BenchError
    from compiler.bench import bench
    from compiler.bench import format_report

    if args.compare is not None and not Path(args.compare).is_file():
        raise BenchError(f"--compare {args.compare}: no such model file")

    result = bench(args.artifact, compare=args.compare, threads=args.threads, runs=args.runs,
                   warmup=args.warmup, cold_reps=args.cold_reps, overhead=args.overhead,
                   rebuild=args.rebuild)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        sys.stdout.write(format_report(result))
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from runtime.inspection import format_text
    from runtime.inspection import inspect_artifact

    if args.html:
        check_output_file(args.html, "--html")
    ins = inspect_artifact(args.artifact, top=args.top)
    if args.html:
        from compiler.artifact.report import render_memory_html  # jinja2: only for the page

        page = render_memory_html(ins.plan, ins.report)
        try:
            Path(args.html).write_text(page, encoding="utf-8")
        except OSError as exc:
            print(f"onnx-aot: error: cannot write {args.html}: {exc.strerror or exc}", file=sys.stderr)
            return 1
        print(f"onnx-aot: wrote {args.html}", file=sys.stderr)
    if args.json:
        print(json.dumps(ins.summary, indent=1, ensure_ascii=False))
    else:
        sys.stdout.write(format_text(ins, steps=args.steps))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
