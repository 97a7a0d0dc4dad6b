"""``compile_model``: ONNX model in, artifact folder out.

frontend -> passes -> partition + schedule -> memory plan -> codegen -> artifact, as in
ARCHITECTURE.md. The artifact is written into a temporary sibling folder and renamed into place,
so a failed or interrupted compile never leaves a half-written folder where one is expected.

``compile_model``'s options:
``shapes`` binds input shapes (``--shape``): each dim a size or a range ``(LO, HI)``; ``dims``
binds named dims (``dim_param``) to a size or range wherever they appear (``--dim``). A range
is a symbol: the artifact runs at every shape in range (docs/dynamic-shapes.md). ``binds``
turns graph inputs into constants (``--bind``), for inputs that carry shapes, axes or sizes.
``max_arena_bytes`` fails the compile (``ArenaLimitError``) when an arena needs more;
``golden_cases`` seeded self-test cases are stored for ``Session.verify()`` and run on the built
artifact before it is put in place (``compiler/artifact/check.py``): a reference run that fails
(``GoldenReferenceError``) or an artifact that fails or disagrees (``ArtifactCheckError``) leaves
``out_dir`` as it was; 0: none, unchecked, with an ``UncheckedArtifactWarning``. ``run_check``
False skips the run alone (for providers that build no code, e.g. the fuzzer's).
``cpu`` picks the C kernels' target (``--cpu``; None: ``build.isa``, else this machine's level,
``resolve_cpu``); x86-64 artifacts also ship a portable x86-64-v2 build.
``winograd`` False (``--no-winograd``): 3x3 stride-1 convolutions stay direct (docs/ops.md).
``compiled_control`` False runs If / Loop / Scan steps as on a target that cannot compile them:
their programs on the reference kernels, not their nested schedules (compiler/back_half.py).
``opt_shapes`` (``--opt-shape``, a compile with ranges only): bindings to specialize for as well,
each given by some inputs' shapes (``{"x": (1, 3, 48, 320)}``); each becomes a static artifact
``opt/<k>/`` inside this one, which a run at exactly that binding dispatches to. ``values``
(``--value``, ``{"M": (0, 64)}``): inputs made value symbols (compiler/frontend/value_symbols.py).
``narrow_weights`` False (``--wide-weights``) stores weights the model ships narrow (int8 / fp16
behind a Cast or a DequantizeLinear) widened, as the kernels read them (compiler/ir/narrow.py):
a bigger weights.bin that a C program maps as it is (kernels/cpu/model.h).
``precision`` (``--precision``): "fp32", "bf16" or "auto" (compiler/precision.py).
``quantize`` "int8" (``--quantize``) with ``calibration`` (``--calibration DATA.npz``, or its
arrays by input name) and ``calibration_method`` (minmax, entropy, percentile): post-training
static quantization of the fp32 model before the compile (compiler/quantize/); the error against
fp32 on the calibration feeds is measured and reported at the end.
``max_error`` (``--max-error E``, with bf16 or int8): steps go back to fp32, most sensitive first,
until the artifact's error against the fp32 model (max |difference| / max |fp32 output|, per output
and feed: the golden feeds for bf16, the calibration feeds for int8) is under E; the manifest records
the error per output and the bound, ``verify`` re-checks it, ``inspect`` shows the steps' precisions;
a bound even the all-fp32 artifact misses is an ``AccuracyBoundError`` (compiler/accuracy/).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import platform
import sys
import tempfile
import warnings
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from compiler.accuracy import Hook
from compiler.accuracy import check_max_error
from compiler.accuracy import compile_bf16
from compiler.accuracy.int8 import compile_int8
from compiler.accuracy.int8 import int8_hook
from compiler.artifact.check import check_artifact
from compiler.artifact.check import warn_unchecked
from compiler.artifact.conditioning import widen_for_conditioning
from compiler.artifact.golden import DEFAULT_CASES
from compiler.artifact.golden import make_golden
from compiler.artifact.golden import skipped_reason
from compiler.artifact.writer import ModelSource
from compiler.artifact.writer import check_out_dir
from compiler.artifact.writer import write_artifact
from compiler.back_half import plan_graph
from compiler.codegen.options import BuildOptions
from compiler.dynamic import OPT_DIR
from compiler.frontend.dims import DimSpec
from compiler.frontend.importer import import_model
from compiler.ir.graph import Graph
from compiler.limits import check_arena_limit
from compiler.memory_policy import MemoryPolicy
from compiler.memory_policy import memory_policy
from compiler.nested import optimize_bodies
from compiler.passes import optimize
from compiler.passes.materialize_outputs import materialize_outputs
from compiler.plan import build_plan
from compiler.precision import DEFAULT_PRECISION
from compiler.precision import bf16_engine
from compiler.precision import resolve_precision
from compiler.providers.base import Provider
from compiler.providers.reference import ReferenceProvider
from compiler.quantize import Quantized
from compiler.quantize import check_options as check_quantize_options
from compiler.quantize import quantize_model
from runtime.errors import ArtifactCheckError
from runtime.errors import CompileError
from runtime.errors import GoldenReferenceError
from runtime.errors import UncheckedArtifactWarning
from runtime.isa import X86_LEVELS
from runtime.isa import host_x86_level
from runtime.selftest import VerifyReport

__all__ = ["compile_model", "compile_graph", "TARGETS", "CPU_TARGETS", "default_providers", "resolve_cpu"]

TARGETS = ("cpu", "cuda")
CPU_TARGETS = ("native", *X86_LEVELS)  # --cpu; None: the build machine's level
PORTABLE_CPU = "x86-64-v2"  # the second build every x86-64 artifact carries

Progress = Callable[[str], None]


def default_providers(target: str) -> list[Provider]:
    if target == "cpu":
        from compiler.providers.c.provider import CProvider

        return [CProvider(), ReferenceProvider()]
    if target == "cuda":
        # The reference kernels run on cupy in the device space, so an op without a CUDA kernel
        # stays on the device; the host providers then only see what cannot run there at all.
        from compiler.providers.c.provider import CProvider
        from compiler.providers.cuda.provider import CudaProvider

        return [CudaProvider(), ReferenceProvider("cuda"), CProvider(), ReferenceProvider()]
    raise CompileError(f"unknown target {target!r} (supported: {', '.join(TARGETS)})")


def compile_model(
    model: str | os.PathLike[str] | onnx.ModelProto, out_dir: str | os.PathLike[str], *,
    opt_level: int = 3, target: str = "cpu", build: BuildOptions | None = None, cpu: str | None = None,
    shapes: Mapping[str, Sequence[DimSpec]] | None = None, dims: Mapping[str, DimSpec] | None = None,
    binds: Mapping[str, Any] | None = None, values: Mapping[str, Any] | None = None,
    opt_shapes: Sequence[Mapping[str, Sequence[int]]] | None = None,
    providers: list[Provider] | None = None, progress: Progress | None = None,
    plan_budget_ms: float | None = None, max_arena_bytes: int | None = None,
    golden_cases: int = DEFAULT_CASES, run_check: bool = True,
    winograd: bool = True, compiled_control: bool = True, narrow_weights: bool = True,
    precision: str = DEFAULT_PRECISION, quantize: str | None = None,
    calibration: str | os.PathLike[str] | Mapping[str, np.ndarray] | None = None,
    calibration_method: str = "minmax", max_error: float | None = None,
) -> Path:
    """Compile ``model`` into the artifact folder ``out_dir`` and return its path (the options: the
    module's docstring)."""
    say = progress or (lambda _msg: None)
    check_quantize_options(quantize, calibration, calibration_method, precision)
    check_max_error(max_error, precision, quantize, golden_cases, run_check, opt_shapes)
    out = _checked_start(out_dir, opt_level)
    build = _cpu_build_options(build, cpu)
    resolved = resolve_precision(precision, build, say)
    engine = _bf16_engine(resolved, build, say)
    providers = default_providers(target) if providers is None else providers
    source = _source_identity(model)
    import_args = {"shapes": shapes, "binds": binds, "dims": dims, "values": values}
    quantized = _quantized(model, quantize, calibration, calibration_method, import_args, say)
    model = model if quantized is None else quantized.model
    front_of = functools.partial(_front_half, shapes=shapes, binds=binds, dims=dims, values=values,
                                 opt_level=opt_level, target=target, winograd=winograd,
                                 compiled_control=compiled_control, narrow_weights=narrow_weights,
                                 precision=resolved, bf16_engine=engine, say=say)
    graph, policy = front_of(model)
    options = _recorded_options(opt_level=opt_level, target=target, shapes=shapes, dims=dims, values=values,
                                binds=binds, plan_budget_ms=plan_budget_ms, max_arena_bytes=max_arena_bytes,
                                golden_cases=golden_cases, winograd=winograd, cpu=build.isa,
                                compiled_control=compiled_control, narrow_weights=narrow_weights,
                                precision=None if precision == DEFAULT_PRECISION else resolved,
                                max_error=max_error)
    if quantized is not None:
        options["quantize"] = quantized.record
    variants = _opt_variants(model, graph, policy, opt_shapes or (), binds, say, options, opt_level=opt_level,
                             target=target, build=build, cpu=cpu, winograd=winograd,
                             compiled_control=compiled_control, narrow_weights=narrow_weights,
                             precision=resolved, golden_cases=golden_cases, run_check=run_check)

    def back(g: Graph, p: MemoryPolicy, hook: Hook | None) -> Path:
        return compile_graph(g, out, providers=providers, build=build, progress=say,
                             plan_budget_ms=plan_budget_ms, max_arena_bytes=max_arena_bytes,
                             golden_cases=golden_cases, source=source, options=options,
                             extra_files=variants, run_check=run_check, policy=p, accuracy=hook)

    first = [(graph, policy)]  # the graph already optimized, then fresh ones for more tries
    return _build(lambda m: first.pop() if first and m is model else front_of(m), back, model, resolved,
                  quantized, import_args, max_error, golden_cases, say)


def _build(front_of: Callable[[Any], tuple[Graph, MemoryPolicy]], back: Callable[..., Path], model: Any,
           precision: str, quantized: Quantized | None, import_args: dict[str, Any], max_error: float | None,
           cases: int, say: Progress) -> Path:
    """The back half as the precision asks: fp32 as it is; bf16 and int8 with their error measured
    and recorded, and steps put back in fp32 under ``max_error`` (compiler/accuracy/)."""
    if quantized is not None and max_error is not None:
        return compile_int8(quantized, import_args, front_of, back, max_error, say)
    if quantized is not None:
        graph, policy = front_of(model)
        return back(graph, policy, int8_hook(quantized, None, say))
    if precision == "bf16" or max_error is not None:  # (--precision auto that chose fp32: no bf16 steps)
        return compile_bf16(lambda: front_of(model), back, max_error, cases, say)
    graph, policy = front_of(model)
    return back(graph, policy, None)


def _quantized(model: str | os.PathLike[str] | onnx.ModelProto, quantize: str | None,
               calibration: str | os.PathLike[str] | Mapping[str, np.ndarray] | None, method: str,
               import_args: dict[str, Any], say: Progress) -> Quantized | None:
    """``--quantize``: the model calibrated and rewritten into QDQ form (None without it)."""
    if quantize is None:
        return None
    assert calibration is not None  # (check_quantize_options)
    return quantize_model(model, calibration, method, import_args, say)


def _checked_start(out_dir: str | os.PathLike[str], opt_level: int) -> Path:
    """The artifact folder, once the level is valid and the folder can be written: bad options fail
    before any work (``CompileError``)."""
    if opt_level not in (0, 1, 2, 3):
        raise CompileError(f"optimization level must be 0-3, got {opt_level}")
    out = Path(out_dir)
    check_out_dir(out)
    return out


def _front_half(model: str | os.PathLike[str] | onnx.ModelProto,
                shapes: Mapping[str, Sequence[DimSpec]] | None, binds: Mapping[str, Any] | None,
                dims: Mapping[str, DimSpec] | None, values: Mapping[str, Any] | None,
                *, opt_level: int, target: str, winograd: bool, compiled_control: bool,
                narrow_weights: bool, precision: str, bf16_engine: str,
                say: Progress) -> tuple[Graph, MemoryPolicy]:
    """The model imported and optimized (the bodies of its control steps too, where the target
    compiles them), and its memory policy (chosen once, here)."""
    say("loading model")
    graph = import_model(model, shapes, binds, dims, values)
    graph.narrowing.enabled = narrow_weights
    policy = memory_policy(graph)
    say(f"optimizing (-O{opt_level}): {len(graph) + len(graph.eliminated)} ONNX nodes{policy.summary}")
    lowered: dict[str, Any] = {"target": target, "winograd": winograd, "precision": precision,
                               "bf16_engine": bf16_engine}
    graph = optimize(graph, opt_level, **lowered)
    if compiled_control and target == "cpu":  # elsewhere the bodies are not compiled
        optimize_bodies(graph, lambda body: optimize(body, opt_level, **lowered))
    return graph, policy


def _bf16_engine(precision: str, build: BuildOptions, say: Progress) -> str:
    """The bf16 engine whose rules pick a bf16 compile's bf16 convs (``bf16_engine``), said."""
    if precision != "bf16":
        return "amx"  # (unused)
    engine, why = bf16_engine(build)
    say(f"bf16 steps chosen for {'AMX-BF16' if engine == 'amx' else 'vdpbf16ps'} ({why})")
    return engine


def _recorded_options(*, opt_level: int, target: str, shapes: Mapping[str, Sequence[DimSpec]] | None,
                      dims: Mapping[str, DimSpec] | None, values: Mapping[str, Any] | None,
                      binds: Mapping[str, Any] | None, plan_budget_ms: float | None,
                      max_arena_bytes: int | None, golden_cases: int, winograd: bool, cpu: str,
                      compiled_control: bool, narrow_weights: bool, precision: str | None,
                      max_error: float | None = None) -> dict[str, Any]:
    """The compile options the manifest records (a flag that is on by default only when off; the
    precision only when ``--precision`` was given, so fp32 manifests stay as they were; the bound
    only with ``--max-error``)."""
    return {
        "opt_level": opt_level,
        "target": target,
        **_range_options(shapes, dims, values),
        "binds": {k: np.asarray(v).tolist() for k, v in sorted((binds or {}).items())},
        "plan_budget_ms": plan_budget_ms,
        **({"max_arena_bytes": max_arena_bytes} if max_arena_bytes is not None else {}),
        "golden_cases": golden_cases,
        "winograd": winograd,
        "cpu": cpu,
        **({} if compiled_control else {"compiled_control": False}),
        **({} if narrow_weights else {"narrow_weights": False}),
        **({} if precision is None else {"precision": precision}),
        **({} if max_error is None else {"max_error": max_error}),
    }


def _range_options(shapes: Mapping[str, Sequence[DimSpec]] | None, dims: Mapping[str, DimSpec] | None,
                   values: Mapping[str, Any] | None) -> dict[str, Any]:
    """The manifest's record of ``--shape`` (always), ``--dim`` and ``--value`` (when given)."""
    out: dict[str, Any] = {"shapes": {k: [_option_dim(d) for d in v]
                                      for k, v in sorted((shapes or {}).items())}}
    if dims:
        out["dims"] = {k: _option_dim(v) for k, v in sorted(dims.items())}
    if values:
        out["values"] = {k: _option_dim(v) for k, v in sorted(values.items())}
    return out


def _opt_variants(model: str | os.PathLike[str] | onnx.ModelProto, graph: Graph, policy: MemoryPolicy,
                  opt_shapes: Sequence[Mapping[str, Sequence[int]]], binds: Mapping[str, Any] | None,
                  say: Progress, recorded: dict[str, Any], **options: Any) -> dict[str, bytes]:
    """The files of the --opt-shape variants of the dynamic ``graph`` (each a static compile);
    ``recorded`` (the manifest's compile options) gets them."""
    if not opt_shapes:
        return {}
    recorded["opt_shapes"] = [{k: [int(d) for d in v] for k, v in sorted(spec.items())}
                              for spec in opt_shapes]
    if graph.value_symbols:
        raise CompileError("--opt-shape does not combine with value symbols (--value) yet")
    files: dict[str, bytes] = {}
    for k, spec in enumerate(opt_shapes):
        at = policy.specialize(spec)
        say(f"compiling the static variant opt/{k} for " + ", ".join(f"{n} {list(s)}" for n, s in at.items()))
        files.update(_static_variant(model, k, at, binds, **options))
    return files


def _static_variant(model: str | os.PathLike[str] | onnx.ModelProto, k: int,
                    shapes: Mapping[str, Sequence[int]], binds: Mapping[str, Any] | None,
                    **options: Any) -> dict[str, bytes]:
    """The files of the static artifact of an --opt-shape variant, under ``opt/<k>/``."""
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore", UncheckedArtifactWarning)  # the whole compile's says it
        try:
            sub = compile_model(model, Path(tmp) / "variant", shapes=shapes, binds=binds, **options)
        except (GoldenReferenceError, ArtifactCheckError) as exc:  # named for the variant, not its temp path
            message = str(exc).replace(f"{Path(tmp) / 'variant'}: ", "")
            raise type(exc)(f"the static variant opt/{k} ({dict(shapes)}): {message}") from None
        return {f"{OPT_DIR}/{k}/{p.relative_to(sub).as_posix()}": p.read_bytes()
                for p in sorted(sub.rglob("*")) if p.is_file()}


def compile_graph(
    graph: Graph,
    out_dir: str | os.PathLike[str],
    *,
    providers: list[Provider] | None = None,
    build: BuildOptions | None = None,
    progress: Progress | None = None,
    plan_budget_ms: float | None = None,
    max_arena_bytes: int | None = None,
    golden_cases: int = DEFAULT_CASES,
    source: ModelSource | tuple[str, str] | None = None,
    options: dict[str, Any] | None = None,
    extra_files: Mapping[str, bytes] | None = None,
    run_check: bool = True,
    policy: MemoryPolicy | None = None,
    accuracy: Callable[[Path, VerifyReport | None], None] | None = None,
) -> Path:
    """Compile an already imported and optimized IR ``graph`` (changed in place) into ``out_dir``.

    The back half of :func:`compile_model` (compiler/back_half.py, then kernels and artifact), for
    graphs built directly too, e.g. tests of onnx-aot's own ops; CPU providers unless ``providers``
    is given. ``source`` is the (name, sha256) recorded as the model's source, ``options`` the
    compile options recorded in the manifest; ``golden_cases`` and ``run_check`` as for
    compile_model; ``policy`` the graph's memory policy (None: compiler/memory_policy.py's choice);
    ``accuracy`` gets the built folder and its golden check's report after the check
    (compiler/accuracy/record.py).
    """
    say = progress or (lambda _msg: None)
    policy = memory_policy(graph) if policy is None else policy
    providers = default_providers("cpu") if providers is None else providers
    policy.check_providers(providers)
    build = _cpu_build_options(None, None) if build is None else build
    out = Path(out_dir)
    source = ModelSource(*(source or (graph.name or "graph", "")))
    options = dict(options) if options is not None else {"target": "cpu", "cpu": build.isa}
    materialize_outputs(graph)  # (plan_graph's first steps, before the golden cases run the graph)
    graph.verify()
    say("computing golden self-test outputs with the reference kernels")
    golden, unchecked = _golden(graph, out, golden_cases, policy)
    attrs_of = {id(node): dict(node.attrs) for node in graph.nodes}  # as the golden cases ran them
    planned = plan_graph(graph, providers, policy, plan_budget_ms,
                         compiled_control=options.get("compiled_control", True), say=say)
    check_arena_limit(source.file, planned.mem_plans, max_arena_bytes)
    plan = build_plan(planned)
    say(f"generating kernels for {len(plan.partitions)} partition(s)")
    checked = unchecked is None and run_check

    def check(folder: Path) -> None:
        report = check_artifact(folder, plan.plan, out, say) if checked else None
        if accuracy is not None:
            accuracy(folder, report)

    def write(golden_files: Mapping[str, bytes]) -> Path:
        return write_artifact(out, plan, planned.providers, build, source, options, say,
                              extra_files={**golden_files, **(extra_files or {})},
                              check=check if checked or accuracy is not None else None)

    final = _write_checked(write, graph, attrs_of, golden, say)
    say(f"wrote {final}")
    return final


def _golden(graph: Graph, out: Path, cases: int, policy: MemoryPolicy) -> tuple[dict[str, bytes], str | None]:
    """The golden self-test files of ``graph`` (at the bindings ``policy`` names, when it has
    symbols) and why they hold no case (warned), if they hold none."""
    public = [graph.output_names[k] if k < len(graph.output_names) else v.name
              for k, v in enumerate(graph.outputs)]
    golden = make_golden(graph, public, cases=cases, bindings=policy.golden_bindings())
    unchecked = skipped_reason(golden)
    if unchecked is not None:
        warn_unchecked(out, unchecked)
    return golden, unchecked


def _write_checked(write: Callable[[Mapping[str, bytes]], Path], graph: Graph,
                   attrs_of: Mapping[int, dict[str, Any]], golden: dict[str, bytes], say: Progress) -> Path:
    """``write(golden)``; when the check finds outputs off their tolerance by no more than the
    reference's own movement under a 1-ulp nudge (compiler/artifact/conditioning.py), again with
    those tolerances widened; any other disagreement stands."""
    try:
        return write(golden)
    except ArtifactCheckError as exc:
        widened = widen_for_conditioning(graph, attrs_of, golden, exc.mismatches)
        if widened is None:
            raise
        say("the disagreement is within the reference's own movement under a 1-ulp change of its "
            "inputs (ill-conditioned outputs): their golden tolerances widened to cover it")
        return write(widened)


def _option_dim(dim: DimSpec) -> int | list[int]:
    """A dim as the manifest's compile options record it: a size, or [LO, HI] (numpy ints too)."""
    if isinstance(dim, (tuple, list)):
        return [int(d) for d in dim]
    return int(dim)


def resolve_cpu(cpu: str | None) -> str:
    """The ``-march`` value for ``--cpu``: None is the build machine's level, the highest
    x86-64-vN whose features this CPU has ("native" off x86-64 or when the flags are unknown)."""
    if cpu is None:
        return host_x86_level() or "native"
    if cpu not in CPU_TARGETS:
        raise CompileError(f"unknown CPU target {cpu!r} (supported: {', '.join(CPU_TARGETS)})")
    return cpu


def _cpu_build_options(build: BuildOptions | None, cpu: str | None) -> BuildOptions:
    if build is None or cpu is not None:
        build = dataclasses.replace(build or BuildOptions(), isa=resolve_cpu(cpu))
    portable = None
    if build.isa != PORTABLE_CPU and platform.machine().lower() in ("x86_64", "amd64"):
        portable = PORTABLE_CPU
    return dataclasses.replace(build, portable_isa=portable)


def _source_identity(model: str | os.PathLike[str] | onnx.ModelProto) -> ModelSource:
    if isinstance(model, onnx.ModelProto):
        data = model.SerializeToString(deterministic=True)
        return ModelSource(model.graph.name or "model", hashlib.sha256(data).hexdigest(), len(data))
    path = Path(model)
    try:
        data = path.read_bytes()
    except OSError:
        return ModelSource(path.name, "")
    return ModelSource(path.name, hashlib.sha256(data).hexdigest(), len(data) + _external_nbytes(path, data))


def _external_nbytes(path: Path, data: bytes) -> int:
    """The bytes of the external-data files next to the model ``data`` that it names (0: none)."""
    try:
        proto = onnx.load_from_string(data)
    except Exception:  # the import reports an unreadable model with its own error
        return 0
    names = {e.value for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL
             for e in t.external_data if e.key == "location"}
    return sum((path.parent / n).stat().st_size for n in sorted(names) if (path.parent / n).is_file())


def stderr_progress(message: str) -> None:
    print(f"onnx-aot: {message}", file=sys.stderr, flush=True)
