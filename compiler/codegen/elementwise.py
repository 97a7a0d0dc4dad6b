"""The elementwise / epilogue expression emitter shared by the C and CUDA renderers.

Turns an elementwise op, an activation, or a ``FusedElementwise`` program (docs/ops.md) into C
expressions over named scalar variables; renderers wrap them in their own loops. Also holds what
both renderers need around those expressions: the dtype -> C type tables, float literals, and the
index math of numpy broadcasting (strides with zeros for broadcast dimensions, merging of
dimensions that stay contiguous for every operand, index expressions over loop variables).

Expressions are NaN-propagating where numpy is (``x < 0 ? 0 : x`` rather than ``fmaxf``), and
use only the C99 math functions CUDA also provides, so one table serves both languages; the few
spellings that differ (infinities, NaN) come from a ``Dialect``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.contract import FUSED_ELEMENTWISE
from runtime.symbolic import as_dim

__all__ = [
    "Dialect",
    "C_DIALECT",
    "CUDA_DIALECT",
    "Instr",
    "Emitted",
    "LoopNest",
    "ELEMENTWISE_OPS",
    "ACTIVATIONS",
    "ctype",
    "storage_ctype",
    "literal",
    "node_program",
    "program_supported",
    "emit_program",
    "activation_expr",
    "vector_activation_expr",
    "broadcast_strides",
    "contiguous_strides",
    "coalesce",
    "index_expr",
    "loop_nest",
    "unflatten",
    "ElementwiseNode",
    "elementwise_node",
]


@dataclass(frozen=True)
class Dialect:
    """Spellings that differ between the C and CUDA renderers."""

    name: str
    inf: str
    nan: str


C_DIALECT = Dialect("c", "INFINITY", "NAN")
# The CUDA prelude (templates/cuda/model.cu.j2) defines INFINITY and NAN itself where no host
# header did (NVRTC compiles without the C library), so both languages spell them the same.
CUDA_DIALECT = Dialect("cuda", "INFINITY", "NAN")

# -- type tables ------------------------------------------------------------------------------

_COMPUTE_CTYPES = {"float32": "float", "float64": "double", "int64": "int64_t", "int32": "int32_t"}
_STORAGE_CTYPES = {1: "uint8_t", 2: "uint16_t", 4: "uint32_t", 8: "uint64_t"}
# NVRTC has no <stdint.h>: the CUDA prelude typedefs these from the built-in types.
_CUDA_STORAGE_CTYPES = {1: "oa_u8", 2: "oa_u16", 4: "oa_u32", 8: "oa_u64"}


def ctype(dtype: np.dtype | str) -> str:
    """The C type a kernel computes in for ``dtype``."""
    name = np.dtype(dtype).name
    if name not in _COMPUTE_CTYPES:
        raise KeyError(f"no C compute type for dtype {name}")
    return _COMPUTE_CTYPES[name]


def storage_ctype(dtype: np.dtype | str, dialect: Dialect = C_DIALECT) -> str:
    """An unsigned C type of the same size, for kernels that only move elements."""
    dt = np.dtype(dtype)
    table = _CUDA_STORAGE_CTYPES if dialect.name == "cuda" else _STORAGE_CTYPES
    if dt.kind not in "biufc" or dt.itemsize not in table:
        raise KeyError(f"no {dialect.name} storage type for dtype {dt}")
    return table[dt.itemsize]


def literal(value: float, dialect: Dialect = C_DIALECT) -> str:
    """A float32 C literal that parses back to exactly ``np.float32(value)``."""
    f = np.float32(value)
    if np.isnan(f):
        return dialect.nan
    if np.isinf(f):
        return dialect.inf if f > 0 else f"(-{dialect.inf})"
    text = str(f)  # numpy prints the shortest string that round-trips in float32
    if not any(c in text for c in ".e"):
        text += ".0"
    text += "f"
    return f"({text})" if text.startswith("-") else text


# -- ops --------------------------------------------------------------------------------------

_Attrs = Mapping[str, Any]


def _f(x: float) -> str:
    return literal(x)


def _clip(x: str, lo: float, hi: float) -> str:
    expr = x
    if not math.isinf(hi) or hi < 0:
        expr = f"({x} > {_f(hi)} ? {_f(hi)} : {expr})"
    if not math.isinf(lo) or lo > 0:
        expr = f"({x} < {_f(lo)} ? {_f(lo)} : {expr})"
    return expr


def _gelu(x: str, a: _Attrs) -> str:
    if a["approximate"] == "tanh":
        inner = f"{_f(0.7978845608028654)} * ({x} + {_f(0.044715)} * {x} * {x} * {x})"
        return f"(0.5f * {x} * (1.0f + tanhf({inner})))"
    return f"(0.5f * {x} * (1.0f + erff({x} * {_f(0.7071067811865476)})))"


def _hard_sigmoid(x: str, a: _Attrs) -> str:
    v = f"({_f(a['alpha'])} * {x} + {_f(a['beta'])})"
    return f"({v} < 0.0f ? 0.0f : ({v} > 1.0f ? 1.0f : {v}))"


_UNARY: dict[str, Callable[[str, _Attrs], str]] = {
    "Relu": lambda x, a: f"({x} < 0.0f ? 0.0f : {x})",
    "Sigmoid": lambda x, a: f"(1.0f / (1.0f + expf(-{x})))",
    "Tanh": lambda x, a: f"tanhf({x})",
    "Exp": lambda x, a: f"expf({x})",
    "Log": lambda x, a: f"logf({x})",
    "Neg": lambda x, a: f"(-{x})",
    "Abs": lambda x, a: f"fabsf({x})",
    "Sqrt": lambda x, a: f"sqrtf({x})",
    "Reciprocal": lambda x, a: f"(1.0f / {x})",
    "Erf": lambda x, a: f"erff({x})",
    "Floor": lambda x, a: f"floorf({x})",
    "Ceil": lambda x, a: f"ceilf({x})",
    "Sin": lambda x, a: f"sinf({x})",
    "Cos": lambda x, a: f"cosf({x})",
    "Sign": lambda x, a: f"({x} > 0.0f ? 1.0f : ({x} < 0.0f ? -1.0f : {x}))",
    "Softplus": lambda x, a: f"({x} > 0.0f ? {x} + log1pf(expf(-{x})) : log1pf(expf({x})))",
    "Clip": lambda x, a: _clip(x, float(a["min"]), float(a["max"])),
    "LeakyRelu": lambda x, a: f"({x} < 0.0f ? {x} * {_f(a['alpha'])} : {x})",
    "Elu": lambda x, a: f"({x} < 0.0f ? {_f(a['alpha'])} * (expf({x}) - 1.0f) : {x})",
    "HardSigmoid": _hard_sigmoid,
    "HardSwish": lambda x, a: f"({x} * {_clip(f'({x} / 6.0f + 0.5f)', 0.0, 1.0)})",
    "Gelu": _gelu,
}

_BINARY: dict[str, Callable[[str, str], str]] = {
    "Add": lambda a, b: f"({a} + {b})",
    "Sub": lambda a, b: f"({a} - {b})",
    "Mul": lambda a, b: f"({a} * {b})",
    "Div": lambda a, b: f"({a} / {b})",
    "Pow": lambda a, b: f"powf({a}, {b})",
    "Max": lambda a, b: f"(({a} > {b} || {a} != {a}) ? {a} : {b})",
    "Min": lambda a, b: f"(({a} < {b} || {a} != {a}) ? {a} : {b})",
}

_COMPARE = {"Equal": "==", "Less": "<", "Greater": ">"}
_LOGIC = {"And": "&&", "Or": "||"}
_VARIADIC = {"Sum", "Mean", "Max", "Min"}

# Every op name an elementwise node or program instruction may use here.
ELEMENTWISE_OPS = (
    frozenset(_UNARY) | frozenset(_BINARY) | _VARIADIC | set(_COMPARE) | set(_LOGIC) | {"Not", "Where"}
)
# The activations FusedConv / FusedGemm carry (docs/ops.md); Silu is x * sigmoid(x) through the
# vector math of templates/c/vmath.c.j2 (vsilu, and ssilu: lane 0 of it, so both forms agree).
ACTIVATIONS = frozenset({"", "Relu", "Clip", "LeakyRelu", "Silu"})

_REQUIRED_ATTRS = {
    "Clip": ("min", "max"),
    "LeakyRelu": ("alpha",),
    "Elu": ("alpha",),
    "HardSigmoid": ("alpha", "beta"),
    "Gelu": ("approximate",),
}


@dataclass(frozen=True)
class Instr:
    """One program instruction: ``op`` over refs ``"i<k>"`` (input k) / ``"t<k>"`` (result k)."""

    op: str
    args: tuple[str, ...]
    attrs: Mapping[str, Any]


@dataclass(frozen=True)
class Emitted:
    """Scalar statements ``ctype name = expr;`` in order; ``result`` names the final value."""

    temps: tuple[tuple[str, str, str], ...]
    result: str


def node_program(kind: str, attrs: Mapping[str, Any], n_inputs: int) -> tuple[Instr, ...]:
    """The program a node computes: its own ``program`` for FusedElementwise, else one op."""
    if kind == FUSED_ELEMENTWISE:
        return tuple(
            Instr(str(ins["op"]), tuple(str(r) for r in ins["args"]), dict(ins.get("attrs") or {}))
            for ins in attrs["program"]
        )
    return (Instr(kind, tuple(f"i{k}" for k in range(n_inputs)), dict(attrs)),)


def _arity_ok(op: str, n: int) -> bool:
    if op in _UNARY or op == "Not":
        return n == 1
    if op in _VARIADIC:
        return n >= 1
    if op == "Where":
        return n == 3
    return n == 2


def program_supported(program: Sequence[Instr], n_inputs: int) -> bool:
    """Whether ``emit_program`` can emit ``program`` with float inputs and a float result."""
    try:
        emit_program(program, [f"x{k}" for k in range(n_inputs)])
    except (KeyError, ValueError, TypeError):
        return False
    return True


def emit_program(
    program: Sequence[Instr],
    inputs: Sequence[str],
    consts: Mapping[int, float] | None = None,
    prefix: str = "t",
) -> Emitted:
    """Statements computing ``program`` from input expressions ``inputs`` (float scalars).

    ``consts`` maps input indices whose value is a known scalar (used to strength-reduce, e.g.
    ``Pow(x, 2)`` into ``x * x``). Raises ``KeyError``/``ValueError``/``TypeError`` for an op,
    arity, attribute or type the emitter does not handle.
    """
    if not program:
        raise ValueError("empty elementwise program")
    known = dict(consts or {})
    exprs: list[tuple[str, str]] = [("float", x) for x in inputs]  # (type, expr) per input
    temps: list[tuple[str, str, str]] = []
    results: list[tuple[str, str]] = []

    def ref(r: str) -> tuple[str, str]:
        if len(r) < 2 or r[0] not in "it" or not r[1:].isdigit():
            raise ValueError(f"bad program ref {r!r}")
        k = int(r[1:])
        table = exprs if r[0] == "i" else results
        if k >= len(table):
            raise ValueError(f"program ref {r!r} out of range")
        return table[k]

    for n, ins in enumerate(program):
        out_type, expr = _instr_expr(ins, ref, known)
        name = f"{prefix}{n}"
        temps.append((out_type, name, expr))
        results.append((out_type, name))
    if results[-1][0] != "float":
        raise TypeError("elementwise program must produce a float")
    return Emitted(tuple(temps), results[-1][1])


def _instr_expr(ins: Instr, ref: Callable[[str], tuple[str, str]],
                known: Mapping[int, float]) -> tuple[str, str]:
    """(C type, expression) of one instruction, ``ref`` giving an operand's (type, expression);
    raises for an op, arity, attribute or operand type the emitter does not handle (see
    ``emit_program``)."""
    op = ins.op
    if op not in ELEMENTWISE_OPS or not _arity_ok(op, len(ins.args)):
        raise KeyError(f"elementwise op {op} with {len(ins.args)} args not supported")
    for key in _REQUIRED_ATTRS.get(op, ()):
        if key not in ins.attrs:
            raise KeyError(f"{op} lacks attribute {key!r}")
    args = [ref(r) for r in ins.args]
    types = [t for t, _ in args]
    vals = [e for _, e in args]
    if op in _LOGIC or op == "Not":
        if any(t != "int" for t in types):
            raise TypeError(f"{op} takes boolean operands")
        return "int", f"(!{vals[0]})" if op == "Not" else f"({vals[0]} {_LOGIC[op]} {vals[1]})"
    if op == "Where":
        if types != ["int", "float", "float"]:
            raise TypeError("Where takes (bool, float, float)")
        return "float", f"({vals[0]} ? {vals[1]} : {vals[2]})"
    if any(t != "float" for t in types):
        raise TypeError(f"{op} takes float operands")
    if op in _COMPARE:
        return "int", f"({vals[0]} {_COMPARE[op]} {vals[1]})"
    if op in _UNARY:
        return "float", _UNARY[op](vals[0], ins.attrs)
    if op == "Pow" and ins.args[1][0] == "i" and known.get(int(ins.args[1][1:])) == 2.0:
        return "float", f"({vals[0]} * {vals[0]})"
    if op in _VARIADIC:
        return "float", _variadic(op, vals)
    return "float", _BINARY[op](vals[0], vals[1])


def _variadic(op: str, vals: list[str]) -> str:
    if len(vals) == 1:
        return vals[0]
    if op in ("Sum", "Mean"):
        total = "(" + " + ".join(vals) + ")"
        return total if op == "Sum" else f"({total} / {_f(len(vals))})"
    acc = vals[0]
    for v in vals[1:]:
        acc = _BINARY[op](acc, v)
    return acc


def vector_activation_expr(
    activation: str, act_min: float, act_max: float, act_alpha: float, var: str
) -> str:
    """``activation_expr`` on a whole vector ``var`` (type ``vf``), lane for lane the same values.

    Uses the ``vbcast`` / ``vselect`` helpers of templates/c/model.c.j2; NaN passes through as in
    the scalar form, since every comparison with NaN is false.
    """
    if activation == "":
        return var
    if activation == "Relu":
        return f"vselect({var} < vbcast(0.0f), vbcast(0.0f), {var})"
    if activation == "Clip":
        expr = var
        if not math.isinf(act_max) or act_max < 0:
            hi = f"vbcast({_f(act_max)})"
            expr = f"vselect({var} > {hi}, {hi}, {expr})"
        if not math.isinf(act_min) or act_min > 0:
            lo = f"vbcast({_f(act_min)})"
            expr = f"vselect({var} < {lo}, {lo}, {expr})"
        return expr
    if activation == "LeakyRelu":
        return f"vselect({var} < vbcast(0.0f), {var} * vbcast({_f(act_alpha)}), {var})"
    if activation == "Silu":
        return f"vsilu({var})"
    raise KeyError(f"activation {activation!r} not supported")


def activation_expr(activation: str, act_min: float, act_max: float, act_alpha: float, var: str) -> str:
    """The epilogue activation of FusedConv / FusedGemm applied to the float variable ``var``."""
    if activation == "":
        return var
    if activation == "Relu":
        return _UNARY["Relu"](var, {})
    if activation == "Clip":
        return _clip(var, act_min, act_max)
    if activation == "LeakyRelu":
        return _UNARY["LeakyRelu"](var, {"alpha": act_alpha})
    if activation == "Silu":
        return f"ssilu({var})"
    raise KeyError(f"activation {activation!r} not supported")


# -- index math -------------------------------------------------------------------------------


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major element strides of ``shape``."""
    strides: list[Any] = [1] * len(shape)  # ints, or Exprs of a dynamic graph's symbols
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * as_dim(shape[d + 1])
    return tuple(strides)


def broadcast_strides(in_shape: Sequence[int], out_shape: Sequence[int],
                      same: Callable[[Any, Any], bool] | None = None) -> tuple[int, ...]:
    """Element strides of ``in_shape`` read at each index of ``out_shape`` (numpy broadcasting).
    ``same(a, b)``: two different expressions of a dynamic graph's symbols that are equal at every
    binding a run accepts (an import assumption the runtime checks before any step)."""
    if len(in_shape) > len(out_shape):
        raise ValueError(f"cannot broadcast {tuple(in_shape)} to {tuple(out_shape)}")
    own = contiguous_strides(in_shape)
    pad = len(out_shape) - len(in_shape)
    strides = [0] * len(out_shape)
    for d, size in enumerate(in_shape):
        out = as_dim(out_shape[pad + d])
        if size == out or (same is not None and same(size, out)):
            strides[pad + d] = own[d] if size != 1 else 0
        elif size != 1:
            raise ValueError(f"cannot broadcast {tuple(in_shape)} to {tuple(out_shape)}")
    return tuple(strides)


def coalesce(
    shape: Sequence[int], strides: Sequence[Sequence[int]]
) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """Drop size-1 dimensions and merge neighbours that stay linear for every operand."""
    dims: list[Any] = []  # ints, or Exprs of a dynamic graph's symbols
    cols: list[list[Any]] = [[] for _ in strides]
    for d, size in enumerate(shape):
        if size == 1:
            continue
        if dims and all(col[-1] == as_dim(s[d]) * size for col, s in zip(cols, strides, strict=True)):
            dims[-1] *= as_dim(size)
            for col, s in zip(cols, strides, strict=True):
                col[-1] = as_dim(s[d])
            continue
        dims.append(as_dim(size))
        for col, s in zip(cols, strides, strict=True):
            col.append(as_dim(s[d]))
    if not dims:
        return (1,), tuple((0,) for _ in strides)
    return tuple(dims), tuple(tuple(col) for col in cols)


def index_expr(strides: Sequence[int], names: Sequence[str], text: Callable[[Any], str] = str) -> str:
    """``i0 * s0 + i1 * s1 ...`` with zero strides dropped ("0" when every stride is zero); a
    stride is written by ``text`` (a run-time one as C over the binding: compiler/codegen/cdims.py)."""
    terms = [n if s == 1 else f"{n} * {text(s)}" for n, s in zip(names, strides, strict=True) if s != 0]
    return " + ".join(terms) if terms else "0"


@dataclass(frozen=True)
class LoopNest:
    """A loop nest over ``dims`` (variables ``names``) with each operand's index expression."""

    dims: tuple[int, ...]
    names: tuple[str, ...]
    out_index: str
    in_index: tuple[str, ...]
    total: int


def loop_nest(
    out_shape: Sequence[int], in_strides: Sequence[Sequence[int]], out_strides: Sequence[int] | None = None,
    text: Callable[[Any], Any] | None = None,
) -> LoopNest:
    """The coalesced loop nest writing ``out_shape`` (contiguous unless ``out_strides``). With
    symbolic dims ``text`` turns each run-time dim and stride into the kernel's C (``CDim``); the
    nest's ``total`` is then the C text of the element count."""
    ostr = tuple(out_strides) if out_strides is not None else contiguous_strides(out_shape)
    dims, cols = coalesce(out_shape, [ostr, *in_strides])
    names = tuple(f"i{d}" for d in range(len(dims)))
    write: Callable[[Any], Any] = text if text is not None else (lambda d: d)
    total = math.prod(as_dim(d) for d in out_shape)
    return LoopNest(
        dims=tuple(write(d) for d in dims),
        names=names,
        out_index=index_expr(cols[0], names, lambda s: str(write(s))),
        in_index=tuple(index_expr(c, names, lambda s: str(write(s))) for c in cols[1:]),
        total=write(total),
    )


def unflatten(dims: Sequence[int], names: Sequence[str], flat: str) -> tuple[tuple[str, str], ...]:
    """``(name, expression)`` pairs recovering row-major indices over ``dims`` from ``flat``.

    For a renderer that maps one thread to one element of a loop nest (CUDA); the outermost
    index is a division only, the innermost a remainder only; size-1 dimensions are ``0``. A
    run-time dim (a ``CDim``, C text) stays text.
    """
    out: list[tuple[str, str]] = []
    inner: Any = 1
    for d in range(len(dims) - 1, -1, -1):
        size: Any = int(dims[d]) if isinstance(dims[d], int | np.integer) else dims[d]
        if size == 1:
            expr = "0"
        else:
            scaled = flat if inner == 1 else f"({flat} / {inner})"
            expr = scaled if d == 0 else f"{scaled} % {size}"
        out.append((names[d], expr))
        inner = size if isinstance(inner, int) and inner == 1 else inner * size
    return tuple(reversed(out))


@dataclass(frozen=True)
class ElementwiseNode:
    """An elementwise node ready to render: its loop nest, loads and statements.

    ``loaded`` are the positions (among the node's present inputs) read from memory, as ``in<k>``
    into ``x<k>``; every other input is a scalar constant folded into the expressions as a literal.
    """

    loaded: tuple[int, ...]
    nest: LoopNest
    loads: tuple[tuple[str, str, str], ...]  # (variable, pointer, index expression) per loaded input
    emitted: Emitted
    program_length: int


def scalar_constant(value: Any) -> float | None:
    """The float32 value of a one-element constant ``value`` (an IR Value), else None."""
    if value.const is None or value.const.size != 1:
        return None
    return float(np.asarray(value.const, dtype=np.float32).reshape(-1)[0])


def elementwise_node(
    kind: str,
    attrs: Mapping[str, Any],
    inputs: Sequence[Any],
    out_shape: Sequence[int],
    dialect: Dialect = C_DIALECT,
    text: Callable[[Any], Any] | None = None,
    same: Callable[[Any, Any], bool] | None = None,
) -> ElementwiseNode:
    """The loop nest and statements of an elementwise op over ``inputs`` (IR Values, broadcast to
    ``out_shape``); one-element constants become literals. Symbolic dims need ``text`` (see
    ``loop_nest``); ``same`` as for ``broadcast_strides``."""
    consts: dict[int, float] = {}
    exprs: list[str] = []
    strides: list[tuple[int, ...]] = []
    for k, value in enumerate(inputs):
        c = scalar_constant(value)
        if c is not None:
            consts[k] = c
            exprs.append(literal(c, dialect))
            continue
        exprs.append(f"x{k}")
        strides.append(broadcast_strides(tuple(value.shape), out_shape, same))
    nest = loop_nest(out_shape, strides, text=text)
    loaded = tuple(k for k in range(len(inputs)) if k not in consts)
    loads = tuple((f"x{k}", f"in{k}", idx) for k, idx in zip(loaded, nest.in_index, strict=True))
    program = node_program(kind, attrs, len(inputs))
    return ElementwiseNode(loaded, nest, loads, emit_program(program, exprs, consts), len(program))
