"""Dims of a dynamic graph as C text: what a C kernel with run-time dims computes its sizes with.

A dynamic artifact's C partition reads the binding's values from an ``int64_t`` array, ``dyn``
(its last ext pointer slot, named ``DYN_EXT`` in plan.json; the runtime fills it at each binding):
the symbols' values in the plan's symbol order (sorted by name), then the arena offset of each
buffer (the placeholder ``_b<k>`` is ``dyn[S + k]``, S the number of symbols). ``c_dim`` writes a
dim (an int or a ``runtime.symbolic.Expr``) as an ``int64_t`` expression over that array.

Every division in the canonical form has a numerator >= 0 (its coefficients lie in ``[0, c)`` and
symbols are >= 0), so C's truncating ``/`` is the floor the expression means.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence

from runtime.contract import DYN_EXT
from runtime.contract import placeholder_index
from runtime.symbolic import Dim
from runtime.symbolic import Expr

__all__ = ["DYN_EXT", "CDim", "c_dim", "kernel_dims"]


def c_dim(x: Dim, symbols: Sequence[str], dyn: str = "dyn") -> str:
    """``x`` as C text over the array ``dyn`` (see the module docstring); an int as itself."""
    if not isinstance(x, Expr):
        return str(int(x))
    index = {name: k for k, name in enumerate(symbols)}
    return _expr(x, index, len(symbols), dyn)


def _expr(x: Dim, index: dict[str, int], count: int, dyn: str) -> str:
    if not isinstance(x, Expr):
        return f"INT64_C({int(x)})" if abs(int(x)) > 2**31 - 1 else str(int(x))
    parts = []
    for mono, coef in x._terms:
        factors = [_atom(atom, index, count, dyn) for atom, power in mono for _ in range(power)]
        if coef != 1:
            factors.insert(0, str(coef) if coef > 0 else f"({coef})")
        parts.append("*".join(factors))
    if x._const:
        parts.append(str(x._const) if x._const > 0 else f"({x._const})")
    return "(" + " + ".join(parts) + ")"


def _atom(atom: tuple, index: dict[str, int], count: int, dyn: str) -> str:
    kind = atom[0]
    if kind == "s":
        name = atom[1]
        if name in index:
            return f"{dyn}[{index[name]}]"
        k = placeholder_index(name)
        if k is not None:
            return f"{dyn}[{count + k}]"
        raise ValueError(f"dim symbol {name!r} is neither one of {sorted(index)} nor a buffer placeholder")
    if kind == "fd":
        return f"({_expr(atom[1], index, count, dyn)} / {atom[2]})"
    args = [_expr(a, index, count, dyn) for a in atom[1]]
    op = "<" if kind == "min" else ">"
    text = args[0]
    for other in args[1:]:
        text = f"({text} {op} {other} ? {text} : {other})"
    return text


class CDim:
    """A run-time dim inside a kernel template: ``str()`` is its C text (an ``int64_t``
    expression), and ``+ - * // %`` with ints or other ``CDim`` make C text too (``//`` is C's
    ``/``: sizes are >= 0). Comparisons are not defined: a template decides static facts on ints
    only (``{% if d is integer and ... %}``), so a run-time dim cannot take a compile-time branch."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"CDim({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CDim) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def _bin(self, other: object, op: str, swap: bool = False) -> CDim:
        if not isinstance(other, int | CDim) or isinstance(other, bool):
            return NotImplemented
        a, b = (str(other), self.text) if swap else (self.text, str(other))
        return CDim(f"({a} {op} {b})")


def _operator(op: str, swap: bool) -> Callable[[CDim, object], CDim]:
    def method(self: CDim, other: object) -> CDim:
        return self._bin(other, op, swap)

    return method


for _name, _op in (("add", "+"), ("sub", "-"), ("mul", "*"), ("floordiv", "/"), ("mod", "%")):
    setattr(CDim, f"__{_name}__", _operator(_op, False))
    setattr(CDim, f"__r{_name}__", _operator(_op, True))


def kernel_dims(symbols: Sequence[str]) -> Callable[[object], int | CDim]:
    """A kernel's writer of dims: an int stays an int, an ``Expr`` becomes a ``CDim`` over the
    kernel's parameter ``dyn`` (the binding)."""
    def write(x: object) -> int | CDim:
        if isinstance(x, Expr):
            return CDim(c_dim(x, symbols, "dyn"))
        assert isinstance(x, int | CDim), x
        return x

    return write
