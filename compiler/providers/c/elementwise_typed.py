"""C kernels mapping elements of any dtype: Cast, Where, the comparison / logic ops, and per-tensor
QuantizeLinear / DequantizeLinear (at the end of the module).

Each is one loop nest over the output reading every input at its numpy-broadcast index (the index
math of ``compiler.codegen.elementwise``) into a typed scalar, with a C expression giving the
output element. They complement the float32-only elementwise kernels of ``elementwise``: the
comparisons (Equal, Less, Greater, LessOrEqual, GreaterOrEqual) take any numeric or bool inputs,
And / Or / Xor / Not take bools, Where selects elements of any fixed-size dtype, and a bool output is
stored as one byte 0 / 1, as numpy stores it. A kernel may run with its output over a same-shaped,
same-dtype input: each element is read before it is written, at the same index. In a dynamic
graph the nest's sizes and strides are run-time dims (C over the binding, ``rundims.py``).

Cast follows numpy's ``astype`` (the reference kernel): integers narrow modulo 2^bits, floats round
to nearest, bool is ``x != 0``. Float to integer truncates toward zero; where the truncated value
does not fit the target (NaN, infinities, out of range: undefined in ONNX) the generated C still
has no undefined behaviour: int32 / int64 get their minimum, 8 / 16-bit targets convert through
int32 and wrap (what numpy gives on x86), uint32 through int64 and wraps, uint64 takes values
above -1 directly and others through int64. float16 uses the compiler's ``_Float16``; a float16
output is claimed only from bool, 8 / 16-bit integers and floats (conversions that round exactly
once whatever the route).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.codegen.elementwise import LoopNest
from compiler.codegen.elementwise import broadcast_strides
from compiler.codegen.elementwise import loop_nest
from compiler.codegen.elementwise import storage_ctype
from compiler.codegen.toolchain import TargetInfo
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.providers.base import GenStep
from compiler.providers.base import shape_of
from compiler.providers.c.common import PARALLEL_MIN_WORK
from compiler.providers.c.common import Arg
from compiler.providers.c.common import CKernel
from compiler.providers.c.common import StepCode
from compiler.providers.c.common import arg
from compiler.providers.c.common import output_args
from compiler.providers.c.rundims import known_zero
from compiler.providers.c.rundims import parallel_if
from compiler.providers.c.rundims import run_dims
from compiler.providers.c.rundims import symbolic_const
from compiler.providers.kit import KernelContext
from compiler.providers.kit import Param

__all__ = [
    "MapContext",
    "CastKernel",
    "WhereKernel",
    "CompareKernel",
    "QuantizeKernel",
    "DequantizeKernel",
    "value_ctype",
    "cast_expr",
    "cast_supported",
]

_CHUNK = 4096  # elements per parallel chunk when the nest is a single loop

_VALUE_CTYPES = {
    "bool": "uint8_t",
    "int8": "int8_t",
    "int16": "int16_t",
    "int32": "int32_t",
    "int64": "int64_t",
    "uint8": "uint8_t",
    "uint16": "uint16_t",
    "uint32": "uint32_t",
    "uint64": "uint64_t",
    "float16": "_Float16",
    "float32": "float",
    "float64": "double",
}
# float16 outputs only from types whose conversion rounds once whatever the route.
_TO_HALF_FROM = frozenset({"bool", "int8", "uint8", "int16", "uint16", "float16", "float32", "float64"})

_INT64 = "({v} >= -9223372036854775808.0 && {v} < 9223372036854775808.0 ? (int64_t){v} : INT64_MIN)"
_INT32 = "({v} > -2147483649.0 && {v} < 2147483648.0 ? (int32_t){v} : INT32_MIN)"
_FLOAT_TO_INT = {
    "int64": _INT64,
    "int32": _INT32,
    "int16": f"(int16_t){_INT32}",
    "int8": f"(int8_t){_INT32}",
    "uint16": f"(uint16_t){_INT32}",
    "uint8": f"(uint8_t){_INT32}",
    "uint32": f"(uint32_t){_INT64}",
    "uint64": f"({{v}} > -1.0 && {{v}} < 18446744073709551616.0 ? (uint64_t){{v}} : (uint64_t){_INT64})",
}

_COMPARE = {"Equal": "==", "Less": "<", "Greater": ">", "LessOrEqual": "<=", "GreaterOrEqual": ">="}
_LOGIC = {
    "And": "({a} && {b})",
    "Or": "({a} || {b})",
    "Xor": "(({a} != 0) != ({b} != 0))",
    "Not": "({a} == 0)",
}


def value_ctype(dtype: np.dtype) -> str:
    """The C type holding one element of ``dtype`` by value (bool: a uint8_t 0 / 1)."""
    name = np.dtype(dtype).name
    if name not in _VALUE_CTYPES:
        raise KeyError(f"no C value type for dtype {name}")
    return _VALUE_CTYPES[name]


def cast_supported(src: np.dtype, dst: np.dtype) -> bool:
    """Whether ``cast_expr`` converts ``src`` to ``dst`` exactly as numpy's ``astype``."""
    s, d = np.dtype(src).name, np.dtype(dst).name
    if s not in _VALUE_CTYPES or d not in _VALUE_CTYPES:
        return False
    return d != "float16" or s in _TO_HALF_FROM


def cast_expr(src: np.dtype, dst: np.dtype, v: str) -> str:
    """C expression converting the scalar variable ``v`` (float16 sources: loaded as float)."""
    s, d = np.dtype(src), np.dtype(dst)
    to = value_ctype(d)
    if d.kind == "b":
        return f"(uint8_t)({v} != 0)"
    if s.kind == "b":
        return f"({to})({v} != 0)"
    if s.kind == "f" and d.kind in "iu":
        return _FLOAT_TO_INT[d.name].format(v=v)
    return f"({to}){v}"


@dataclass(frozen=True)
class MapContext(KernelContext):
    nest: LoopNest
    loads: tuple[tuple[str, str, str, str], ...]  # (ctype, variable, pointer param, index expression)
    result: str  # C expression of the output element
    parallel: bool
    chunk: int
    parallel_if: str = ""  # run-time dims (CDim sizes): the C condition for the worker pool


def _broadcasts(node: Node) -> bool:
    """Every input broadcasting to the one output (run-time dims too; no symbolic constant)."""
    if len(node.outputs) != 1 or not node.inputs or any(v is None or symbolic_const(v) for v in node.inputs):
        return False
    out = shape_of(node.outputs[0], symbolic=True)
    try:
        for v in node.inputs:
            broadcast_strides(shape_of(v, symbolic=True), out)
    except ValueError:
        return False
    return True


def _build(step: GenStep, ctypes: list[tuple[str, str]], out_ctype: str, expr: str) -> StepCode:
    """The map step: input k loaded as ``ctypes[k]`` = (pointer type, variable type) into ``a<k>``."""
    node = step.node
    out_shape = shape_of(node.outputs[0], symbolic=True)
    args: list[Arg] = []
    strides = []
    for k, value in enumerate(node.inputs):
        assert value is not None
        args.append(arg(step.inputs[k], ctypes[k][0], True, step, f"input {k} ({value.name})"))
        strides.append(broadcast_strides(shape_of(value, symbolic=True), out_shape))
    args += output_args(step, out_ctype)
    rd = run_dims(step)  # a dynamic node's sizes and strides: C over the binding
    nest = loop_nest(out_shape, strides, text=rd.write if rd.dynamic else None)
    names = [f"in{k}" for k in range(len(node.inputs))] + ["y"]
    ctx = MapContext(
        params=tuple(Param(n, a.ctype, a.const, False) for n, a in zip(names, args, strict=True)) + rd.params,
        nest=nest,
        loads=tuple(
            (var_type, f"a{k}", f"in{k}", index)
            for k, ((_, var_type), index) in enumerate(zip(ctypes, nest.in_index, strict=True))
        ),
        result=expr,
        parallel=rd.dynamic or nest.total >= PARALLEL_MIN_WORK,
        chunk=_CHUNK,
        parallel_if=parallel_if(nest.total, PARALLEL_MIN_WORK),
    )
    if known_zero(nest.total):
        return StepCode(None, ctx, ())
    return StepCode("c/map_typed.c.j2", ctx, (*args, *rd.args))


def _dtype(v: Value | None) -> np.dtype:
    assert v is not None and v.dtype is not None
    return v.dtype


class CastKernel(CKernel):
    kinds: tuple[str, ...] = ("Cast",)
    dynamic = True  # run-time dims (the map's nest from the binding)

    def supports(self, node: Node) -> bool:
        if len(node.inputs) != 1 or not _broadcasts(node):
            return False
        src, dst = _dtype(node.input(0)), _dtype(node.outputs[0])
        if dst != np.dtype(str(node.attrs["to"])):
            return False
        return cast_supported(src, dst) and shape_of(node.input(0), symbolic=True) == shape_of(
            node.outputs[0], symbolic=True)

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        src, dst = _dtype(step.node.input(0)), _dtype(step.node.outputs[0])
        var = "float" if src.name == "float16" else value_ctype(src)
        return _build(step, [(value_ctype(src), var)], value_ctype(dst), cast_expr(src, dst, "a0"))


class WhereKernel(CKernel):
    kinds: tuple[str, ...] = ("Where",)
    dynamic = True

    def supports(self, node: Node) -> bool:
        if len(node.inputs) != 3 or not _broadcasts(node):
            return False
        cond, x, y = (_dtype(v) for v in node.inputs)
        out = _dtype(node.outputs[0])
        return cond.kind == "b" and x == out and y == out and out.kind in "biuf" and out.name in _VALUE_CTYPES

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        ctype = storage_ctype(_dtype(step.node.outputs[0]))
        loads = [("uint8_t", "uint8_t"), (ctype, ctype), (ctype, ctype)]
        return _build(step, loads, ctype, "(a0 ? a1 : a2)")


class CompareKernel(CKernel):
    kinds: tuple[str, ...] = tuple(_COMPARE) + tuple(_LOGIC)
    dynamic = True

    def supports(self, node: Node) -> bool:
        arity = 1 if node.kind == "Not" else 2
        if len(node.inputs) != arity or not _broadcasts(node) or _dtype(node.outputs[0]).kind != "b":
            return False
        dtypes = {_dtype(v) for v in node.inputs}
        if len(dtypes) != 1:
            return False
        (dtype,) = dtypes
        if node.kind in _LOGIC:
            return dtype.kind == "b"
        return dtype.name in _VALUE_CTYPES

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        ctype = value_ctype(_dtype(node.input(0)))
        loads = [(ctype, ctype)] * len(node.inputs)
        if node.kind in _COMPARE:
            expr = f"(uint8_t)(a0 {_COMPARE[node.kind]} a1)"
        else:
            expr = "(uint8_t)" + _LOGIC[node.kind].format(a="a0", b="a1")
        return _build(step, loads, "uint8_t", expr)


# QuantizeLinear / DequantizeLinear per tensor (a one-element scale and zero point, which broadcast
# like any map input): the reference kernel's arithmetic in C. Quantize divides in float32 (the
# ``precision`` a float32 scale gives), rounds half to even (``rintf``), adds the zero point
# (exact: the sum only leaves float32's exact integers far outside the target's range, where
# either way saturates), maps NaN to 0 and saturates; Dequantize multiplies the exact integer
# ``x - zero`` by the scale in float32.
_QUANT_CTYPES = frozenset({"int8", "uint8", "int16", "uint16"})


def _per_tensor(node: Node, x_names: frozenset[str]) -> bool:
    """x of ``x_names``, a float32 scale and (when given) a zero point, each of one element."""
    if not 2 <= len(node.inputs) <= 3 or not _broadcasts(node) or int(node.attrs.get("block_size", 0)):
        return False
    x, scale = node.inputs[0], node.inputs[1]
    ok = _dtype(x).name in x_names and _dtype(scale) == np.float32
    return ok and all(int(np.prod(shape_of(v))) == 1 for v in node.inputs[1:] if v is not None)


class QuantizeKernel(CKernel):
    kinds: tuple[str, ...] = ("QuantizeLinear",)
    dynamic = True  # run-time dims of x (the scale and zero point: one element each)

    def supports(self, node: Node) -> bool:
        to = str(node.attrs.get("to", ""))
        zero = node.inputs[2] if len(node.inputs) > 2 else None
        return (_per_tensor(node, frozenset({"float32"})) and str(node.attrs.get("precision")) == "float32"
                and to in _QUANT_CTYPES and _dtype(node.outputs[0]).name == to
                and (zero is None or _dtype(zero).name == to))

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        to = np.dtype(_dtype(node.outputs[0]))
        info = np.iinfo(to)
        ctype = value_ctype(to)
        loads = [("float", "float"), ("float", "float")] + [(ctype, ctype)] * (len(node.inputs) - 2)
        q = "(rintf(a0 / a1) + (float)a2)" if len(node.inputs) > 2 else "rintf(a0 / a1)"
        lo, hi = f"{info.min}.0f", f"{info.max}.0f"
        expr = f"({ctype})(int)({q} != {q} ? 0.0f : {q} < {lo} ? {lo} : {q} > {hi} ? {hi} : {q})"
        return _build(step, loads, ctype, expr)


class DequantizeKernel(CKernel):
    kinds: tuple[str, ...] = ("DequantizeLinear",)
    dynamic = True

    def supports(self, node: Node) -> bool:
        zero = node.inputs[2] if len(node.inputs) > 2 else None
        x = node.inputs[0]
        return (_per_tensor(node, _QUANT_CTYPES | {"int32"}) and str(node.attrs.get("to")) == "float32"
                and _dtype(node.outputs[0]) == np.float32 and (zero is None or _dtype(zero) == _dtype(x)))

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        ctype = value_ctype(_dtype(node.input(0)))
        loads = [(ctype, ctype), ("float", "float")] + [(ctype, ctype)] * (len(node.inputs) - 2)
        if len(node.inputs) > 2:
            expr = "(float)((int64_t)a0 - (int64_t)a2) * a1"
        else:
            expr = "(float)a0 * a1"
        return _build(step, loads, "float", expr)


KERNELS = (CastKernel(), WhereKernel(), CompareKernel(), QuantizeKernel(), DequantizeKernel())
