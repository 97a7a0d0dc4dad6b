"""Integer dim expressions over named symbols: what a dynamic dim of a plan is.

A dim of a tensor is a plain ``int`` where it is static and an :class:`Expr` where it depends on
the symbols an artifact was compiled for (``--shape x=1x3x48x32..2048`` makes dim 3 of ``x`` a
symbol; ``--dim seq=1..512`` binds a named ``dim_param``). Expressions are built with ``+ - *``
(products of symbols too: ``H*W`` after a Flatten), floor division and ``%`` by a positive int,
:func:`ceildiv`, :func:`min_` and :func:`max_` (a Slice end is clamped), and they are kept in one
canonical form, so expressions that are equal by these rules compare and hash equal::

    (W + 2) // 2 - 1 + 1 == (W + 2) // 2      (both W//2+1)
    (4 * W) // 2 == 2 * W
    (W // 2) // 2 == W // 4                   (floor(floor(P/a)/b) == floor(P/(a*b)))

and an expression that simplifies to a constant is a plain ``int``.

**The canonical form.** An expression is a polynomial with integer coefficients over *atoms*: a
symbol, ``P // c`` (``P`` a polynomial whose coefficients all lie in ``[0, c)`` and share no
factor with ``c``: ``floor((c*Q + R) / c) == Q + floor(R / c)`` for integer ``Q``), ``min(...)``
and ``max(...)``. ``P % c`` is ``P - c*(P//c)``; ``ceildiv(P, c)`` is ``(P + c - 1) // c``.

**Text.** :meth:`Expr.to_json` writes Python syntax (``"2*seq+1"``, ``"(W+1)//2"``,
``"min(W,2048)"``); :func:`parse` reads it back through Python's ``ast`` with a whitelist (names,
ints, ``+ - * // %``, ``min``/``max``): nothing is evaluated or compiled, results are cached, so a
runtime can evaluate plan shapes quickly with :func:`evaluate_text`. Pure Python: the runtime
imports this module.
"""

from __future__ import annotations

import ast
import keyword
import math
import operator
from collections.abc import Iterable
from collections.abc import Mapping
from functools import lru_cache
from typing import Union

__all__ = ["Dim", "Expr", "sym", "as_dim", "floordiv", "ceildiv", "mod", "min_", "max_", "evaluate", "bounds",
           "simplify", "free_symbols", "is_symbolic", "to_json", "parse", "evaluate_text"]

# An atom: ("s", name) | ("fd", Expr, divisor) | ("min", args) | ("max", args)
Atom = tuple
Monomial = tuple  # ((atom, power), ...) sorted by atom key, powers >= 1
Dim = Union[int, "Expr"]

_KIND_ORDER = {"s": 0, "fd": 1, "min": 2, "max": 3}


class Expr:
    """A non-constant integer expression in canonical form (build one with :func:`sym` and the
    operators; never directly). Hashable; ``==`` is equality of canonical forms."""

    __slots__ = ("_terms", "_const", "_hash", "_text")

    def __init__(self, terms: tuple[tuple[Monomial, int], ...], const: int) -> None:
        self._terms = terms
        self._const = const
        self._hash: int | None = None
        self._text: str | None = None

    # -- comparison and hashing: canonical forms --
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Expr):
            return False  # a constant is an int, never an Expr
        return self._const == other._const and self._terms == other._terms

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash((self._terms, self._const))
        return self._hash

    # -- arithmetic --
    def __add__(self, other: object) -> Dim:
        o = _coerce(other)
        return NotImplemented if o is None else _add(self, o)

    __radd__ = __add__

    def __sub__(self, other: object) -> Dim:
        o = _coerce(other)
        return NotImplemented if o is None else _add(self, _scale(o, -1))

    def __rsub__(self, other: object) -> Dim:
        o = _coerce(other)
        return NotImplemented if o is None else _add(o, _scale(self, -1))

    def __mul__(self, other: object) -> Dim:
        o = _coerce(other)
        return NotImplemented if o is None else _mul(self, o)

    __rmul__ = __mul__

    def __neg__(self) -> Dim:
        return _scale(self, -1)

    def __pos__(self) -> Expr:
        return self

    def __floordiv__(self, other: object) -> Dim:
        return floordiv(self, _divisor(other))

    def __mod__(self, other: object) -> Dim:
        return mod(self, _divisor(other))

    # -- reading --
    def evaluate(self, bindings: Mapping[str, int]) -> int:
        total = self._const
        for mono, coef in self._terms:
            product = coef
            for atom, power in mono:
                product *= _eval_atom(atom, bindings) ** power
            total += product
        return total

    def to_json(self) -> str:
        if self._text is None:
            self._text = _text(self)
        return self._text

    __str__ = to_json

    def __format__(self, spec: str) -> str:
        try:
            return format(self.to_json(), spec)
        except ValueError:  # a numeric spec (f"{size:,}" in a message): the text as it is
            return self.to_json()

    def __repr__(self) -> str:
        return f"Expr({self.to_json()!r})"


# ---------------------------------------------------------------- construction

def sym(name: str) -> Expr:
    """The symbol ``name`` (a Python identifier other than ``min`` / ``max`` and the keywords)."""
    if (not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name)
            or name in ("min", "max")):
        raise ValueError(f"{name!r} is not a valid symbol name (a Python identifier, not min/max)")
    return Expr(((((("s", name), 1),), 1),), 0)


def as_dim(value: object) -> Dim:
    """``value`` as a dim: an :class:`Expr` as it is, anything integer (numpy ints too) as ``int``."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, bool):
        raise TypeError("a bool is not a dim")
    return operator.index(value)  # type: ignore[arg-type]


def is_symbolic(value: object) -> bool:
    return isinstance(value, Expr)


def _coerce(value: object) -> Dim | None:
    try:
        return as_dim(value)
    except TypeError:
        return None


def _divisor(value: object) -> int:
    if isinstance(value, Expr) or isinstance(value, bool):
        raise TypeError("an expression divides only by a positive int")
    return operator.index(value)  # type: ignore[arg-type]


def _parts(x: Dim) -> tuple[dict[Monomial, int], int]:
    if isinstance(x, Expr):
        return dict(x._terms), x._const
    return {}, int(x)


def _make(terms: Mapping[Monomial, int], const: int) -> Dim:
    kept = tuple(sorted(((m, c) for m, c in terms.items() if c), key=lambda mc: _mono_key(mc[0])))
    return Expr(kept, const) if kept else const


def _add(a: Dim, b: Dim) -> Dim:
    terms, const = _parts(a)
    other, c2 = _parts(b)
    for mono, coef in other.items():
        terms[mono] = terms.get(mono, 0) + coef
    return _make(terms, const + c2)


def _scale(a: Dim, k: int) -> Dim:
    terms, const = _parts(a)
    return _make({m: c * k for m, c in terms.items()}, const * k)


def _mono_mul(m1: Monomial, m2: Monomial) -> Monomial:
    powers: dict[Atom, int] = dict(m1)
    for atom, power in m2:
        powers[atom] = powers.get(atom, 0) + power
    return tuple(sorted(powers.items(), key=lambda ap: _atom_key(ap[0])))


def _mul(a: Dim, b: Dim) -> Dim:
    t1, c1 = _parts(a)
    t2, c2 = _parts(b)
    terms: dict[Monomial, int] = {}
    for mono, coef in [*t1.items(), *(((), c1),)]:
        for mono2, coef2 in [*t2.items(), *(((), c2),)]:
            key = _mono_mul(mono, mono2)
            terms[key] = terms.get(key, 0) + coef * coef2
    const = terms.pop((), 0)
    return _make(terms, const)


def floordiv(x: Dim, c: int) -> Dim:
    """``floor(x / c)`` for a positive int ``c``, in canonical form."""
    c = _divisor(c)
    if c <= 0:
        raise ValueError(f"division of a dim by {c}: the divisor must be a positive int")
    if not isinstance(x, Expr):
        return operator.index(x) // c
    if c == 1:
        return x
    terms, const = _parts(x)
    quotient = _make({m: a // c for m, a in terms.items()}, const // c)
    rest = {m: a % c for m, a in terms.items() if a % c}
    rest_const = const % c
    if not rest:
        return quotient  # 0 <= rest_const < c: its floor is 0
    g = math.gcd(c, rest_const, *rest.values())
    rest = {m: a // g for m, a in rest.items()}
    rest_const //= g
    c //= g
    if len(rest) == 1:
        (mono, coef), = rest.items()
        if coef == 1 and len(mono) == 1 and mono[0][1] == 1 and mono[0][0][0] == "fd":
            _, inner, a = mono[0][0]  # floor((floor(P/a) + k) / c) == floor((P + k*a) / (a*c))
            return _add(quotient, floordiv(_add(inner, rest_const * a), a * c))
    atom = ("fd", _make(rest, rest_const), c)
    return _add(quotient, Expr((((((atom, 1),), 1),)), 0))


def ceildiv(x: Dim, c: int) -> Dim:
    """``ceil(x / c)`` for a positive int ``c`` (``(x + c - 1) // c``)."""
    return floordiv(_add(x, _divisor(c) - 1), c)


def mod(x: Dim, c: int) -> Dim:
    """``x % c`` (Python's: in ``[0, c)``) for a positive int ``c``: ``x - c*(x//c)``."""
    return _add(x, _scale(floordiv(x, c), -_divisor(c)))


def min_(*args: object) -> Dim:
    """The least of ``args``: ints combine; of two expressions that differ by a constant the smaller
    is kept; otherwise a ``min(...)`` atom with its arguments sorted."""
    return _extremum("min", args)


def max_(*args: object) -> Dim:
    """The greatest of ``args`` (as :func:`min_`)."""
    return _extremum("max", args)


def _extremum(kind: str, args: Iterable[object]) -> Dim:
    pick = min if kind == "min" else max
    flat: list[Dim] = []
    for arg in map(as_dim, args):
        inner = _single_atom(arg)
        if inner is not None and inner[0] == kind:
            flat.extend(inner[1])
        else:
            flat.append(arg)
    if not flat:
        raise ValueError(f"{kind}() of no dims")
    ints = [a for a in flat if not isinstance(a, Expr)]
    kept: list[Dim] = [pick(ints)] if ints else []
    for arg in dict.fromkeys(a for a in flat if isinstance(a, Expr)):
        for k, other in enumerate(kept):
            diff = _add(arg, _scale(other, -1))
            if not isinstance(diff, Expr):  # they differ by a constant: one always wins
                smaller = arg if diff < 0 else other
                kept[k] = smaller if kind == "min" else (other if smaller is arg else arg)
                break
        else:
            kept.append(arg)
    if len(kept) == 1:
        return kept[0]
    atom = (kind, tuple(sorted(kept, key=_dim_key)))
    return Expr((((((atom, 1),), 1),)), 0)


def _single_atom(x: Dim) -> Atom | None:
    if isinstance(x, Expr) and not x._const and len(x._terms) == 1:
        mono, coef = x._terms[0]
        if coef == 1 and len(mono) == 1 and mono[0][1] == 1:
            return mono[0][0]
    return None


# ---------------------------------------------------------------- reading

def _eval_atom(atom: Atom, bindings: Mapping[str, int]) -> int:
    kind = atom[0]
    if kind == "s":
        try:
            return int(bindings[atom[1]])
        except KeyError:
            raise ValueError(f"no value for symbol {atom[1]!r}") from None
    if kind == "fd":
        return evaluate(atom[1], bindings) // atom[2]
    values = [evaluate(a, bindings) for a in atom[1]]
    return min(values) if kind == "min" else max(values)


def evaluate(x: Dim, bindings: Mapping[str, int]) -> int:
    """The value of dim ``x`` with each symbol given by ``bindings`` (an int stays itself)."""
    return x.evaluate(bindings) if isinstance(x, Expr) else int(x)


def _interval_mul(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    products = [a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1]]
    return min(products), max(products)


def _atom_bounds(atom: Atom, ranges: Mapping[str, tuple[int, int]]) -> tuple[int, int]:
    kind = atom[0]
    if kind == "s":
        try:
            lo, hi = ranges[atom[1]]
        except KeyError:
            raise ValueError(f"no range for symbol {atom[1]!r}") from None
        return int(lo), int(hi)
    if kind == "fd":
        lo, hi = bounds(atom[1], ranges)
        return lo // atom[2], hi // atom[2]
    each = [bounds(a, ranges) for a in atom[1]]
    pick = min if kind == "min" else max
    return pick(b[0] for b in each), pick(b[1] for b in each)


def bounds(x: Dim, ranges: Mapping[str, tuple[int, int]]) -> tuple[int, int]:
    """``(lo, hi)`` with ``lo <= x <= hi`` whenever every symbol lies in its ``ranges`` (inclusive);
    interval arithmetic, so the interval may be wider than the exact one."""
    if not isinstance(x, Expr):
        return int(x), int(x)
    lo = hi = x._const
    for mono, coef in x._terms:
        interval = (coef, coef)
        for atom, power in mono:
            a = _atom_bounds(atom, ranges)
            for _ in range(power):
                interval = _interval_mul(interval, a)
        lo, hi = lo + interval[0], hi + interval[1]
    return lo, hi


def simplify(x: Dim, ranges: Mapping[str, tuple[int, int]]) -> Dim:
    """``x`` with what the symbols' ``ranges`` decide folded: an atom whose bounds are one value
    becomes that value (``(s+4)//5`` for ``s`` in 1..4 is 1), and a ``min`` / ``max`` argument that
    can never be the extremum is dropped (``min(1, W)`` for ``W >= 1`` is 1)."""
    if not isinstance(x, Expr):
        return x
    lo, hi = bounds(x, ranges)
    if lo == hi:
        return lo
    result: Dim = x._const
    for mono, coef in x._terms:
        product: Dim = coef
        for atom, power in mono:
            value = _simplify_atom(atom, ranges)
            for _ in range(power):
                product = _mul(product, value)
        result = _add(result, product)
    return result


def _simplify_atom(atom: Atom, ranges: Mapping[str, tuple[int, int]]) -> Dim:
    kind = atom[0]
    if kind == "s":
        return Expr((((((atom, 1),), 1),)), 0)
    if kind == "fd":
        value = floordiv(simplify(atom[1], ranges), atom[2])
    else:
        args = [simplify(a, ranges) for a in atom[1]]
        kept = list(args)
        for arg in args:  # for min: an argument never below another one is never needed
            lo, hi = bounds(arg, ranges)
            dominated = [o for o in kept if o is not arg and (
                lo >= bounds(o, ranges)[1] if kind == "min" else hi <= bounds(o, ranges)[0])]
            if dominated and len(kept) > 1:
                kept = [o for o in kept if o is not arg]
        value = _extremum(kind, kept or args)
    lo, hi = bounds(value, ranges)
    return lo if lo == hi else value


def free_symbols(x: object) -> frozenset[str]:
    """The names of the symbols ``x`` depends on (none for an int)."""
    if not isinstance(x, Expr):
        return frozenset()
    found: set[str] = set()
    for mono, _ in x._terms:
        for atom, _ in mono:
            if atom[0] == "s":
                found.add(atom[1])
            elif atom[0] == "fd":
                found |= free_symbols(atom[1])
            else:
                for arg in atom[1]:
                    found |= free_symbols(arg)
    return frozenset(found)


# ---------------------------------------------------------------- text

def to_json(x: Dim) -> int | str:
    """A dim as plan.json holds it: an int, or the expression's text."""
    return x.to_json() if isinstance(x, Expr) else int(x)


def _atom_text(atom: Atom) -> str:
    kind = atom[0]
    if kind == "s":
        return str(atom[1])
    if kind == "fd":
        inner = atom[1]
        body = inner.to_json()
        bare = _single_atom(inner)
        return f"{body}//{atom[2]}" if bare is not None and bare[0] != "fd" else f"({body})//{atom[2]}"
    return f"{kind}({','.join(str(a) for a in atom[1])})"


def _atom_key(atom: Atom) -> tuple[int, str]:
    return _KIND_ORDER[atom[0]], _atom_text(atom)


def _mono_key(mono: Monomial) -> tuple:
    return tuple((_atom_key(atom), -power) for atom, power in mono)


def _dim_key(x: Dim) -> tuple[int, str]:
    return (1, x.to_json()) if isinstance(x, Expr) else (0, f"{int(x):+021d}")


def _text(x: Expr) -> str:
    out = ""
    for k, (mono, coef) in enumerate(x._terms):
        factors = [_atom_text(atom) for atom, power in mono for _ in range(power)]
        alone = len(factors) == 1 and abs(coef) == 1 and (coef == 1 or k > 0)
        if not alone:  # (2*W//2 would read as (2*W)//2, -W//2 as (-W)//2)
            factors = [f"({f})" if mono_atom[0] == "fd" else f
                       for mono_atom, power in mono for f in [_atom_text(mono_atom)] * power]
        body = "*".join(factors)
        if abs(coef) != 1:
            body = f"{abs(coef)}*{body}"
        if coef < 0:
            out += f"-{body}"
        else:
            out += f"+{body}" if k else body
    if x._const:
        out += f"{x._const:+d}"
    return out


_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.FloorDiv: floordiv, ast.Mod: mod}


def _from_ast(node: ast.AST, text: str) -> Dim:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name):
        return sym(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _from_ast(node.operand, text)
        return _scale(inner, -1) if isinstance(node.op, ast.USub) else inner
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _from_ast(node.left, text), _from_ast(node.right, text)
        if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and isinstance(right, Expr):
            raise ValueError(f"dim expression {text!r}: // and % take a positive int on the right")
        return _BINOPS[type(node.op)](left, right)  # type: ignore[no-any-return,arg-type]
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("min", "max")
            and not node.keywords and node.args):
        args = [_from_ast(a, text) for a in node.args]
        return min_(*args) if node.func.id == "min" else max_(*args)
    raise ValueError(f"dim expression {text!r}: {type(node).__name__} is not allowed "
                     f"(names, ints, + - * // %, min and max only)")


@lru_cache(maxsize=4096)
def parse(text: str) -> Dim:
    """The dim that :meth:`Expr.to_json` wrote as ``text`` (an int for a constant). Only names,
    ints, ``+ - * // %`` and ``min``/``max`` calls are accepted; raises ValueError otherwise."""
    if not isinstance(text, str) or len(text) > 10_000:
        raise ValueError(f"dim expression {text!r}: not a text of at most 10000 characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"dim expression {text!r}: {exc.msg}") from None
    return _from_ast(tree.body, text)


def evaluate_text(dim: int | str, bindings: Mapping[str, int]) -> int:
    """A plan's dim (an int, or an expression's text) at ``bindings``."""
    if isinstance(dim, str):
        return evaluate(parse(dim), bindings)
    return int(dim)
