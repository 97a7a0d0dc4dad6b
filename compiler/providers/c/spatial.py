"""C kernels for the spatial ops: Resize over the last two axes and ConvTranspose (1-D / 2-D).

Resize: the per-axis tap tables of ``runtime.kernels.spatial.resize_taps`` (the reference kernel's
own) are compiled into the kernel as static arrays, so every mode the reference handles (nearest,
linear, cubic, antialias, exclude_outside, tf_crop_and_resize) runs the same arithmetic; each
output row first blends its input rows (H taps) into a row buffer, then gathers the W taps, in the
reference's axis order. Only float32 resizes that leave every axis but the last two unchanged are
claimed, with bounded tables. With run-time dims (a dynamic graph: no tables can be compiled) a
nearest Resize by whole scales (asymmetric, floor; ``spatial_resize_nearest.c.j2``), and nearest /
linear ones whose taps the step computes at run time (``resize_runtime.py``) are claimed.

ConvTranspose: per image and group, the register-blocked GEMM tile of ``gemm`` computes the
columns W_g^T X_g -- one row per (output channel, kh, kw), one column per input pixel -- into
scratch (W read transposed in place), then col2im gathers them per output row: y[n, m, oh, :] adds
column rows (m, kh, kw) at the input row ih with oh = ih * sh + kh * dh - pt, each a strided axpy
over iw. float32 NCHW (1-D as H = 1) with groups, dilations, strides, pads and output_padding
(the output shape). In a dynamic graph the batch and the spatial sizes are C locals read from the
binding (channels, taps, strides and pads compile-time) and the tile's columns a run-time count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from compiler.codegen.cdims import CDim
from compiler.codegen.elementwise import literal
from compiler.codegen.toolchain import TargetInfo
from compiler.ir.graph import Node
from compiler.providers.base import GenStep
from compiler.providers.base import shape_of
from compiler.providers.c.common import PARALLEL_MIN_WORK
from compiler.providers.c.common import Arg
from compiler.providers.c.common import CKernel
from compiler.providers.c.common import StepCode
from compiler.providers.c.common import all_float32
from compiler.providers.c.common import dyn_arg
from compiler.providers.c.common import params
from compiler.providers.c.common import step_args
from compiler.providers.c.conv import Decls
from compiler.providers.c.conv import dynamic_geometry
from compiler.providers.c.conv import pool_condition
from compiler.providers.c.gemm import MAX_PANEL
from compiler.providers.c.gemm import Epilogue
from compiler.providers.c.gemm import Tiling
from compiler.providers.c.gemm import choose_tiling
from compiler.providers.c.gemm import run_time_columns
from compiler.providers.c.gemm import sized_scratch
from compiler.providers.c.resize_runtime import runtime_resize
from compiler.providers.c.resize_runtime import runtime_resize_scratch
from compiler.providers.c.resize_runtime import takes_runtime_scales
from compiler.providers.c.rundims import is_dynamic
from compiler.providers.c.rundims import parallel_if
from compiler.providers.c.rundims import run_dims
from compiler.providers.geometry import ConvTransposeGeometry
from compiler.providers.geometry import claimed
from compiler.providers.kit import KernelContext
from compiler.providers.kit import Param
from runtime.errors import RuntimeKernelError
from runtime.kernels.spatial import ResizeTaps
from runtime.kernels.spatial import resize_plan
from runtime.symbolic import Expr

__all__ = ["ResizeContext", "NearestContext", "ConvTransposeContext", "ResizeKernel", "ConvTransposeKernel"]

# Most table entries (taps over both axes) compiled into one Resize kernel, and the widest input
# row its per-thread row buffer (on the stack) may hold.
MAX_RESIZE_TAPS = 1 << 16
MAX_RESIZE_ROW = 1 << 14


# -- Resize -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AxisTable:
    """One axis's taps as C initializers: ``size`` outputs of ``taps`` (index, weight) pairs."""

    size: int
    taps: int
    index: tuple[int, ...]
    weight: tuple[str, ...]  # float32 literals
    outside: tuple[int, ...]  # 1 where the output takes the extrapolation value; () when none


@dataclass(frozen=True)
class ResizeContext(KernelContext):
    outer: int  # product of the unchanged leading axes
    h: int
    w: int
    th: AxisTable
    tw: AxisTable
    nearest: bool  # one tap of weight 1 on both axes: a pure gather
    extrapolation: str
    parallel: bool


def _table(taps: ResizeTaps) -> AxisTable:
    size, n = taps.index.shape
    outside = tuple(int(v) for v in taps.outside) if taps.outside is not None and taps.outside.any() else ()
    return AxisTable(size, n, tuple(int(i) for i in taps.index.reshape(-1)),
                     tuple(literal(float(w)) for w in taps.weights.reshape(-1)), outside)


def _resize_tables(node: Node) -> tuple[int, int, int, ResizeTaps, ResizeTaps] | None:
    """(outer, h, w, H taps, W taps) when only the last two axes change, else None."""
    xs, ys = shape_of(node.input(0)), shape_of(node.outputs[0])
    if not xs or len(xs) != len(ys) or min(xs + ys) < 1 or max(ys) > MAX_RESIZE_TAPS:
        return None  # (the tables have an entry per output index: too many, leave it to the reference)
    try:
        plan = resize_plan(xs, ys, node.attrs)
    except (KeyError, TypeError, ValueError, RuntimeKernelError):
        return None
    if len(plan) == 1:  # 1-D: one row
        plan = [ResizeTaps(1, np.zeros((1, 1), np.int64), np.ones((1, 1)), None), *plan]
        xs, ys = (1, *xs), (1, *ys)
    if not all(t.is_identity for t in plan[:-2]):
        return None
    return math.prod(xs[:-2]), xs[-2], xs[-1], plan[-2], plan[-1]


@dataclass(frozen=True)
class NearestContext(KernelContext):
    """Resize by whole scales (nearest, asymmetric, floor): output (oh, ow) reads input
    (oh / sh, ow / sw) of (outer, h, w) planes (ints, or CDim: C over the binding)."""

    outer: object
    h: object
    w: object
    sh: int
    sw: int
    parallel: bool
    parallel_if: str  # with run-time dims: the C condition for the worker pool


def _whole_scales(node: Node) -> tuple[int, int] | None:
    """(sh, sw) of a nearest Resize by whole scales on the last two axes (asymmetric, floor: output
    index o reads input o // s), every other axis unchanged; else None."""
    a = node.attrs
    if (a.get("mode"), a.get("coordinate_transformation_mode"), a.get("nearest_mode")) != (
            "nearest", "asymmetric", "floor") or a.get("antialias") or "scales" not in a:
        return None
    xs, ys = shape_of(node.input(0), symbolic=True), shape_of(node.outputs[0], symbolic=True)
    scales = [float(v) for v in a["scales"]]
    if len(xs) < 2 or len(ys) != len(xs) or len(scales) != len(xs):
        return None
    if any(v != 1.0 for v in scales[:-2]) or any(v < 1 or v != int(v) for v in scales[-2:]):
        return None
    sh, sw = int(scales[-2]), int(scales[-1])
    if ys[:-2] != xs[:-2] or ys[-2] != xs[-2] * sh or ys[-1] != xs[-1] * sw:
        return None
    return sh, sw


def _nearest_resize(step: GenStep) -> StepCode:
    """A nearest Resize by whole scales, static or with run-time dims: rows written element by
    element once and copied (a static one's tap tables gathered each element: 4.6x as long on
    YOLOv8n's 2x upsampling)."""
    node = step.node
    scales = _whole_scales(node)
    assert scales is not None, node.describe()
    xs = shape_of(node.input(0), symbolic=True)
    args = step_args(step)
    rd = run_dims(step)
    outer = rd.write(math.prod(xs[:-2]))
    work = rd.write(math.prod(xs) * scales[0] * scales[1])
    ctx = NearestContext(
        params=params(["x", "y"], args, [True, True]) + rd.params,
        outer=outer,
        h=rd.write(xs[-2]),
        w=rd.write(xs[-1]),
        sh=scales[0],
        sw=scales[1],
        parallel=not isinstance(work, int) or work >= 4 * PARALLEL_MIN_WORK,
        parallel_if=parallel_if(work, 4 * PARALLEL_MIN_WORK),
    )
    return StepCode("c/spatial_resize_nearest.c.j2", ctx, (*args, *rd.args))


class ResizeKernel(CKernel):
    kinds: tuple[str, ...] = ("Resize",)
    dynamic = True  # run-time dims: nearest by whole scales (_whole_scales), else resize_runtime.py

    def supports(self, node: Node) -> bool:
        if not all_float32(node) or len(node.inputs) != 1 or len(node.outputs) != 1:
            return False
        if is_dynamic(node):
            return _whole_scales(node) is not None or takes_runtime_scales(node)
        tables = _resize_tables(node)
        if tables is None:
            return False
        _, _, w, th, tw = tables
        return th.index.size + tw.index.size <= MAX_RESIZE_TAPS and w <= MAX_RESIZE_ROW

    def scratch_nbytes(self, node: Node) -> int | Expr:  # type: ignore[override]
        if is_dynamic(node) and _whole_scales(node) is None:
            return runtime_resize_scratch(node)
        return 0

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        if is_dynamic(node) and _whole_scales(node) is None:
            return runtime_resize(step)
        if is_dynamic(node) or _whole_scales(node) is not None:
            return _nearest_resize(step)
        tables = _resize_tables(node)
        assert tables is not None, node.describe()
        outer, h, w, th, tw = tables
        args = step_args(step)
        nearest = all(t.index.shape[1] == 1 and bool((t.weights == 1.0).all()) for t in (th, tw))
        work = outer * th.index.shape[0] * (w * th.index.shape[1] + tw.index.size)
        ctx = ResizeContext(
            params=params(["x", "y"], args, [True, True]),
            outer=outer,
            h=h,
            w=w,
            th=_table(th),
            tw=_table(tw),
            nearest=nearest,
            extrapolation=literal(float(node.attrs["extrapolation_value"])),
            parallel=work >= PARALLEL_MIN_WORK,
        )
        return StepCode("c/spatial_resize.c.j2", ctx, tuple(args))


# -- ConvTranspose ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConvTransposeContext(KernelContext):
    t: Tiling  # the product W_g^T (mg * kh * kw x cg) times X_g (cg x h * w)
    e: Epilogue
    bias: bool
    g: ConvTransposeGeometry
    pool: str  # C condition: the phases run on the worker pool (threads only for enough work)
    decls: Decls = ()  # a dynamic node's run-time sizes (NB, H, W, OH, OW, NP = H * W)


def _conv_transpose_geometry(node: Node) -> ConvTransposeGeometry:
    return claimed(ConvTransposeGeometry.from_node(node, "NCHW", symbolic=is_dynamic(node)), node)


class ConvTransposeKernel(CKernel):
    kinds: tuple[str, ...] = ("ConvTranspose",)
    dynamic = True  # run-time batch and spatial sizes (the tile's columns H * W at run time)

    def supports(self, node: Node) -> bool:
        if not all_float32(node) or len(node.inputs) > 3:
            return False
        g = ConvTransposeGeometry.from_node(node, "NCHW", symbolic=is_dynamic(node))
        b = node.input(2)
        return g is not None and (b is None or (not b.is_symbolic and shape_of(b) == (g.m,)))

    def scratch_nbytes(self, node: Node) -> int | Expr:  # type: ignore[override]
        g = _conv_transpose_geometry(node)
        return 4 * g.mg * g.kh * g.kw * g.h * g.w  # type: ignore[no-any-return]  # one image and group's columns

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        g = _conv_transpose_geometry(node)
        bias = node.input(2) is not None
        args = [*step_args(step), *sized_scratch(step, self.scratch_nbytes(node))]
        names = ["x", "w"] + (["bias"] if bias else []) + ["y", "scratch"]
        step_params = params(names, args, [True] * len(names))
        e = Epilogue("", False, "", 0, 0, False, "v")
        if is_dynamic(node):
            return _dynamic_conv_transpose(step, g, e, bias, args, step_params, target)
        t = choose_tiling(g.mg * g.kh * g.kw, g.h * g.w, g.cg, target)
        ctx = ConvTransposeContext(
            params=step_params,
            t=t,
            e=e,
            bias=bias,
            g=g,
            pool=pool_condition(2 * g.batch * g.groups * g.mg * g.kh * g.kw * t.n * g.cg),
        )
        return StepCode("c/spatial_conv_transpose.c.j2", ctx, tuple(args))


def _dynamic_conv_transpose(step: GenStep, g0: ConvTransposeGeometry, e: Epilogue, bias: bool,
                            args: list[Arg], step_params: tuple[Param, ...], target: TargetInfo) -> StepCode:
    """The same kernel over run-time sizes: C locals from the binding, the tile's N (input pixels
    per image, NP) a run-time count (``run_time_columns``: the tail panel's B rows copied into a
    zeroed buffer), threads when the run's work is large enough."""
    g, decls = dynamic_geometry(g0, step.symbols)
    decls += (("NP", str(g.h * g.w)),)
    t = run_time_columns(choose_tiling(g.mg * g.kh * g.kw, 64 * MAX_PANEL, g.cg, target), CDim("NP"))
    work = CDim("NP") * (g.batch * (2 * g.groups * g.mg * g.kh * g.kw * g.cg))  # type: ignore[operator]
    ctx = ConvTransposeContext(
        params=(*step_params, Param("dyn", "int64_t", True, True)),
        t=t,
        e=e,
        bias=bias,
        g=g,
        pool=pool_condition(work),
        decls=decls,
    )
    return StepCode("c/spatial_conv_transpose.c.j2", ctx, (*args, dyn_arg(step)))


KERNELS = (ResizeKernel(), ConvTransposeKernel())
