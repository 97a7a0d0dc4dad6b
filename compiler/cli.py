"""The ``onnx-aot`` command line: compile | run | bench | inspect | verify | strip.

``python -m compiler`` is the same program. run, inspect, verify and strip are the runtime's own
commands (``runtime/cli.py``, also ``python -m runtime``), which a deploy-only install has too;
this module adds compile, bench and ``inspect --html``. Errors of the project's own types print
one clear line (exit 1); usage errors exit 2.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from compiler.frontend.dims import DimSpec
from compiler.frontend.dims import placeholders
from compiler.frontend.dims import shape_arg
from compiler.version import __version__
from runtime.cli import ARTIFACT_HELP
from runtime.cli import REBUILD_HELP
from runtime.cli import THREADS_HELP
from runtime.cli import CommandError
from runtime.cli import add_runtime_commands
from runtime.cli import check_artifact_arg
from runtime.cli import check_output_file
from runtime.cli import check_output_folder
from runtime.cli import count_arg as _count
from runtime.cli import parse_arg
from runtime.cli import parse_input_arg
from runtime.cli import positive_arg as _positive
from runtime.cli import read_input
from runtime.cli import report_error
from runtime.cli import run_runtime_command
from runtime.errors import ModelQuirkWarning
from runtime.errors import OnnxAotError
from runtime.errors import UncheckedArtifactWarning

__all__ = ["CommandError", "main", "parse_bind", "parse_dim", "parse_opt_shape", "parse_shape", "parse_value"]


def parse_shape(text: str) -> tuple[str, tuple[DimSpec, ...]]:
    """``NAME=1x3x224x224`` -> ("NAME", (1, 3, 224, 224)); ``NAME=1x3x48x32..2048`` gives the last dim
    a range, ``(32, 2048)``; the name may contain '='-free text.

    Every dim must be a whole number >= 0 or a range ``LO..HI`` (the compiler checks them against
    the model): a name such as ``N`` or a -1 pasted from a model's declared shape is refused with
    the text to use instead.
    """
    name, sep, dims = text.rpartition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=D0xD1x..., got {text!r}")
    parts = [d.strip() for d in re.split("[xX]", dims)] if dims.strip() else []
    sizes = [_dim_spec(d) for d in parts]
    if None in sizes:
        k = sizes.index(None)
        what = "a negative size" if re.fullmatch("-[0-9]+", parts[k]) else "not a number"
        raise argparse.ArgumentTypeError(
            f"--shape {text}: dim {k} is {parts[k]!r}, {what}; every dim must be a number >= 0 (the "
            f"size to compile for), e.g. "
            f"{shape_arg(name, placeholders([s if isinstance(s, int) else None for s in sizes]))} "
            f"(or a range LO..HI of sizes: --shape x=1x3x48x32..2048)")
    return name, tuple(s for s in sizes if s is not None)


def parse_opt_shape(text: str) -> dict[str, tuple[int, ...]]:
    """``x=1x3x48x320`` or ``ids=1x128,mask=1x128`` (``--opt-shape``): one binding to specialize for,
    given by some inputs' static shapes."""
    out: dict[str, tuple[int, ...]] = {}
    for part in text.split(","):
        name, dims = parse_shape(part.strip())
        if any(not isinstance(d, int) for d in dims):
            raise argparse.ArgumentTypeError(f"--opt-shape {text}: {name} has a range; an --opt-shape is "
                                             f"one size per dim")
        out[name] = tuple(int(d) for d in dims)  # type: ignore[arg-type]
    return out


def parse_dim(text: str) -> tuple[str, DimSpec]:
    """``PARAM=LO..HI`` (``--dim seq=1..512``) -> ("seq", (1, 512)); ``PARAM=N`` fixes the dim."""
    return _named_spec(text, "PARAM=LO..HI (a dim_param of the model and the range of its sizes, e.g. "
                             "--dim seq=1..512)")


def parse_value(text: str) -> tuple[str, DimSpec]:
    """``NAME=LO..HI`` (``--value M=0..64``) -> ("M", (0, 64)): a value symbol's input and range."""
    return _named_spec(text, "NAME=LO..HI (a one-element integer or bool input and the range of its "
                             "values, e.g. --value M=0..64)")


def _named_spec(text: str, usage: str) -> tuple[str, DimSpec]:
    name, sep, dim = text.rpartition("=")
    spec = _dim_spec(dim.strip())
    if not sep or not name or spec is None:
        raise argparse.ArgumentTypeError(f"expected {usage}, got {text!r}")
    return name, spec


def _dim_spec(text: str) -> DimSpec | None:
    """``N`` -> N, ``LO..HI`` -> (LO, HI); None for anything else."""
    match = re.fullmatch(r"([0-9]+)(?:\.\.([0-9]+))?", text)
    if match is None:
        return None
    lo, hi = match.groups()
    return int(lo) if hi is None else (int(lo), int(hi))


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


def _budget(text: str) -> float:
    value = float(parse_arg(text, float, "milliseconds"))
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"the planning budget must be a finite number >= 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="onnx-aot",
        description="Ahead-of-time compiler for ONNX models: compile a model into an artifact "
                    "folder, then run it with the small runtime.",
    )
    parser.add_argument("--version", action="version", version=f"onnx-aot {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_compile(sub)
    added = add_runtime_commands(sub)
    added["inspect"].add_argument("--html", metavar="FILE",
                                  help="also write the memory page (as report/memory.html) to FILE")
    _add_bench(sub)
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
                   help="bind an input's shape, e.g. --shape input=1x3x224x224; a dim may be a range "
                        "LO..HI, e.g. --shape x=1x3x48x32..2048 (repeatable)")
    p.add_argument("--dim", action="append", type=parse_dim, default=[], metavar="PARAM=LO..HI",
                   help="bind a named dim (a dim_param) of every input that has it to a range, e.g. "
                        "--dim seq=1..512 (repeatable; see docs/dynamic-shapes.md)")
    p.add_argument("--value", action="append", type=parse_value, default=[], metavar="NAME=LO..HI",
                   help="make a one-element integer or bool input a value symbol: its value (a Loop's "
                        "trip count or first condition) varies in LO..HI and sizes results, e.g. "
                        "--value M=0..64 (repeatable; see docs/dynamic-shapes.md)")
    p.add_argument("--opt-shape", action="append", type=parse_opt_shape, default=[], metavar="NAME=DIMS",
                   help="with ranges: a shape to specialize for as well (a static variant in the artifact "
                        "that runs at exactly that shape), e.g. --opt-shape x=1x3x48x320; inputs that "
                        "share a binding go in one, comma-separated (repeatable)")
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
    p.add_argument("--wide-weights", dest="narrow_weights", action="store_false",
                   help="store weights the model ships narrow (int8 / fp16 behind a Cast or a "
                        "DequantizeLinear) widened, as the kernels read them: a bigger weights.bin, "
                        "no widening at load, and an artifact a C program can run (kernels/cpu/model.h)")
    _add_precision(p)
    p.add_argument("--golden-cases", type=_count, default=2, metavar="N",
                   help="seeded self-test cases stored for 'onnx-aot verify' and run on the built artifact "
                        "before it is written (default 2; 0: none, the artifact written unchecked)")
    p.add_argument("--cpu", default=None, choices=["native", "x86-64-v2", "x86-64-v3", "x86-64-v4"],
                   help="the C kernels' target (default: this machine's x86-64 level; 'native' "
                        "elsewhere); x86-64 artifacts also carry a portable x86-64-v2 build, which "
                        "the runtime falls back to on a CPU that lacks the target's features")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")


def _add_precision(p: argparse.ArgumentParser) -> None:
    """``compile``'s reduced-precision options: --precision, --quantize and its calibration."""
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "auto"],
                   help="the GEMM and convolution weights' precision: fp32 (default), bf16 (rounded to "
                        "bfloat16, half their bytes; bf16 products in fp32 sums on AMX-BF16, fp32 "
                        "elsewhere), auto (bf16 where the --cpu target has AVX512_BF16, else fp32, and "
                        "says so)")
    p.add_argument("--quantize", default=None, choices=["int8"],
                   help="post-training static quantization: int8 activations per tensor and weights per "
                        "output channel (S8S8, onnxruntime's QDQ form), scales from --calibration; the "
                        "error against fp32 on those feeds is printed at the end (not with --precision bf16)")
    p.add_argument("--calibration", default=None, metavar="DATA.npz",
                   help="with --quantize: an .npz of one array per input name, samples along a leading "
                        "axis: for an input (1, 3, 224, 224) an array (N, 1, 3, 224, 224), or (N, 3, 224, "
                        "224) where the input's first dim is 1")
    p.add_argument("--max-error", type=float, default=None, metavar="E",
                   help="with --precision bf16 or --quantize int8: put steps back in fp32, most sensitive "
                        "first, until the error against the fp32 model (max |difference| / max |fp32 "
                        "output|, per output, on the golden feeds for bf16, the calibration feeds for "
                        "int8) is under E; recorded in the manifest, re-checked by verify")
    p.add_argument("--calibration-method", default="minmax", choices=["minmax", "entropy", "percentile"],
                   help="how --quantize picks each activation's range from the feeds: minmax (default: "
                        "smallest to largest value seen), entropy (least KL divergence, TensorRT's: 2048-bin "
                        "histogram of |x|, 128 levels), percentile (the 99.999th percentile of |x|)")


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
    p.add_argument("--input", action="append", type=parse_input_arg, default=[], metavar="NAME=FILE.npy",
                   help="feed an input from a .npy file, to both engines (random data for inputs not "
                        "given): token ids, real images, a shape within the artifact's ranges")
    p.add_argument("--cold-reps", type=_count, default=5, metavar="N",
                   help="session creation, creation + first run and peak RSS, each measured in N fresh "
                        "processes per engine (engines alternating; medians; 0: skip; default 5)")
    p.add_argument("--overhead", action="store_true",
                   help="the runtime's own time per run: Session.run minus the kernels' step times")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--rebuild", action="store_true", help=REBUILD_HELP + " (the in-process runs)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:  # bare ``onnx-aot``: the help, as a usage error
        parser.print_help(sys.stderr)
        return 2
    args = parser.parse_args(argv)
    try:
        return _dispatch(args)
    except (OnnxAotError, OSError) as exc:  # OSError: a file the command reads or writes
        return report_error(exc)
    except KeyboardInterrupt:
        print("onnx-aot: interrupted", file=sys.stderr)
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "compile":
        return _compile(args)
    if args.command == "bench":
        check_artifact_arg(args.artifact)
        return _bench(args)
    if args.command == "inspect" and args.html:
        check_artifact_arg(args.artifact)
        _write_html(args)
    return run_runtime_command(args)


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
    with warnings.catch_warnings():  # restores showwarning too
        warnings.simplefilter("always", UncheckedArtifactWarning)
        warnings.simplefilter("always", ModelQuirkWarning)
        warnings.showwarning = _one_line_warning
        out = compile_model(args.model, args.output, opt_level=args.opt_level, target=args.target,
                            shapes=shapes, dims=dict(args.dim) or None, binds=dict(args.bind),
                            progress=None if args.quiet else stderr_progress,
                            plan_budget_ms=args.plan_budget_ms, max_arena_bytes=args.max_arena_bytes,
                            golden_cases=args.golden_cases, cpu=args.cpu, winograd=args.winograd,
                            opt_shapes=args.opt_shape or None, values=dict(args.value) or None,
                            narrow_weights=args.narrow_weights, precision=args.precision,
                            quantize=args.quantize, calibration=args.calibration,
                            calibration_method=args.calibration_method, max_error=args.max_error)
    if not args.quiet:
        print(f"compiled {args.model} -> {out} in {time.perf_counter() - start:.2f} s")
    return 0


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                      file: Any = None, line: str | None = None) -> None:
    """A warning of the compile as one ``onnx-aot: warning:`` line (no source location)."""
    print(f"onnx-aot: warning: {message}", file=sys.stderr, flush=True)


def _bench(args: argparse.Namespace) -> int:
    from compiler.bench import BenchError
    from compiler.bench import bench
    from compiler.bench import format_report

    if args.compare is not None and not Path(args.compare).is_file():
        raise BenchError(f"--compare {args.compare}: no such model file")

    inputs = {name: read_input(name, path) for name, path in args.input}
    result = bench(args.artifact, compare=args.compare, threads=args.threads, runs=args.runs,
                   warmup=args.warmup, cold_reps=args.cold_reps, overhead=args.overhead,
                   rebuild=args.rebuild, inputs=inputs)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        sys.stdout.write(format_report(result))
    return 0


def _write_html(args: argparse.Namespace) -> None:
    """``inspect --html FILE``: the memory page (jinja2: the compiler's side), before the text."""
    from compiler.artifact.report import render_memory_html
    from runtime.inspection import inspect_artifact

    check_output_file(args.html, "--html")
    ins = inspect_artifact(args.artifact, top=args.top)
    try:
        Path(args.html).write_text(render_memory_html(ins.plan, ins.report), encoding="utf-8")
    except OSError as exc:
        raise CommandError(f"cannot write {args.html}: {exc.strerror or exc}") from None
    print(f"onnx-aot: wrote {args.html}", file=sys.stderr)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
