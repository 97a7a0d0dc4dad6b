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
- ``Cast`` between integer types keeps the value where the type holds its bounds; to float32 /
  float64 where the float holds every integer of its bounds exactly (a dim cast to float and
  scaled by whole numbers stays whole: ``Floor``, ``Ceil`` and the cast back keep it).

A float value here is always a whole number: a fraction is no symbolic constant (each ONNX node's
results are stored as one), so a float product by 1.5 is left to the probes like anything else
without an exact rule (a comparison, ``Where``, a divisor that is an expression, a sign not known
over the ranges), and the fit is then checked (``fit_check.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np

from compiler.ir.graph import Node
from compiler.ir.graph import Value
from runtime.symbolic import Dim
from runtime.symbolic import Expr
from runtime.symbolic import bounds
from runtime.symbolic import evaluate
from runtime.symbolic import floordiv
from runtime.symbolic import free_symbols
from runtime.symbolic import max_
from runtime.symbolic import min_
from runtime.symbolic import mod

__all__ = ["fold_exact", "tight_bounds"]

Ranges = Mapping[str, tuple[int, int]]
_MANTISSA = {"float32": 24, "float64": 53}
_ENUMERATED = 1 << 16  # the largest range of one symbol whose bounds are found by evaluating it


class _Refuse(Exception):
    """The node has no exact rule here: the probes take it."""


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
        folded[value.name] = array if any(isinstance(x, Expr) for x in array.reshape(-1)) else \
            array.astype(value.dtype)
    return folded


def _each(array: np.ndarray, fn: Callable[[Any], Any]) -> np.ndarray:
    """``fn`` of every element of object array ``array``, in its shape."""
    return np.array([fn(x) for x in array.reshape(-1)], dtype=object).reshape(array.shape)


def _known(node: Node, value: Value) -> np.ndarray:
    """A compile-time input as an object array of ints (integer or whole float elements; a
    Shape's input is read through its shape only)."""
    if node.kind == "Shape":
        return np.empty(0, object)
    if value.const is None:
        raise _Refuse("input not known")
    const = value.const
    if const.dtype == object:
        return const
    whole = const.dtype.kind in "iu" or (const.dtype.kind == "f" and bool(np.all(np.isfinite(const)))
                                          and np.array_equal(const, np.floor(const)))
    if not whole:
        raise _Refuse("not an integer or whole float constant")
    return np.array([int(x) for x in const.reshape(-1)], dtype=object).reshape(const.shape)


def _check(x: Any, out: Value, ranges: Ranges) -> Any:
    """``x`` as ``out``'s dtype holds it, or _Refuse where that dtype might not."""
    dtype = out.dtype
    assert dtype is not None
    if dtype.kind in "iu":
        lo, hi = bounds(x, ranges)
        info = np.iinfo(dtype)
        if lo < info.min or hi > info.max:
            raise _Refuse(f"{x} may not fit {dtype}")
        return x
    bits = _MANTISSA.get(dtype.name)
    if bits is None:
        raise _Refuse(f"{dtype} values")
    lo, hi = bounds(x, ranges)
    if max(-lo, hi) >= 2**bits:
        raise _Refuse(f"{x} may not be exact in {dtype}")
    return x


def tight_bounds(x: Dim, ranges: Ranges) -> tuple[int, int]:
    """``bounds(x, ranges)``, made exact by evaluating ``x`` at every size where it is of one symbol
    with a range of at most ``_ENUMERATED`` sizes and interval arithmetic cannot decide its sign
    (``20 - (100 - W)//8`` is canonically ``8 + W - (7*W + 4)//8``, whose intervals overlap 0)."""
    lo, hi = bounds(x, ranges)
    names = free_symbols(x)
    if lo >= 0 or hi <= 0 or len(names) != 1:
        return lo, hi
    (name,) = names
    first, last = ranges[name]
    if last - first >= _ENUMERATED:
        return lo, hi
    values = [evaluate(x, {name: v}) for v in range(first, last + 1)]
    return min(values), max(values)


def _sign(x: Dim, ranges: Ranges) -> int:
    """1 where ``x >= 0`` over the ranges, -1 where ``x <= 0``; _Refuse where it can be either."""
    lo, hi = tight_bounds(x, ranges)
    if lo >= 0:
        return 1
    if hi <= 0:
        return -1
    raise _Refuse(f"the sign of {x} is not known over the ranges")


def _int_div(a: Dim, b: Dim, ranges: Ranges) -> Dim:
    """ONNX's integer Div: truncation toward zero."""
    if isinstance(b, Expr) or b == 0:
        raise _Refuse("a division by an expression or by zero")
    sign = _sign(a, ranges)  # trunc(a / b) == sign(a) * sign(b) * (|a| // |b|)
    return floordiv(sign * a, abs(b)) * sign * (1 if b > 0 else -1)


def _elementwise(fn: Callable[..., Any]) -> Callable[[Node, list[Any], Ranges], np.ndarray]:
    def rule(node: Node, args: list[Any], ranges: Ranges) -> np.ndarray:
        arrays = np.broadcast_arrays(*[np.asarray(a, dtype=object) for a in args if a is not None])
        flat = [fn(node, ranges, *items) for items in zip(*(a.reshape(-1) for a in arrays), strict=True)]
        return np.array(flat, dtype=object).reshape(arrays[0].shape)
    return rule


def _is_float(node: Node) -> bool:
    return node.outputs[0].dtype is not None and node.outputs[0].dtype.kind == "f"


def _div(node: Node, ranges: Ranges, a: Any, b: Any) -> Any:
    if _is_float(node):
        raise _Refuse("a float quotient (a fraction at some sizes)")
    return _int_div(a, b, ranges)


def _mod(node: Node, ranges: Ranges, a: Any, b: Any) -> Any:
    if _is_float(node) or isinstance(b, Expr) or b == 0:
        raise _Refuse("Mod other than of an integer by a constant")
    if node.attrs.get("fmod", 0):  # C's fmod: the dividend's sign
        return mod(a, abs(b)) if _sign(a, ranges) > 0 else -mod(-a, abs(b))
    return mod(a, b) if b > 0 else -mod(-a, -b)


def _extremum(kind: str) -> Callable[..., Any]:
    def fn(node: Node, ranges: Ranges, *items: Any) -> Any:
        return (min_ if kind == "min" else max_)(*items)
    return fn


def _variadic(fn: Callable[..., Any], node: Node, args: list[Any], ranges: Ranges) -> np.ndarray:
    present = [a for a in args if a is not None]
    result = present[0]
    for other in present[1:]:
        result = _elementwise(fn)(node, [result, other], ranges)
    return np.asarray(result, dtype=object)


def _cast(node: Node, args: list[Any], ranges: Ranges) -> np.ndarray:
    """Whole values stay themselves (``_check`` asks the type to hold them)."""
    out, source = node.outputs[0].dtype, node.inputs[0].dtype if node.inputs[0] is not None else None
    if out is None or out.kind == "b" or source is None or source.kind not in "iuf":
        raise _Refuse("a cast to or from bool")
    return np.asarray(args[0], dtype=object)


def _abs(node: Node, ranges: Ranges, x: Any) -> Any:
    return x if _sign(x, ranges) > 0 else -x


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
    if any(isinstance(i, Expr) for i in indices.reshape(-1)):
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
    "Floor": lambda node, args, ranges: np.asarray(args[0], dtype=object),  # (whole values)
    "Ceil": lambda node, args, ranges: np.asarray(args[0], dtype=object),
    "Add": _elementwise(lambda node, ranges, a, b: a + b),
    "Sub": _elementwise(lambda node, ranges, a, b: a - b),
    "Mul": _elementwise(lambda node, ranges, a, b: a * b),
    "Neg": _elementwise(lambda node, ranges, a: -a),
    "Abs": _elementwise(_abs),
    "Div": _elementwise(_div),
    "Mod": _elementwise(_mod),
    "Sum": lambda node, args, ranges: _variadic(lambda n, r, a, b: a + b, node, args, ranges),
    "Max": lambda node, args, ranges: _variadic(_extremum("max"), node, args, ranges),
    "Min": lambda node, args, ranges: _variadic(_extremum("min"), node, args, ranges),
}
