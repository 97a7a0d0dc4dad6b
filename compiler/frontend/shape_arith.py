"""Shape arithmetic over symbols, computed exactly: the ops a shape computation is made of, run on
expressions (``runtime/symbolic.py``) instead of sampled and fitted.

A model that pads its width up to a multiple of 32 computes ``Shape -> Gather -> Add 31 -> Div 32 ->
Mul 32 -> Sub`` on the shape tensor. Fitted from probe sizes (``probing.py``), ``(W + 31) // 32``
is ambiguous: every offset from 24 to 31 gives the same values at most sizes, and the fit's pick
is wrong where no probe lands on a boundary (``W % 32 == 1``). Here each node of such a
computation is evaluated once on object arrays whose elements are ints and expressions, with
ONNX's semantics:

- ``Shape``, ``Gather``, ``Reshape`` (Squeeze / Unsqueeze / Flatten), ``Concat``, ``Slice`` and
  ``Identity`` move elements;
- ``Add``, ``Sub``, ``Mul``, ``Neg``, ``Max``, ``Min``, ``Sum`` are exact on expressions;
- integer ``Div`` truncates toward zero: ``floordiv`` where the numerator is never negative over
  the ranges (its negation's where it is never positive), by a constant divisor; ``Mod`` takes the
  divisor's sign (``fmod=0``) or the dividend's (``fmod=1``, where its sign is known); ``Abs``
  where the sign is known;
- ``Cast`` between integer types keeps the value where the type holds its bounds; to a float type
  where the float holds every integer of its bounds exactly;
- float values are kept as exact fractions ``num / den``: a product by a constant (every float is
  ``p / 2**k``) or a sum is exact where the result's numerator fits the mantissa; a quotient by a
  whole constant ``d`` is rounded once by the float division, and ``Floor`` / ``Ceil`` / ``Cast``
  to an integer of it are still exact where ``|num| + d < 2**mantissa`` (the rounded quotient
  cannot cross an integer: its distance to one is at least ``1/d``, more than half an ulp there).

Anything else (a comparison, ``Where``, a float op with no exact rule, a divisor that is an
expression, a sign not known over the ranges) leaves the node to the probes, whose fit is then
verified (``fit_check.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import partial
from typing import Any

import numpy as np

from compiler.ir.graph import Node
from compiler.ir.graph import Value
from runtime.symbolic import Dim
from runtime.symbolic import Expr
from runtime.symbolic import bounds
from runtime.symbolic import ceildiv
from runtime.symbolic import floordiv
from runtime.symbolic import max_
from runtime.symbolic import min_
from runtime.symbolic import mod

__all__ = ["fold_exact"]

Ranges = Mapping[str, tuple[int, int]]
_MANTISSA = {"float32": 24, "float64": 53}


class _Refuse(Exception):
    """The node has no exact rule here: the probes take it."""


@dataclass(frozen=True)
class _Frac:
    """``num / den`` (``den > 1``) held by a float tensor; ``exact``: the float holds it exactly
    (else it is one correctly rounded division, only ever rounded to an integer next)."""

    num: Dim
    den: int
    exact: bool


def fold_exact(nodes: Sequence[Node], outputs: Sequence[Value],
               ranges: Ranges) -> dict[str, np.ndarray] | None:
    """``outputs`` of the canonical ``nodes`` (inputs known, some symbolic) as object arrays of
    ints and expressions, computed exactly; None where some node has no exact rule."""
    results: dict[int, np.ndarray] = {}
    try:
        for node in nodes:
            rule = _RULES.get(node.kind)
            if rule is None or any(v.shape is None or any(isinstance(d, Expr) for d in v.shape)
                                   for v in node.outputs):
                raise _Refuse(node.kind)
            args = [None if v is None else results[id(v)] if id(v) in results else _known(node, v)
                    for v in node.inputs]
            out = node.outputs[0]
            array = np.asarray(rule(node, args, ranges), dtype=object).reshape(out.shape)
            results[id(out)] = _each(array, partial(_check, out=out, ranges=ranges))
    except (_Refuse, TypeError, ValueError, IndexError, ZeroDivisionError):
        return None
    folded = {}
    for value in outputs:
        if id(value) not in results:
            return None
        array = results[id(value)]
        if any(isinstance(x, _Frac) for x in array.reshape(-1)):
            return None  # (a fraction as a result: the probes decide, and folding refuses it)
        folded[value.name] = array if any(isinstance(x, Expr) for x in array.reshape(-1)) else \
            array.astype(value.dtype)
    return folded


def _each(array: np.ndarray, fn: Callable[[Any], Any]) -> np.ndarray:
    """``fn`` of every element of object array ``array``, in its shape."""
    return np.array([fn(x) for x in array.reshape(-1)], dtype=object).reshape(array.shape)


def _known(node: Node, value: Value) -> np.ndarray:
    """A compile-time input as an object array (ints for integer and whole float elements,
    fractions for the other floats; a Shape's input is read through its shape only)."""
    if node.kind == "Shape":
        return np.empty(0, object)
    if value.const is None:
        raise _Refuse("input not known")
    const = value.const
    if const.dtype == object:
        return const
    if const.dtype.kind in "iu":
        return np.array([int(x) for x in const.reshape(-1)], dtype=object).reshape(const.shape)
    if const.dtype.kind != "f" or not np.all(np.isfinite(const)):
        raise _Refuse("not an integer or finite float constant")
    return np.array([_from_float(float(x)) for x in const.reshape(-1)], dtype=object).reshape(const.shape)


def _from_float(x: float) -> Dim | _Frac:
    f = Fraction(x)
    return f.numerator if f.denominator == 1 else _Frac(f.numerator, f.denominator, True)


def _check(x: Any, out: Value, ranges: Ranges) -> Any:
    """``x`` as ``out``'s dtype holds it, or _Refuse where that dtype might not."""
    dtype = out.dtype
    assert dtype is not None
    if dtype.kind in "iu":
        if isinstance(x, _Frac):
            raise _Refuse("a fraction in an integer tensor")
        lo, hi = bounds(x, ranges)
        info = np.iinfo(dtype)
        if lo < info.min or hi > info.max:
            raise _Refuse(f"{x} may not fit {dtype}")
        return x
    bits = _MANTISSA.get(dtype.name)
    if bits is None:
        raise _Refuse(f"{dtype} values")
    num = x.num if isinstance(x, _Frac) else x
    lo, hi = bounds(num, ranges)
    if max(-lo, hi) >= 2**bits:
        raise _Refuse(f"{x} may not be exact in {dtype}")
    return x


def _mantissa(value: Value) -> int:
    bits = _MANTISSA.get(value.dtype.name if value.dtype is not None else "")
    if bits is None:
        raise _Refuse("not a float32 / float64 tensor")
    return bits


def _sign(x: Dim, ranges: Ranges) -> int:
    """1 where ``x >= 0`` over the ranges, -1 where ``x <= 0``; _Refuse where it can be either."""
    lo, hi = bounds(x, ranges)
    if lo >= 0:
        return 1
    if hi <= 0:
        return -1
    raise _Refuse(f"the sign of {x} is not known over the ranges")


def _as_parts(x: Any) -> tuple[Dim, int]:
    if isinstance(x, _Frac):
        if not x.exact:
            raise _Refuse("a rounded quotient used other than by rounding")
        return x.num, x.den
    return x, 1


def _frac(num: Dim, den: int, exact: bool = True) -> Dim | _Frac:
    if den < 0:
        num, den = -num, -den
    if not isinstance(num, Expr):
        g = math.gcd(num, den)
        num, den = num // g, den // g
    return num if den == 1 else _Frac(num, den, exact)


def _add(a: Any, b: Any) -> Any:
    (n1, d1), (n2, d2) = _as_parts(a), _as_parts(b)
    den = d1 * d2 // math.gcd(d1, d2)
    return _frac(n1 * (den // d1) + n2 * (den // d2), den)


def _mul(a: Any, b: Any) -> Any:
    (n1, d1), (n2, d2) = _as_parts(a), _as_parts(b)
    return _frac(n1 * n2, d1 * d2)


def _int_div(a: Any, b: Any, ranges: Ranges) -> Dim:
    """ONNX's integer Div: truncation toward zero."""
    if isinstance(b, Expr) or isinstance(a, _Frac) or isinstance(b, _Frac):
        raise _Refuse("a division by an expression")
    if b == 0:
        raise _Refuse("division by zero")
    sign = _sign(a, ranges)  # trunc(a / b) == sign(a) * sign(b) * (|a| // |b|)
    return floordiv(sign * a, abs(b)) * sign * (1 if b > 0 else -1)


def _float_div(a: Any, b: Any, bits: int, ranges: Ranges) -> Any:
    """A float quotient by a whole constant: exact where it is a power of two, else one rounding."""
    if isinstance(b, (Expr, _Frac)) or isinstance(a, _Frac) or b == 0:
        raise _Refuse("a float division other than of a whole value by a whole constant")
    if abs(b) & (abs(b) - 1) == 0:  # a power of two: the quotient is exact
        return _frac(a, b)
    lo, hi = bounds(a, ranges)
    if max(-lo, hi) + abs(b) >= 2**bits:
        raise _Refuse("a rounded quotient that may cross an integer")
    return _frac(a, b, exact=False)


def _round(x: Any, how: str, ranges: Ranges) -> Dim:
    """``floor`` / ``ceil`` / ``trunc`` of an element."""
    if not isinstance(x, _Frac):
        return x
    if how == "trunc":
        how = "floor" if _sign(x.num, ranges) > 0 else "ceil"
    return floordiv(x.num, x.den) if how == "floor" else ceildiv(x.num, x.den)


def _elementwise(fn: Callable[..., Any]) -> Callable[[Node, list[Any], Ranges], np.ndarray]:
    def rule(node: Node, args: list[Any], ranges: Ranges) -> np.ndarray:
        arrays = np.broadcast_arrays(*[np.asarray(a, dtype=object) for a in args if a is not None])
        flat = [fn(node, ranges, *items) for items in zip(*(a.reshape(-1) for a in arrays), strict=True)]
        return np.array(flat, dtype=object).reshape(arrays[0].shape)
    return rule


def _is_float(node: Node) -> bool:
    return node.outputs[0].dtype is not None and node.outputs[0].dtype.kind == "f"


def _div(node: Node, ranges: Ranges, a: Any, b: Any) -> Any:
    return _float_div(a, b, _mantissa(node.outputs[0]), ranges) if _is_float(node) else _int_div(a, b, ranges)


def _mod(node: Node, ranges: Ranges, a: Any, b: Any) -> Any:
    if _is_float(node) or isinstance(b, (Expr, _Frac)) or isinstance(a, _Frac) or b == 0:
        raise _Refuse("Mod other than of an integer by a constant")
    if node.attrs.get("fmod", 0):  # C's fmod: the dividend's sign
        return mod(a, abs(b)) if _sign(a, ranges) > 0 else -mod(-a, abs(b))
    return mod(a, b) if b > 0 else -mod(-a, -b)


def _extremum(kind: str) -> Callable[..., Any]:
    def fn(node: Node, ranges: Ranges, *items: Any) -> Any:
        if any(isinstance(x, _Frac) for x in items):
            raise _Refuse("min / max of fractions")
        return (min_ if kind == "min" else max_)(*items)
    return fn


def _variadic(fn: Callable[..., Any], node: Node, args: list[Any], ranges: Ranges) -> np.ndarray:
    present = [a for a in args if a is not None]
    result = present[0]
    for other in present[1:]:
        result = _elementwise(fn)(node, [result, other], ranges)
    return np.asarray(result, dtype=object)


def _cast(node: Node, args: list[Any], ranges: Ranges) -> np.ndarray:
    out = node.outputs[0]
    assert out.dtype is not None
    source = node.inputs[0].dtype if node.inputs[0] is not None else None
    if out.dtype.kind == "b" or source is None or source.kind not in "iuf":
        raise _Refuse("a cast to or from bool")
    array = np.asarray(args[0], dtype=object)
    if out.dtype.kind in "iu":
        return _each(array, lambda x: _round(x, "trunc", ranges))
    _mantissa(out)
    if any(isinstance(x, _Frac) and not x.exact for x in array.reshape(-1)):
        raise _Refuse("a rounded quotient cast to another float type")
    return array


def _rounding(how: str) -> Callable[[Node, list[Any], Ranges], np.ndarray]:
    def rule(node: Node, args: list[Any], ranges: Ranges) -> np.ndarray:
        return _each(np.asarray(args[0], dtype=object), lambda x: _round(x, how, ranges))
    return rule


def _abs(node: Node, ranges: Ranges, x: Any) -> Any:
    num, den = _as_parts(x)
    return x if _sign(num, ranges) > 0 else _frac(-num, den)


def _shape(node: Node, args: list[Any], ranges: Ranges) -> np.ndarray:
    x = node.inputs[0]
    assert x is not None and x.shape is not None
    return np.array(list(x.shape)[node.attrs["start"]:node.attrs["end"]], dtype=object)


def _slice(node: Node, args: list[Any], ranges: Ranges) -> np.ndarray:
    array = np.asarray(args[0], dtype=object)
    index = [slice(None)] * array.ndim
    attrs = node.attrs
    for axis, start, end, step in zip(attrs["axes"], attrs["starts"], attrs["ends"], attrs["steps"],
                                      strict=True):
        if any(isinstance(v, Expr) for v in (start, end)):
            raise _Refuse("symbolic slice bounds")
        index[axis] = slice(start, None if end < 0 else end, step)
    return array[tuple(index)]


def _gather(node: Node, args: list[Any], ranges: Ranges) -> np.ndarray:
    data, indices = np.asarray(args[0], dtype=object), np.asarray(args[1], dtype=object)
    if any(isinstance(i, (Expr, _Frac)) for i in indices.reshape(-1)):
        raise _Refuse("symbolic indices")
    return np.take(data, indices.astype(np.int64), axis=node.attrs["axis"])


_RULES: dict[str, Callable[[Node, list[Any], Ranges], np.ndarray]] = {
    "Shape": _shape,
    "Identity": lambda node, args, ranges: np.asarray(args[0], dtype=object),
    "Reshape": lambda node, args, ranges: np.asarray(args[0], dtype=object),
    "Concat": lambda node, args, ranges: np.concatenate(
        [np.asarray(a, dtype=object) for a in args if a is not None], axis=node.attrs["axis"]),
    "Slice": _slice,
    "Gather": _gather,
    "Cast": _cast,
    "Floor": _rounding("floor"),
    "Ceil": _rounding("ceil"),
    "Add": _elementwise(lambda node, ranges, a, b: _add(a, b)),
    "Sub": _elementwise(lambda node, ranges, a, b: _add(a, _mul(b, -1))),
    "Mul": _elementwise(lambda node, ranges, a, b: _mul(a, b)),
    "Neg": _elementwise(lambda node, ranges, a: _mul(a, -1)),
    "Abs": _elementwise(_abs),
    "Div": _elementwise(_div),
    "Mod": _elementwise(_mod),
    "Sum": lambda node, args, ranges: _variadic(lambda n, r, a, b: _add(a, b), node, args, ranges),
    "Max": lambda node, args, ranges: _variadic(_extremum("max"), node, args, ranges),
    "Min": lambda node, args, ranges: _variadic(_extremum("min"), node, args, ranges),
}
