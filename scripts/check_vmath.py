"""Check the vector math of templates/c/vmath.c.j2 over every float32 input, and time it.

The prelude every kernel unit starts with (templates/c/model.c.j2 rendered for one ``-march``:
``vf``, ``vbcast``, ``vselect`` and the vector math) is compiled with ``scripts/vmath_check.c``
and the flags of a real build (``compiler.codegen.toolchain.compile_flags``) into a small
library. For each function, all 2^32 bit patterns are run through the vector function and compared
with double-precision libm on the same input (in C, in parallel, in chunks): the maximum error in
float32 ulp of the reference (and where), the maximum absolute error, NaN disagreements and lanes
where the scalar twin (``sexp`` ...) differs from the vector result. Some composites are measured
in ulp only above an input (``ulp_from``; below it their values are tiny and only the absolute
error is meaningful). Then the throughput: ns per value of the vector function and of the scalar
libm form today's kernels use, one thread, 4096 values in cache.

The exit status is 0 when every function is within its documented bound (docs/vector-math.md).
tests/test_vmath.py runs the same library on a sample against numpy.

Usage: python scripts/check_vmath.py [--cpu native|x86-64-v2|...] [--only exp,tanh] [--quick]
       [--threads N] [--no-bench]     (--quick: every 4099th bit pattern instead of all)
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from compiler.codegen.env import render
from compiler.codegen.options import BuildOptions
from compiler.codegen.toolchain import compile_flags
from compiler.codegen.toolchain import target_info
from compiler.providers.c.provider import ABI_VERSION
from compiler.providers.c.provider import ModelContext
from runtime.errors import CompileError

__all__ = ["Function", "FUNCTIONS", "VmathLibrary", "build", "scan", "bench", "main"]

HARNESS = Path(__file__).resolve().parent / "vmath_check.c"


@dataclass(frozen=True)
class Function:
    """One vector function: its number in vmath_check.c and its documented bounds."""

    name: str
    max_ulp: float  # the bound in ulp over inputs >= ulp_from
    ulp_from: float = -np.inf  # below this input only the absolute error is bounded
    max_abs: float = np.inf  # the absolute-error bound over all inputs


# The order is vmath_check.c's function numbers; the bounds are docs/vector-math.md's table.
FUNCTIONS = (
    Function("exp", 1.5),
    Function("expm1", 2.0),
    Function("log", 1.5),
    Function("log1p", 2.0),
    Function("tanh", 2.0),
    Function("sigmoid", 2.5),
    Function("erf", 2.0),
    Function("silu", 3.5, ulp_from=-87.3, max_abs=1e-40),
    Function("softplus", 3.0),
    Function("mish", 5.0, ulp_from=-87.3, max_abs=1e-40),
    Function("gelu", 3.5, ulp_from=-1.0, max_abs=1e-7),
    Function("gelu_tanh", 3.5, ulp_from=-1.0, max_abs=1e-7),
    Function("sqrt", 0.5),
)


def _prelude(vector_bytes: int) -> str:
    ctx = ModelContext(ABI_VERSION, vector_bytes, (), (), (), "kernel")
    return render("c/model.c.j2", ctx)


class VmathLibrary:
    """The harness built for one ``-march`` and loaded with ctypes."""

    def __init__(self, path: Path, isa: str, vector_bytes: int) -> None:
        self.isa = isa
        self.lanes = vector_bytes // 4
        self._lib = ctypes.CDLL(str(path))
        self._lib.vm_scan.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_float,
                                      ctypes.c_void_p]
        self._lib.vm_eval.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        self._lib.vm_time.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                      ctypes.c_int64, ctypes.c_int64]
        self._lib.vm_time.restype = ctypes.c_double

    def eval(self, name: str, x: np.ndarray) -> np.ndarray:
        """``name`` applied to the float32 array ``x`` (full vectors, the scalar twin on the tail)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        y = np.empty_like(x)
        self._lib.vm_eval(_number(name), x.ctypes.data, y.ctypes.data, x.size)
        return y

    def scan(self, name: str, lo: int, hi: int) -> np.ndarray:
        """vm_scan's nine figures over the bit patterns [lo, hi)."""
        out = np.zeros(9)
        fn = FUNCTIONS[_number(name)]
        self._lib.vm_scan(_number(name), lo, hi, fn.ulp_from, out.ctypes.data)
        return out

    def time(self, name: str, which: int, x: np.ndarray, reps: int) -> float:
        """Seconds per value (which 0: the vector function, 1: the scalar libm form)."""
        y = np.empty_like(x)
        return float(self._lib.vm_time(_number(name), which, x.ctypes.data, y.ctypes.data, x.size, reps))


def _number(name: str) -> int:
    for i, fn in enumerate(FUNCTIONS):
        if fn.name == name:
            return i
    raise KeyError(f"no vector function {name!r}")


def build(isa: str, out_dir: Path, cc: str = "cc") -> VmathLibrary:
    """Compile the harness with the flags of a real ``-march=isa`` build into ``out_dir``."""
    import subprocess

    options = BuildOptions(cc=cc, isa=isa)
    vector_bytes = target_info(options).vector_bytes
    prelude = out_dir / f"vmath_prelude_{vector_bytes}.h"
    prelude.write_text(_prelude(vector_bytes))
    library = out_dir / f"vmath_check_{isa}.so"
    argv = [cc, *compile_flags(options), "-include", str(prelude), str(HARNESS), "-o", str(library), "-lm"]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise CompileError(f"building the vmath harness failed ({' '.join(argv)}):\n{proc.stderr[-4000:]}")
    return VmathLibrary(library, isa, vector_bytes)


def scan(lib: VmathLibrary, fn: Function, step: int = 1, chunk: int = 1 << 28) -> dict[str, float]:
    """The error figures of ``fn`` over all bit patterns (``step`` > 1: every step-th chunk start
    only, for a quick look), merged over chunks."""
    best = np.zeros(9)
    total = 1 << 32
    if step > 1:
        starts = range(0, total, step * 64)
        spans = [(s, min(s + 64, total)) for s in starts]
    else:
        spans = [(s, min(s + chunk, total)) for s in range(0, total, chunk)]
    for lo, hi in spans:
        part = lib.scan(fn.name, lo, hi)
        for k in (0, 2, 6):
            if part[k] > best[k]:
                best[k], best[k + 1] = part[k], part[k + 1]
        if part[4] and not best[4]:
            best[5] = part[5]
        best[4] += part[4]
        best[8] += part[8]
    return {
        "ulp": best[0], "ulp_at": _float_of(best[1]), "abs": best[2], "abs_at": _float_of(best[3]),
        "nan_mismatches": best[4], "nan_at": _float_of(best[5]),
        "ulp_all": best[6], "ulp_all_at": _float_of(best[7]), "twin_mismatches": best[8],
    }


def _float_of(bits: float) -> float:
    return float(np.array([int(bits)], dtype=np.uint32).view(np.float32)[0])


def bench(lib: VmathLibrary, fn: Function, n: int = 4096, reps: int = 500,
          trials: int = 9) -> tuple[float, float]:
    """(vector, libm) nanoseconds per value on inputs spread over the function's busy range, the
    best of ``trials`` runs."""
    rng = np.random.default_rng(0)
    if fn.name in ("log", "log1p"):
        x = rng.uniform(0.0, 100.0, n).astype(np.float32)
    else:
        x = rng.uniform(-10.0, 10.0, n).astype(np.float32)
    lib.time(fn.name, 0, x, reps // 10)  # warm up
    # the fastest of several runs: on a shared machine the others measure its other tenants
    vec = min(lib.time(fn.name, 0, x, reps) for _ in range(trials))
    libm = min(lib.time(fn.name, 1, x, max(1, reps // 10)) for _ in range(trials))
    return vec * 1e9, libm * 1e9


def _check(lib: VmathLibrary, fn: Function, step: int) -> bool:
    t0 = time.perf_counter()
    r = scan(lib, fn, step)
    ok = (r["ulp"] <= fn.max_ulp and r["abs"] <= fn.max_abs and r["nan_mismatches"] == 0
          and r["twin_mismatches"] == 0)
    domain = "" if fn.ulp_from == -np.inf else f" (x >= {fn.ulp_from:g}; all: {r['ulp_all']:.3g})"
    nan_at = f" (x={r['nan_at']!r})" if r["nan_mismatches"] else ""
    below = "" if fn.ulp_from == -np.inf else f"abs {r['abs']:.3g} at x={r['abs_at']:.9g} below; "
    print(f"{fn.name:10s} max {r['ulp']:.3f} ulp at x={r['ulp_at']:.9g}{domain}; "
          f"{below}NaN mismatches {int(r['nan_mismatches'])}"
          f"{nan_at}; "
          f"twin mismatches {int(r['twin_mismatches'])}; bound {fn.max_ulp:g} ulp"
          f"{'' if fn.max_abs == np.inf else f', abs {fn.max_abs:g}'}: {'ok' if ok else 'FAIL'}"
          f"  [{time.perf_counter() - t0:.0f} s]", flush=True)
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", default="native", help="-march of the build (default native)")
    parser.add_argument("--only", default="", help="comma-separated function names")
    parser.add_argument("--quick", action="store_true", help="every 4099th chunk of 64 patterns")
    parser.add_argument("--no-bench", action="store_true")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or [fn.name for fn in FUNCTIONS]
    with tempfile.TemporaryDirectory(prefix="onnx-aot-vmath-") as tmp:
        lib = build(args.cpu, Path(tmp))
        print(f"-march={args.cpu}: {lib.lanes} float lanes; {'sampled' if args.quick else 'all 2^32 inputs'}")
        ok = all([_check(lib, FUNCTIONS[_number(n)], 4099 if args.quick else 1) for n in names])
        if not args.no_bench:
            print("ns/value, one thread, 4096 values in cache, best of 9 runs: vector vs scalar libm")
            for n in names:
                vec, libm = bench(lib, FUNCTIONS[_number(n)])
                print(f"{n:10s} {vec:7.3f} ns   libm {libm:7.3f} ns   {libm / vec:5.1f}x")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
