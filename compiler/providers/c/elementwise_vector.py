"""The vector form of an elementwise program: a whole ``vf`` of outputs per statement.

The elementwise kernel's scalar loops are vectorized by gcc until the program calls libm (tanhf,
expf, erff, ...), which stops that: Magika's GELU-tanh step spent 14 of 44 ms in scalar tanhf.
Where every instruction has a vector form here (arithmetic, Relu / Clip / LeakyRelu / HardSigmoid /
HardSwish with ``vselect``, a Where of a comparison as ``vselect`` of its mask, and the vector math
of ``templates/c/vmath.c.j2`` through ``compiler/codegen/vmath.py``), the kernel's innermost loop
runs ``vf`` statements over full vectors and the scalar program for the tail. Each form computes
what the scalar one does lane for lane, NaN included (a comparison with NaN is false in both); the
transcendental functions are the vector math's, within the bounds of docs/vector-math.md of libm's
results.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from compiler.codegen.elementwise import Instr
from compiler.codegen.elementwise import literal
from compiler.codegen.vmath import VECTOR_MATH_OPS
from compiler.codegen.vmath import vector_math_expr

__all__ = ["vector_program"]

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ARITH = {"Add": "+", "Sub": "-", "Mul": "*", "Div": "/"}
_COMPARE = {"Less": "<", "Greater": ">", "Equal": "=="}
_ZERO, _ONE = "vbcast(0.0f)", "vbcast(1.0f)"


def _clip(x: str, lo: str | None, hi: str | None) -> str:
    """The scalar ``_clip``'s order: the upper bound first, then the lower one wins."""
    expr = x
    if hi is not None:
        expr = f"vselect({x} > {hi}, {hi}, {expr})"
    if lo is not None:
        expr = f"vselect({x} < {lo}, {lo}, {expr})"
    return expr


def _bound(value: float, upper: bool) -> str | None:
    """A clip bound as a vector constant; None where the scalar form leaves it out (infinite)."""
    infinite = value == float("inf") if upper else value == float("-inf")
    return None if infinite else f"vbcast({literal(value)})"


def _unary(op: str, x: str, attrs: dict) -> str | None:
    if op == "Neg":
        return f"(-{x})"
    if op == "Relu":
        return f"vselect({x} < {_ZERO}, {_ZERO}, {x})"
    if op == "LeakyRelu":
        return f"vselect({x} < {_ZERO}, {x} * vbcast({literal(float(attrs['alpha']))}), {x})"
    if op == "Clip":
        return _clip(x, _bound(float(attrs["min"]), False), _bound(float(attrs["max"]), True))
    if op == "HardSigmoid":
        alpha, beta = literal(float(attrs["alpha"])), literal(float(attrs["beta"]))
        return _clip(f"(vbcast({alpha}) * {x} + vbcast({beta}))", _ZERO, _ONE)
    if op in VECTOR_MATH_OPS and op not in ("SiLU",):
        try:
            return vector_math_expr(op, x, attrs)
        except KeyError:
            return None
    return None


def vector_program(program: Sequence[Instr], inputs: Sequence[str]) -> tuple[tuple[str, str], ...] | None:
    """``(name, vf expression)`` statements computing ``program`` over vector ``inputs`` (variable
    names or ``vbcast(...)`` constants), the last one the result; None when an instruction has no
    vector form here."""
    values = list(inputs)
    out: list[tuple[str, str]] = []
    masks: dict[str, str] = {}  # a comparison's result, "v<k>": its vi expression (read by a Where)
    for n, ins in enumerate(program):
        args = []
        for r in ins.args:
            k = int(r[1:])
            args.append(values[k] if r[0] == "i" else f"v{k}")
        cond = ""
        if ins.op == "Where" and len(args) == 3 and args[0] in masks:
            cond, args = masks[args[0]], args[1:]
        elif any(a in masks for a in args):
            return None  # (a comparison is read by a Where only: fuse_elementwise)
        # the vector math takes a variable (some forms read it twice): name a constant argument
        for j, a in enumerate(args):
            if not _IDENT.fullmatch(a):
                out.append((f"v{n}_{j}", a))
                args[j] = f"v{n}_{j}"
        if ins.op in _COMPARE and len(args) == 2:
            masks[f"v{n}"] = f"({args[0]} {_COMPARE[ins.op]} {args[1]})"
            continue
        if ins.op == "Where":
            expr: str | None = f"vselect({cond}, {args[0]}, {args[1]})" if cond else None
        elif ins.op in _ARITH and len(args) == 2:
            expr = f"({args[0]} {_ARITH[ins.op]} {args[1]})"
        elif ins.op == "HardSwish" and len(args) == 1:  # x * clip(x / 6 + 0.5, 0, 1), as the scalar form
            out.append((f"v{n}_u", f"({args[0]} / vbcast(6.0f) + vbcast(0.5f))"))
            expr = f"({args[0]} * {_clip(f'v{n}_u', _ZERO, _ONE)})"
        elif len(args) == 1:
            expr = _unary(ins.op, args[0], dict(ins.attrs))
        else:
            expr = None
        if expr is None:
            return None
        out.append((f"v{n}", expr))
    return tuple(out)
