"""C kernels that reduce along axes: the Reduce* family, ArgMax / ArgMin, TopK, LayerNormalization.

Every kernel reads a contiguous input at compile-time strides; in a dynamic graph the Reduce*
kernels and LayerNormalization (its row count) take run-time dims (C over the binding,
``rundims.py``) instead. A reduction's dimensions are
merged into alternating groups of kept and reduced dimensions: when the innermost group is
reduced ("rows") each output element is a reduction of contiguous runs; when it is kept ("cols")
each work item accumulates a block of contiguous outputs over every reduced position, so both
cases read memory in order. Floats are accumulated in float32 (``omp simd`` splits long rows into
vector lanes); maxima and minima propagate NaN as numpy does. Einsum is in ``einsum``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from compiler.codegen.elementwise import contiguous_strides
from compiler.codegen.elementwise import literal
from compiler.codegen.toolchain import TargetInfo
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.providers.base import GenStep
from compiler.providers.base import shape_of
from compiler.providers.c.common import PARALLEL_MIN_WORK
from compiler.providers.c.common import CKernel
from compiler.providers.c.common import StepCode
from compiler.providers.c.common import all_float32
from compiler.providers.c.common import input_args
from compiler.providers.c.common import output_args
from compiler.providers.c.common import params
from compiler.providers.c.common import step_args
from compiler.providers.c.dtypes import CType
from compiler.providers.c.dtypes import all_nonempty
from compiler.providers.c.dtypes import ctype_of
from compiler.providers.c.dtypes import offset_expr
from compiler.providers.c.dtypes import prod
from compiler.providers.c.rundims import is_dynamic
from compiler.providers.c.rundims import run_dims
from compiler.providers.c.rundims import symbolic_const
from compiler.providers.kit import KernelContext
from runtime.symbolic import Expr

__all__ = [
    "ReduceContext",
    "AxisContext",
    "ArgContext",
    "TopKContext",
    "LayerNormContext",
    "ReduceKernel",
    "ArgKernel",
    "TopKKernel",
    "LayerNormKernel",
]

# Reduce* op -> the template's name for it.
REDUCE_OPS = {
    "ReduceSum": "sum",
    "ReduceMean": "mean",
    "ReduceMax": "max",
    "ReduceMin": "min",
    "ReduceProd": "prod",
    "ReduceL1": "l1",
    "ReduceL2": "l2",
    "ReduceSumSquare": "sumsq",
    "ReduceLogSum": "logsum",
    "ReduceLogSumExp": "logsumexp",
}
# Which reductions each dtype kind runs (mean, roots and logarithms of integers are not done).
REDUCE_KINDS = {
    "f": frozenset(REDUCE_OPS.values()),
    "i": frozenset({"sum", "prod", "max", "min", "l1", "sumsq"}),
    "u": frozenset({"sum", "prod", "max", "min", "l1", "sumsq"}),
    "b": frozenset({"max", "min"}),
}
COL_BLOCK = 256  # outputs one "cols" work item accumulates (on the stack)


def _numeric(v: Value | None) -> CType | None:
    """The C type of a numeric (not bool) value."""
    t = ctype_of(v)
    return t if t is not None and t.kind != "b" else None


def _along_axis(node: Node) -> tuple[CType, tuple[int, ...], int]:
    """An ArgMax / ArgMin / TopK node's input type, its shape (run-time dims as expressions) and
    the axis it works along."""
    t = _numeric(node.input(0))
    assert t is not None, node.describe()
    return t, shape_of(node.input(0), symbolic=True), int(node.attrs["axis"])


# -- Reduce* ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReduceContext(KernelContext):
    t: CType
    op: str  # a value of REDUCE_OPS
    mode: str  # "rows": the innermost group is reduced | "cols": it is kept
    outer: int  # rows: outputs | cols: output rows of ``inner`` elements
    outer_off: str  # input offset of outer position ``o``
    rcount: int  # reduced positions walked by ``r`` (rows: excluding the innermost group)
    red_off: str  # input offset of reduced position ``r``
    inner: int  # length of the innermost group (contiguous)
    block: int  # cols: outputs per work item
    nblocks: int
    count: int  # elements reduced into each output (ReduceMean)
    parallel: bool
    parallel_if: str = ""  # run-time dims (sizes CDim): the C condition for the worker pool


@dataclass(frozen=True)
class _Group:
    size: int
    stride: int
    reduced: bool


def _groups(shape: tuple[int, ...], axes: set[int]) -> list[_Group]:
    """Adjacent dimensions merged while they are all kept or all reduced (size 1 dropped)."""
    strides = contiguous_strides(shape)
    out: list[_Group] = []
    for d, size in enumerate(shape):
        if size == 1:
            continue
        if out and out[-1].reduced == (d in axes):
            out[-1] = _Group(out[-1].size * size, strides[d], d in axes)
        else:
            out.append(_Group(size, strides[d], d in axes))
    return out


def _reduced_shape(shape: tuple[int, ...], axes: list[int], keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if d in axes else n for d, n in enumerate(shape))
    return tuple(n for d, n in enumerate(shape) if d not in axes)


def _reduce_axes(node: Node) -> list[int] | None:
    """The canonical axes when they and the output shape are consistent, else None."""
    xs = shape_of(node.input(0), symbolic=True)
    axes = [int(a) for a in node.attrs["axes"]]
    if not axes or axes != sorted(set(axes)) or axes[0] < 0 or axes[-1] >= len(xs):
        return None
    keepdims = bool(int(node.attrs["keepdims"]))
    if shape_of(node.outputs[0], symbolic=True) != _reduced_shape(xs, axes, keepdims):
        return None
    return axes


def _run_offset(flat: str, sizes: list, strides: list) -> str:
    """C text: the element offset of row-major position ``flat`` over ``sizes`` at ``strides``
    (ints or run-time ``CDim``; the outermost index a division only)."""
    terms, inner = [], 1
    for d in range(len(sizes) - 1, -1, -1):
        scaled = flat if isinstance(inner, int) and inner == 1 else f"({flat} / {inner})"
        index = scaled if d == 0 else f"{scaled} % {sizes[d]}"
        terms.append(f"({index}) * {strides[d]}")
        inner = inner * sizes[d]
    return " + ".join(reversed(terms)) if terms else "0"


def _dynamic_reduce(step: GenStep, t: CType, axes: list[int]) -> StepCode:
    """A reduction with run-time dims: the groups as in the static kernel (a run-time dim is never
    taken for 1), their sizes and strides C over the binding; "cols" work items of COL_BLOCK."""
    node = step.node
    xs = shape_of(node.input(0), symbolic=True)
    rd = run_dims(step)
    groups = [_Group(rd.write(g.size), rd.write(g.stride), g.reduced) for g in _groups(xs, set(axes))]
    groups = groups or [_Group(1, 1, True)]
    last = groups[-1]
    mode = "rows" if last.reduced else "cols"
    kept = [g for g in groups[:-1] if not g.reduced]
    red = [g for g in (groups[:-1] if last.reduced else groups) if g.reduced]
    nblocks = (last.size + COL_BLOCK - 1) // COL_BLOCK if mode == "cols" else 1
    outer = math.prod([g.size for g in kept], start=1)
    args = step_args(step, t.name)
    total = rd.write(math.prod(xs))
    ctx = ReduceContext(
        params=params(["x", "y"], args, [False, False]) + rd.params,
        t=t,
        op=REDUCE_OPS[node.op_type],
        mode=mode,
        outer=outer,
        outer_off=_run_offset("o", [g.size for g in kept], [g.stride for g in kept]),
        rcount=math.prod([g.size for g in red], start=1),
        red_off=_run_offset("r", [g.size for g in red], [g.stride for g in red]),
        inner=last.size,
        block=COL_BLOCK if mode == "cols" else 1,
        nblocks=nblocks,
        count=rd.write(math.prod([xs[a] for a in axes])),
        parallel=True,
        parallel_if=f"{total} >= {PARALLEL_MIN_WORK} && {outer * nblocks} > 1",
    )
    return StepCode("c/reduce.c.j2", ctx, (*args, *rd.args))


class ReduceKernel(CKernel):
    kinds: tuple[str, ...] = tuple(REDUCE_OPS)
    dynamic = True  # run-time dims: group sizes and strides from the binding

    def supports(self, node: Node) -> bool:
        if len(node.inputs) != 1 or len(node.outputs) != 1:
            return False
        x, y = node.input(0), node.outputs[0]
        t = ctype_of(x)
        if (
            t is None
            or x is None
            or y.dtype != x.dtype
            or REDUCE_OPS[node.op_type] not in REDUCE_KINDS[t.kind]
        ):
            return False
        if symbolic_const(x):
            return False
        return _reduce_axes(node) is not None

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        axes = _reduce_axes(node)
        t = ctype_of(node.input(0))
        assert axes is not None and t is not None, node.describe()
        if is_dynamic(node):
            return _dynamic_reduce(step, t, axes)
        xs = shape_of(node.input(0))
        groups = _groups(xs, set(axes)) or [_Group(1, 1, True)]
        last = groups[-1]
        mode = "rows" if last.reduced else "cols"
        kept = [g for g in groups[:-1] if not g.reduced]
        red = [g for g in (groups[:-1] if last.reduced else groups) if g.reduced]
        nblocks = -(-last.size // COL_BLOCK) if mode == "cols" else 1
        outer = prod([g.size for g in kept])
        args = step_args(step, t.name)
        ctx = ReduceContext(
            params=params(["x", "y"], args, [all_nonempty(node)] * 2),
            t=t,
            op=REDUCE_OPS[node.op_type],
            mode=mode,
            outer=outer,
            outer_off=offset_expr("o", [g.size for g in kept], [g.stride for g in kept]),
            rcount=prod([g.size for g in red]),
            red_off=offset_expr("r", [g.size for g in red], [g.stride for g in red]),
            inner=last.size,
            block=max(1, min(COL_BLOCK, last.size)),
            nblocks=nblocks,
            count=prod([xs[a] for a in axes]),
            parallel=prod(xs) >= PARALLEL_MIN_WORK and outer * nblocks > 1,
        )
        return StepCode("c/reduce.c.j2", ctx, tuple(args))


# -- ArgMax / ArgMin ----------------------------------------------------------------------------


@dataclass(frozen=True)
class AxisContext(KernelContext):
    """What the kernels along one axis (ArgMax / ArgMin, TopK) take: the step's parameters, the
    input's C type, its rows (``outer`` x ``inner``; CDims with run-time dims) of ``length``
    elements and whether the rows go to the worker pool."""

    ctype: str
    floating: bool  # NaN checks are emitted
    outer: int
    length: int
    inner: int
    parallel: bool
    parallel_if: str = ""  # run-time dims: the C condition for the worker pool


@dataclass(frozen=True, kw_only=True)
class ArgContext(AxisContext):
    op: str  # "max" | "min"
    last: bool  # select_last_index


class ArgKernel(CKernel):
    kinds: tuple[str, ...] = ("ArgMax", "ArgMin")
    dynamic = True  # run-time dims off the axis (the axis static): rows from the binding

    def supports(self, node: Node) -> bool:
        if len(node.inputs) != 1 or len(node.outputs) != 1 or _numeric(node.input(0)) is None:
            return False
        y = node.outputs[0]
        if y.dtype != np.int64 or y.shape is None or symbolic_const(node.input(0)):
            return False
        xs = shape_of(node.input(0), symbolic=True)
        axis = int(node.attrs["axis"])
        int(node.attrs["select_last_index"])
        if not 0 <= axis < len(xs) or isinstance(xs[axis], Expr) or xs[axis] < 1:
            return False
        return shape_of(y, symbolic=True) == _reduced_shape(xs, [axis], bool(int(node.attrs["keepdims"])))

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        t, xs, axis = _along_axis(node)
        rd = run_dims(step)
        outer, length = rd.write(math.prod(xs[:axis])), int(xs[axis])
        inner = rd.write(math.prod(xs[axis + 1 :]))
        args = step_args(step, t.name, "int64_t")
        total = rd.write(math.prod(xs))
        ctx = ArgContext(
            params=params(["x", "y"], args, [not rd.dynamic and all_nonempty(node)] * 2) + rd.params,
            ctype=t.name,
            floating=t.kind == "f",
            op="max" if node.op_type == "ArgMax" else "min",
            last=bool(int(node.attrs["select_last_index"])),
            outer=outer,
            length=length,
            inner=inner,
            parallel=rd.dynamic or total >= PARALLEL_MIN_WORK and outer * inner > 1,
            parallel_if=f"{total} >= {PARALLEL_MIN_WORK} && {outer * inner} > 1" if rd.dynamic else "",
        )
        return StepCode("c/reduce_arg.c.j2", ctx, (*args, *rd.args))


# -- TopK -------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TopKContext(AxisContext):
    largest: bool
    k: int


class TopKKernel(CKernel):
    """The k best of each row in a heap kept in the outputs themselves, then heap-sorted."""

    kinds: tuple[str, ...] = ("TopK",)
    dynamic = True  # run-time dims before the axis; the axis and the dims after it static

    def supports(self, node: Node) -> bool:
        if len(node.inputs) != 1 or len(node.outputs) != 2 or _numeric(node.input(0)) is None:
            return False
        x, (values, indices) = node.input(0), node.outputs
        assert x is not None
        if values.dtype != x.dtype or indices.dtype != np.int64 or symbolic_const(x):
            return False
        xs = shape_of(x, symbolic=True)
        axis, k = int(node.attrs["axis"]), int(node.attrs["k"])
        int(node.attrs["largest"])
        int(node.attrs["sorted"])
        if not 0 <= axis < len(xs) or any(isinstance(d, Expr) for d in xs[axis:]) or not 1 <= k <= xs[axis]:
            return False
        ys = xs[:axis] + (k,) + xs[axis + 1 :]
        return shape_of(values, symbolic=True) == ys and shape_of(indices, symbolic=True) == ys

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        t, xs, axis = _along_axis(node)
        rd = run_dims(step)  # a run-time outer in a dynamic graph
        outer, length, inner = rd.write(math.prod(xs[:axis])), int(xs[axis]), prod(xs[axis + 1 :])
        k = int(node.attrs["k"])
        rows = outer * inner
        args = [*input_args(step, t.name), output_args(step, t.name)[0], output_args(step, "int64_t")[1]]
        work = rows * length * max(1, k.bit_length())
        ctx = TopKContext(
            params=params(["x", "yv", "yi"], args, [not rd.dynamic and all_nonempty(node)] * 3) + rd.params,
            ctype=t.name,
            floating=t.kind == "f",
            largest=bool(int(node.attrs["largest"])),
            k=k,
            outer=outer,
            length=length,
            inner=inner,
            parallel=rd.dynamic or work >= PARALLEL_MIN_WORK and rows > 1,
            parallel_if=f"{work} >= {PARALLEL_MIN_WORK} && {rows} > 1" if rd.dynamic else "",
        )
        return StepCode("c/reduce_topk.c.j2", ctx, (*args, *rd.args))


# -- LayerNormalization -------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerNormContext(KernelContext):
    outer: int
    n: int  # elements normalized together
    scale_index: str  # "j" (one per element) or "0" (one for all)
    bias: bool
    bias_index: str
    eps: str
    stats: int  # 0, 1 (Mean) or 2 (Mean and InvStdDev) statistics outputs
    parallel: bool
    parallel_if: str = ""  # a run-time row count (outer: CDim): the C condition for the worker pool


def _per_element_index(v: Value | None, norm: tuple[int, ...]) -> str | None:
    """How a Scale / B of shape broadcastable to ``norm`` is indexed: "j", "0" or None (neither)."""
    if v is None:
        return None
    shape = shape_of(v)
    if len(shape) > len(norm):
        return None
    if prod(shape) == 1:
        return "0"
    trimmed = shape[next(i for i, d in enumerate(shape) if d != 1) :]
    return "j" if trimmed == norm[len(norm) - len(trimmed) :] and prod(trimmed) == prod(norm) else None


class LayerNormKernel(CKernel):
    kinds: tuple[str, ...] = ("LayerNormalization",)
    dynamic = True  # run-time dims before the axis (the row count); the normalized dims static

    def supports(self, node: Node) -> bool:
        if not all_float32(node) or not 1 <= len(node.outputs) <= 3 or not 2 <= len(node.inputs) <= 3:
            return False
        if any(symbolic_const(v) for v in node.inputs):
            return False
        xs = shape_of(node.input(0), symbolic=True)
        axis = int(node.attrs["axis"])
        float(node.attrs["epsilon"])
        norm = xs[axis:] if 0 <= axis < len(xs) else ()
        if any(isinstance(d, Expr) for d in norm):
            return False
        if not norm or prod(norm) < 1 or shape_of(node.outputs[0], symbolic=True) != xs:
            return False
        stat_shape = xs[:axis] + (1,) * len(norm)
        if any(shape_of(v, symbolic=True) != stat_shape for v in node.outputs[1:]):
            return False
        if _per_element_index(node.input(1), norm) is None:
            return False
        return node.input(2) is None or _per_element_index(node.input(2), norm) is not None

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        xs = shape_of(node.input(0), symbolic=True)
        axis = int(node.attrs["axis"])
        norm = tuple(int(d) for d in xs[axis:])
        scale_index = _per_element_index(node.input(1), norm)
        bias_index = _per_element_index(node.input(2), norm)
        assert scale_index is not None, node.describe()
        args = step_args(step)
        names = ["x", "scale"] + (["bias"] if bias_index is not None else []) + ["y"]
        names += ["mean_out", "inv_std_out"][: len(node.outputs) - 1]
        rd = run_dims(step)  # a run-time row count (outer) in a dynamic graph
        outer = rd.write(math.prod(xs[:axis]))
        n = prod(norm)
        ctx = LayerNormContext(
            # x and y may share memory (each row is read in full before it is written)
            params=params(names, args, [name not in ("x", "y") for name in names]) + rd.params,
            outer=outer,
            n=n,
            scale_index=scale_index,
            bias=bias_index is not None,
            bias_index=bias_index or "0",
            eps=literal(float(node.attrs["epsilon"])),
            stats=len(node.outputs) - 1,
            parallel=rd.dynamic or outer * n * 4 >= PARALLEL_MIN_WORK and outer > 1,
            parallel_if=f"{outer} * {n * 4} >= {PARALLEL_MIN_WORK} && {outer} > 1" if rd.dynamic else "",
        )
        return StepCode("c/reduce_layernorm.c.j2", ctx, (*args, *rd.args))


KERNELS = (ReduceKernel(), ArgKernel(), TopKKernel(), LayerNormKernel())
