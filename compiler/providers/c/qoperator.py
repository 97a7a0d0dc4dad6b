"""C kernels of the 8-bit integer ops (runtime/contract.py; docs/ops.md, "Integer ops"): QBinary and
QLookup as element maps (templates/c/map_typed.c.j2), a QBinary whose one operand is constant
along long rows (a per-channel B) as per-row 256-entry tables of the same expression
(qbinary_rows.c.j2), QAveragePool (qpool.c.j2), QGlobalAveragePool (qglobal_pool.c.j2) and
QSoftmax (qsoftmax.c.j2).

Each computes what its reference kernel (runtime/kernels/qoperator.py) computes, bit for bit: the
scales and zero points are constants known here, so their float32 factors, the dequantization
and exp tables are formed once in Python with the reference's own functions and written into the
kernel as literals. The build contracts multiply-adds (``-ffp-contract=fast``), so no kernel leaves
a float32 product for the compiler to fuse: products of integers and float32 factors are formed
in double, where they are exact, and rounded to float32 by a cast; sums read tables. Every kernel
splits on output elements (rows), so results do not depend on the thread count.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.codegen.elementwise import LoopNest
from compiler.codegen.elementwise import broadcast_strides
from compiler.codegen.elementwise import coalesce
from compiler.codegen.elementwise import contiguous_strides
from compiler.codegen.elementwise import literal
from compiler.codegen.elementwise import loop_nest
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
from compiler.providers.c.common import params
from compiler.providers.c.elementwise_typed import MapContext
from compiler.providers.c.elementwise_typed import value_ctype
from compiler.providers.c.qchannel import add_code
from compiler.providers.c.qlookup import lookup_code
from compiler.providers.geometry import PoolGeometry
from compiler.providers.geometry import claimed
from compiler.providers.kit import KernelContext
from compiler.providers.kit import Param
from runtime.contract import Q_AVERAGE_POOL
from runtime.contract import Q_BINARY
from runtime.contract import Q_GLOBAL_AVERAGE_POOL
from runtime.contract import Q_LOOKUP
from runtime.contract import Q_SOFTMAX
from runtime.kernels.qoperator import binary_ratios
from runtime.kernels.qoperator import dequantize_table
from runtime.kernels.qoperator import softmax_exp_table
from runtime.kernels.qoperator import softmax_factor

__all__ = ["QGlobalPoolContext", "QOut", "QPoolContext", "QRowsContext", "QSoftmaxContext"]

_EIGHT_BIT = frozenset({np.dtype(np.int8), np.dtype(np.uint8)})
_CHUNK = 4096  # elements per parallel chunk of a one-loop map


def _static(v: Value | None) -> bool:
    return v is not None and v.dtype is not None and v.shape is not None and not v.is_symbolic


def _params_known(node: Node, data: tuple[int, ...]) -> bool:
    """Inputs ``data`` and the output are 8-bit of one type with static shapes; every other
    present input is a constant of one element (a float32 scale or a zero point of that type)."""
    values = [node.outputs[0], *(node.inputs[k] for k in data)]
    if len(node.outputs) != 1 or not all(_static(v) for v in values):
        return False
    dtypes = {v.dtype for v in values if v is not None}
    if len(dtypes) != 1 or not dtypes <= _EIGHT_BIT:
        return False
    for k, v in enumerate(node.inputs):
        if k in data or v is None:
            continue
        if v.const is None or v.const.size != 1 or v.const.dtype not in (np.dtype(np.float32), *dtypes):
            return False
    return True


def _ctype(v: Value | None) -> str:
    assert v is not None and v.dtype is not None
    return value_ctype(v.dtype)


def _const(node: Node, k: int) -> np.ndarray | None:
    v = node.input(k)
    return None if v is None else v.const


def _zero(node: Node, k: int) -> int:
    z = _const(node, k)
    return 0 if z is None else int(z.reshape(-1)[0])


def _limits(node: Node) -> tuple[int, int]:
    info = np.iinfo(node.outputs[0].dtype)
    return int(info.min), int(info.max)


@dataclass(frozen=True)
class QOut:
    """The quantized output of the pools and QSoftmax: its zero point and the range of its type,
    where results saturate."""

    zero: int
    lo: int
    hi: int


def _qout(node: Node, zero: int) -> QOut:
    """The output whose zero point is input ``zero`` of ``node``."""
    return QOut(_zero(node, zero), *_limits(node))


def _double(value: float) -> str:
    """A C double literal equal to ``value`` (hexadecimal: exact)."""
    text = float(value).hex()
    return f"({text})" if text.startswith("-") else text


@dataclass(frozen=True)
class _Unary:
    """What the kernels from X to Y of X's 8-bit type (the pools, QSoftmax) start from: X's dtype
    and shape, their C type, and the step's arguments and parameters ``x`` -> ``y``."""

    dtype: np.dtype
    shape: tuple[int, ...]
    ctype: str
    args: tuple[Arg, ...]
    params: tuple[Param, ...]


def _unary(step: GenStep) -> _Unary:
    x = step.node.input(0)
    assert x is not None and x.dtype is not None
    ctype = value_ctype(x.dtype)
    args = (arg(step.inputs[0], ctype, True, step, "input 0"), *output_args(step, ctype))
    return _Unary(x.dtype, shape_of(x), ctype, args, params(["x", "y"], args, [True, True]))


def _map(step: GenStep, inputs: tuple[int, ...], extra: tuple[tuple[int, str], ...], result: str) -> StepCode:
    """An element map over the output (map_typed.c.j2): inputs ``inputs`` loaded at their broadcast
    index as ``a0``, ``a1`` ..., inputs ``extra`` passed whole as (index, parameter name)."""
    node = step.node
    out = shape_of(node.outputs[0])
    ctypes = [_ctype(node.inputs[k]) for k in inputs]
    strides = [broadcast_strides(shape_of(node.inputs[k]), out) for k in inputs]
    nest = loop_nest(out, strides)
    loaded = [arg(step.inputs[k], c, True, step, f"input {k}") for k, c in zip(inputs, ctypes, strict=True)]
    whole = [arg(step.inputs[k], _ctype(node.inputs[k]), True, step, name) for k, name in extra]
    outs = output_args(step, _ctype(node.outputs[0]))
    names = [f"in{j}" for j in range(len(inputs))] + [name for _, name in extra] + ["y"]
    args = [*loaded, *whole, *outs]
    ctx = MapContext(
        params=tuple(Param(n, a.ctype, a.const, False) for n, a in zip(names, args, strict=True)),
        nest=nest,
        loads=tuple((c, f"a{j}", f"in{j}", index)
                    for j, (c, index) in enumerate(zip(ctypes, nest.in_index, strict=True))),
        result=result,
        parallel=nest.total >= PARALLEL_MIN_WORK,
        chunk=_CHUNK,
    )
    return StepCode("c/map_typed.c.j2", ctx, tuple(args))


def _saturated(expr: str, node: Node, ftype: str = "double") -> str:
    """``expr`` (a rounded value of ``ftype``) clamped to the output's range and converted: a
    statement expression whose comparisons vectorize (min / max), where fmin / fmax are calls."""
    lo, hi = _limits(node)
    ctype = _ctype(node.outputs[0])
    return f"({{ const {ftype} v = {expr}; ({ctype})(int)(v < {lo}.0 ? {lo}.0 : v > {hi}.0 ? {hi}.0 : v); }})"


@dataclass(frozen=True)
class QRowsContext(KernelContext):
    nest: LoopNest
    ctype: str  # the inputs' C type
    out_ctype: str
    result: str  # the map's C expression of one result from a0 (A) and a1 (B)
    fixed_var: str  # "a0" / "a1": the operand constant along each row
    fixed_ptr: str
    fixed_index: str  # its index in the row (the innermost variable is 0)
    vary_var: str
    vary_ptr: str
    vary_index: str
    parallel: bool


_ROW_TABLE_MIN = 1024  # elements a row needs for its 256-entry table to pay


def _row_tables(step: GenStep, result: str) -> StepCode | None:
    """QBinary as per-row tables (qbinary_rows.c.j2) where one operand is constant along long
    innermost rows and the other is not; None elsewhere."""
    node = step.node
    out = shape_of(node.outputs[0])
    strides = [broadcast_strides(shape_of(node.inputs[k]), out) for k in (0, 3)]
    dims, cols = coalesce(out, [contiguous_strides(out), *strides])
    if not dims or dims[-1] < _ROW_TABLE_MIN or [c[-1] == 0 for c in cols[1:]].count(True) != 1:
        return None
    fixed = 0 if cols[1][-1] == 0 else 1
    nest = loop_nest(out, strides)
    ctype = _ctype(node.inputs[0])
    args = [arg(step.inputs[k], ctype, True, step, f"input {k}") for k in (0, 3)]
    args += output_args(step, _ctype(node.outputs[0]))
    ctx = QRowsContext(
        params=params(["in0", "in1", "y"], args, [True, True, True]), nest=nest, ctype=ctype,
        out_ctype=_ctype(node.outputs[0]), result=result,
        fixed_var=f"a{fixed}", fixed_ptr=f"in{fixed}", fixed_index=nest.in_index[fixed],
        vary_var=f"a{1 - fixed}", vary_ptr=f"in{1 - fixed}", vary_index=nest.in_index[1 - fixed],
        parallel=nest.total >= PARALLEL_MIN_WORK,
    )
    return StepCode("c/qbinary_rows.c.j2", ctx, tuple(args))


class QBinaryKernel(CKernel):
    kinds: tuple[str, ...] = (Q_BINARY,)

    def supports(self, node: Node) -> bool:
        return node.attrs.get("op") in ("Add", "Mul") and _params_known(node, (0, 3))

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        op = str(node.attrs["op"])
        za, zb, zc = _zero(node, 2), _zero(node, 5), _zero(node, 7)
        ra, rb = binary_ratios(op, _const(node, 1), _const(node, 4), _const(node, 6))
        da, db = f"(double)((int)a0 - ({za}))", f"(double)((int)a1 - ({zb}))"
        if op == "Add":  # exact in double (products of 8-bit differences and float32 factors)
            expr = _saturated(f"rint({_double(ra)} * {da} + {_double(rb)} * {db} + {zc}.0)", node)
            same = add_code(step, (_double(ra), _double(rb)), (za, zb, zc), expr)
            if same is not None:
                return same
        else:  # the exact product scaled in float32, the zero point added in float32 (cast by cast)
            scaled = f"(double)(float)({da} * {db} * {_double(ra)})"
            expr = _saturated(f"rintf((float)({scaled} + {zc}.0))", node, "float")
        return _row_tables(step, expr) or _map(step, (0, 3), (), expr)


class QLookupKernel(CKernel):
    kinds: tuple[str, ...] = (Q_LOOKUP,)

    def supports(self, node: Node) -> bool:
        x, table = node.input(0), node.input(1)
        return (len(node.inputs) == 2 and _static(x) and _static(node.outputs[0]) and table is not None
                and table.dtype == node.outputs[0].dtype and table.size == 256
                and {x.dtype, table.dtype} <= _EIGHT_BIT and shape_of(x) == shape_of(node.outputs[0]))  # type: ignore[union-attr]

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        return lookup_code(step)


@dataclass(frozen=True)
class QPoolContext(KernelContext):
    ctype: str
    g: PoolGeometry
    deq: tuple[str, ...]  # float32 literals: the dequantized value of each input byte
    count_include_pad: bool
    y_scale: str  # float32 literal
    y: QOut
    parallel: bool


class QAveragePoolKernel(CKernel):
    kinds: tuple[str, ...] = (Q_AVERAGE_POOL,)

    def supports(self, node: Node) -> bool:
        if not _params_known(node, (0,)):
            return False
        g = PoolGeometry.from_node(node, "NCHW")
        return g is not None and g.dh == 1 and g.dw == 1

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        x = _unary(step)
        g = claimed(PoolGeometry.from_node(node, "NCHW"), node)
        ctx = QPoolContext(
            params=x.params,
            ctype=x.ctype,
            g=g,
            deq=tuple(literal(v) for v in dequantize_table(x.dtype, _const(node, 1), _const(node, 2))),
            count_include_pad=bool(int(node.attrs["count_include_pad"])),
            y_scale=literal(float(_const(node, 3).reshape(-1)[0])),  # type: ignore[union-attr]
            y=_qout(node, 4),
            parallel=g.batch * g.c * g.oh * g.ow * g.kh * g.kw >= PARALLEL_MIN_WORK,
        )
        return StepCode("c/qpool.c.j2", ctx, x.args)


@dataclass(frozen=True)
class QGlobalPoolContext(KernelContext):
    ctype: str
    channels_last: bool
    outs: int  # N * C
    c: int
    size: int  # elements per image
    x_zero: int
    factor: str  # double literal of the float32 factor x_scale / (y_scale * size)
    y: QOut
    parallel: bool


class QGlobalAveragePoolKernel(CKernel):
    kinds: tuple[str, ...] = (Q_GLOBAL_AVERAGE_POOL,)

    def supports(self, node: Node) -> bool:
        x = node.input(0)
        if not _params_known(node, (0,)) or x is None or len(shape_of(x)) < 3:
            return False
        shape = shape_of(x)
        size = int(np.prod(shape[1:-1] if int(node.attrs["channels_last"]) else shape[2:]))
        return size < 1 << 23  # (the int32 sum of 8-bit values cannot overflow)

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        x = _unary(step)
        shape = x.shape
        last = bool(int(node.attrs["channels_last"]))
        c = shape[-1] if last else shape[1]
        size = int(np.prod(shape[1:-1] if last else shape[2:]))
        scale = lambda k: np.float32(_const(node, k).reshape(-1)[0])  # type: ignore[union-attr]  # noqa: E731
        ctx = QGlobalPoolContext(
            params=x.params, ctype=x.ctype, channels_last=last,
            outs=shape[0] * c, c=c, size=size, x_zero=_zero(node, 2),
            factor=_double(float(scale(1) / (scale(3) * np.float32(size)))),
            y=_qout(node, 4),
            parallel=int(np.prod(shape)) >= PARALLEL_MIN_WORK,
        )
        return StepCode("c/qglobal_pool.c.j2", ctx, x.args)


@dataclass(frozen=True)
class QSoftmaxContext(KernelContext):
    ctype: str
    rows: int
    length: int
    table: tuple[str, ...]  # float32 literals: e[k] for an input k below its row's maximum
    factor: str  # float32 literal: floor(1 / y_scale)
    y: QOut  # (q >= y.zero: only y.hi can be reached)
    parallel: bool


class QSoftmaxKernel(CKernel):
    kinds: tuple[str, ...] = (Q_SOFTMAX,)

    def supports(self, node: Node) -> bool:
        x = node.input(0)
        return _params_known(node, (0,)) and x is not None and len(shape_of(x)) >= 1 and shape_of(x)[-1] > 0

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        x = _unary(step)
        shape = x.shape
        ctx = QSoftmaxContext(
            params=x.params, ctype=x.ctype,
            rows=int(np.prod(shape[:-1])), length=int(shape[-1]),
            table=tuple(literal(v) for v in softmax_exp_table(_const(node, 1), int(shape[-1]))),
            factor=literal(float(softmax_factor(_const(node, 2)))), y=_qout(node, 3),
            parallel=int(np.prod(shape)) * 4 >= PARALLEL_MIN_WORK,
        )
        return StepCode("c/qsoftmax.c.j2", ctx, x.args)


KERNELS = (QBinaryKernel(), QLookupKernel(), QAveragePoolKernel(), QGlobalAveragePoolKernel(),
           QSoftmaxKernel())
