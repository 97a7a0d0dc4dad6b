"""C kernels for the channels-last pools of the layout pass (semantics: runtime/kernels/nhwc.py).

``onnx_aot.MaxPoolNhwc`` / ``AveragePoolNhwc`` (``templates/c/pool_nhwc.c.j2``): one output pixel
at a time, vectors over its contiguous channels held in registers while the window's taps are
folded in. Output pixels whose windows lie wholly inside the input (a rectangle known at compile
time) unroll the taps (up to 64) at constant offsets with no bounds checks; the border pixels clip their
window to the input rows and columns at run time. Both paths fold the taps in the reference's
order (row-major over the window), skipping padding, so AveragePool sums are the reference's to
the bit; divisors come from per-axis count tables, the reference's own (``window_counts``:
``count_include_pad``, ceil-mode windows reaching past the declared padding, dilations). MaxPool
propagates NaN like ``numpy.maximum``.

``onnx_aot.GlobalAveragePoolNhwc`` and ``onnx_aot.LRNNhwc`` (``templates/c/channel_nhwc.c.j2``):
channel-chunk accumulators summed pixel by pixel (in blocks of ``SUM_BLOCK`` pixels, then the blocks'
sums: a long row's float sum stays accurate); LRN per pixel from a zero-padded row of squares
(beta 0.75 / 0.5 / 1 with square roots and a division, vectorized; other betas call ``powf``).

All four take a dynamic graph's run-time batch and spatial sizes (channels static): the pools'
inside rectangle is C locals and the AveragePool divisor is counted at run time (the taps inside
the input, or the whole window with ``count_include_pad``; ceil mode is static only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from compiler.codegen.cdims import CDim
from compiler.codegen.cdims import kernel_dims
from compiler.codegen.elementwise import literal
from compiler.codegen.toolchain import TargetInfo
from compiler.ir.graph import Node
from compiler.providers.base import GenStep
from compiler.providers.base import shape_of
from compiler.providers.c.common import PARALLEL_MIN_WORK
from compiler.providers.c.common import CKernel
from compiler.providers.c.common import StepCode
from compiler.providers.c.common import dyn_arg
from compiler.providers.c.common import float32_unary
from compiler.providers.c.common import params
from compiler.providers.c.common import step_args
from compiler.providers.c.conv import Decls
from compiler.providers.c.conv import dynamic_geometry
from compiler.providers.c.conv import is_dynamic
from compiler.providers.c.conv_nhwc import inside_decls
from compiler.providers.c.pool_bf16 import bf16_pool
from compiler.providers.c.pool_bf16 import build_bf16_pool
from compiler.providers.geometry import PoolGeometry
from compiler.providers.geometry import claimed
from compiler.providers.kit import KernelContext
from compiler.providers.kit import Param
from runtime.contract import AVERAGE_POOL_NHWC
from runtime.contract import GLOBAL_AVERAGE_POOL_NHWC
from runtime.contract import LRN_NHWC
from runtime.contract import MAX_POOL_NHWC
from runtime.symbolic import Expr

__all__ = [
    "Channels",
    "PoolNhwcContext",
    "ChannelNhwcContext",
    "PoolNhwcKernel",
    "ChannelNhwcKernel",
    "channel_walk",
]

UNROLL = 4  # vectors of channels a pool keeps in registers per pass over a window
MAX_UNROLLED_TAPS = 64  # larger windows loop over their taps
CHUNK = 256  # channels GlobalAveragePool accumulates per pass over the pixels
# GlobalAveragePool over more pixels than this sums blocks of this many pixels, then the block sums:
# a float sum of S terms in a row drifts ~S ulps (1.8e-4 on PP-OCRv4 rec's 6x512 maps at W=2048,
# onnxruntime 1.4e-5); two levels drift ~(SUM_BLOCK + S / SUM_BLOCK) ulps
SUM_BLOCK = 64
MAX_LRN_CHANNELS = 16384  # LRN keeps a pixel's squares on the (thread's) stack: 64 KiB at most


@dataclass(frozen=True)
class Channels:
    """How a kernel walks ``c`` contiguous channels with vectors of ``vw`` floats.

    ``blocks`` blocks of ``unroll`` vectors from channel 0, then single vectors at ``singles``
    (the last one may overlap the one before it, which is harmless for kernels whose channels
    are independent), then ``scalar`` channels one at a time (only when ``c < vw``).
    """

    c: int
    vw: int
    unroll: int
    blocks: int
    singles: tuple[int, ...]
    scalar: int


def channel_walk(c: int, vw: int, unroll: int = UNROLL) -> Channels:
    if c < vw:
        return Channels(c, vw, unroll, 0, (), c)
    block = unroll * vw
    blocks = c // block
    done = blocks * block
    singles = [done + k * vw for k in range((c - done) // vw)]
    if (c - done) % vw:
        singles.append(c - vw)
    return Channels(c, vw, unroll, blocks, tuple(singles), 0)


# -- MaxPool / AveragePool -----------------------------------------------------------------------


@dataclass(frozen=True)
class PoolNhwcContext(KernelContext):
    op: str  # "max" | "avg"
    g: PoolGeometry
    ch: Channels
    oh_lo: int  # output rows [oh_lo, oh_hi) and columns [ow_lo, ow_hi): windows inside the input
    oh_hi: int
    ow_lo: int
    ow_hi: int
    taps: tuple[int, ...]  # element offsets of the window's taps from its first, row-major; () when
    # the window is too big to unroll
    count_h: tuple[int, ...]  # avg: counted taps per output row / column
    count_w: tuple[int, ...]
    parallel: bool
    # A dynamic node's: run-time sizes as C locals (``decls``; the inside rectangle too), the
    # divisor counted at run time (``include``: the whole window, else the taps inside the input;
    # ceil mode is static only), the pool for enough work (``when``: a C condition).
    dyn: bool = False
    decls: Decls = ()
    include: bool = False
    when: str = ""


class PoolNhwcKernel(CKernel):
    kinds: tuple[str, ...] = (MAX_POOL_NHWC, AVERAGE_POOL_NHWC)
    dynamic = True  # run-time batch and spatial sizes (not in ceil mode)

    def supports(self, node: Node) -> bool:
        if not float32_unary(node):
            return False
        if node.kind == AVERAGE_POOL_NHWC and node.attrs.get("count_include_pad") not in (0, 1):
            return False
        return PoolGeometry.from_node(node, "NHWC", is_dynamic(node)) is not None

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        if is_dynamic(node):
            return _build_dynamic_pool(step, target)
        if bf16_pool(node):  # (--precision bf16: between bf16 steps, in bfloat16)
            return build_bf16_pool(step, target)
        g = claimed(PoolGeometry.from_node(node, "NHWC"), node)
        avg = node.kind == AVERAGE_POOL_NHWC
        include = avg and bool(int(node.attrs["count_include_pad"]))
        args = step_args(step)
        oh_lo, oh_hi = g.rows.inside()
        ow_lo, ow_hi = g.cols.inside()
        ctx = PoolNhwcContext(
            params=params(["x", "y"], args, [True, True]),
            op="avg" if avg else "max",
            g=g,
            ch=channel_walk(g.c, target.vector_bytes // 4),
            oh_lo=oh_lo,
            oh_hi=oh_hi,
            ow_lo=ow_lo,
            ow_hi=ow_hi,
            taps=tuple((i * g.dh * g.w + j * g.dw) * g.c for i in range(g.kh) for j in range(g.kw))
            if g.kh * g.kw <= MAX_UNROLLED_TAPS
            else (),
            count_h=g.rows.counts(include) if avg else (),
            count_w=g.cols.counts(include) if avg else (),
            parallel=g.batch * g.oh * g.ow * g.c * g.kh * g.kw >= PARALLEL_MIN_WORK and g.batch * g.oh > 1,
        )
        return StepCode("c/pool_nhwc.c.j2", ctx, tuple(args))


def _build_dynamic_pool(step: GenStep, target: TargetInfo) -> StepCode:
    node = step.node
    g, decls = dynamic_geometry(claimed(PoolGeometry.from_node(node, "NHWC", True), node), step.symbols)
    avg = node.kind == AVERAGE_POOL_NHWC
    decls += inside_decls("OHI", g.h, g.oh, g.kh, g.sh, g.dh, g.pt)
    decls += inside_decls("OWI", g.w, g.ow, g.kw, g.sw, g.dw, g.pl)
    args = [*step_args(step), dyn_arg(step)]
    taps = [(i * g.dh * g.w + j * g.dw) * g.c for i in range(g.kh) for j in range(g.kw)]
    ctx = PoolNhwcContext(
        params=(*params(["x", "y"], args[:-1], [True, True]), Param("dyn", "int64_t", True, True)),
        op="avg" if avg else "max",
        g=g,
        ch=channel_walk(g.c, target.vector_bytes // 4),
        oh_lo=CDim("OHILO"),  # type: ignore[arg-type]
        oh_hi=CDim("OHIHI"),  # type: ignore[arg-type]
        ow_lo=CDim("OWILO"),  # type: ignore[arg-type]
        ow_hi=CDim("OWIHI"),  # type: ignore[arg-type]
        taps=tuple(taps) if g.kh * g.kw <= MAX_UNROLLED_TAPS else (),
        count_h=(),
        count_w=(),
        parallel=True,
        dyn=True,
        decls=decls,
        include=avg and bool(int(node.attrs["count_include_pad"])),
        when=f"{g.batch * g.oh * g.ow * g.c * g.kh * g.kw} >= {PARALLEL_MIN_WORK} && {g.batch * g.oh} > 1",
    )
    return StepCode("c/pool_nhwc.c.j2", ctx, tuple(args))


# -- GlobalAveragePool, LRN ----------------------------------------------------------------------


@dataclass(frozen=True)
class ChannelNhwcContext(KernelContext):
    op: str  # "global_avg" | "lrn"
    n: int
    s: int  # pixels per image
    c: int
    chunk: int  # global_avg: channels per accumulator chunk
    block: int  # global_avg: pixels per partial sum (0: one running sum; static S <= SUM_BLOCK)
    lrn_lo: int  # lrn: channels below / above c in the window
    lrn_hi: int
    lrn_alpha: str  # alpha / size
    lrn_beta: str
    lrn_bias: str
    lrn_power: str  # "sqrt3/4" (beta 0.75) | "sqrt" (0.5) | "one" (1) | "pow"
    parallel: bool
    when: str = ""  # a dynamic node's C condition for the pool (n and s are then C text over ``dyn``)


LRN_POWERS = {0.75: "sqrt3/4", 0.5: "sqrt", 1.0: "one"}


class ChannelNhwcKernel(CKernel):
    kinds: tuple[str, ...] = (GLOBAL_AVERAGE_POOL_NHWC, LRN_NHWC)
    dynamic = True  # run-time batch and spatial sizes; channels static

    def supports(self, node: Node) -> bool:
        if not float32_unary(node):
            return False
        xs, ys = shape_of(node.input(0), symbolic=True), shape_of(node.outputs[0], symbolic=True)
        if len(xs) != 4 or isinstance(xs[3], Expr):
            return False
        if node.kind == GLOBAL_AVERAGE_POOL_NHWC:
            return ys == (xs[0], 1, 1, xs[3])
        a = node.attrs
        size = a.get("size")
        numbers = all(isinstance(a.get(k), (int, float)) for k in ("alpha", "beta", "bias"))
        fits = xs[3] <= MAX_LRN_CHANNELS
        return ys == xs and numbers and isinstance(size, int) and size >= 1 and fits

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        n, h, w, c = shape_of(node.input(0), symbolic=True)
        lrn = node.kind == LRN_NHWC
        a = node.attrs
        size = int(a["size"]) if lrn else 1
        beta = float(a["beta"]) if lrn else 1.0
        args = step_args(step)
        chunk = min(CHUNK, c)
        names, restrict = ["x", "y"], [True, True]
        sizes: tuple[Any, Any, Any] = (n, h * w, n * h * w if lrn else n * math.ceil(c / chunk))
        if is_dynamic(node):  # n and s as C text over the binding; threads for enough work
            write = kernel_dims(step.symbols)
            when = f"{write(n * h * w * c * size)} >= {PARALLEL_MIN_WORK} && {write(sizes[2])} > 1"
            sizes = (write(n), write(h * w), None)
            step_params = (*params(names, args, restrict), Param("dyn", "int64_t", True, True))
            args = [*args, dyn_arg(step)]
        else:
            when, step_params = "", params(names, args, restrict)
        n, s, jobs = sizes
        ctx = ChannelNhwcContext(
            params=step_params,
            op="lrn" if lrn else "global_avg",
            n=n,
            s=s,
            c=c,
            chunk=chunk,
            block=0 if lrn or (isinstance(s, int) and s <= SUM_BLOCK) else SUM_BLOCK,
            lrn_lo=(size - 1) // 2,
            lrn_hi=size - 1 - (size - 1) // 2,
            lrn_alpha=literal(float(a["alpha"]) / size) if lrn else "0.0f",
            lrn_beta=literal(beta),
            lrn_bias=literal(float(a["bias"])) if lrn else "0.0f",
            lrn_power=LRN_POWERS.get(beta, "pow"),
            parallel=bool(when) or (n * s * c * size >= PARALLEL_MIN_WORK and jobs > 1),
            when=when,
        )
        return StepCode("c/channel_nhwc.c.j2", ctx, tuple(args))


KERNELS = (PoolNhwcKernel(), ChannelNhwcKernel())
