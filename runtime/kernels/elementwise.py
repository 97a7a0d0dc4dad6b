"""Elementwise reference kernels, and the one table FusedElementwise programs draw from.

``apply_elementwise(xp, op, args, attrs)`` evaluates one elementwise op (canonical attributes,
numpy broadcasting); the plain kernels registered here and the ``onnx_aot.FusedElementwise``
kernel both call it, and the fusion pass reads the name sets to know what it may fuse.
Float32 stays float32, as in ONNX, except erf/Gelu (computed in float64 and cast back: erf has
no numpy/cupy function, and the series below wants the headroom).

The ops in ``ELEMENTWISE_REFERENCE_ONLY`` (further math, comparisons, bitwise ops, Mod,
BitShift) are kept out of the fusable sets: the C/CUDA emitters have no expression for them, and
a fused group holding one would pull its float32 neighbours off the C provider. Their float16
inputs are computed in float32 and rounded back.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from collections.abc import Sequence
from functools import reduce
from typing import Any

import numpy as np

from runtime.errors import RuntimeKernelError
from runtime.errors import UnsupportedOpError
from runtime.kernels.common import finish
from runtime.kernels.registry import Kernel
from runtime.kernels.registry import OutputSpec
from runtime.kernels.registry import register

__all__ = [
    "ELEMENTWISE_BINARY",
    "ELEMENTWISE_OPS",
    "ELEMENTWISE_REFERENCE_ONLY",
    "ELEMENTWISE_TERNARY",
    "ELEMENTWISE_UNARY",
    "ELEMENTWISE_VARIADIC",
    "apply_elementwise",
    "erf",
]

# 2/sqrt(pi) * z * sum_n c_n z^(2n), c_n = (-1)^n / (n! (2n+1)): erf's Maclaurin series; 17 terms
# leave < 1e-15 for |z| <= 1.
_ERF_SERIES = [(-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(17)]
# Numerical Recipes' erfc (Chebyshev fit, fractional error < 1.2e-7); used for |z| > 1 only,
# where erfc <= 0.16, so erf's absolute error stays below 2e-8 (5.2e-9 measured on [-6, 6]).
_ERFC_FIT = [
    -1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806,
    0.27886807, -1.13520398, 1.48851587, -0.82215223, 0.17087277,
]  # fmt: skip


def _horner(coefficients: Sequence[float], t: Any) -> Any:
    acc = coefficients[-1]
    for c in reversed(coefficients[:-1]):
        acc = acc * t + c
    return acc


def erf(xp: Any, x: Any) -> Any:
    """erf(x) in float64 (absolute error < 2e-8), for any real input dtype."""
    z = xp.asarray(x).astype(xp.float64)
    a = xp.abs(z)
    small = 2.0 / math.sqrt(math.pi) * z * _horner(_ERF_SERIES, z * z)
    t = 1.0 / (1.0 + 0.5 * a)
    erfc = t * xp.exp(-a * a + _horner(_ERFC_FIT, t))
    large = xp.where(z < 0, erfc - 1.0, 1.0 - erfc)
    return xp.where(a <= 1.0, small, large)


def _same(x: Any, y: Any) -> Any:
    """``y`` cast back to ``x``'s dtype (ops computed wider than their input)."""
    return y.astype(x.dtype) if y.dtype != x.dtype else y


def _clip(xp: Any, x: Any, lo: float, hi: float) -> Any:
    # Infinite bounds are skipped, finite ones cast to x's dtype, so integer inputs stay integer.
    if math.isfinite(lo):
        x = xp.maximum(x, xp.asarray(lo, dtype=x.dtype))
    if math.isfinite(hi):
        x = xp.minimum(x, xp.asarray(hi, dtype=x.dtype))
    return x


def _sigmoid(xp: Any, x: Any) -> Any:
    e = xp.exp(-xp.abs(x))  # never overflows
    return xp.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _softplus(xp: Any, x: Any) -> Any:
    return xp.maximum(x, 0) + xp.log1p(xp.exp(-xp.abs(x)))


def _gelu(xp: Any, x: Any, approximate: str) -> Any:
    z = x.astype(xp.float64)
    if approximate == "none":
        y = 0.5 * z * (1.0 + erf(xp, z / math.sqrt(2.0)))
    elif approximate == "tanh":
        y = 0.5 * z * (1.0 + xp.tanh(math.sqrt(2.0 / math.pi) * (z + 0.044715 * z * z * z)))
    else:
        raise UnsupportedOpError(f"Gelu: approximate={approximate!r} is not supported")
    return _same(x, y)


def _div(xp: Any, a: Any, b: Any) -> Any:
    if xp.result_type(a, b).kind not in "iu":
        return xp.divide(a, b)
    # Integer division truncates toward zero in ONNX (C semantics); floor division does not.
    q = xp.floor_divide(a, b)
    return q + ((xp.remainder(a, b) != 0) & ((a < 0) != (b < 0)))


Unary = Callable[[Any, Any, dict[str, Any]], Any]
_UNARY: dict[str, Unary] = {
    "Relu": lambda xp, x, at: xp.maximum(x, 0),
    "Sigmoid": lambda xp, x, at: _sigmoid(xp, x),
    "Tanh": lambda xp, x, at: xp.tanh(x),
    "Exp": lambda xp, x, at: xp.exp(x),
    "Log": lambda xp, x, at: xp.log(x),
    "Neg": lambda xp, x, at: xp.negative(x),
    "Abs": lambda xp, x, at: xp.abs(x),
    "Sqrt": lambda xp, x, at: xp.sqrt(x),
    "Reciprocal": lambda xp, x, at: xp.reciprocal(x),
    "Erf": lambda xp, x, at: _same(x, erf(xp, x)),
    "Floor": lambda xp, x, at: xp.floor(x),
    "Ceil": lambda xp, x, at: xp.ceil(x),
    "Softplus": lambda xp, x, at: _softplus(xp, x),
    "Sign": lambda xp, x, at: xp.sign(x),
    "Sin": lambda xp, x, at: xp.sin(x),
    "Cos": lambda xp, x, at: xp.cos(x),
    "Not": lambda xp, x, at: xp.logical_not(x),
    "Clip": lambda xp, x, at: _clip(xp, x, float(at["min"]), float(at["max"])),
    "LeakyRelu": lambda xp, x, at: xp.where(x >= 0, x, x * at["alpha"]),
    "Elu": lambda xp, x, at: xp.where(x > 0, x, at["alpha"] * xp.expm1(xp.minimum(x, 0))),
    "HardSigmoid": lambda xp, x, at: xp.clip(x * at["alpha"] + at["beta"], 0, 1),
    "Gelu": lambda xp, x, at: _gelu(xp, x, at["approximate"]),
}

Binary = Callable[[Any, Any, Any], Any]
_BINARY: dict[str, Binary] = {
    "Add": lambda xp, a, b: xp.add(a, b),
    "Sub": lambda xp, a, b: xp.subtract(a, b),
    "Mul": lambda xp, a, b: xp.multiply(a, b),
    "Div": _div,
    "Pow": lambda xp, a, b: _same(a, xp.power(a, b)),
    "Equal": lambda xp, a, b: xp.equal(a, b),
    "Less": lambda xp, a, b: xp.less(a, b),
    "Greater": lambda xp, a, b: xp.greater(a, b),
    "And": lambda xp, a, b: xp.logical_and(a, b),
    "Or": lambda xp, a, b: xp.logical_or(a, b),
}

# Variadic ops take one or more arguments, broadcast together.
_VARIADIC: dict[str, Binary] = {
    "Sum": lambda xp, a, b: xp.add(a, b),
    "Max": lambda xp, a, b: xp.maximum(a, b),
    "Min": lambda xp, a, b: xp.minimum(a, b),
    "Mean": lambda xp, a, b: xp.add(a, b),  # divided by the count below
}

ELEMENTWISE_UNARY: frozenset[str] = frozenset(_UNARY)
# Two-argument ops; the variadic ones (one or more arguments) are included.
ELEMENTWISE_BINARY: frozenset[str] = frozenset(_BINARY) | frozenset(_VARIADIC)
ELEMENTWISE_VARIADIC: frozenset[str] = frozenset(_VARIADIC)
ELEMENTWISE_TERNARY: frozenset[str] = frozenset({"Where"})
ELEMENTWISE_OPS: frozenset[str] = ELEMENTWISE_UNARY | ELEMENTWISE_BINARY | ELEMENTWISE_TERNARY


# -- reference-only elementwise ops (not fused, see the module docstring) ----------------------
def _wide(xp: Any, x: Any) -> Any:
    """``x`` in float32 when it is float16 (the formulas below round once, at the end)."""
    return x.astype(xp.float32) if x.dtype == xp.float16 else x


def _float_unary(fn: Callable[[Any, Any, dict[str, Any]], Any]) -> Unary:
    """A float op computed on ``_wide(x)`` and cast back to ``x``'s dtype."""
    return lambda xp, x, at: _same(x, fn(xp, _wide(xp, x), at))


def _isinf(xp: Any, x: Any, at: dict[str, Any]) -> Any:
    found = xp.zeros(x.shape, dtype=bool)
    if at["detect_positive"]:
        found = found | (x == math.inf)
    if at["detect_negative"]:
        found = found | (x == -math.inf)
    return found


def _shrink(xp: Any, x: Any, at: dict[str, Any]) -> Any:
    lambd, bias = at["lambd"], at["bias"]
    return xp.where(x < -lambd, x + bias, xp.where(x > lambd, x - bias, xp.zeros_like(x)))


def _unsigned(dtype: Any) -> np.dtype:
    return np.dtype(f"u{np.dtype(dtype).itemsize}")


def _bitshift(xp: Any, a: Any, b: Any, at: dict[str, Any]) -> Any:
    """ONNX BitShift: a shift by < 0 or >= the bit width leaves only the sign fill (-1 or 0)."""
    a, b = xp.broadcast_arrays(a, b)
    bits = 8 * a.dtype.itemsize
    valid = (b >= 0) & (b < bits)
    amount = xp.where(valid, b, 0).astype(_unsigned(a.dtype))
    signed = a.dtype.kind == "i"
    if at["direction"] == "RIGHT":  # arithmetic for signed types
        shifted = xp.right_shift(a, amount.astype(a.dtype))
        fill = xp.right_shift(a, bits - 1) if signed else xp.zeros_like(a)
    else:  # shift the two's-complement bits, discarding what passes the sign bit
        shifted = xp.left_shift(a.astype(amount.dtype), amount).astype(a.dtype)
        fill = xp.zeros_like(a)
    return xp.where(valid, shifted, fill)


_UNARY_REF: dict[str, Unary] = {
    "Round": lambda xp, x, at: xp.rint(x),  # half to even
    "IsNaN": lambda xp, x, at: xp.isnan(x),
    "IsInf": _isinf,
    "BitwiseNot": lambda xp, x, at: xp.invert(x),
    "Tan": _float_unary(lambda xp, x, at: xp.tan(x)),
    "Asin": _float_unary(lambda xp, x, at: xp.arcsin(x)),
    "Acos": _float_unary(lambda xp, x, at: xp.arccos(x)),
    "Atan": _float_unary(lambda xp, x, at: xp.arctan(x)),
    "Sinh": _float_unary(lambda xp, x, at: xp.sinh(x)),
    "Cosh": _float_unary(lambda xp, x, at: xp.cosh(x)),
    "Asinh": _float_unary(lambda xp, x, at: xp.arcsinh(x)),
    "Acosh": _float_unary(lambda xp, x, at: xp.arccosh(x)),
    "Atanh": _float_unary(lambda xp, x, at: xp.arctanh(x)),
    "Softsign": _float_unary(lambda xp, x, at: x / (1 + xp.abs(x))),
    "Mish": _float_unary(lambda xp, x, at: x * xp.tanh(_softplus(xp, x))),
    "HardSwish": _float_unary(lambda xp, x, at: x * xp.clip(x / 6 + 0.5, 0, 1)),
    "Swish": _float_unary(lambda xp, x, at: x * _sigmoid(xp, at["alpha"] * x)),
    "ThresholdedRelu": _float_unary(lambda xp, x, at: xp.where(x > at["alpha"], x, 0)),
    "Selu": _float_unary(
        lambda xp, x, at: at["gamma"] * xp.where(x > 0, x, at["alpha"] * xp.expm1(xp.minimum(x, 0)))
    ),
    "Celu": _float_unary(
        lambda xp, x, at: xp.maximum(x, 0) + at["alpha"] * xp.expm1(xp.minimum(x, 0) / at["alpha"])
    ),
    "Shrink": lambda xp, x, at: _same(x, _shrink(xp, _wide(xp, x), at)),
}

BinaryWithAttrs = Callable[[Any, Any, Any, dict[str, Any]], Any]
_BINARY_REF: dict[str, BinaryWithAttrs] = {
    "GreaterOrEqual": lambda xp, a, b, at: xp.greater_equal(a, b),
    "LessOrEqual": lambda xp, a, b, at: xp.less_equal(a, b),
    "Xor": lambda xp, a, b, at: xp.logical_xor(a, b),
    "BitwiseAnd": lambda xp, a, b, at: xp.bitwise_and(a, b),
    "BitwiseOr": lambda xp, a, b, at: xp.bitwise_or(a, b),
    "BitwiseXor": lambda xp, a, b, at: xp.bitwise_xor(a, b),
    "BitShift": _bitshift,
    # fmod=0: the result takes the divisor's sign (floor); fmod=1: the dividend's (truncation).
    "Mod": lambda xp, a, b, at: xp.fmod(a, b) if at["fmod"] else xp.mod(a, b),
    "PRelu": lambda xp, x, slope, at: xp.where(x > 0, x, x * slope),  # slope broadcasts to x
}

# Elementwise ops the reference kernels run but the fusion pass must not take.
ELEMENTWISE_REFERENCE_ONLY: frozenset[str] = frozenset(_UNARY_REF) | frozenset(_BINARY_REF)


def _arity(op: str, args: Sequence[Any], want: int) -> None:
    if len(args) != want:
        raise RuntimeKernelError(f"{op}: takes {want} argument(s), got {len(args)}")


def apply_elementwise(xp: Any, op: str, args: Sequence[Any], attrs: dict[str, Any]) -> Any:
    """Evaluate elementwise ``op`` on ``args`` (numpy broadcasting) with canonical ``attrs``."""
    if op in _UNARY:
        _arity(op, args, 1)
        return _UNARY[op](xp, args[0], attrs)
    if op in _VARIADIC:
        if not args:
            raise RuntimeKernelError(f"{op}: takes at least one argument")
        fn = _VARIADIC[op]
        total = reduce(lambda a, b: fn(xp, a, b), args[1:], args[0])
        if op == "Mean":
            total = _same(args[0], xp.divide(total, len(args)))
        return total
    if op in _BINARY:
        _arity(op, args, 2)
        return _BINARY[op](xp, args[0], args[1])
    if op in _UNARY_REF:
        _arity(op, args, 1)
        return _UNARY_REF[op](xp, args[0], attrs)
    if op in _BINARY_REF:
        _arity(op, args, 2)
        return _BINARY_REF[op](xp, args[0], args[1], attrs)
    if op == "Where":
        _arity(op, args, 3)
        return xp.where(args[0], args[1], args[2])
    raise UnsupportedOpError(f"{op!r} is not an elementwise op the reference kernels know")


def _elementwise_kernel(op: str) -> Kernel:
    def kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
        y = apply_elementwise(xp, op, inputs, attrs)
        return finish(xp, op, [y], outputs, broadcast=True)

    kernel.__name__ = kernel.__qualname__ = f"elementwise_{op}"
    kernel.__doc__ = f"Reference kernel for {op} (see apply_elementwise)."
    return kernel


for _op in sorted(ELEMENTWISE_OPS | ELEMENTWISE_REFERENCE_ONLY):
    register(_op)(_elementwise_kernel(_op))
