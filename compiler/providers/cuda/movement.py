"""CUDA kernels that only move elements: Concat, Transpose, Reshape / Identity / Copy
(``templates/cuda/move.cu.j2``, one thread per element).

They take any fixed-size dtype; Reshape and Identity launch nothing when the planner made them
views onto the same bytes, and a Concat nothing when every input was produced in its slice. A
dynamic graph's node takes its run-time sizes, strides and slice widths as parameters (``RunDims``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from compiler.codegen.elementwise import CUDA_DIALECT
from compiler.codegen.elementwise import contiguous_strides
from compiler.codegen.elementwise import loop_nest
from compiler.codegen.elementwise import storage_ctype
from compiler.codegen.elementwise import unflatten
from compiler.ir.graph import Node
from compiler.providers.base import GenStep
from compiler.providers.base import shape_of
from compiler.providers.c.common import same_dtype_movable
from compiler.providers.c.movement import ConcatKernel
from compiler.providers.c.movement import CopyKernel
from compiler.providers.c.movement import TransposeKernel
from compiler.providers.c.rundims import known_zero
from compiler.providers.cuda.common import MAX_ELEMENTS
from compiler.providers.cuda.common import THREADS
from compiler.providers.cuda.common import CudaKernel
from compiler.providers.cuda.common import KernelCode
from compiler.providers.cuda.common import RunDims
from compiler.providers.cuda.common import blocks
from compiler.providers.cuda.common import fits_int32
from compiler.providers.cuda.common import input_ptrs
from compiler.providers.cuda.common import is_dynamic
from compiler.providers.cuda.common import output_ptrs
from compiler.providers.cuda.common import ptr
from compiler.providers.cuda.common import used_indices
from compiler.providers.kit import KernelContext
from compiler.providers.kit import Param
from runtime.plan_schema import LaunchArg

__all__ = ["CudaMoveContext", "CudaCopyKernel", "CudaTransposeKernel", "CudaConcatKernel"]


@dataclass(frozen=True)
class CudaMoveContext(KernelContext):
    threads: int
    op: str  # "copy" | "transpose" | "concat"
    total: int
    index: tuple[tuple[str, str], ...]  # transpose: loop variables
    in_index: str  # transpose: the input index
    outer: int  # concat: rows
    row: int  # concat: elements per output row
    chunks: tuple[tuple[str, Any, Any, bool], ...]  # concat: (param, width, start, in place)
    dims: tuple[str, ...] = ()  # run-time dim parameters (a dynamic graph's node)


class _MoveKernel(CudaKernel):
    """A kernel that only moves elements: any fixed-size dtype, 32-bit element counts (at the
    largest binding for a dynamic graph's node)."""

    dynamic = True

    def operands_fit(self, node: Node) -> bool:
        if is_dynamic(node):
            return same_dtype_movable(node) and fits_int32(node)
        values = [v for v in node.inputs if v is not None] + list(node.outputs)
        return same_dtype_movable(node) and all(
            v.shape is not None and 0 < math.prod(v.shape) <= MAX_ELEMENTS for v in values
        )


def _move(
    step: GenStep,
    op: str,
    total: Any,
    names: Sequence[str],
    args: Sequence[LaunchArg],
    *,
    rd: RunDims,
    index: tuple[tuple[str, str], ...] = (),
    in_index: str = "",
    outer: Any = 0,
    row: Any = 0,
    chunks: tuple[tuple[str, Any, Any, bool], ...] = (),
) -> KernelCode:
    """The move kernel's code; ``total`` (an int or an ``Expr``) elements, one thread each."""
    dtype = step.node.outputs[0].dtype
    assert dtype is not None
    ctype = storage_ctype(dtype, CUDA_DIALECT)
    # Only a transpose's input may be __restrict__: a copy or concat may meet its output.
    params = tuple(Param(n, ctype, n != "y", n == "x" and op == "transpose") for n in names)
    ctx = CudaMoveContext(
        params=params,
        threads=THREADS,
        op=op,
        total=rd(total),
        index=index,
        in_index=in_index,
        outer=rd(outer),
        row=rd(row),
        chunks=tuple((name, rd(width), rd(start), skip) for name, width, start, skip in chunks),
        dims=rd.names,
    )
    grid = (blocks(total, THREADS), 1, 1)
    return KernelCode("cuda/move.cu.j2", ctx, grid, (THREADS, 1, 1), 0, (*args, *rd.args))


class CudaCopyKernel(_MoveKernel):
    claims_like = CopyKernel

    def build(self, step: GenStep) -> tuple[KernelCode, ...]:
        total = math.prod(shape_of(step.node.outputs[0], symbolic=True))
        if step.inputs[0] == step.outputs[0]:
            return ()  # a view onto the same bytes
        args = [*input_ptrs(step), *output_ptrs(step)]
        return (_move(step, "copy", total, ["x", "y"], args, rd=RunDims()),)


class CudaTransposeKernel(_MoveKernel):
    claims_like = TransposeKernel

    def build(self, step: GenStep) -> tuple[KernelCode, ...]:
        node = step.node
        xs, ys = shape_of(node.input(0), symbolic=True), shape_of(node.outputs[0], symbolic=True)
        own = contiguous_strides(xs)
        rd = RunDims()
        nest = loop_nest(ys, [tuple(own[int(p)] for p in node.attrs["perm"])], text=rd)
        index = used_indices(unflatten(nest.dims, nest.names, "flat"), nest.in_index)
        args = [*input_ptrs(step), *output_ptrs(step)]
        total = math.prod(ys)
        return (
            _move(step, "transpose", total, ["x", "y"], args, rd=rd, index=index, in_index=nest.in_index[0]),
        )


class CudaConcatKernel(_MoveKernel):
    claims_like = ConcatKernel

    def build(self, step: GenStep) -> tuple[KernelCode, ...]:
        node = step.node
        out = node.outputs[0]
        ys, axis = shape_of(out, symbolic=True), int(node.attrs["axis"])
        assert out.dtype is not None
        inner = math.prod(ys[axis + 1 :])
        outer = math.prod(ys[:axis])
        out_loc = step.outputs[0]
        chunks: list[tuple[str, Any, Any, bool]] = []
        names: list[str] = []
        args: list[LaunchArg] = []
        start: Any = 0
        for k, v in enumerate(node.inputs):
            assert v is not None
            width = shape_of(v, symbolic=True)[axis] * inner
            loc = step.inputs[k]
            in_place = (
                outer == 1
                and loc is not None
                and loc.kind == out_loc.kind
                and loc.offset == out_loc.offset + start * out.dtype.itemsize
            )
            if not known_zero(width):
                if not in_place:
                    names.append(f"in{k}")
                    args.append(ptr(loc, step, f"input {k} ({v.name})"))
                chunks.append((f"in{k}", width, start, in_place))
            start += width
        if all(c[3] for c in chunks):
            return ()  # every input was produced straight into its slice
        names.append("y")
        args += output_ptrs(step)
        return (
            _move(step, "concat", outer * start, names, args, rd=RunDims(), outer=outer, row=start,
                  chunks=tuple(chunks)),
        )


KERNELS = (CudaCopyKernel(), CudaTransposeKernel(), CudaConcatKernel())
