"""C kernels that only move bytes: Concat, Transpose, and the copies.

A Transpose that is a batch of 2-D transposes once size-1 axes are dropped and axes that stay
adjacent are merged -- (B, R, S) -> (B, S, R), such as the layout pass's NCHW <-> NHWC
Transposes -- moves 4-byte elements in blocks of vw x vw transposed in registers (two-input
shuffles, log2(vw) stages), two by two blocks at a time so that whole cache lines of x are read
and of y written; threads take pieces of about 128 x 128 elements; a last, partial step overlaps
the one before it. With fewer rows or columns than a vector holds (a 3-channel image), or other
element sizes, such a Transpose is two plain loops the compiler vectorizes; any other Transpose
is a loop nest over the output.

Reshape and Identity are views: no code when input and output have the same location, a checked
memcpy otherwise; onnx_aot.Copy is the same memcpy. They take any fixed-size dtype (elements are
moved as unsigned integers of the same size).

In a dynamic graph (run-time dims: C text over the kernel's ``dyn``, compiler/codegen/cdims.py)
Concat's row counts and sizes, the copies' byte count and a Transpose's loop nest (sizes and
strides) are read from the binding; a dynamic Transpose that is a batched 2-D transpose of 4-byte
elements with no short static side runs the blocked transpose where its run-time sides fit a
step (else the loop nest, parallel from 4x the usual work), decided at run time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import replace
from typing import Any

from compiler.codegen.elementwise import LoopNest
from compiler.codegen.elementwise import contiguous_strides
from compiler.codegen.elementwise import loop_nest
from compiler.codegen.elementwise import storage_ctype
from compiler.codegen.toolchain import TargetInfo
from compiler.ir.graph import Node
from compiler.providers.base import GenStep
from compiler.providers.base import shape_of
from compiler.providers.c.common import PARALLEL_MIN_WORK
from compiler.providers.c.common import CKernel
from compiler.providers.c.common import StepCode
from compiler.providers.c.common import params
from compiler.providers.c.common import same_dtype_movable
from compiler.providers.c.common import step_args
from compiler.providers.c.rundims import is_dynamic
from compiler.providers.c.rundims import known_zero
from compiler.providers.c.rundims import parallel_if
from compiler.providers.c.rundims import run_dims
from compiler.providers.c.rundims import symbolic_const
from compiler.providers.kit import KernelContext
from runtime.contract import COPY
from runtime.symbolic import Expr
from runtime.symbolic import max_

__all__ = [
    "ConcatContext",
    "TransposeBlocks",
    "TransposePlanes",
    "TransposeContext",
    "CopyContext",
    "ConcatKernel",
    "TransposeKernel",
    "CopyKernel",
]


@dataclass(frozen=True)
class ConcatContext(KernelContext):
    outer: int  # CDim (C text) in a dynamic graph, as the byte counts below
    row_bytes: int  # bytes of one output row (everything from the axis on)
    chunks: tuple[tuple[str, int, int], ...]  # (input param, bytes per row, byte offset in the row)


TRANSPOSE_PIECE = 128  # rows and columns of x in one thread's piece of a blocked transpose
TRANSPOSE_PLANE_PIECE = 2048  # the long axis's length in one thread's piece of TransposePlanes


@dataclass(frozen=True)
class TransposeBlocks:
    """A batched 2-D transpose (B, R, S) -> (B, S, R) of 4-byte elements in vw x vw blocks.

    The work is cut into pieces of ``chunk`` rows x ``tile`` columns of x (the last piece along
    each axis also takes what is left over, so pieces never overlap); a piece is walked in steps
    of ``rstep`` x ``sstep`` (one or two blocks along each axis: whole cache lines of x read and
    of y written), the blocks at ``offsets`` (row, column) of a step in that order; with
    ``rows_inner`` down the rows of x (along the rows of y) inside each column step, else along
    the rows of x.
    ``shuffles``: the register transpose, steps ``(dst, a, b, indices)`` of two-input shuffles
    over the block's rows ``r0 .. r{vw-1}``; ``outputs[j]`` holds row j of the transposed block.
    """

    batches: int
    rows: int
    cols: int
    vw: int
    rstep: int
    sstep: int
    offsets: tuple[tuple[int, int], ...]
    rows_inner: bool
    chunk: int
    chunks: int
    tile: int
    tiles: int
    shuffles: tuple[tuple[str, str, str, tuple[int, ...]], ...]
    outputs: tuple[str, ...]


def _set_stride(nbytes: int) -> int:
    """The power of two (at most a 4 KiB page) dividing a row stride of ``nbytes``: the larger,
    the fewer L1 sets a column strip of rows at that stride falls into."""
    return min(nbytes & -nbytes, 4096)


def _step(n: int | Expr, vw: int) -> int:
    """Elements along an axis per step: two blocks where they fit (a run-time size: the kernel
    checks that they do)."""
    return 2 * vw if isinstance(n, Expr) or n >= 2 * vw else vw


def _strips(n: int | Expr) -> int:
    """``_set_stride`` of a row of ``n`` elements; a run-time size is taken at its worst (4 KiB)."""
    return 4096 if isinstance(n, Expr) else _set_stride(4 * n)


def transpose_blocks(batches: int, rows: int, cols: int, vw: int) -> TransposeBlocks:
    """The blocked walk of B transposes of ``rows`` x ``cols`` 4-byte elements (both at least
    ``vw``). The walk reads x or writes y in column strips, whichever has the row stride that
    spreads over more L1 sets (measured on Zen 3: a 1-4 KiB multiple costs 1.5-3x), writing y
    along its rows on a tie; the blocks of a step complete the cache lines of the side walked in
    column strips first (10-20% on Zen 3). Sizes may be run-time ones (``Expr``): ``chunks`` and
    ``tiles`` are then expressions too, the steps two blocks."""
    rstep, sstep = _step(rows, vw), _step(cols, vw)
    chunk = max(rstep, TRANSPOSE_PIECE // rstep * rstep)
    tile = max(sstep, TRANSPOSE_PIECE // sstep * sstep)
    rows_inner = _strips(rows) >= _strips(cols)
    # the blocks of a step: finishing the lines of the strip-written side first
    if rows_inner:
        offsets = tuple((i, j) for j in range(0, sstep, vw) for i in range(0, rstep, vw))
    else:
        offsets = tuple((i, j) for i in range(0, rstep, vw) for j in range(0, sstep, vw))
    shuffles, outputs = register_transpose(vw)
    chunks, tiles = max_(1, rows // chunk), max_(1, cols // tile)
    return TransposeBlocks(batches, rows, cols, vw, rstep, sstep, offsets, rows_inner, chunk,
                           chunks, tile, tiles, shuffles, outputs)  # type: ignore[arg-type]  # fmt: skip


@dataclass(frozen=True)
class TransposePlanes:
    """A batched 2-D transpose (B, R, S) -> (B, S, R) with fewer rows or columns than a vector:
    plain loops, the short axis inside when it is R (so the compiler interleaves the R rows
    of x), outside when it is S; threads take pieces of ``piece`` along the long axis."""

    batches: int
    rows: int
    cols: int
    few_rows: bool
    piece: int
    pieces: int


@dataclass(frozen=True)
class TransposeContext(KernelContext):
    nest: LoopNest
    parallel: bool
    blocks: TransposeBlocks | None  # set: the blocked batched 2-D transpose, not the nest
    planes: TransposePlanes | None  # set: a batched 2-D transpose with a short axis, not the nest
    parallel_if: str = ""  # the OpenMP if clause's condition where the size is a run-time one
    fits: str = ""  # with run-time blocks: the condition (C) that they fit, else the nest runs


@dataclass(frozen=True)
class CopyContext(KernelContext):
    nbytes: int  # CDim (C text) in a dynamic graph


def _agree(a: object, b: object) -> bool:
    """Two dims a Concat needs equal: equal, or different expressions of run-time dims, which the
    import recorded as an assumption the runtime checks at each binding before any step runs
    (compiler/frontend/importer.py ``_record_assumptions``; YOLOv8's 2*((h+31)//32) and
    (h+15)//16); the kernel's sizes are the output's."""
    return a == b or isinstance(a, Expr) or isinstance(b, Expr)


class ConcatKernel(CKernel):
    kinds: tuple[str, ...] = ("Concat",)
    dynamic = True  # run-time dims: row counts and sizes from the binding

    def supports(self, node: Node) -> bool:
        if not same_dtype_movable(node) or len(node.outputs) != 1 or not node.inputs:
            return False
        if any(v is None or symbolic_const(v) for v in node.inputs):
            return False
        ys = shape_of(node.outputs[0], symbolic=True)
        axis = node.attrs.get("axis")
        if not isinstance(axis, int) or not 0 <= axis < len(ys):
            return False
        shapes = [shape_of(v, symbolic=True) for v in node.inputs]
        same = all(len(s) == len(ys) and all(_agree(a, b) for d, (a, b) in enumerate(zip(s, ys, strict=True))
                                             if d != axis) for s in shapes)
        return same and sum((s[axis] for s in shapes), 0) == ys[axis]

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        out = node.outputs[0]
        ys, axis = shape_of(out, symbolic=True), int(node.attrs["axis"])
        assert out.dtype is not None
        item, ctype = out.dtype.itemsize, storage_ctype(out.dtype)
        inner = math.prod(ys[axis + 1 :])
        chunks, offset = [], 0
        for k, v in enumerate(node.inputs):
            assert v is not None
            nbytes = shape_of(v, symbolic=True)[axis] * inner * item
            chunks.append((f"in{k}", nbytes, offset))
            offset += nbytes
        args = step_args(step, ctype)
        names = [f"in{k}" for k in range(len(node.inputs))] + ["y"]
        rd = run_dims(step)
        ctx = ConcatContext(
            params=params(names, args, [False] * len(args)) + rd.params,
            outer=rd.write(math.prod(ys[:axis])),
            row_bytes=rd.write(offset),
            chunks=tuple((name, rd.write(n), rd.write(o)) for name, n, o in chunks if not known_zero(n)),
        )
        return StepCode("c/concat.c.j2", ctx, (*args, *rd.args))


def _shuffle_pattern(vw: int, stage: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The (low, high) index lists of one stage of the register transpose on vectors of vw.

    Stage 0 interleaves pairs of elements within 128-bit lanes (unpcklps / unpckhps), stage 1
    pairs of pairs (shufps), stage k >= 2 blocks of 4 << (k - 2) elements (vperm2f128, ...).
    """
    lo: list[int] = []
    hi: list[int] = []
    if stage < 2:
        for a in range(0, vw, 4):
            b = vw + a
            if stage == 0:
                lo += [a, b, a + 1, b + 1]
                hi += [a + 2, b + 2, a + 3, b + 3]
            else:
                lo += [a, a + 1, b, b + 1]
                hi += [a + 2, a + 3, b + 2, b + 3]
        return tuple(lo), tuple(hi)
    h = 4 << (stage - 2)
    for base in range(0, vw, 2 * h):
        lo += [*range(base, base + h), *range(vw + base, vw + base + h)]
        hi += [*range(base + h, base + 2 * h), *range(vw + base + h, vw + base + 2 * h)]
    return tuple(lo), tuple(hi)


def register_transpose(vw: int) -> tuple[tuple[tuple[str, str, str, tuple[int, ...]], ...], tuple[str, ...]]:
    """Shuffles transposing ``vw`` vectors ``r0 .. r{vw-1}`` of ``vw`` elements (vw a power of
    two, at least 4), and the variable holding each output row; checked by simulating them."""
    if vw < 4 or vw & (vw - 1):
        raise ValueError(f"no register transpose for vectors of {vw} elements")
    names = [f"r{i}" for i in range(vw)]
    held = {name: [(i, j) for j in range(vw)] for i, name in enumerate(names)}
    steps: list[tuple[str, str, str, tuple[int, ...]]] = []
    stage = 0
    while (1 << stage) < vw:
        d = 1 << stage
        lo, hi = _shuffle_pattern(vw, stage)
        new = list(names)
        for i in range(vw):
            if i & d:
                continue
            a, b = names[i], names[i + d]
            for k, idx in ((i, lo), (i + d, hi)):
                dst = f"s{stage}_{k}"
                both = held[a] + held[b]
                held[dst] = [both[t] for t in idx]
                steps.append((dst, a, b, idx))
                new[k] = dst
        names = new
        stage += 1
    outputs = [""] * vw
    for name in names:
        (j,) = {col for _, col in held[name]}
        if [row for row, _ in held[name]] != list(range(vw)) or outputs[j]:
            raise AssertionError(f"register transpose of {vw}: {name} holds {held[name]}")
        outputs[j] = name
    return tuple(steps), tuple(outputs)


def batched_2d(xs: tuple[int, ...], perm: list[int]) -> tuple[int, int, int] | None:
    """(B, R, S) when transposing ``xs`` by ``perm`` is B transposes of R x S matrices (after
    dropping size-1 axes and merging axes that stay adjacent), else None."""
    keep = [a for a in range(len(xs)) if xs[a] != 1]
    following = dict(zip(keep, keep[1:], strict=False))
    groups: list[list[int]] = []  # runs of input axes, in output order
    for a in (p for p in perm if xs[p] != 1):
        if groups and following.get(groups[-1][-1]) == a:
            groups[-1].append(a)
        else:
            groups.append([a])
    sizes = [math.prod(xs[a] for a in g) for g in groups]
    by_input = sorted(range(len(groups)), key=lambda g: groups[g][0])
    if by_input == [1, 0]:
        return 1, sizes[1], sizes[0]
    if by_input == [0, 2, 1]:
        return sizes[0], sizes[2], sizes[1]
    return None


class TransposeKernel(CKernel):
    kinds: tuple[str, ...] = ("Transpose",)
    dynamic = True  # run-time dims: a loop nest with sizes and strides from the binding

    def supports(self, node: Node) -> bool:
        if not same_dtype_movable(node) or len(node.outputs) != 1 or len(node.inputs) != 1:
            return False
        if symbolic_const(node.input(0)):
            return False
        xs, perm = shape_of(node.input(0), symbolic=True), node.attrs.get("perm")
        if not isinstance(perm, (list, tuple)) or sorted(int(p) for p in perm) != list(range(len(xs))):
            return False
        return shape_of(node.outputs[0], symbolic=True) == tuple(xs[int(p)] for p in perm)

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        if is_dynamic(node):
            return _dynamic_transpose(step, target.vector_bytes // 4)
        xs, ys = shape_of(node.input(0)), shape_of(node.outputs[0])
        dtype = node.outputs[0].dtype
        assert dtype is not None
        ctype = storage_ctype(dtype)
        own = contiguous_strides(xs)
        strides = tuple(own[int(p)] for p in node.attrs["perm"])
        args = step_args(step, ctype)
        nest = loop_nest(ys, [strides])
        vw = target.vector_bytes // 4
        shape = batched_2d(xs, [int(p) for p in node.attrs["perm"]])
        blocks = planes = None
        if dtype.itemsize == 4 and shape is not None and min(shape[1:]) >= vw:
            blocks = transpose_blocks(*shape, vw)
        elif shape is not None and min(shape[1:]) > 1:
            batches, rows, cols = shape
            long = max(rows, cols)
            piece = min(long, TRANSPOSE_PLANE_PIECE)
            planes = TransposePlanes(batches, rows, cols, rows < cols, piece, -(-long // piece))
        # threads: for a loop nest from 4x the usual work, for the batched 2-D transposes (which
        # move a vector or more a cycle) from the usual work (2048x7x7 on 2 threads: 1.5x)
        least, pieces = 4 * PARALLEL_MIN_WORK, len(nest.dims)
        if blocks is not None:
            least, pieces = PARALLEL_MIN_WORK, blocks.batches * blocks.chunks * blocks.tiles
        elif planes is not None:
            least, pieces = PARALLEL_MIN_WORK, planes.batches * planes.pieces
        ctx = TransposeContext(
            params=params(["x", "y"], args, [True, True]),
            nest=nest,
            parallel=nest.total >= least and pieces > 1,
            blocks=blocks,
            planes=planes,
        )
        return StepCode("c/transpose.c.j2", ctx, tuple(args))


def _dynamic_blocks(xs: tuple[Any, ...], perm: list[int], itemsize: int, vw: int,
                    write: Callable[[Any], Any]) -> tuple[TransposeBlocks | None, str]:  # fmt: skip
    """The blocked batched 2-D transpose of a Transpose with run-time dims (the layout pass's NCHW
    <-> NHWC edges: (N, C, H*W) <-> (N, H*W, C)), its sizes C over the binding, and the run-time
    condition that its steps fit (else the loop nest runs); None where a static side is short."""
    shape = batched_2d(xs, perm)
    if itemsize != 4 or shape is None or any(isinstance(d, int) and d < vw for d in shape[1:]):
        return None, ""
    b = transpose_blocks(*shape, vw)
    fits = " && ".join(f"{write(n)} >= {k}" for n, k in ((b.rows, b.rstep), (b.cols, b.sstep))
                       if isinstance(n, Expr))  # fmt: skip
    return replace(b, batches=write(b.batches), rows=write(b.rows), cols=write(b.cols),
                   chunks=write(b.chunks), tiles=write(b.tiles)), fits


def _dynamic_transpose(step: GenStep, vw: int) -> StepCode:
    """A Transpose with run-time dims: the blocked batched 2-D transpose where it is one (when its
    steps fit at run time), else the loop nest over the output, its sizes and strides C over the
    binding; threads from 4x the usual work, decided at run time."""
    node = step.node
    xs, ys = shape_of(node.input(0), symbolic=True), shape_of(node.outputs[0], symbolic=True)
    dtype = node.outputs[0].dtype
    assert dtype is not None
    own = contiguous_strides(xs)
    strides = tuple(own[int(p)] for p in node.attrs["perm"])
    args = step_args(step, storage_ctype(dtype))
    rd = run_dims(step)
    nest = loop_nest(ys, [strides], text=rd.write)
    blocks, fits = _dynamic_blocks(xs, [int(p) for p in node.attrs["perm"]], dtype.itemsize, vw, rd.write)
    ctx = TransposeContext(
        params=params(["x", "y"], args, [True, True]) + rd.params,
        nest=nest,
        parallel=not isinstance(nest.total, int) or nest.total >= 4 * PARALLEL_MIN_WORK,
        blocks=blocks,
        planes=None,
        parallel_if=parallel_if(nest.total, (1 if blocks is not None else 4) * PARALLEL_MIN_WORK),
        fits=fits,
    )
    return StepCode("c/transpose.c.j2", ctx, (*args, *rd.args))


class CopyKernel(CKernel):
    kinds: tuple[str, ...] = ("Reshape", "Identity", COPY)
    dynamic = True  # run-time dims: the byte count from the binding

    def supports(self, node: Node) -> bool:
        if not same_dtype_movable(node) or len(node.outputs) != 1 or len(node.inputs) != 1:
            return False
        if symbolic_const(node.input(0)):
            return False
        return math.prod(shape_of(node.input(0), symbolic=True)) == math.prod(
            shape_of(node.outputs[0], symbolic=True))

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        dtype = node.outputs[0].dtype
        assert dtype is not None
        ctype = storage_ctype(dtype)
        args = step_args(step, ctype)
        rd = run_dims(step)
        ctx = CopyContext(
            params=params(["x", "y"], args, [False, False]) + rd.params,
            nbytes=rd.write(node.outputs[0].nbytes),
        )
        if step.inputs[0] == step.outputs[0] or known_zero(node.outputs[0].nbytes):
            return StepCode(None, ctx, ())  # a view onto the same bytes: nothing to do
        return StepCode("c/copy.c.j2", ctx, (*args, *rd.args))


KERNELS = (ConcatKernel(), TransposeKernel(), CopyKernel())
