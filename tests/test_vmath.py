"""The vector math of templates/c/vmath.c.j2 on a sample, against numpy float64.

``scripts/check_vmath.py`` checks every float32 input; here 1.1 million per function: NaN, +-Inf,
+-0, denormals, the overflow / underflow / saturation thresholds and their neighbours, random bit
patterns and dense values where each function is busy -- for the x86-64-v2 build (4 lanes, no FMA)
and the host's native build, within the bounds of docs/vector-math.md (``FUNCTIONS``). The C forms
kernels get from compiler/codegen/vmath.py, and the generated text for an explicit ``--cpu``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from compiler.codegen.env import render
from compiler.codegen.vmath import VECTOR_MATH_OPS
from compiler.codegen.vmath import scalar_math_expr
from compiler.codegen.vmath import vector_math_expr
from compiler.providers.c.provider import ABI_VERSION
from compiler.providers.c.provider import ModelContext
from scripts.check_vmath import FUNCTIONS
from scripts.check_vmath import Function
from scripts.check_vmath import VmathLibrary
from scripts.check_vmath import build
from tests.cpu_targets import host_runs

_THRESHOLDS = (88.72283, 88.722839, 88.7228394, 89.0, -87.33654, -87.3365479, -103.972076, -103.97208,
               -103.972084, -104.0, 9.01, 3.9192059, 0.921875, 0.5493061, 0.34657359, -17.32868, 20.0,
               -4.0 * math.sqrt(2.0), -5.65, -9.0, 16.6355324, 1.0, -1.0, 2.0, 0.5, 1e-30, 2.0**-25)


def _sample(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    info = np.finfo(np.float32)
    special = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, info.tiny, info.smallest_subnormal,
                        info.tiny - info.smallest_subnormal, info.max, info.eps], np.float32)
    near = np.array(_THRESHOLDS, np.float32)
    steps = np.arange(-40, 41, dtype=np.int32)
    around = (near.view(np.int32)[:, None] + steps).ravel().view(np.float32)
    parts = [special, -special, around, -around,
             rng.integers(0, 2**32, 600_000, dtype=np.uint64).astype(np.uint32).view(np.float32),
             rng.uniform(-20.0, 20.0, 300_000).astype(np.float32),
             rng.uniform(-2.0, 2.0, 100_000).astype(np.float32),
             (rng.standard_normal(100_000) * 1e-3).astype(np.float32),
             rng.uniform(-110.0, 100.0, 50_000).astype(np.float32)]
    return np.concatenate(parts)


def _erf(x: np.ndarray) -> np.ndarray:
    return np.frompyfunc(math.erf, 1, 1)(x).astype(np.float64)


def _erfc(x: np.ndarray) -> np.ndarray:
    return np.frompyfunc(math.erfc, 1, 1)(x).astype(np.float64)


def _reference(name: str, x: np.ndarray) -> np.ndarray:
    """float64 numpy on the float32 inputs (the formulas of scripts/vmath_check.c)."""
    sp = np.logaddexp(0.0, x)
    u = 0.7978845608028654 * (x + 0.044715 * x**3)
    table = {
        "exp": lambda: np.exp(x), "expm1": lambda: np.expm1(x), "log": lambda: np.log(x),
        "log1p": lambda: np.log1p(x), "tanh": lambda: np.tanh(x), "sigmoid": lambda: 1.0 / (1.0 + np.exp(-x)),
        "erf": lambda: _erf(x), "silu": lambda: x / (1.0 + np.exp(-x)), "softplus": lambda: sp,
        "mish": lambda: x * np.tanh(sp), "gelu": lambda: 0.5 * x * _erfc(-x * 0.7071067811865476),
        "gelu_tanh": lambda: x / (1.0 + np.exp(-2.0 * u)),
        "sqrt": lambda: np.sqrt(x),
    }
    return table[name]()


def _ulp_error(y: np.ndarray, r: np.ndarray) -> np.ndarray:
    """|y - r| in float32 ulp of r; 0 where both are NaN or the same infinity, inf on a NaN or an
    infinity that the rounded reference does not have (scripts/vmath_check.c's ulp_error)."""
    rf = r.astype(np.float32)
    err = np.zeros(r.shape)
    nan = np.isnan(r) | np.isnan(y)
    inf = ~nan & (np.isinf(rf) | np.isinf(y))
    err[nan] = np.where(np.isnan(r[nan]) & np.isnan(y[nan]), 0.0, np.inf)
    err[inf] = np.where(y[inf] == rf[inf], 0.0, np.inf)
    ok = ~nan & ~inf
    exponent = np.frexp(r[ok])[1]
    ulp = np.ldexp(1.0, np.maximum(exponent - 1, -126) - 23)
    err[ok] = np.abs(y[ok].astype(np.float64) - r[ok]) / ulp
    return err


_TARGETS = ["x86-64-v2", "native"]


@pytest.fixture(scope="module", params=_TARGETS)
def library(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> VmathLibrary:
    isa = request.param
    lib = build(isa, tmp_path_factory.mktemp(f"vmath-{isa}"))
    if isa != "native" and not host_runs(isa):
        pytest.skip(f"this host does not run {isa} code")
    return lib


@pytest.fixture(scope="module")
def sample() -> np.ndarray:
    return _sample()


@pytest.mark.parametrize("fn", FUNCTIONS, ids=[fn.name for fn in FUNCTIONS])
def test_within_documented_bound(library: VmathLibrary, sample: np.ndarray, fn: Function) -> None:
    y = library.eval(fn.name, sample)
    with np.errstate(all="ignore"):
        r = _reference(fn.name, sample.astype(np.float64))
        err = _ulp_error(y, r)
    in_ulp = ~(sample < fn.ulp_from)
    worst = int(np.argmax(np.where(in_ulp, err, 0.0)))
    assert err[in_ulp].max() <= fn.max_ulp, (
        f"{fn.name} ({library.isa}): {err[worst]:.3f} ulp at x={sample[worst]!r} "
        f"(got {y[worst]!r}, float64 {r[worst]!r}); bound {fn.max_ulp}")
    assert np.array_equal(np.isnan(y), np.isnan(r)), f"{fn.name}: NaN where float64 has none or v.v."
    with np.errstate(over="ignore"):
        below = ~in_ulp & np.isfinite(r.astype(np.float32))
    if below.any():
        assert np.abs(y[below] - r[below]).max() <= fn.max_abs


def test_specials(library: VmathLibrary) -> None:
    inf, nan = np.float32(np.inf), np.float32(np.nan)
    x = np.array([inf, -inf, 0.0, -0.0, nan, 100.0, -200.0], np.float32)
    got = {fn.name: library.eval(fn.name, x) for fn in FUNCTIONS}
    np.testing.assert_array_equal(got["exp"], [inf, 0, 1, 1, nan, inf, 0])
    np.testing.assert_array_equal(got["expm1"], [inf, -1, 0, -0.0, nan, inf, -1])
    np.testing.assert_array_equal(got["log"], [inf, nan, -inf, -inf, nan, np.log(np.float32(100)), nan])
    np.testing.assert_array_equal(got["tanh"], [1, -1, 0, -0.0, nan, 1, -1])
    np.testing.assert_array_equal(got["sigmoid"], [1, 0, 0.5, 0.5, nan, 1, 0])
    np.testing.assert_array_equal(got["erf"], [1, -1, 0, -0.0, nan, 1, -1])
    for name in ("expm1", "tanh", "erf", "log1p"):  # odd near 0: the sign of zero is kept
        assert np.signbit(library.eval(name, np.array([-0.0], np.float32))[0]), name
    assert library.eval("log1p", np.array([-1.0], np.float32))[0] == -inf
    # denormal results: exp and sigmoid round them, not flush them
    assert library.eval("exp", np.array([-100.0], np.float32))[0] == np.float32(math.exp(-100.0))
    assert library.eval("sigmoid", np.array([-100.0], np.float32))[0] == np.float32(math.exp(-100.0))


def test_scalar_twin_equals_vector_lane(library: VmathLibrary, sample: np.ndarray) -> None:
    """vm_eval runs whole vectors and then the s-twins on the tail: both give the same bits (a NaN
    may differ in sign and payload)."""
    lanes = library.lanes
    x = sample[: 64 * lanes + lanes - 1]
    for fn in FUNCTIONS:
        tail = library.eval(fn.name, x)  # the last lanes - 1 values through the scalar twin
        padded = np.concatenate([x, np.zeros(1, np.float32)])
        whole = library.eval(fn.name, padded)[:-1]  # every value through a full vector
        same = (tail.view(np.uint32) == whole.view(np.uint32)) | (np.isnan(tail) & np.isnan(whole))
        assert same.all(), f"{fn.name}: twin differs at x={x[~same][:4]!r}"


@pytest.mark.parametrize("cpu", ["x86-64-v2", "x86-64-v4"])
def test_prelude_text_builds_from_vector_extensions_only(cpu: str) -> None:
    vector_bytes = {"x86-64-v2": 16, "x86-64-v4": 64}[cpu]
    text = render("c/model.c.j2", ModelContext(ABI_VERSION, vector_bytes, (), (), (), "kernel"))
    assert f"vector_size({vector_bytes})" in text
    for fn in FUNCTIONS:
        assert f"static inline vf v{fn.name}(vf x)" in text
        assert f"static inline float s{fn.name}(float x)" in text
    for banned in ("immintrin", "_mm", "expf(", "tanhf(", "erff(", "logf("):
        assert banned not in text, banned


def test_expressions_for_kernels() -> None:
    assert vector_math_expr("Sigmoid", "v") == "vsigmoid(v)"
    assert scalar_math_expr("Sigmoid", "s") == "ssigmoid(s)"
    assert vector_math_expr("Gelu", "v", {"approximate": "tanh"}) == "vgelu_tanh(v)"
    assert vector_math_expr("Gelu", "v", {"approximate": "none"}) == "vgelu(v)"
    elu = vector_math_expr("Elu", "v", {"alpha": 0.5})
    assert elu == "vselect(v < vbcast(0.0f), (vbcast(0.5f) * vexpm1(v)), v)"
    selu = scalar_math_expr("Selu", "s", {"alpha": 2.0, "gamma": 3.0})
    assert selu == "(3.0f * (s < 0.0f ? (2.0f * sexpm1(s)) : s))"
    assert {"Exp", "Log", "Tanh", "Erf", "Softplus", "Mish", "SiLU"} <= VECTOR_MATH_OPS
    with pytest.raises(KeyError, match="no vector-math form"):
        vector_math_expr("Sin", "v")
    with pytest.raises(KeyError):
        vector_math_expr("Elu", "v", {})


_FORMS = {  # op, attrs -> the harness function computing the same values
    ("Sigmoid", ()): "sigmoid", ("Tanh", ()): "tanh", ("Exp", ()): "exp", ("Log", ()): "log",
    ("Erf", ()): "erf", ("Softplus", ()): "softplus", ("Mish", ()): "mish", ("SiLU", ()): "silu",
    ("Gelu", (("approximate", "none"),)): "gelu", ("Gelu", (("approximate", "tanh"),)): "gelu_tanh",
    ("Sqrt", ()): "sqrt",
}


def test_kernel_forms_compile_and_match(tmp_path: Path) -> None:
    """Every form of compiler/codegen/vmath.py compiled in a vector loop with a scalar tail
    (x86-64-v2 flags of a real build): the values are the harness's, Elu and Selu numpy's."""
    import ctypes
    import subprocess

    from compiler.codegen.options import BuildOptions
    from compiler.codegen.toolchain import compile_flags

    ops = [*_FORMS, ("Elu", (("alpha", 0.5),)), ("Selu", (("alpha", 1.5), ("gamma", 2.0)))]
    bodies = []
    for k, (op, attrs) in enumerate(ops):
        bodies.append(
            f"__attribute__((visibility(\"default\"))) void form{k}(const float* x, float* y, int n)\n"
            f"{{\n  int i = 0;\n  for (; i + 4 <= n; i += 4) {{\n    const vf v = vload(x + i);\n"
            f"    vstore(y + i, {vector_math_expr(op, 'v', dict(attrs))});\n  }}\n"
            f"  for (; i < n; i++) {{\n    const float s = x[i];\n"
            f"    y[i] = {scalar_math_expr(op, 's', dict(attrs))};\n  }}\n}}\n")
    source = tmp_path / "forms.c"
    source.write_text(render("c/model.c.j2", ModelContext(ABI_VERSION, 16, tuple(bodies), (), (), "kernel")))
    options = BuildOptions(isa="x86-64-v2")
    argv = ["cc", *compile_flags(options), str(source), "-o", str(tmp_path / "forms.so"), "-lm"]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    if not host_runs("x86-64-v2"):
        pytest.skip("this host does not run x86-64-v2 code")
    forms = ctypes.CDLL(str(tmp_path / "forms.so"))
    lib = build("x86-64-v2", tmp_path)
    x = np.concatenate([_sample(1)[:4001], np.array([-2.5, -0.0, 3.0], np.float32)])
    for k, (op, attrs) in enumerate(ops):
        y = np.empty_like(x)
        getattr(forms, f"form{k}")(ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(y.ctypes.data), x.size)
        if (op, attrs) in _FORMS:
            expected = lib.eval(_FORMS[op, attrs], x)
        else:
            a = dict(attrs)
            with np.errstate(all="ignore"):
                expected = (np.float32(a.get("gamma", 1.0))
                            * np.where(x < 0, np.float32(a["alpha"]) * lib.eval("expm1", x), x))
        np.testing.assert_array_equal(y.view(np.uint32), expected.astype(np.float32).view(np.uint32),
                                      err_msg=op)
