"""C calls of the vector math (templates/c/vmath.c.j2) for the ops and activations built on it.

``vector_math_expr("Sigmoid", "v")`` is ``vsigmoid(v)``: a C expression over a ``vf`` variable
(model.c.j2's vector type) that the kernels' vector loops can evaluate in place of scalar libm;
``scalar_math_expr`` is the same op on a ``float`` variable through the scalar twins (``ssigmoid``),
which return lane 0 of the vector function, so a loop's scalar tail computes exactly what its full
vectors would. The variable is named, not an expression: some forms (Elu, Selu) read it twice.
Error bounds of each function: docs/vector-math.md (``scripts/check_vmath.py`` measures them over
all float32 inputs). "SiLU" is not an ONNX op but the ``x * Sigmoid(x)`` pattern, for fusions.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from compiler.codegen.elementwise import literal

__all__ = ["VECTOR_MATH_OPS", "vector_math_expr", "scalar_math_expr"]


@dataclass(frozen=True)
class _Lang:
    """How one flavour (vector or scalar) spells a call, a constant and a negative-select."""

    prefix: str  # "v" or "s": vexp / sexp

    def call(self, name: str, x: str) -> str:
        return f"{self.prefix}{name}({x})"

    def const(self, value: float) -> str:
        return f"vbcast({literal(value)})" if self.prefix == "v" else literal(value)

    def if_negative(self, x: str, then: str, other: str) -> str:
        """``then`` where x < 0, else ``other`` (NaN takes ``other``, like the scalar ``?:``)."""
        if self.prefix == "v":
            return f"vselect({x} < vbcast(0.0f), {then}, {other})"
        return f"({x} < 0.0f ? {then} : {other})"


def _gelu(x: str, a: Mapping[str, Any], lang: _Lang) -> str:
    approximate = a["approximate"]
    if approximate not in ("none", "tanh"):
        raise KeyError(f"Gelu approximate={approximate!r} has no vector form")
    return lang.call("gelu_tanh" if approximate == "tanh" else "gelu", x)


def _elu(x: str, a: Mapping[str, Any], lang: _Lang) -> str:
    return lang.if_negative(x, f"({lang.const(a['alpha'])} * {lang.call('expm1', x)})", x)


def _selu(x: str, a: Mapping[str, Any], lang: _Lang) -> str:
    return f"({lang.const(a['gamma'])} * {_elu(x, a, lang)})"


_SIMPLE = {
    "Exp": "exp", "Log": "log", "Tanh": "tanh", "Sigmoid": "sigmoid", "Erf": "erf",
    "Softplus": "softplus", "Mish": "mish", "SiLU": "silu", "Sqrt": "sqrt",
}
_WITH_ATTRS: dict[str, Callable[[str, Mapping[str, Any], _Lang], str]] = {
    "Gelu": _gelu, "Elu": _elu, "Selu": _selu,
}

# The ops (and the SiLU pattern) with a vector-math form.
VECTOR_MATH_OPS = frozenset(_SIMPLE) | frozenset(_WITH_ATTRS)


def _expr(op: str, x: str, attrs: Mapping[str, Any] | None, lang: _Lang) -> str:
    if op in _SIMPLE:
        return lang.call(_SIMPLE[op], x)
    if op in _WITH_ATTRS:
        return _WITH_ATTRS[op](x, {} if attrs is None else attrs, lang)
    raise KeyError(f"op {op!r} has no vector-math form (have: {', '.join(sorted(VECTOR_MATH_OPS))})")


def vector_math_expr(op: str, x: str, attrs: Mapping[str, Any] | None = None) -> str:
    """``op`` applied to the ``vf`` variable ``x`` (attributes as the canonical node carries them:
    Elu ``alpha``, Selu ``alpha`` and ``gamma``, Gelu ``approximate``)."""
    return _expr(op, x, attrs, _Lang("v"))


def scalar_math_expr(op: str, x: str, attrs: Mapping[str, Any] | None = None) -> str:
    """``op`` applied to the ``float`` variable ``x``, bit for bit lane 0 of ``vector_math_expr``."""
    return _expr(op, x, attrs, _Lang("s"))
