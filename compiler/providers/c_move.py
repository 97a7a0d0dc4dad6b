"""C kernels that only move bytes: Concat, Transpose, and the copies.

Reshape and Identity are views: no code when input and output have the same location, a checked
memcpy otherwise; onnx_aot.Copy is the same memcpy. They take any fixed-size dtype (elements are
moved as unsigned integers of the same size).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from compiler.codegen.elementwise import LoopNest, contiguous_strides, loop_nest, storage_ctype
from compiler.codegen.toolchain import TargetInfo
from compiler.ir.graph import Node
from compiler.providers.base import StepPlan
from compiler.providers.c_common import (
    PARALLEL_MIN_WORK,
    Param,
    StepCode,
    comment,
    fn_name,
    input_args,
    output_args,
    params,
    register,
    same_dtype_movable,
    shape_of,
)

__all__ = [
    "ConcatContext",
    "TransposeContext",
    "CopyContext",
    "ConcatKernel",
    "TransposeKernel",
    "CopyKernel",
]


def _prod(dims: tuple[int, ...] | list[int]) -> int:
    return int(np.prod(dims, dtype=np.int64))


@dataclass(frozen=True)
class ConcatContext:
    fn: str
    comment: str
    params: tuple[Param, ...]
    outer: int
    row_bytes: int  # bytes of one output row (everything from the axis on)
    chunks: tuple[tuple[str, int, int], ...]  # (input param, bytes per row, byte offset in the row)


@dataclass(frozen=True)
class TransposeContext:
    fn: str
    comment: str
    params: tuple[Param, ...]
    nest: LoopNest
    parallel: bool


@dataclass(frozen=True)
class CopyContext:
    fn: str
    comment: str
    params: tuple[Param, ...]
    nbytes: int


class ConcatKernel:
    kinds: tuple[str, ...] = ("Concat",)

    def supports(self, node: Node) -> bool:
        if not same_dtype_movable(node) or len(node.outputs) != 1 or not node.inputs:
            return False
        if any(v is None for v in node.inputs):
            return False
        ys = shape_of(node.outputs[0])
        axis = node.attrs.get("axis")
        if not isinstance(axis, int) or not 0 <= axis < len(ys):
            return False
        shapes = [shape_of(v) for v in node.inputs]
        same = all(
            len(s) == len(ys) and s[:axis] == ys[:axis] and s[axis + 1 :] == ys[axis + 1 :] for s in shapes
        )
        return same and sum(s[axis] for s in shapes) == ys[axis]

    def scratch_nbytes(self, node: Node) -> int:
        return 0

    def build(self, step: StepPlan, target: TargetInfo) -> StepCode:
        node = step.node
        out = node.outputs[0]
        ys, axis = shape_of(out), int(node.attrs["axis"])
        assert out.dtype is not None
        item, ctype = out.dtype.itemsize, storage_ctype(out.dtype)
        inner = _prod(ys[axis + 1 :])
        chunks, offset = [], 0
        for k, v in enumerate(node.inputs):
            assert v is not None
            nbytes = shape_of(v)[axis] * inner * item
            chunks.append((f"in{k}", nbytes, offset))
            offset += nbytes
        args = [*input_args(step, ctype), *output_args(step, ctype)]
        names = [f"in{k}" for k in range(len(node.inputs))] + ["y"]
        ctx = ConcatContext(
            fn=fn_name(step),
            comment=comment(node),
            params=params(names, args, [False] * len(args)),
            outer=_prod(ys[:axis]),
            row_bytes=offset,
            chunks=tuple(c for c in chunks if c[1] > 0),
        )
        return StepCode("c/concat.c.j2", ctx, ctx.fn, tuple(args))


class TransposeKernel:
    kinds: tuple[str, ...] = ("Transpose",)

    def supports(self, node: Node) -> bool:
        if not same_dtype_movable(node) or len(node.outputs) != 1 or len(node.inputs) != 1:
            return False
        xs, perm = shape_of(node.input(0)), node.attrs.get("perm")
        if not isinstance(perm, (list, tuple)) or sorted(int(p) for p in perm) != list(range(len(xs))):
            return False
        return shape_of(node.outputs[0]) == tuple(xs[int(p)] for p in perm)

    def scratch_nbytes(self, node: Node) -> int:
        return 0

    def build(self, step: StepPlan, target: TargetInfo) -> StepCode:
        node = step.node
        xs, ys = shape_of(node.input(0)), shape_of(node.outputs[0])
        dtype = node.outputs[0].dtype
        assert dtype is not None
        ctype = storage_ctype(dtype)
        own = contiguous_strides(xs)
        strides = tuple(own[int(p)] for p in node.attrs["perm"])
        args = [*input_args(step, ctype), *output_args(step, ctype)]
        nest = loop_nest(ys, [strides])
        ctx = TransposeContext(
            fn=fn_name(step),
            comment=comment(node),
            params=params(["x", "y"], args, [True, True]),
            nest=nest,
            parallel=nest.total >= 4 * PARALLEL_MIN_WORK and len(nest.dims) > 1,
        )
        return StepCode("c/transpose.c.j2", ctx, ctx.fn, tuple(args))


class CopyKernel:
    kinds: tuple[str, ...] = ("Reshape", "Identity", "onnx_aot.Copy")

    def supports(self, node: Node) -> bool:
        if not same_dtype_movable(node) or len(node.outputs) != 1 or len(node.inputs) != 1:
            return False
        return math.prod(shape_of(node.input(0))) == math.prod(shape_of(node.outputs[0]))

    def scratch_nbytes(self, node: Node) -> int:
        return 0

    def build(self, step: StepPlan, target: TargetInfo) -> StepCode:
        node = step.node
        dtype = node.outputs[0].dtype
        assert dtype is not None
        ctype = storage_ctype(dtype)
        args = [*input_args(step, ctype), *output_args(step, ctype)]
        ctx = CopyContext(
            fn=fn_name(step),
            comment=comment(node),
            params=params(["x", "y"], args, [False, False]),
            nbytes=node.outputs[0].nbytes,
        )
        if step.inputs[0] == step.outputs[0] or ctx.nbytes == 0:
            return StepCode(None, ctx, ctx.fn, ())  # a view onto the same bytes: nothing to do
        return StepCode("c/copy.c.j2", ctx, ctx.fn, tuple(args))


for _kernel in (ConcatKernel(), TransposeKernel(), CopyKernel()):
    register(_kernel)
