"""CUDA kernels that normalize or reduce NCHW planes and rows.

Per channel (``templates/cuda/channel.cu.j2``): GlobalAveragePool / GlobalMaxPool (one warp per
plane), BatchNormalization and LRN (one thread per element). Per row, one warp a row
(``templates/cuda/rows.cu.j2``): Softmax / LogSoftmax, LayerNormalization, ReduceMean / ReduceSum
over any axes. Attribute and shape checks are the C kernels' where the C provider runs the op.
A dynamic graph's channel kernels, Softmax / LogSoftmax and LayerNormalization (normalized dims
static) take their run-time sizes as parameters (``RunDims``); its reductions run elsewhere.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from compiler.codegen.elementwise import broadcast_strides
from compiler.codegen.elementwise import coalesce
from compiler.codegen.elementwise import contiguous_strides
from compiler.codegen.elementwise import index_expr
from compiler.codegen.elementwise import literal
from compiler.codegen.elementwise import unflatten
from compiler.ir.graph import Node
from compiler.providers.base import GenStep
from compiler.providers.base import shape_of
from compiler.providers.c.norm import ChannelKernel
from compiler.providers.c.norm import SoftmaxKernel
from compiler.providers.cuda.common import THREADS
from compiler.providers.cuda.common import WARPS
from compiler.providers.cuda.common import CudaKernel
from compiler.providers.cuda.common import KernelCode
from compiler.providers.cuda.common import RunDims
from compiler.providers.cuda.common import blocks
from compiler.providers.cuda.common import float_params
from compiler.providers.cuda.common import input_ptrs
from compiler.providers.cuda.common import output_ptrs
from compiler.providers.cuda.common import used_indices
from compiler.providers.kit import KernelContext

__all__ = ["CudaChannelContext", "CudaChannelKernel", "RowsContext", "CudaSoftmaxKernel",
           "CudaLayerNormKernel", "CudaReduceKernel"]


@dataclass(frozen=True)
class CudaChannelContext(KernelContext):
    threads: int
    op: str  # "global_avg" | "global_max" | "batchnorm" | "lrn"
    n: Any  # int, or a run-time dim (CDim)
    c: int
    s: Any
    eps: str
    lrn_lo: int
    lrn_hi: int
    lrn_alpha: str
    lrn_beta: str
    lrn_bias: str
    dims: tuple[str, ...] = ()  # run-time dim parameters (a dynamic graph's node)


class _Dynamic(CudaKernel):
    """A row or channel kernel that also takes a dynamic graph's node (sizes as parameters)."""

    dynamic = True


class CudaChannelKernel(_Dynamic):
    claims_like = ChannelKernel

    def build(self, step: GenStep) -> tuple[KernelCode, ...]:
        node = step.node
        xs = shape_of(node.input(0), symbolic=True)
        rd = RunDims()
        a = node.attrs
        op = {"GlobalAveragePool": "global_avg", "GlobalMaxPool": "global_max",
              "BatchNormalization": "batchnorm", "LRN": "lrn"}[node.op_type]  # fmt: skip
        if op == "batchnorm":  # may run in place: nothing restrict
            params = float_params(["x", "scale", "bias", "mean", "var", "y"], False)
        else:
            params = float_params(["x", "y"], True)
        size = int(a["size"]) if op == "lrn" else 1
        s = math.prod(xs[2:])
        ctx = CudaChannelContext(
            params=params, threads=THREADS, op=op, n=rd(xs[0]), c=xs[1],
            s=rd(s), eps=literal(float(a["epsilon"])) if op == "batchnorm" else "0.0f",
            lrn_lo=(size - 1) // 2, lrn_hi=size - 1 - (size - 1) // 2,
            lrn_alpha=literal(float(a["alpha"]) / size) if op == "lrn" else "0.0f",
            lrn_beta=literal(float(a["beta"])) if op == "lrn" else "0.0f",
            lrn_bias=literal(float(a["bias"])) if op == "lrn" else "0.0f", dims=rd.names,
        )  # fmt: skip
        per_block = WARPS if op.startswith("global") else THREADS
        work = xs[0] * xs[1] * (1 if op.startswith("global") else s)
        args = (*input_ptrs(step), *output_ptrs(step), *rd.args)
        grid = (blocks(work, per_block), 1, 1)
        return (KernelCode("cuda/channel.cu.j2", ctx, grid, (THREADS, 1, 1), 0, args),)


@dataclass(frozen=True)
class RowsContext(KernelContext):
    threads: int
    op: str  # "softmax" | "logsoftmax" | "layernorm" | "reduce"
    rows: Any  # int, or a run-time dim (CDim)
    length: Any
    inner: Any
    scale: str  # layernorm: 1 / length; reduce: "" (sum) or 1 / count (mean)
    eps: str
    has_bias: bool
    row_index: tuple[tuple[str, str], ...]  # reduce: kept indices from `row`
    row_base: str
    red_index: tuple[tuple[str, str], ...]  # reduce: reduced indices from `r`
    red_offset: str
    dims: tuple[str, ...] = ()  # run-time dim parameters (a dynamic graph's node)


def _rows(step: GenStep, ctx: RowsContext, rows: Any = None,
          rd: RunDims | None = None) -> tuple[KernelCode, ...]:
    """The row kernel's code: ``rows`` (an int or an ``Expr``; default ``ctx.rows``) one warp each,
    ``rd`` the run-time dims the context was written with."""
    rd = rd if rd is not None else RunDims()
    ctx = dataclasses.replace(ctx, dims=rd.names)
    args = (*input_ptrs(step), *output_ptrs(step), *rd.args)
    grid = (blocks(ctx.rows if rows is None else rows, WARPS), 1, 1)
    return (KernelCode("cuda/rows.cu.j2", ctx, grid, (THREADS, 1, 1), 0, args),)


_NO_REDUCE = dict(row_index=(), row_base="0", red_index=(), red_offset="0")


class CudaSoftmaxKernel(_Dynamic):
    claims_like = SoftmaxKernel

    def supports(self, node: Node) -> bool:
        return super().supports(node) and bool(shape_of(node.input(0), symbolic=True))

    def build(self, step: GenStep) -> tuple[KernelCode, ...]:
        node = step.node
        xs, axis = shape_of(node.input(0), symbolic=True), int(node.attrs["axis"])
        inner = math.prod(xs[axis + 1 :])
        rows = math.prod(xs[:axis]) * inner
        rd = RunDims()
        ctx = RowsContext(
            params=float_params(["x", "y"], False), threads=THREADS,
            op=node.op_type.lower(), rows=rd(rows), length=rd(xs[axis]),
            inner=rd(inner), scale="", eps="", has_bias=False, **_NO_REDUCE,  # type: ignore[arg-type]
        )  # fmt: skip
        return _rows(step, ctx, rows, rd)


class CudaLayerNormKernel(_Dynamic):
    kinds: tuple[str, ...] = ("LayerNormalization",)

    def supports(self, node: Node) -> bool:
        if not self.operands_fit(node) or len(node.outputs) != 1 or not 2 <= len(node.inputs) <= 3:
            return False
        if node.input(0) is None or node.input(1) is None:
            return False
        xs = shape_of(node.input(0), symbolic=True)
        axis = node.attrs.get("axis")
        if not isinstance(axis, int) or not 0 <= axis < len(xs) or "epsilon" not in node.attrs:
            return False
        norm = xs[axis:]
        if not all(isinstance(d, int) for d in norm):
            return False  # the normalized dims static (the scale's shape)
        for v in node.inputs[1:]:
            if v is None:
                continue
            vs = shape_of(v)
            try:
                broadcast_strides(vs, norm)
            except ValueError:
                return False
            if math.prod(vs) != math.prod(norm):
                return False  # per-element scale / bias only
        return shape_of(node.outputs[0], symbolic=True) == xs

    def build(self, step: GenStep) -> tuple[KernelCode, ...]:
        node = step.node
        xs, axis = shape_of(node.input(0), symbolic=True), int(node.attrs["axis"])
        length = math.prod(xs[axis:])
        has_bias = node.input(2) is not None
        names = ["x", "scale"] + (["bias"] if has_bias else []) + ["y"]
        rows, rd = math.prod(xs[:axis]), RunDims()
        ctx = RowsContext(
            params=float_params(names, False), threads=THREADS,
            op="layernorm", rows=rd(rows), length=length, inner=1,
            scale=literal(1.0 / length), eps=literal(float(node.attrs["epsilon"])),
            has_bias=has_bias, **_NO_REDUCE,  # type: ignore[arg-type]
        )  # fmt: skip
        return _rows(step, ctx, rows, rd)


def _reduce_axes(node: Node) -> tuple[int, ...] | None:
    xs = shape_of(node.input(0), symbolic=True)
    axes = node.attrs.get("axes")
    if not isinstance(axes, (list, tuple)) or not isinstance(node.attrs.get("keepdims"), int):
        return None
    out = sorted({int(a) for a in axes}) if axes else list(range(len(xs)))
    if any(not 0 <= a < len(xs) for a in out):
        return None
    return tuple(out)


class CudaReduceKernel(_Dynamic):
    kinds: tuple[str, ...] = ("ReduceMean", "ReduceSum")

    def supports(self, node: Node) -> bool:
        if not self.operands_fit(node) or len(node.inputs) != 1 or len(node.outputs) != 1:
            return False
        axes = _reduce_axes(node)
        if axes is None:
            return False
        xs = shape_of(node.input(0), symbolic=True)
        kept = [d for a, d in enumerate(xs) if a not in axes]
        keep = bool(node.attrs["keepdims"])
        expect = tuple(1 if a in axes else d for a, d in enumerate(xs)) if keep else tuple(kept)
        return shape_of(node.outputs[0], symbolic=True) == expect

    def build(self, step: GenStep) -> tuple[KernelCode, ...]:
        node = step.node
        xs = shape_of(node.input(0), symbolic=True)
        axes = _reduce_axes(node)
        assert axes is not None, node.describe()
        strides = contiguous_strides(xs)
        kept = [a for a in range(len(xs)) if a not in axes]
        kdims, (kstr,) = coalesce([xs[a] for a in kept], [[strides[a] for a in kept]])
        rdims, (rstr,) = coalesce([xs[a] for a in axes], [[strides[a] for a in axes]])
        knames = tuple(f"k{d}" for d in range(len(kdims)))
        rnames = tuple(f"r{d}" for d in range(len(rdims)))
        rd = RunDims()
        row_base = index_expr(kstr, knames, lambda x: str(rd(x)))
        red_offset = index_expr(rstr, rnames, lambda x: str(rd(x)))
        count, rows = math.prod(xs[a] for a in axes), math.prod(kdims)
        length = rd(count)  # a run-time count's mean divides by it at run time
        scale = literal(1.0 / count) if isinstance(length, int) else f"(1.0f / (float){length})"
        ctx = RowsContext(
            params=float_params(["x", "y"], True), threads=THREADS,
            op="reduce", rows=rd(rows), length=length, inner=1,
            scale=scale if node.op_type == "ReduceMean" else "", eps="", has_bias=False,
            row_index=used_indices(unflatten(tuple(rd(d) for d in kdims), knames, "row"), [row_base]),
            row_base=row_base, red_offset=red_offset,
            red_index=used_indices(unflatten(tuple(rd(d) for d in rdims), rnames, "r"), [red_offset]),
        )  # fmt: skip
        return _rows(step, ctx, rows, rd)


KERNELS = (CudaChannelKernel(), CudaSoftmaxKernel(), CudaLayerNormKernel(), CudaReduceKernel())
