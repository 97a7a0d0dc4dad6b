"""Execute every generated CUDA kernel on the host CPU and check it against the reference kernels.

No GPU needed. Each model is compiled with ``target="cuda"`` (CUDA provider first, the reference
kernels for the rest; nvcc is not run), its ``kernels/cuda/model.cu`` is built with g++ against
``tests/support/cuda_host/cuda_host.h`` (each block's threads are fibers, so ``__syncthreads``
and the warp shuffles really synchronize) and the plan runs on host memory
(``tests/support/cuda_host/runner.py``): every CUDA step is checked on its own against its
reference kernel, and stray writes, unwritten outputs, partial barriers, bad warp masks and memory
faults are failures that name the step, op and kernel.

Models: the kernel shapes of ``tests/support/cuda_host/models.py`` (partial tiles, odd sizes, every
template variant), the two CUDA test models of ``tests/test_cuda_codegen.py``, a transformer
encoder block (``tests/support/transformer_model.py``, both Gelu forms), and the nine light-zoo
models with seeded random weights: densenet121 and squeezenet at 1x3x64x64 (their input dims
freed; both end in global pooling); the others at their own 224 x 224 -- fully connected heads
(alexnet, vgg19, zfnet512) or fixed 7 x 7 average pools (inception v1 / v2, resnet50) and a
shufflenet whose shapes do not infer with free dims.

Counting: M is the number of distinct ``__global__`` functions over all models (functions equal
up to their name and comment count once); a function matches when every launch of it in every
model matched. A template file is covered when a matching function was rendered from it
(``common.cu.j2``: its ``signature`` macro starts every kernel, so any match covers it;
``model.cu.j2``: a matching function calls its ``oa_warp_sum`` / ``oa_warp_max``). The last line
is ``N/M CUDA kernels match the reference; templates covered T/U`` and the exit status is 0 only
when N == M, every model ran and T == U.

With ``--device`` (cupy and a GPU), every checked step also runs on the GPU from the same arena
bytes, and the host's outputs must match the GPU's (tests/support/cuda_host/device.py): a check of
the host execution itself. With ``--real``, the pinned real models of ``scripts/fetch_models.py``
that are already in its cache run too (their entry's --shape / --bind; ppocrv4-det at
1x3x160x192), on random feeds.

Usage: python scripts/cuda_host_check.py [MODEL ...] [--quick] [--real] [--device] [--list] [--keep DIR]
       [-v] [--one-order]
       (also ``python -m scripts.cuda_host_check``); --quick: the kernel shapes and test models only.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "templates" / "cuda"
SMALL_ZOO = {"densenet121": 64, "squeezenet": 64}
FUNCTION_RE = re.compile(r'(?:/\*[^*]*\*/\s*)?extern "C" __global__')


@dataclass
class Tally:
    """What the models so far say about each distinct function (keyed by its normalized text)."""

    status: dict[str, bool] = field(default_factory=dict)  # launched: all launches matched
    seen: dict[str, str] = field(default_factory=dict)  # text -> "model:kernel" first seen
    template: dict[str, tuple[str, str]] = field(default_factory=dict)  # text -> (template, variant)
    failed_models: list[str] = field(default_factory=list)


def _functions(source: str) -> dict[str, str]:
    """Kernel name -> its text with the name and the leading comment taken out."""
    starts = [m.start() for m in FUNCTION_RE.finditer(source)]
    out: dict[str, str] = {}
    for i, start in enumerate(starts):
        text = source[start:starts[i + 1] if i + 1 < len(starts) else len(source)]
        text = re.sub(r"^/\*[^*]*\*/\s*", "", text)
        name = re.search(r"__launch_bounds__\(\d+\) (\w+)\(", text)
        assert name is not None, text[:200]
        out[name.group(1)] = text.replace(f" {name.group(1)}(", " KERNEL(", 1).strip()
    return out


@contextmanager
def _recording() -> Iterator[dict[str, tuple[str, str]]]:
    """Kernel name -> (template file, variant), for the kernels the CUDA provider renders."""
    import compiler.providers.cuda.provider as provider

    seen: dict[str, tuple[str, str]] = {}
    render = provider.render

    def recorded(template: str, ctx: Any, **kw: Any) -> str:
        if "name" in kw:
            variant = getattr(ctx, "op", None) or getattr(ctx, "mode", None) or "-"
            seen[str(kw["name"])] = (Path(template).name, str(variant))
        return render(template, ctx, **kw)

    provider.render = recorded  # type: ignore[assignment]
    try:
        yield seen
    finally:
        provider.render = render  # type: ignore[assignment]


def _compile(model: Any, out: Path, shapes: dict[str, tuple[int, ...]] | None,
             binds: dict[str, Any] | None = None) -> tuple[Path, dict[str, Any]]:
    from compiler import compile_model
    from compiler.codegen.options import BuildOptions
    from compiler.providers.cuda.provider import CudaProvider
    from compiler.providers.reference import ReferenceProvider

    providers = [CudaProvider(), ReferenceProvider("cuda"), ReferenceProvider()]
    with _recording() as templates:
        path = compile_model(model, out, target="cuda", shapes=shapes, binds=binds,
                             providers=providers,  # type: ignore[arg-type]
                             build=BuildOptions(extra={"nvcc": "none"}), golden_cases=0)
    return path, templates


def _free_spatial_dims(model: Any) -> tuple[Any, str]:
    """``model`` with its image input's H and W and its outputs' dims made symbolic."""
    inits = {t.name for t in model.graph.initializer}
    inp = next(i for i in model.graph.input if i.name not in inits)
    for k in (2, 3):
        dim = inp.type.tensor_type.shape.dim[k]
        dim.ClearField("dim_value")
        dim.dim_param = f"hw{k}"
    del model.graph.value_info[:]
    for out in model.graph.output:
        for j, dim in enumerate(out.type.tensor_type.shape.dim):
            dim.ClearField("dim_value")
            dim.dim_param = f"{out.name}_{j}"
    return model, inp.name


def model_list(quick: bool) -> dict[str, Callable[[], tuple[Any, dict[str, tuple[int, ...]] | None]]]:
    """Name -> a function building (model, --shape bindings), in the order the check runs them."""
    from tests.support.cuda_host.models import SHAPE_MODELS
    from tests.support.transformer_model import transformer_model
    from tests.support.zoo import ZOO
    from tests.support.zoo import zoo_model
    from tests.test_cuda_codegen import _eltwise_chain_model
    from tests.test_cuda_codegen import _transformer_model

    models: dict[str, Callable[[], tuple[Any, dict[str, tuple[int, ...]] | None]]] = {}
    for name, build in SHAPE_MODELS.items():
        models[name] = lambda build=build: (build(), None)
    models["codegen_chain"] = lambda: (_eltwise_chain_model(), None)
    models["codegen_block"] = lambda: (_transformer_model(), None)
    models["transformer"] = lambda: (transformer_model(batch=2, seq=24, dim=64, heads=4, ffn=96), None)
    models["transformer_erf"] = lambda: (transformer_model(batch=1, seq=33, dim=48, heads=3, ffn=80,
                                                           erf=True), None)
    if quick:
        return models
    for name in ZOO:
        if name in SMALL_ZOO:
            def small(name: str = name) -> tuple[Any, dict[str, tuple[int, ...]] | None]:
                model, inp = _free_spatial_dims(zoo_model(name))
                return model, {inp: (1, 3, SMALL_ZOO[name], SMALL_ZOO[name])}
            models[name] = small
        else:
            models[name] = lambda name=name: (zoo_model(name), None)
    return models


# real models (scripts/fetch_models.py) at a smaller shape than their entry's, where they allow one
REAL_SHAPES = {"ppocrv4-det": {"x": (1, 3, 160, 192)}}


def real_models() -> dict[str, Callable[[], tuple[Any, ...]]]:
    """The pinned real models already in the cache (``python -m scripts.fetch_models`` fetches
    them; nothing is downloaded here), with their entry's --shape / --bind options."""
    from scripts.fetch_models import MODELS
    from scripts.fetch_models import cache_dir

    found: dict[str, Callable[[], tuple[Any, ...]]] = {}
    for entry in MODELS:
        path = cache_dir() / entry.wheel.folder / entry.member
        if path.is_file():
            shapes = REAL_SHAPES.get(entry.name, entry.shape_options)
            found[entry.name] = lambda p=str(path), s=shapes, b=entry.bind_options: (p, s or None, b or None)
    return found


def check_model(name: str, build: Callable[[], tuple[Any, ...]], out: Path, tally: Tally, verbose: bool,
                orders: tuple[bool, ...] = (False,), device: bool = False) -> None:
    """Compile ``name``, run its CUDA steps on the host once per thread order (False: ascending)
    and add what they say to ``tally``."""
    from tests.support.cuda_host.models import SPECIAL_FEEDS
    from tests.support.cuda_host.models import random_feeds
    from tests.support.cuda_host.runner import HostRun

    t0 = time.perf_counter()
    model, shapes, *binds = build()
    path, templates = _compile(model, out / name, shapes, binds[0] if binds else None)
    source = (path / "kernels" / "cuda" / "model.cu").read_text()
    functions = _functions(source)
    t1 = time.perf_counter()
    checks = []
    t2 = t3 = 0.0
    for reverse in orders:
        run = HostRun(path, reverse=reverse, device=device)
        t2 = time.perf_counter()
        checks += run.run(random_feeds(run.plan.inputs, special=name in SPECIAL_FEEDS))
        t3 = time.perf_counter()
    for kernel, text in functions.items():
        tally.seen.setdefault(text, f"{name}:{kernel}")
        if kernel in templates:
            tally.template.setdefault(text, templates[kernel])
    bad = 0
    for check in checks:
        for kernel in check.kernels:
            text = functions[kernel]
            tally.status[text] = tally.status.get(text, True) and check.ok
        if not check.ok:
            bad += 1
            print(f"  {name}: {check.describe()}")
        elif verbose:
            print(f"  {name}: {check.describe()}")
    order = " (both thread orders)" if len(orders) > 1 else ""
    gpu = [c.device_error for c in checks if c.device_error is not None]
    if gpu:
        order += f", on the GPU too (largest |host - GPU| {max(gpu):.3g})"
    print(f"{name}: {len(checks) - bad}/{len(checks)} CUDA steps match{order}, {len(functions)} kernels "
          f"(compile {t1 - t0:.1f} s, g++ {t2 - t1:.1f} s, run {t3 - t2:.1f} s)", flush=True)


def summary(tally: Tally) -> tuple[int, int, int, int, list[str]]:
    """(N, M, T, U, notes): matching / all distinct kernels, covered / all template files."""
    m = len(tally.seen)
    matching = [t for t in tally.seen if tally.status.get(t) is True]
    notes = [f"kernel {tally.seen[t]} never launched" for t in tally.seen if t not in tally.status]
    notes += [f"kernel {tally.seen[t]} ({'/'.join(tally.template.get(t, ('?', '?')))}) does not match"
              for t in tally.seen if tally.status.get(t) is False]
    covered = {tally.template[t][0] for t in matching if t in tally.template}
    if matching:
        covered.add("common.cu.j2")
    if any("oa_warp_" in t for t in matching):
        covered.add("model.cu.j2")
    files = sorted(p.name for p in TEMPLATES.glob("*.cu.j2"))
    notes += [f"template {f} not covered" for f in files if f not in covered]
    return len(matching), m, len(covered & set(files)), len(files), notes


def _variants(tally: Tally) -> str:
    seen: dict[str, set[str]] = {}
    for text, (template, variant) in tally.template.items():
        if tally.status.get(text):
            seen.setdefault(template, set()).add(variant)
    return "; ".join(f"{t}: {', '.join(sorted(v))}" for t, v in sorted(seen.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", help="model names (default: all)")
    parser.add_argument("--quick", action="store_true", help="kernel shapes and test models only")
    parser.add_argument("--list", action="store_true", help="list the models and exit")
    parser.add_argument("--device", action="store_true",
                        help="also run every checked step on the GPU (cupy) and compare host with GPU")
    parser.add_argument("--real", action="store_true",
                        help="also the real models of scripts/fetch_models.py found in its cache")
    parser.add_argument("--keep", type=Path, help="compile into DIR and keep the artifacts")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every step")
    parser.add_argument("--one-order", action="store_true",
                        help="run the small models in ascending thread order only (default: both)")
    args = parser.parse_args(argv)
    from tests.support.zoo import ZOO

    models: dict[str, Callable[[], tuple[Any, ...]]] = dict(model_list(args.quick and not args.models))
    if args.real or any(m not in models for m in args.models):
        models.update(real_models())
    if args.list:
        print("\n".join(models))
        return 0
    unknown = [m for m in args.models if m not in models]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; --list names them")
    chosen = args.models or [m for m in models if args.real or m not in real_models()]
    tally = Tally()
    with tempfile.TemporaryDirectory(prefix="cuda_host_") as tmp:
        out = args.keep or Path(tmp)
        for name in chosen:
            try:
                both = not args.one_order and name not in ZOO  # the zoo runs in one order
                check_model(name, models[name], out, tally, args.verbose, (False, True) if both else (False,),
                            args.device)
            except Exception as exc:
                tally.failed_models.append(name)
                print(f"{name}: FAILED: {type(exc).__name__}: {exc}", flush=True)
                if args.verbose:
                    traceback.print_exc()
    n, m, t, u, notes = summary(tally)
    for note in notes + [f"model {name} did not run" for name in tally.failed_models]:
        print(f"  - {note}")
    print(f"variants matched: {_variants(tally)}")
    print(f"{n}/{m} CUDA kernels match the reference; templates covered {t}/{u}")
    return 0 if n == m and t == u and not tally.failed_models else 1


if __name__ == "__main__":
    if str(ROOT) not in sys.path:  # run as a file: make the repo's packages importable
        sys.path.insert(0, str(ROOT))
    sys.exit(main())
