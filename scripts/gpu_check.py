"""Every on-GPU check of issue 3 (the CUDA provider), in one run, ending in one table.

For the nine random-weight light-zoo models and the transformer test block (opset-20 Gelu and the
Erf form): compile with ``target="cuda"``, run, compare with onnxruntime CPU (rtol 1e-3, atol 1e-4;
the largest absolute error and the largest error in tolerance units are printed), run again with
CUDA graphs and compare that too, and time end to end (numpy in, numpy out) the median GPU latency
without and with graphs, the CPU path (onnx-aot ``target="cpu"``, all cores) and torch on the same
weights (a small ONNX -> torch interpreter of the zoo's ops, fp32 with TF32 off; a model using an
op it lacks says so in the table). Then: the NVRTC fallback (cubins and PTX ignored, the ``.cu``
compiled into a fresh cache, matched against onnxruntime, loaded again from the cache), and the
GPU tests of ``tests/test_cuda_runtime.py`` under pytest. Ratios are onnx-aot GPU (the faster of
with/without graphs) / the other; below 1 means onnx-aot on the GPU is faster.

Exits non-zero when any output mismatches or any check fails. Each model is checked in its own
try/except so one failure does not hide the others.

Usage: python -m scripts.gpu_check [MODEL ...] [--runs N] [--no-torch] [--no-cpu] [--no-pytest]
                                   [--json FILE]
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

RTOL, ATOL = 1e-3, 1e-4
TRANSFORMERS = ("transformer", "transformer_erf")


@dataclass
class Row:
    model: str
    ok: bool = False
    module: str = "-"
    max_abs_err: float | None = None
    tol_units: float | None = None  # max |got - want| / (atol + rtol |want|); <= 1 passes
    graph_ok: bool | None = None
    gpu_ms: float | None = None
    graph_ms: float | None = None
    cpu_ms: float | None = None
    torch_ms: float | None = None
    torch_note: str = ""
    transfers: int = 0
    host_steps: int = 0
    arena_mib: float = 0.0
    errors: list[str] = field(default_factory=list)


def median_ms(fn: Callable[[], Any], runs: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def compare(got: list[Any], want: list[Any]) -> tuple[bool, float, float]:
    import numpy as np

    ok, abs_err, units = True, 0.0, 0.0
    for g, w in zip(got, want, strict=True):
        g64, w64 = np.asarray(g, np.float64), np.asarray(w, np.float64)
        if g64.shape != w64.shape or not np.all(np.isfinite(g64)):
            return False, float("inf"), float("inf")
        diff = np.abs(g64 - w64)
        abs_err = max(abs_err, float(diff.max(initial=0.0)))
        units = max(units, float((diff / (ATOL + RTOL * np.abs(w64))).max(initial=0.0)))
        ok = ok and bool(np.allclose(g64, w64, rtol=RTOL, atol=ATOL))
    return ok, abs_err, units


def load_model(name: str) -> tuple[Any, dict[str, Any]]:
    if name in TRANSFORMERS:
        from tests.support.transformer_model import transformer_input
        from tests.support.transformer_model import transformer_model

        model = transformer_model(erf=name.endswith("erf"))
        return model, transformer_input(model)
    from tests.support.zoo import dummy_input
    from tests.support.zoo import zoo_model

    model = zoo_model(name)
    return model, dummy_input(model)


def cuda_session(path: Path, graphs: bool) -> Any:
    """A Session; with ``graphs``, its CUDA partitions capture CUDA graphs."""
    from runtime import Session

    if graphs and "cuda_graph" in inspect.signature(Session).parameters:
        options: dict[str, Any] = {"cuda_graph": True}  # the lead wires this option into Session
        return Session(path, **options)
    session = Session(path)
    if graphs:  # until Session takes cuda_graph=True: rebuild its CUDA partitions with capture=True
        from runtime.providers.cuda import CudaPartition

        for i, (kind, part) in enumerate(session._partitions):
            if kind == "cuda" and not part.capture:
                session._partitions[i] = ("cuda", CudaPartition(
                    session._artifact, session.plan.partitions[i], session._weights["cuda"], capture=True))
    return session


def check_model(name: str, args: argparse.Namespace, tmp: Path) -> Row:
    from compiler import compile_model
    from runtime import Session
    from tests.support.models import ort_run

    row = Row(name)
    model, feeds = load_model(name)
    want = ort_run(model, feeds)
    path = compile_model(model, tmp / f"{name}.cuda", target="cuda")
    session = cuda_session(path, graphs=False)
    plan = session.plan
    row.module = ",".join(sorted({p.module_source for k, p in session._partitions if k == "cuda"})) or "none"
    row.transfers = sum(1 for s in plan.steps if s.op_type == "Transfer")
    spaces = {p.index: p.memory_space for p in plan.partitions}
    row.host_steps = sum(1 for s in plan.steps if s.op_type != "Transfer" and spaces[s.partition] == "host")
    row.arena_mib = sum(a.nbytes for a in plan.arenas if a.memory_space == "cuda") / 2**20
    got = session.run(None, feeds)
    row.ok, row.max_abs_err, row.tol_units = compare(got, want)
    if not row.ok:
        row.errors.append(f"outputs differ from onnxruntime (max abs err {row.max_abs_err:.3g})")
    row.gpu_ms = median_ms(lambda: session.run(None, feeds), args.runs)
    try:
        graphed = cuda_session(path, graphs=True)
        for _ in range(2):  # the first run captures, the second replays
            row.graph_ok = compare(graphed.run(None, feeds), want)[0] and row.graph_ok is not False
        if not row.graph_ok:
            row.errors.append("outputs with CUDA graphs differ from onnxruntime")
        row.graph_ms = median_ms(lambda: graphed.run(None, feeds), args.runs)
    except Exception as exc:
        row.graph_ok = False
        row.errors.append(f"CUDA graphs: {type(exc).__name__}: {exc}")
    if not args.no_cpu:
        cpu = Session(compile_model(model, tmp / f"{name}.cpu", target="cpu"), threads=os.cpu_count())
        row.cpu_ms = median_ms(lambda: cpu.run(None, feeds), max(3, args.runs // 4), warmup=1)
    if not args.no_torch:
        try:
            net = OnnxTorch(model)
            t_ok, t_err, _ = compare(net.run(feeds), want)
            row.torch_ms = median_ms(lambda: net.run(feeds), args.runs)
            row.torch_note = "" if t_ok else f"torch itself differs from ORT ({t_err:.2g})"
        except NotImplementedError as exc:
            row.torch_note = f"skipped: {exc}"
        except Exception as exc:
            row.torch_note = f"skipped: {type(exc).__name__}: {exc}"
    return row


def check_nvrtc(tmp: Path) -> Row:
    """The NVRTC fallback on the small transformer: compile into a fresh cache, match, hit the cache."""
    import dataclasses

    from compiler import compile_model
    from runtime.providers.cuda import CudaPartition
    from tests.support.models import ort_run
    from tests.support.transformer_model import transformer_input
    from tests.support.transformer_model import transformer_model

    row = Row("nvrtc-fallback")
    os.environ["ONNX_AOT_CUDA_CACHE"] = str(tmp / "nvrtc-cache")
    model = transformer_model(seq=32, dim=64, ffn=256)
    feeds = transformer_input(model)
    session = cuda_session(compile_model(model, tmp / "nvrtc", target="cuda"), graphs=False)
    for attempt in ("compile", "cache"):
        for i, (kind, _part) in enumerate(session._partitions):
            if kind != "cuda":
                continue
            record = session.plan.partitions[i]
            assert record.module is not None  # as if nvcc was absent: no cubins, no PTX
            module = dataclasses.replace(record.module, cubins={}, ptx=None)
            record = dataclasses.replace(record, module=module)
            part = CudaPartition(session._artifact, record, session._weights["cuda"])
            if part.module_source != "nvrtc" or part.module.cache_hit != (attempt == "cache"):
                row.errors.append(f"{attempt}: loaded {part.module_source}, "
                                  f"cache hit {part.module.cache_hit}")
            session._partitions[i] = ("cuda", part)
        row.ok, row.max_abs_err, row.tol_units = compare(session.run(None, feeds), ort_run(model, feeds))
        if not row.ok:
            row.errors.append(f"{attempt}: outputs differ from onnxruntime")
    row.module = "nvrtc"
    row.ok = row.ok and not row.errors
    return row


def run_pytest() -> Row:
    row = Row("pytest-gpu")
    result = subprocess.run([sys.executable, "-m", "pytest", "tests/test_cuda_runtime.py", "-q", "-rs",
                             "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True)
    tail = result.stdout.strip().splitlines()[-1:] or [result.stderr.strip()[-300:]]
    row.ok = result.returncode == 0 and "skipped" not in tail[0]
    row.module = "-"
    row.torch_note = tail[0][:100]
    if not row.ok:
        row.errors.append(result.stdout[-3000:] + result.stderr[-2000:])
    return row


# -- torch on the same weights: a small interpreter of the ONNX ops these models use ------------------
class OnnxTorch:
    """Runs an ONNX graph with torch on the GPU (fp32, TF32 off). ``NotImplementedError`` names an op
    or attribute it does not cover."""

    def __init__(self, model: Any, device: str = "cuda") -> None:
        import numpy as np
        import torch
        import torch.nn.functional as F  # noqa: N812
        from onnx import helper
        from onnx import numpy_helper

        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = True
        self.torch = torch
        self.device = dev = torch.device(device)
        graph = model.graph
        self.opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
        consts = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        self.env0 = {n: torch.from_numpy(np.array(a, copy=True)).to(dev) for n, a in consts.items()
                     if a.dtype.kind == "f"}
        self.inputs = [i.name for i in graph.input if i.name not in consts]
        self.outputs = [o.name for o in graph.output]
        self.steps: list[tuple[Callable[..., Any], list[str], list[str]]] = []
        for node in graph.node:
            at = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            at = {k: v.decode() if isinstance(v, bytes) else v for k, v in at.items()}
            self.steps.append((self._op(node, at, consts, F, np), list(node.input), list(node.output)))

    def _op(self, node: Any, at: dict[str, Any], consts: dict[str, Any], F: Any,  # noqa: N803
            np: Any) -> Callable[..., Any]:
        torch, op = self.torch, node.op_type
        if at.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
            raise NotImplementedError(f"{op} auto_pad={at['auto_pad']}")

        def pads2d() -> tuple[list[int], bool]:
            p = list(at.get("pads", [0] * 4))
            return p, p[0] == p[2] and p[1] == p[3]

        if op == "Conv":
            p, sym = pads2d()
            stride, dil, groups = at.get("strides", [1, 1]), at.get("dilations", [1, 1]), at.get("group", 1)
            if sym:
                return lambda x, w, b=None: F.conv2d(x, w, b, stride, (p[0], p[1]), dil, groups)
            return lambda x, w, b=None: F.conv2d(F.pad(x, (p[1], p[3], p[0], p[2])), w, b, stride, 0, dil,
                                                 groups)
        if op in ("MaxPool", "AveragePool"):
            p, sym = pads2d()
            k, s, ceil = at["kernel_shape"], at.get("strides", [1, 1]), bool(at.get("ceil_mode", 0))
            if op == "MaxPool":
                if at.get("dilations", [1, 1]) != [1, 1]:
                    raise NotImplementedError("MaxPool dilations")
                if sym:
                    return lambda x: F.max_pool2d(x, k, s, (p[0], p[1]), ceil_mode=ceil)
                return lambda x: F.max_pool2d(F.pad(x, (p[1], p[3], p[0], p[2]), value=-float("inf")), k, s,
                                              ceil_mode=ceil)
            incl = bool(at.get("count_include_pad", 0))
            if sym:
                return lambda x: F.avg_pool2d(x, k, s, (p[0], p[1]), ceil_mode=ceil, count_include_pad=incl)
            lrtb = (p[1], p[3], p[0], p[2])

            def avg_pool_asymmetric(x: Any) -> Any:  # the mean over each window's real elements
                total = F.avg_pool2d(F.pad(x, lrtb), k, s, ceil_mode=ceil)
                if incl:
                    return total
                ones = F.pad(torch.ones_like(x[:1, :1]), lrtb)
                return total / F.avg_pool2d(ones, k, s, ceil_mode=ceil)
            return avg_pool_asymmetric
        if op == "GlobalAveragePool":
            return lambda x: x.mean(dim=(2, 3), keepdim=True)
        if op == "LRN":
            size, alpha = at["size"], at.get("alpha", 1e-4)
            beta, bias = at.get("beta", 0.75), at.get("bias", 1.0)
            return lambda x: F.local_response_norm(x, size, alpha, beta, bias)
        if op == "BatchNormalization":
            eps = at.get("epsilon", 1e-5)
            return lambda x, s, b, m, v: F.batch_norm(x, m, v, s, b, False, 0.0, eps)
        if op == "Gemm":
            ta, tb = at.get("transA", 0), at.get("transB", 0)
            alpha, beta = at.get("alpha", 1.0), at.get("beta", 1.0)

            def gemm(a: Any, b: Any, c: Any = None) -> Any:
                y = (a.t() if ta else a) @ (b.t() if tb else b)
                y = y * alpha if alpha != 1.0 else y
                return y if c is None else y + (c * beta if beta != 1.0 else c)
            return gemm
        if op == "Reshape":
            if node.input[1] not in consts:
                raise NotImplementedError("Reshape with a computed shape")
            target = [int(d) for d in consts[node.input[1]]]
            return lambda x, _s=None: x.reshape([x.shape[i] if d == 0 else d for i, d in enumerate(target)])
        if op == "Unsqueeze":
            axes = at["axes"] if "axes" in at else [int(a) for a in consts[node.input[1]]]

            def unsqueeze(x: Any, _a: Any = None) -> Any:
                for a in sorted(a % (x.dim() + len(axes)) for a in axes):
                    x = x.unsqueeze(a)
                return x
            return unsqueeze
        if op == "Flatten":
            axis = at.get("axis", 1)
            return lambda x: x.reshape(int(np.prod(x.shape[:axis])), -1)
        if op == "Transpose":
            perm = at.get("perm")
            return lambda x: x.permute(*(perm if perm is not None else reversed(range(x.dim()))))
        if op == "Concat":
            return lambda *xs: torch.cat(xs, dim=at["axis"])
        if op in ("Dropout", "Identity"):
            return lambda x, *_: x  # inference: a Dropout's mask output, if any, stays unset
        if op == "Softmax":
            axis = at.get("axis", 1 if self.opset < 13 else -1)
            if self.opset >= 13:
                return lambda x: torch.softmax(x, dim=axis)
            return lambda x: torch.softmax(x.reshape(int(np.prod(x.shape[:axis % x.dim()])), -1),
                                           dim=-1).reshape(x.shape)
        if op == "LayerNormalization":
            axis, eps = at.get("axis", -1), at.get("epsilon", 1e-5)
            return lambda x, s, b=None: F.layer_norm(x, x.shape[axis % x.dim():], s, b, eps)
        if op == "Gelu":
            return lambda x: F.gelu(x, approximate=at.get("approximate", "none"))
        simple = {"Relu": torch.relu, "Erf": torch.erf, "Sqrt": torch.sqrt, "Tanh": torch.tanh,
                  "Sigmoid": torch.sigmoid, "Add": torch.add, "Sub": torch.sub, "Mul": torch.mul,
                  "Div": torch.div, "Pow": torch.pow, "MatMul": torch.matmul}
        if op in simple:
            return simple[op]
        if op == "Sum":
            return lambda *xs: sum(xs[1:], xs[0])
        raise NotImplementedError(f"op {op}")

    def run(self, feeds: dict[str, Any]) -> list[Any]:
        torch = self.torch
        with torch.inference_mode():
            env = dict(self.env0)
            for name in self.inputs:
                env[name] = torch.from_numpy(feeds[name]).to(self.device)
            for fn, ins, outs in self.steps:
                result = fn(*[env[i] if i in env else None for i in ins if i != ""])
                env[outs[0]] = result
            return [env[n].cpu().numpy() for n in self.outputs]


# -- the table --------------------------------------------------------------------------------------
def _f(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(rows: list[Row]) -> None:
    head = (f"{'model':<16}{'ok':>4}{'module':>8}{'max abs err':>12}{'tol units':>10}{'graph ok':>9}"
            f"{'GPU ms':>9}{'graph ms':>9}{'CPU ms':>9}{'torch ms':>9}{'vs CPU':>8}{'vs torch':>9}"
            f"{'xfers':>6}{'host':>5}{'arena MiB':>10}  note")
    print(head)
    print("-" * len(head))
    for r in rows:
        best = min((t for t in (r.gpu_ms, r.graph_ms) if t is not None), default=None)
        vs_cpu = best / r.cpu_ms if best is not None and r.cpu_ms else None
        vs_torch = best / r.torch_ms if best is not None and r.torch_ms else None
        graph = "-" if r.graph_ok is None else ("yes" if r.graph_ok else "NO")
        note = "; ".join([r.torch_note] + [e.splitlines()[0][:120] for e in r.errors if e]).strip("; ")
        print(f"{r.model:<16}{'yes' if r.ok else 'NO':>4}{r.module[:8]:>8}{_f(r.max_abs_err, '.2e'):>12}"
              f"{_f(r.tol_units, '.3f'):>10}{graph:>9}{_f(r.gpu_ms, '.3f'):>9}{_f(r.graph_ms, '.3f'):>9}"
              f"{_f(r.cpu_ms, '.2f'):>9}{_f(r.torch_ms, '.3f'):>9}{_f(vs_cpu, '.3f'):>8}"
              f"{_f(vs_torch, '.2f'):>9}{r.transfers:>6}{r.host_steps:>5}{r.arena_mib:>10.1f}  {note}",
              flush=True)


def environment() -> str:
    lines = [f"python {sys.version.split()[0]}"]
    try:
        import cupy

        dev = cupy.cuda.Device()
        props = cupy.cuda.runtime.getDeviceProperties(dev.id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        runtime = cupy.cuda.runtime
        lines.append(f"GPU {name} (sm_{dev.compute_capability}), driver CUDA {runtime.driverGetVersion()}, "
                     f"runtime {runtime.runtimeGetVersion()}, cupy {cupy.__version__}")
    except Exception as exc:
        lines.append(f"cupy/GPU: unavailable ({type(exc).__name__}: {exc})")
    try:
        import torch

        lines.append(f"torch {torch.__version__} (CUDA {torch.version.cuda}, TF32 off)")
    except Exception as exc:
        lines.append(f"torch: unavailable ({exc})")
    lines.append(f"CPU path: onnx-aot target=cpu, {os.cpu_count()} threads")
    return "\n".join(lines)


def main() -> int:
    from tests.support.zoo import ZOO  # light: numpy + onnx only

    names = (*ZOO, *TRANSFORMERS)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("models", nargs="*", default=list(names), help=f"default: all of {', '.join(names)}")
    parser.add_argument("--runs", type=int, default=50, help="timed runs per measurement (median)")
    parser.add_argument("--no-torch", action="store_true", help="skip the torch comparison")
    parser.add_argument("--no-cpu", action="store_true", help="skip the CPU-path timing")
    parser.add_argument("--no-pytest", action="store_true", help="skip tests/test_cuda_runtime.py")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON to this file")
    args = parser.parse_args()
    unknown = [m for m in args.models if m not in names]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(names)}")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    print(environment(), flush=True)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            print(f"... {name}", file=sys.stderr, flush=True)
            try:
                rows.append(check_model(name, args, Path(tmp)))
            except Exception as exc:
                traceback.print_exc()
                rows.append(Row(name, errors=[f"{type(exc).__name__}: {exc}"]))
        try:
            rows.append(check_nvrtc(Path(tmp)))
        except Exception as exc:
            traceback.print_exc()
            rows.append(Row("nvrtc-fallback", errors=[f"{type(exc).__name__}: {exc}"]))
    if not args.no_pytest:
        rows.append(run_pytest())
    print()
    print_table(rows)
    failed = [r.model for r in rows if not r.ok or r.graph_ok is False or r.errors]
    print()
    for r in rows:
        for e in r.errors:
            if "\n" in e:
                print(f"--- {r.model} ---\n{e}")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    print(f"SUMMARY: {len(rows) - len(failed)}/{len(rows)} checks passed"
          + (f"; FAILED: {', '.join(failed)}" if failed else "; all outputs match onnxruntime "
             f"(rtol {RTOL}, atol {ATOL})"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
