"""The C kernel of ``onnx_aot.QChannelLookup`` (runtime/contract.py; the reference kernel in
runtime/kernels/qoperator.py): one (C, 256) table, each NCHW plane read through its channel's row
(``templates/c/qchannel_lookup.c.j2``); of ``onnx_aot.QTableAdd``, two (C, 256) float32 tables,
an NCHW plane of each operand read through its channel's rows (``templates/c/qtable_add.c.j2``).
Static 8-bit shapes of rank 3 and up. Also ``add_code``:
QBinary "Add" of two operands of the output's shape in AVX-512 float64 lanes
(``templates/c/qbinary_add.c.j2``; qoperator.py's QBinary kernel takes it there)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.codegen.toolchain import TargetInfo
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.providers.base import GenStep
from compiler.providers.base import shape_of
from compiler.providers.c.common import PARALLEL_MIN_WORK
from compiler.providers.c.common import CKernel
from compiler.providers.c.common import StepCode
from compiler.providers.c.common import arg
from compiler.providers.c.common import output_args
from compiler.providers.c.common import params
from compiler.providers.c.elementwise_typed import value_ctype
from compiler.providers.kit import KernelContext
from runtime.contract import Q_CHANNEL_LOOKUP
from runtime.contract import Q_TABLE_ADD

__all__ = ["QAddContext", "QChannelContext", "QChannelLookupKernel", "QTableAddKernel", "add_code"]

_EIGHT_BIT = frozenset({np.dtype(np.int8), np.dtype(np.uint8)})


@dataclass(frozen=True)
class QChannelContext(KernelContext):
    ctype: str
    out_ctype: str
    c: int
    size: int  # elements per plane
    planes: int  # N * C
    parallel: bool


class QChannelLookupKernel(CKernel):
    kinds: tuple[str, ...] = (Q_CHANNEL_LOOKUP,)

    def supports(self, node: Node) -> bool:
        x, table, y = node.input(0), node.input(1), node.outputs[0]
        if len(node.inputs) != 2 or x is None or table is None or x.shape is None or x.is_symbolic:
            return False
        if len(x.shape) < 3 or x.shape != y.shape or table.const is None or table.dtype != y.dtype:
            return False
        return table.const.shape == (int(x.shape[1]), 256) and {x.dtype, y.dtype} <= _EIGHT_BIT

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        x, y = node.input(0), node.outputs[0]
        assert x is not None and x.dtype is not None and y.dtype is not None
        shape = shape_of(x)
        ctype, out_ctype = value_ctype(x.dtype), value_ctype(y.dtype)
        args = (arg(step.inputs[0], ctype, True, step, "input 0"),
                arg(step.inputs[1], out_ctype, True, step, "input 1 (table)"), *output_args(step, out_ctype))
        size = int(np.prod(shape[2:]))
        planes = int(shape[0]) * int(shape[1])
        ctx = QChannelContext(params=params(["x", "table", "y"], args, [True, True, True]), ctype=ctype,
                              out_ctype=out_ctype, c=int(shape[1]), size=size, planes=planes,
                              parallel=planes * size >= PARALLEL_MIN_WORK)
        return StepCode("c/qchannel_lookup.c.j2", ctx, args)


@dataclass(frozen=True)
class QAddContext(KernelContext):
    ctype: str
    widen: str  # the intrinsic widening 16 input bytes to int32 lanes
    n: int
    chunk: int
    chunks: int
    ra: str  # float64 literals of the float32 factors
    rb: str
    za: int
    zb: int
    zc: int
    lo: int
    hi: int
    result: str  # the element map's expression (the tail)
    parallel: bool


_ADD_CHUNK = 16384


def add_code(step: GenStep, factors: tuple[str, str], zeros: tuple[int, int, int],
             result: str) -> StepCode | None:
    """QBinary "Add" whose operands both have the output's shape; None elsewhere."""
    node = step.node
    a, b, y = node.input(0), node.input(3), node.outputs[0]
    if a is None or b is None or not (shape_of(a) == shape_of(b) == shape_of(y)) or y.dtype is None:
        return None
    ctype = value_ctype(y.dtype)
    args = (arg(step.inputs[0], ctype, True, step, "input 0"),
            arg(step.inputs[3], ctype, True, step, "input 3"), *output_args(step, ctype))
    n = int(np.prod(shape_of(y)))
    info = np.iinfo(y.dtype)
    ctx = QAddContext(params=params(["in0", "in1", "y"], args, [True, True, True]), ctype=ctype,
                      widen="cvtepi8_epi32" if y.dtype == np.int8 else "cvtepu8_epi32", n=n, chunk=_ADD_CHUNK,
                      chunks=-(-n // _ADD_CHUNK), ra=factors[0], rb=factors[1], za=zeros[0], zb=zeros[1],
                      zc=zeros[2], lo=int(info.min), hi=int(info.max), result=result,
                      parallel=n >= PARALLEL_MIN_WORK)
    return StepCode("c/qbinary_add.c.j2", ctx, args)


@dataclass(frozen=True)
class QTableAddContext(KernelContext):
    a_ctype: str
    b_ctype: str
    a_affine: tuple[str, int] | None  # the table is a dequantization: (scale literal, zero point)
    b_affine: tuple[str, int] | None
    a_form: bool  # A_form given: the table computed as BatchNormalization arithmetic
    b_form: bool
    out_ctype: str
    c: int
    size: int  # elements per plane
    planes: int  # N * C
    zero: int
    qmin: int
    qmax: int
    parallel: bool


def _affine(table: np.ndarray, dtype: np.dtype) -> tuple[str, int] | None:
    """(scale as a float literal, zero point) where every row of ``table`` is the dequantization
    table of ``dtype`` by one scale and zero point (a DequantizeLinear operand), else None."""
    from runtime.kernels.qoperator import dequantize_table

    row = table[0]
    codes = np.arange(256, dtype=np.uint8).view(dtype).astype(np.int64)
    zeros = codes[row == 0]
    if zeros.size != 1 or not (table == row).all():
        return None
    zero = int(zeros[0])
    up = np.flatnonzero(codes == zero + 1)
    if up.size != 1:
        return None
    scale = np.float32(row[up[0]])
    if not np.isfinite(scale) or not np.array_equal(dequantize_table(dtype, scale, zero), row):
        return None
    return f"{float(scale)!r}f", zero


def _static_8bit(value: Value | None, shape: tuple[int, ...] | None) -> bool:
    return value is not None and not value.is_symbolic and value.shape == shape and value.dtype in _EIGHT_BIT


class QTableAddKernel(CKernel):
    kinds: tuple[str, ...] = (Q_TABLE_ADD,)

    def supports(self, node: Node) -> bool:
        a, ta, b, tb, scale, zero = (node.input(i) for i in range(6))
        y = node.outputs[0]
        if len(node.inputs) > 8 or a is None or a.shape is None or len(a.shape) < 3:
            return False
        forms = [node.input(6), node.input(7)]
        if any(f is not None and (f.const is None or f.const.shape != (int(a.shape[1]), 5)
                                  or f.dtype != np.float32) for f in forms):
            return False
        if not (_static_8bit(a, a.shape) and _static_8bit(b, a.shape) and _static_8bit(y, a.shape)):
            return False
        rows = (int(a.shape[1]), 256)
        tables = all(t is not None and t.const is not None and t.const.shape == rows and t.dtype == np.float32
                     for t in (ta, tb))
        scalar = scale is not None and scale.const is not None and scale.const.size == 1
        return tables and scalar and (zero is None or (zero.const is not None and zero.const.size == 1))

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        a, b, zero, y = node.input(0), node.input(2), node.input(5), node.outputs[0]
        assert a is not None and b is not None and a.dtype is not None and b.dtype is not None
        assert y.dtype is not None
        shape = shape_of(a)
        out_ctype = value_ctype(y.dtype)
        names = ["a", "ta", "b", "tb", "scale"]
        ctypes = [value_ctype(a.dtype), "float", value_ctype(b.dtype), "float", "float"]
        slots = [0, 1, 2, 3, 4]
        for i, name in ((6, "fa"), (7, "fb")):
            if node.input(i) is not None:
                names.append(name)
                ctypes.append("float")
                slots.append(i)
        ins = (arg(step.inputs[i], ct, True, step, f"input {i}") for i, ct in zip(slots, ctypes, strict=True))
        args = (*ins, *output_args(step, out_ctype))
        size, planes = int(np.prod(shape[2:])), int(shape[0]) * int(shape[1])
        z = 0 if zero is None or zero.const is None else int(np.asarray(zero.const).reshape(-1)[0])
        ta, tb = node.input(1), node.input(3)
        assert ta is not None and ta.const is not None and tb is not None and tb.const is not None
        ctx = QTableAddContext(params=params([*names, "y"], args, [True] * len(args)), a_ctype=ctypes[0],
                               b_ctype=ctypes[2], a_affine=_affine(ta.const, a.dtype),
                               b_affine=_affine(tb.const, b.dtype), a_form=node.input(6) is not None,
                               b_form=node.input(7) is not None, out_ctype=out_ctype, c=int(shape[1]),
                               size=size, planes=planes,
                               zero=z, qmin=int(node.attrs["qmin"]), qmax=int(node.attrs["qmax"]),
                               parallel=planes * size >= PARALLEL_MIN_WORK)
        return StepCode("c/qtable_add.c.j2", ctx, args)


KERNELS = (QChannelLookupKernel(), QTableAddKernel())
