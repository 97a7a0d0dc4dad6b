"""C kernels for data movement: Slice, Expand, Tile, Gather, Split, Range and ConstantOfShape.

Every kernel but Range only moves elements, so it takes any fixed-size dtype (elements travel as
unsigned integers of the same size, as in ``movement``) and has its shapes and offsets fixed at
compile time (Split also with run-time dims off its axis: C over the binding, ``rundims.py``).
Slice, Expand and Tile are one *strided* copy: a loop nest over the output reading
the input at compile-time (possibly zero or negative) strides from a base offset. Split copies
each output's slice of every row.

Gather reads its indices at run time; a negative index counts from the end, and one outside
``[-n, n)`` is a fault the kernel returns before it copies anything (a *checked* kernel: the
entry returns ``ONNX_AOT_FAULT_INDEX`` and the runtime raises ``IndexRangeError``, as the
reference kernel does), so nothing is read out of bounds and no slice is silently zero.
ConstantOfShape has a kernel only for a run-time shape (a static one is folded). Pad is in
``pad``; Cast, Where and the comparison / logic ops are in ``elementwise_typed``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from compiler.codegen.elementwise import LoopNest
from compiler.codegen.elementwise import broadcast_strides
from compiler.codegen.elementwise import contiguous_strides
from compiler.codegen.elementwise import literal
from compiler.codegen.elementwise import loop_nest
from compiler.codegen.elementwise import storage_ctype
from compiler.codegen.toolchain import TargetInfo
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.providers.base import GenStep
from compiler.providers.base import shape_of
from compiler.providers.c.common import PARALLEL_MIN_WORK
from compiler.providers.c.common import CKernel
from compiler.providers.c.common import StepCode
from compiler.providers.c.common import arg
from compiler.providers.c.common import input_args
from compiler.providers.c.common import output_args
from compiler.providers.c.common import params
from compiler.providers.c.common import same_dtype_movable
from compiler.providers.c.common import step_args
from compiler.providers.c.elementwise_typed import value_ctype
from compiler.providers.c.rundims import int_or_none
from compiler.providers.c.rundims import is_dynamic
from compiler.providers.c.rundims import known_zero
from compiler.providers.c.rundims import run_dims
from compiler.providers.c.rundims import symbolic_const
from compiler.providers.kit import KernelContext
from runtime.symbolic import Expr
from runtime.symbolic import as_dim

__all__ = [
    "StridedContext",
    "GatherContext",
    "SplitContext",
    "RangeContext",
    "StridedKernel",
    "GatherKernel",
    "SplitKernel",
    "RangeKernel",
    "FillContext",
    "FillKernel",
    "strided_map",
]


def _prod(dims: Sequence[int]) -> int:
    return int(np.prod(dims, dtype=np.int64))


def _ints(values: object) -> list[int]:
    if not isinstance(values, (list, tuple)):
        raise TypeError(f"expected a list of ints, got {values!r}")
    return [int(v) for v in values]


def _movable(v: Value) -> bool:
    """A static-shaped tensor whose elements can travel as unsigned integers of their size."""
    dtype = v.dtype
    return (
        v.shape is not None and dtype is not None and dtype.kind in "biufc" and dtype.itemsize in (1, 2, 4, 8)
    )


def _unless_empty(elements: object, code: StepCode) -> StepCode:
    """``code``, or no code where the step's ``elements`` are known to be none: nothing to compute."""
    return StepCode(None, code.ctx, ()) if known_zero(elements) else code


# -- Slice / Expand / Tile: one strided copy ----------------------------------------------------


@dataclass(frozen=True)
class StridedContext(KernelContext):
    nest: LoopNest
    base: int  # element offset of the first element read (CDim with run-time dims)
    parallel: bool
    parallel_if: str = ""  # run-time dims: the C condition for the worker pool


def _slice_map(node: Node, shape: tuple[int, ...] | None = None, sliced: tuple[list, ...] | None = None
               ) -> tuple[tuple[int, ...], int, tuple[int, ...]] | None:
    """``sliced``: (starts, ends, axes, steps) to use instead of the node's attributes."""
    xs = shape_of(node.input(0)) if shape is None else shape
    own = contiguous_strides(xs)
    counts, starts, steps = list(xs), [0] * len(xs), [1] * len(xs)
    a = node.attrs
    lists = sliced if sliced is not None else (a["starts"], a["ends"], a["axes"], a["steps"])
    axes = _ints(lists[2])
    if len(set(axes)) != len(axes):
        return None
    for start, end, axis, step in zip(_ints(lists[0]), _ints(lists[1]), axes, _ints(lists[3]), strict=True):
        if not 0 <= axis < len(xs) or step == 0:
            return None
        low, high = (0, xs[axis]) if step > 0 else (-1, xs[axis] - 1)
        if not (low <= start <= high and low <= end <= high):
            return None  # not the canonical clamped form (the reference kernel rejects it too)
        counts[axis], starts[axis], steps[axis] = len(range(start, end, step)), start, step
    if _prod(counts) == 0:
        return tuple(counts), 0, tuple(0 for _ in xs)
    base = sum(s * o for s, o in zip(starts, own, strict=True))
    return tuple(counts), base, tuple(st * o for st, o in zip(steps, own, strict=True))


def _tile_map(node: Node, symbolic: bool = False) -> tuple[tuple[int, ...], int, tuple[int, ...]]:
    xs = shape_of(node.input(0), symbolic=symbolic)
    repeats = _ints(node.attrs["repeats"])
    if len(repeats) != len(xs) or any(r < 0 for r in repeats):
        raise ValueError(f"{node.describe()}: repeats {repeats} do not match rank {len(xs)}")
    own = contiguous_strides(xs)
    shape: list[int] = []
    strides: list[int] = []
    for r, n, s in zip(repeats, xs, own, strict=True):  # output axis d is (repeat, element) row-major
        shape += [r, n]
        strides += [0, s]
    return tuple(shape), 0, tuple(strides)


def strided_map(node: Node) -> tuple[tuple[int, ...], int, tuple[int, ...]] | None:
    """(iteration shape, base offset, input strides) of a Slice / Expand / Tile, or None.

    The iteration shape, walked row-major, enumerates the output in order; it is the output's
    shape except for Tile, whose axis d splits into (repeats[d], dim d).
    """
    ys = shape_of(node.outputs[0])
    if node.kind == "Slice":
        found = _slice_map(node)
        if found is None or found[0] != ys:
            return None
        return found
    if node.kind == "Expand":
        if tuple(_ints(node.attrs["shape"])) != ys:
            return None
        return ys, 0, broadcast_strides(shape_of(node.input(0)), ys)
    shape, base, strides = _tile_map(node)
    if tuple(a * b for a, b in zip(shape[::2], shape[1::2], strict=True)) != ys:
        return None
    return shape, base, strides


def _dynamic_slice(node: Node) -> tuple[tuple[int, ...], int, tuple[int, ...]] | None:
    """``strided_map`` of a Slice with run-time dims (as ints and Exprs, typed as ``shape_of``'s):
    only static axes sliced (a run-time axis only whole), any others run-time."""
    xs = shape_of(node.input(0), symbolic=True)
    a = node.attrs
    if any(not isinstance(int_or_none(x), int) or not 0 <= int(x) < len(xs) for x in a["axes"]):
        return None
    # an axis sliced whole (0 to its size by 1: jax2tf's x[:n] of a run-time n) is no slice
    ranges = zip(a["starts"], a["ends"], a["axes"], a["steps"], strict=True)
    kept = [k for k, (b, e, x, st) in enumerate(ranges)
            if not (int_or_none(b) == 0 and int_or_none(st) == 1 and e == xs[int(x)])]
    sliced = tuple([a[name][k] for k in kept] for name in ("starts", "ends", "axes", "steps"))
    axes = sliced[2]
    if any(isinstance(xs[int(x)], Expr) for x in axes):
        return None
    if any(int_or_none(v) is None for values in (sliced[0], sliced[1], sliced[3]) for v in values):
        return None
    static = tuple(1 if isinstance(d, Expr) else d for d in xs)  # the sliced axes' canonical form
    found = _slice_map(node, static, sliced)
    if found is None or math.prod(found[0]) == 0:
        return None
    own = contiguous_strides(xs)
    counts = tuple(c if a in {int(x) for x in axes} else xs[a] for a, c in enumerate(found[0]))
    starts = {int(x): int(v) for x, v in zip(axes, sliced[0], strict=True)}
    steps = {int(x): int(v) for x, v in zip(axes, sliced[3], strict=True)}
    base = sum((starts.get(a, 0) * own[a] for a in range(len(xs))), 0)
    return counts, base, tuple(steps.get(a, 1) * own[a] for a in range(len(xs)))


def _dynamic_strided(node: Node) -> tuple[tuple[int, ...], int, tuple[int, ...]] | None:
    """(iteration shape, base, strides) of a Slice, Expand or Tile with run-time dims, else None."""
    ys = shape_of(node.outputs[0], symbolic=True)
    if node.kind == "Slice":
        found = _dynamic_slice(node)
        return found if found is not None and found[0] == ys else None
    if node.kind == "Expand":
        try:
            shape = tuple(as_dim(d) for d in node.attrs["shape"])
            strides = broadcast_strides(shape_of(node.input(0), symbolic=True), ys)
        except (TypeError, ValueError):
            return None
        return (ys, 0, strides) if shape == ys else None
    if any(int_or_none(r) is None for r in node.attrs["repeats"]):
        return None  # Tile: static repeats of run-time dims only
    try:
        shape, base, strides = _tile_map(node, symbolic=True)
    except ValueError:
        return None
    tiled = tuple(a * b for a, b in zip(shape[::2], shape[1::2], strict=True))
    return (shape, base, strides) if tiled == ys else None


class StridedKernel(CKernel):
    kinds: tuple[str, ...] = ("Slice", "Expand", "Tile")
    dynamic = True  # run-time dims: Slice of static axes, Expand, Tile; the nest from the binding

    def supports(self, node: Node) -> bool:
        if not same_dtype_movable(node) or len(node.inputs) != 1 or len(node.outputs) != 1:
            return False
        if is_dynamic(node):
            return not symbolic_const(node.input(0)) and _dynamic_strided(node) is not None
        return strided_map(node) is not None

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        if is_dynamic(node):
            return _build_dynamic_strided(step)
        found = strided_map(node)
        assert found is not None, node.describe()
        shape, base, strides = found
        out = node.outputs[0]
        assert out.dtype is not None
        ctype = storage_ctype(out.dtype)
        args = step_args(step, ctype)
        nest = loop_nest(shape, [strides])
        ctx = StridedContext(
            params=params(["x", "y"], args, [True, True]),
            nest=nest,
            base=base,
            parallel=nest.total >= 4 * PARALLEL_MIN_WORK,
        )
        return _unless_empty(out.size, StepCode("c/strided.c.j2", ctx, tuple(args)))


def _build_dynamic_strided(step: GenStep) -> StepCode:
    node = step.node
    found = _dynamic_strided(node)
    assert found is not None, node.describe()
    shape, base, strides = found
    out = node.outputs[0]
    assert out.dtype is not None
    args = step_args(step, storage_ctype(out.dtype))
    rd = run_dims(step)
    nest = loop_nest(shape, [strides], text=rd.write)
    ctx = StridedContext(
        params=params(["x", "y"], args, [True, True]) + rd.params,
        nest=nest,
        base=rd.write(base),
        parallel=True,
        parallel_if=f"{nest.total} >= {4 * PARALLEL_MIN_WORK}",
    )
    return StepCode("c/strided.c.j2", ctx, (*args, *rd.args))


# -- Gather -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GatherContext(KernelContext):
    pre: int  # product of the dimensions before the axis
    n: int  # the axis' length
    axis: int
    count: int  # number of indices
    post_bytes: int  # bytes of one gathered slice (everything after the axis)
    parallel: bool
    parallel_if: str = ""  # run-time dims (the sizes CDim): the C condition for the worker pool


class GatherKernel(CKernel):
    kinds: tuple[str, ...] = ("Gather",)
    dynamic = True  # run-time dims: slice counts and sizes from the binding

    def supports(self, node: Node) -> bool:
        if len(node.inputs) != 2 or len(node.outputs) != 1 or any(v is None for v in node.inputs):
            return False
        x, indices = node.inputs
        y = node.outputs[0]
        assert x is not None and indices is not None
        if indices.dtype not in (np.dtype(np.int32), np.dtype(np.int64)) or indices.shape is None:
            return False
        if x.dtype != y.dtype or not _movable(x) or not _movable(y):
            return False
        if symbolic_const(x) or symbolic_const(indices):
            return False
        xs, axis = shape_of(x, symbolic=True), int(node.attrs["axis"])
        if not 0 <= axis < len(xs):
            return False
        return shape_of(y, symbolic=True) == xs[:axis] + shape_of(indices, symbolic=True) + xs[axis + 1 :]

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        x, indices = node.inputs
        y = node.outputs[0]
        assert x is not None and indices is not None and y.dtype is not None and indices.dtype is not None
        xs, axis = shape_of(x, symbolic=True), int(node.attrs["axis"])
        ctype = storage_ctype(y.dtype)
        args = [
            arg(step.inputs[0], ctype, True, step, f"input 0 ({x.name})"),
            arg(step.inputs[1], value_ctype(indices.dtype), True, step, f"input 1 ({indices.name})"),
            *output_args(step, ctype),
        ]
        rd = run_dims(step)
        pre, count = rd.write(math.prod(xs[:axis])), rd.write(indices.size)
        ctx = GatherContext(
            params=params(["x", "ind", "y"], args, [True] * 3) + rd.params,
            pre=pre,
            n=rd.write(xs[axis]),
            axis=axis,
            count=count,
            post_bytes=rd.write(math.prod(xs[axis + 1 :]) * y.dtype.itemsize),
            parallel=rd.dynamic or y.size >= PARALLEL_MIN_WORK and pre * count > 1,
            parallel_if=(f"{rd.write(y.size)} >= {PARALLEL_MIN_WORK} && {pre * count} > 1"
                         if rd.dynamic else ""),
        )
        return _unless_empty(y.size, StepCode("c/gather.c.j2", ctx, (*args, *rd.args), checked=True))


# -- Split --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SplitContext(KernelContext):
    outer: int
    row_bytes: int  # bytes of one input row (everything from the axis on)
    chunks: tuple[tuple[str, int, int], ...]  # (output param, bytes per row, byte offset in the row)
    parallel: bool
    parallel_if: str = ""  # run-time dims (outer, sizes: CDim): the C condition for the worker pool


class SplitKernel(CKernel):
    kinds: tuple[str, ...] = ("Split",)
    dynamic = True  # run-time dims off the split axis: row counts and sizes from the binding

    def supports(self, node: Node) -> bool:
        if not same_dtype_movable(node) or len(node.inputs) != 1 or not node.outputs:
            return False
        if symbolic_const(node.input(0)):
            return False
        xs, axis = shape_of(node.input(0), symbolic=True), int(node.attrs["axis"])
        sizes = _ints(node.attrs["split"])
        if not 0 <= axis < len(xs) or len(sizes) != len(node.outputs) or sum(sizes) != xs[axis]:
            return False
        return all(
            shape_of(v, symbolic=True) == xs[:axis] + (size,) + xs[axis + 1 :]
            for v, size in zip(node.outputs, sizes, strict=True)
        )

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        x = node.input(0)
        assert x is not None and x.dtype is not None
        xs, axis = shape_of(x, symbolic=True), int(node.attrs["axis"])
        ctype = storage_ctype(x.dtype)
        rd = run_dims(step)
        unit = math.prod(xs[axis + 1 :]) * x.dtype.itemsize
        # An empty output gets no parameter: nothing is written to it.
        outs = output_args(step, ctype)
        chunks, offset = [], 0
        args, names = input_args(step, ctype), ["x"]
        for k, size in enumerate(_ints(node.attrs["split"])):
            if size > 0:
                chunks.append((f"y{k}", rd.write(size * unit), rd.write(offset)))
                args.append(outs[k])
                names.append(f"y{k}")
            offset += size * unit
        outer = rd.write(math.prod(xs[:axis]))
        ctx = SplitContext(
            params=params(names, args, [True] * len(args)) + rd.params,
            outer=outer,
            row_bytes=rd.write(offset),
            chunks=tuple(chunks),
            parallel=rd.dynamic or x.size >= 4 * PARALLEL_MIN_WORK and outer > 1,
            parallel_if=f"{rd.write(x.size)} >= {4 * PARALLEL_MIN_WORK} && {outer} > 1" if rd.dynamic else "",
        )
        return _unless_empty(x.size, StepCode("c/split.c.j2", ctx, (*args, *rd.args)))


# -- Range --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RangeContext(KernelContext):
    ctype: str
    floating: bool
    count: int


_RANGE_DTYPES = frozenset(
    np.dtype(t) for t in (np.int16, np.int32, np.int64, np.float16, np.float32, np.float64)
)


def _scalar(v: Value | None) -> bool:
    return v is not None and v.shape is not None and _prod(v.shape) == 1


class RangeKernel(CKernel):
    """Range(start, limit, delta): element i is start + i * delta, as the reference computes it.

    Floats are computed in double (the product rounded before the sum: no FMA contraction) and
    rounded once to the output type; integers wrap in 64 bits. The count is the output's static
    length, so ``limit`` is not read.
    """

    kinds: tuple[str, ...] = ("Range",)
    dynamic = True  # a run-time count (the output's length from the binding; limit not read)

    def supports(self, node: Node) -> bool:
        if len(node.inputs) != 3 or len(node.outputs) != 1 or not all(_scalar(v) for v in node.inputs):
            return False
        y = node.outputs[0]
        if y.dtype not in _RANGE_DTYPES or any(v is not None and v.dtype != y.dtype for v in node.inputs):
            return False
        if symbolic_const(node.input(0)) or symbolic_const(node.input(2)):
            return False
        return len(shape_of(y, symbolic=True)) == 1

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        y = node.outputs[0]
        assert y.dtype is not None
        ctype = value_ctype(y.dtype)
        start, delta = (arg(step.inputs[i], ctype, True, step, f"input {i} ({node.input(i).name})")  # type: ignore[union-attr]
                        for i in (0, 2))  # limit is not read (it may be a shape's run-time value)
        args = [start, delta, *output_args(step, ctype)]
        rd = run_dims(step)
        ctx = RangeContext(
            params=params(["start", "delta", "y"], args, [True, True, True]) + rd.params,
            ctype=ctype,
            floating=y.dtype.kind == "f",
            count=rd.write(y.size),
        )
        return _unless_empty(y.size, StepCode("c/range.c.j2", ctx, (*args, *rd.args)))


# -- ConstantOfShape of a run-time shape ----------------------------------------------------------


@dataclass(frozen=True)
class FillContext(KernelContext):
    count: int  # elements (CDim: C over the binding)
    value: str  # the element as a C literal


_FILL_DTYPES = frozenset(np.dtype(t) for t in (np.float32, np.int32, np.int64))


class FillKernel(CKernel):
    """ConstantOfShape whose shape holds run-time dims (a static one is folded at compile time):
    every element the attribute ``value``; float32, int32 and int64."""

    kinds: tuple[str, ...] = ("ConstantOfShape",)
    dynamic = True

    def supports(self, node: Node) -> bool:
        y = node.outputs[0] if len(node.outputs) == 1 else None
        if node.inputs or y is None or y.dtype not in _FILL_DTYPES or not is_dynamic(node):
            return False
        return np.dtype(node.attrs.get("dtype", "float32")) == y.dtype and "value" in node.attrs

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        y = node.outputs[0]
        assert y.dtype is not None
        value = np.array(node.attrs["value"]).astype(y.dtype).reshape(())
        args = output_args(step, value_ctype(y.dtype))
        rd = run_dims(step)
        ctx = FillContext(
            params=params(["y"], args, [True]) + rd.params,
            count=rd.write(y.size),
            value=literal(float(value)) if y.dtype.kind == "f" else f"INT64_C({int(value)})",
        )
        return StepCode("c/fill.c.j2", ctx, (*args, *rd.args))


KERNELS = (StridedKernel(), GatherKernel(), SplitKernel(), RangeKernel(), FillKernel())
