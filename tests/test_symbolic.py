"""runtime/symbolic.py: dim expressions keep one canonical form, evaluate like the arithmetic they
came from, print as Python text and read back through the whitelisted parser only."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from runtime.symbolic import Expr
from runtime.symbolic import bounds
from runtime.symbolic import ceildiv
from runtime.symbolic import evaluate
from runtime.symbolic import evaluate_text
from runtime.symbolic import floordiv
from runtime.symbolic import free_symbols
from runtime.symbolic import max_
from runtime.symbolic import min_
from runtime.symbolic import mod
from runtime.symbolic import parse
from runtime.symbolic import simplify
from runtime.symbolic import sym
from runtime.symbolic import to_json

W = sym("W")
H = sym("H")
SEQ = sym("seq")


def test_equal_expressions_are_equal_and_hash_equal() -> None:
    pairs = [((W + 2) // 2 - 1 + 1, (W + 2) // 2), ((4 * W) // 2, 2 * W), ((W // 2) // 2, W // 4),
             (W * 1, W), (W + H, H + W), (H * W * 2, 2 * W * H), (((W + 1) // 2 + 1) // 2, (W + 3) // 4),
             ((W + 2) // 2, W // 2 + 1), (ceildiv(W, 2), (W + 1) // 2), ((2 * W + 2) // 4, (W + 1) // 2),
             (min_(W, 7, 9), min_(7, W)), (max_(W, W + 1), W + 1), (min_(min_(W, H), 3), min_(3, H, W))]
    for a, b in pairs:
        assert a == b, (a, b)
        assert hash(a) == hash(b)
        assert len({a, b}) == 1


def test_constants_are_plain_ints() -> None:
    for value in (W - W, (2 * W) // 2 - W, W * 0 + 3, mod(4 * W, 2), min_(3, 5), (W + 1) * 0):
        assert type(value) is int
    assert (W - W + 5) == 5 and not isinstance(W - W + 5, Expr)
    assert W != 3 and W != W + 0 * H + 1


def test_text_is_python_and_reads_back() -> None:
    assert to_json(2 * SEQ + 1) == "2*seq+1"
    assert to_json((W + 1) // 2) == "(W+1)//2"
    assert to_json(W // 2) == "W//2"
    assert to_json(min_(W, 2048)) == "min(2048,W)"
    assert to_json(5) == 5
    assert f"{(W + 1) // 2}" == "(W+1)//2" and f"{W:,}" == "W" and f"{W:>3}" == "  W"  # (messages)
    for expr in (2 * (W // 2), -(W // 2), W * W - H, H * W * 3 + (W // 2) * 2 - 7, (H * W) // 4,
                 min_(W, 2048) + 1, max_(H, W) * 2, mod(W, 3), 1 - W):
        text = to_json(expr)
        assert isinstance(text, str)
        assert parse(text) == expr, text
        assert evaluate_text(text, {"W": 37, "H": 5}) == evaluate(expr, {"W": 37, "H": 5})


@pytest.mark.parametrize("text", ["__import__('os')", "W.real", "W**2", "W/2", "W//H", "f(W)",
                                  "min(W, key=1)", "[W]", "1.5*W", "True", "W if H else 1", "min()", "W("])
def test_parser_refuses_everything_else(text: str) -> None:
    with pytest.raises(ValueError):
        parse(text)


def test_division_only_by_a_positive_int() -> None:
    with pytest.raises(ValueError):
        floordiv(W, 0)
    with pytest.raises(ValueError):
        W // -2  # noqa: B018
    with pytest.raises(TypeError):
        W // H  # noqa: B018
    with pytest.raises(TypeError):
        W < 3  # noqa: B015
    with pytest.raises(TypeError):
        int(W)  # type: ignore[call-overload]
    with pytest.raises(ValueError):
        sym("min")
    with pytest.raises(ValueError):
        sym("a.b")


def test_evaluate_bounds_and_free_symbols() -> None:
    expr = (W + 1) // 2 * H + min_(W, 100)
    assert evaluate(expr, {"W": 9, "H": 3}) == 5 * 3 + 9
    assert free_symbols(expr) == {"W", "H"}
    assert free_symbols(7) == frozenset()
    assert bounds(expr, {"W": (32, 2048), "H": (1, 2)}) == (16 + 32, 1024 * 2 + 100)
    assert bounds(4, {}) == (4, 4)
    with pytest.raises(ValueError, match="no value for symbol 'H'"):
        evaluate(expr, {"W": 1})
    with pytest.raises(ValueError, match="no range for symbol 'W'"):
        bounds(expr, {"H": (1, 2)})


def test_simplify_folds_what_the_ranges_decide() -> None:
    s = sym("s")
    ranges = {"W": (8, 64), "s": (1, 4)}
    assert simplify(min_(1, W), ranges) == 1
    assert simplify(max_(W, 4), ranges) == W
    assert simplify(s + (s + 4) // 5 - 1, ranges) == s
    assert simplify(min_(W, 100) + 1, ranges) == W + 1
    assert simplify(min_(W, 16), ranges) == min_(W, 16)
    assert simplify((W + 1) // 2 * min_(2, s + 1), ranges) == 2 * ((W + 1) // 2)
    assert simplify(7, ranges) == 7


def _random_expr(rng: random.Random, depth: int) -> tuple[Callable[[dict[str, int]], int], object]:
    """A random expression as a plain-int function and as the same operations on dims."""
    names = ("W", "H", "seq")
    if depth == 0 or rng.random() < 0.25:
        if rng.random() < 0.4:
            c = rng.randint(-5, 9)
            return (lambda b, c=c: c), c
        name = rng.choice(names)
        return (lambda b, n=name: b[n]), sym(name)
    op = rng.choice(["+", "-", "*", "//", "%", "ceil", "min", "max", "neg"])
    fa, ea = _random_expr(rng, depth - 1)
    if op in ("//", "%", "ceil"):
        c = rng.randint(1, 8)
        if op == "//":
            return (lambda b: fa(b) // c), floordiv(ea, c)  # type: ignore[arg-type]
        if op == "%":
            return (lambda b: fa(b) % c), mod(ea, c)  # type: ignore[arg-type]
        return (lambda b: -(-fa(b) // c)), ceildiv(ea, c)  # type: ignore[arg-type]
    if op == "neg":
        return (lambda b: -fa(b)), -ea  # type: ignore[operator]
    fb, eb = _random_expr(rng, depth - 1)
    table: dict[str, tuple[Callable[[int, int], int], Callable[[object, object], object]]] = {
        "+": (lambda x, y: x + y, lambda x, y: x + y),  # type: ignore[operator]
        "-": (lambda x, y: x - y, lambda x, y: x - y),  # type: ignore[operator]
        "*": (lambda x, y: x * y, lambda x, y: x * y),  # type: ignore[operator]
        "min": (min, min_), "max": (max, max_)}
    plain, dim = table[op]
    return (lambda b: plain(fa(b), fb(b))), dim(ea, eb)


def test_random_expressions_evaluate_like_their_arithmetic() -> None:
    rng = random.Random(17)
    for _ in range(600):
        plain, expr = _random_expr(rng, 4)
        text = to_json(expr)  # type: ignore[arg-type]
        back = parse(text) if isinstance(text, str) else text
        assert back == expr, (text, expr)
        ranges = {"W": (1, 40), "H": (-3, 12), "seq": (0, 7)}
        for _ in range(12):
            binding = {n: rng.randint(lo, hi) for n, (lo, hi) in ranges.items()}
            want = plain(binding)
            assert evaluate(expr, binding) == want, (text, binding)  # type: ignore[arg-type]
            assert evaluate_text(text, binding) == want
            lo, hi = bounds(expr, ranges)  # type: ignore[arg-type]
            assert lo <= want <= hi, (text, binding, lo, hi)
            assert evaluate(simplify(expr, ranges), binding) == want, (text, binding)  # type: ignore[arg-type]
