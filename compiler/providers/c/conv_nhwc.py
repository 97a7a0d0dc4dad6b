"""C kernel for ``onnx_aot.ConvNhwc``: a channels-last convolution on weights packed ahead of time.

The conv is a GEMM per group: rows are output pixels (all images, flattened), columns the
group's output channels, K = (kh, kw, c). ``templates/c/conv_nhwc.c.j2`` keeps a register tile
of ``mr`` pixels x one panel of 16 output channels (``runtime/kernels/nhwc.py: PANEL``; 2 AVX2
vectors, 4 SSE ones; with AVX-512, where a panel is one vector, two or three neighbouring full panels of a
chunk, ``PAIR_PANELS`` and ``SPAN_PANELS``), loads the weights straight from their packed panel
(contiguous along K) and broadcasts the input from each pixel's own row pointer: a pixel's
channels are contiguous in NHWC, so the input needs no packing at all. K is walked in
*segments* that are contiguous in the input: one tap's ``C/g`` channels, or, for one group and
dilation 1 along W, a whole kernel row's ``KW * C`` values. Padding is handled one of two ways:

- "check": a tap that falls in the padding reads from a static block of zeros instead of the
  input (one bounds test per pixel and tap, no copy); used where a tap has at least
  ``COPY_MAX_CHANNELS`` channels;
- "copy": the input is copied once into a zero-padded image in scratch, so kernel rows are
  contiguous segments with no tests at all (the 3-channel stems: 7x7 rows of 21 values).

Unpadded convs ("direct") read the input in place. The P pixels are split into ``ceil(P / mr)``
tiles of balanced sizes (``q`` or ``q + 1`` pixels: 49 = 4 x 6 + 5 x 5, not 8 x 6 + 1), tiles into
blocks whose input rows fit in L2. A tile runs over the whole K with bias and residual as its
accumulators' start values and the activation applied as they are stored (blocking K, partial sums
through the output, took 1.03-1.1x as long on ResNet-50's K = 1024..4608 convs here). Panels are
grouped in *chunks* whose weights fit in ``CHUNK_BYTES`` (L2): a tile runs over its chunk's panels
before the next tile, so it writes its pixels' output rows (and reads their residual rows) 64
bytes after 64 bytes rather than one line per 4*M-byte row per panel pass. On ResNet-50's
expanding 1x1 convs with a residual (64->256 @56 .. 512->2048 @7) that took 0.81-0.97x their old
time at 2 threads (alternating A/B, per-step minima; 0.82-0.95x at 1 thread), 1.00-1.05x
onnxruntime's per-node time (up to 1.18x in a noisier run), the model 0.984-0.988x (2 threads) and
0.975x (1 thread); chunks of 64 KiB were the same, 256 KiB and 2 panels
slower, all panels (4 MiB of weights at 7x7) 1.11x; prefetching the residual, finer items and
dynamic schedules changed nothing measurable. Groups of fewer than ``CHUNK_MIN_PANELS`` panels
keep one panel per item over the block's tiles: chunks made ShuffleNet's grouped 1x1 convs (4
groups of 34 channels, K = 34) 1.07-1.12x as long, the model 1.02x. Threads split (group, pixel
block, chunk) items statically, chunks outermost where the weights outweigh the input. A partial
last panel computes only the vectors holding its channels (with a second set of accumulators for
odd k when that leaves too few to hide the FMA latency) and never writes past them.

Depthwise convs (one channel per group, weights (KH, KW, C)) take a separate path, vectorized
over channels: each output pixel sums its taps' channel vectors. Where a kernel row's taps all
lie inside the input, ``DW_PIXELS`` neighbouring pixels run at once, a vector of channels at a
time, with the taps unrolled: each weight vector and each input column they read is loaded once
for all of them (a 3x3 stride-1 row: 3 + 8 loads for 18 products, where gcc does not merge the
loads itself); the border pixels loop over their taps inside the input.

A dynamic graph's node (run-time batch and spatial sizes, C locals read from the binding; channels
and taps static) takes the same paths, with what the static kernel decides from those sizes at
compile time decided in C: tiles of ``mr`` pixels (the last one's rows past the end repeat the
last pixel, stored twice with the same values), pixel blocks, the item order and the thread
count by the same rules; any pad counts as padding ("check" or "copy" taps: whether the last
window reaches an end pad depends on the size), the padded copy's size is an expression, and the
depthwise path's inside columns are C locals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from dataclasses import replace

from compiler.codegen.cdims import CDim
from compiler.codegen.toolchain import TargetInfo
from compiler.ir.graph import Node
from compiler.providers.base import GenStep
from compiler.providers.c.common import PARALLEL_MIN_WORK
from compiler.providers.c.common import CKernel
from compiler.providers.c.common import StepCode
from compiler.providers.c.conv import Decls
from compiler.providers.c.conv import conv_operands
from compiler.providers.c.conv import dynamic_conv_operands
from compiler.providers.c.conv import dynamic_geometry
from compiler.providers.c.conv import epilogue_operands_ok
from compiler.providers.c.conv import is_dynamic
from compiler.providers.c.conv_amx import AMX_CONV
from compiler.providers.c.conv_amx import amx_conv
from compiler.providers.c.gemm import Epilogue
from compiler.providers.geometry import ConvGeometry
from compiler.providers.geometry import claimed
from compiler.providers.kit import KernelContext
from compiler.providers.kit import Param
from runtime.contract import CONV_NHWC
from runtime.kernels.nhwc import PANEL
from runtime.symbolic import Expr
from runtime.symbolic import max_

__all__ = ["ConvNhwcContext", "DepthwiseNhwcContext", "ConvNhwcKernel", "inside_decls", "tap_mode"]

BLOCK_BYTES = 256 * 1024  # input rows of one pixel block (L2)
MIN_ITEMS = 32  # work items to aim for, so threads get balanced shares
CHUNK_BYTES = 128 * 1024  # weights of the panels a pixel tile runs over before the next tile (L2)
CHUNK_MIN_PANELS = 4  # groups with fewer panels run a panel over the block's tiles (no chunks)
COPY_MAX_CHANNELS = 16  # padded convs with fewer channels per tap copy the input into scratch
MAX_ROWS = 8  # pixel rows per tile: each holds a row pointer (general-purpose registers)
DW_VECTORS = 2  # channel vectors per step of the depthwise path
DW_PIXELS = 6  # pixels per step of its interior (at most)
# Tiles of two full panels where a panel is one vector (AVX-512): ResNet-50's 1x1 convs at 2
# threads on an Intel Xeon (two 512-bit FMA ports) went from 1.30x onnxruntime's per-node time to
# 1.05x, the model from 1.105x to 0.98x; outputs bit for bit the same (each output channel's sum
# runs over k in the same order).
PAIR_PANELS = True
# With pairs, the most full panels one tile spans (24 accumulators at 8 rows, 3 + 8 loads per 24
# FMAs); a chunk's r panels left go three at a time unless r is 4 (two pairs), so an even chunk
# needs no single-panel tile.
SPAN_PANELS = 3
# Multi-panel tiles prefetch each panel's weights PREFETCH_K k steps (one cache line each) ahead
# where a segment runs over at least PREFETCH_MIN_K: ResNet-50 at threads=2 on the Intel Xeon
# 0.974-0.975x with (the channels-last convs 0.93-0.98x per step, alternating both orders). Short
# segments (the 7x7 stem's are 21 long) go without: a line 8 steps on is mostly past their end.
PREFETCH_K = 8
PREFETCH_MIN_K = 64


def tap_mode(g: ConvGeometry) -> str:
    """How the GEMM path reads taps in the padding: "direct" (none are), "check" or "copy". With
    run-time sizes any pad counts (whether the last window reaches the end pad depends on them)."""
    if isinstance(g.h, Expr) or isinstance(g.w, Expr):
        padded = max(g.pt, g.pb, g.pl, g.pr) > 0
    else:
        padded = g.rows.padded or g.cols.padded
    if not padded:
        return "direct"
    return "check" if g.cg >= COPY_MAX_CHANNELS else "copy"


def _addressed(g: ConvGeometry, mode: str) -> tuple[int, int]:
    """Rows and columns of the image the kernel addresses (the zero-padded copy's in "copy" mode)."""
    if mode != "copy":
        return g.h, g.w
    if isinstance(g.h, Expr) or isinstance(g.w, Expr):
        return max_(g.pt + g.h, g.rows.reach), max_(g.pl + g.w, g.cols.reach)
    return max(g.pt + g.h, g.rows.reach), max(g.pl + g.w, g.cols.reach)


@dataclass(frozen=True)
class ConvNhwcContext(KernelContext):
    """The GEMM path. Pixel tiles: ``ntiles`` of them, the first ``rem`` with ``q + 1`` rows, the
    rest ``q``; ``tb`` tiles per pixel block, ``nb`` blocks. K: ``nseg`` segments of ``seglen``
    values."""

    method: str  # "gemm"
    e: Epilogue
    vw: int
    nv: int  # vectors per panel
    nvt: int  # vectors holding the partial panel's channels
    g: ConvGeometry
    mode: str  # "direct" | "check" | "copy"
    xh: int  # rows / columns of the image the kernel addresses
    xw: int
    flat: bool  # 1x1, stride 1, unpadded: pixel p's row is x + p * C
    row_segments: bool
    nseg: int
    seglen: int
    np: int  # panels per group
    npf: int  # full panels (the last one holds mg % 16 channels when npf < np)
    mt: int  # channels in the partial panel
    pixels: int
    ntiles: int
    q: int
    rem: int
    tb: int
    nb: int
    pc: int  # panels per chunk: a tile runs over a chunk's panels before the next tile
    nch: int  # chunks per group
    panels_outer: bool  # work items ordered (group, chunk, block) rather than (group, block, chunk)
    parallel: bool
    # A dynamic node's (run-time batch and spatial sizes, C locals declared by ``decls``): tiles of
    # ``mr`` pixels (the last one's rows past the end repeat the last pixel), blocks of at most
    # ``tb_max`` tiles, the item order and the thread count decided in C from the run's sizes.
    dyn: bool = False
    decls: Decls = ()
    mr: int = 0
    tb_max: int = 0
    weights_bytes: int = 0
    min_items: int = 0
    when: str = ""  # the OpenMP if clause
    # two full panels per tile where a panel is one vector (AVX-512): each broadcast input value
    # feeds two FMAs, so a k step loads 2 + rows values for 2 * rows FMAs, not 1 + rows for rows
    pair: bool = False
    span: int = 1  # the most full panels per tile (1 without pairs)
    # with pairs, weights prefetched this many k steps (cache lines of a panel) ahead
    prefetch: int = 0


@dataclass(frozen=True)
class DepthwiseNhwcContext(KernelContext):
    method: str  # "depthwise"
    e: Epilogue
    vw: int
    cbv: int  # channel vectors per step
    px: int  # pixels per step where every tap lies inside the input (one vector of channels)
    columns: tuple[tuple[int, tuple[tuple[int, int], ...]], ...]  # see dw_interior in the template
    ow_lo: int  # output columns ow_lo .. ow_hi - 1 have every tap inside the input row
    ow_hi: int
    g: ConvGeometry
    parallel: bool
    dyn: bool = False  # run-time sizes: C locals declared by ``decls``
    decls: Decls = ()
    when: str = ""  # a dynamic node's OpenMP if clause


def tile_rows(target: TargetInfo) -> int:
    """Pixel rows per tile: accumulators for a panel per row, plus the panel's vectors and a broadcast."""
    nv = PANEL // (target.vector_bytes // 4)
    return max(1, min(MAX_ROWS, (target.vector_registers - nv - 2) // nv))


def _pixel_tiling(pixels: int, k: int, panels: int, mr: int) -> tuple[int, int, int, int, int]:
    """(tiles, q, rem, tiles per block, blocks): tiles of q + 1 or q rows, blocks of balanced size
    whose input rows (k floats a pixel) fit in BLOCK_BYTES, split further until there are
    MIN_ITEMS work items where blocks of two tiles allow."""
    ntiles = math.ceil(pixels / mr)
    q, rem = divmod(pixels, ntiles)
    tb_max = max(2, BLOCK_BYTES // (4 * k * mr))
    nb = math.ceil(ntiles / tb_max)
    while nb * panels < MIN_ITEMS and math.ceil(ntiles / (nb + 1)) >= 2 and nb < ntiles:
        nb += 1
    tb = math.ceil(ntiles / nb)
    return ntiles, q, rem, tb, math.ceil(ntiles / tb)


def _columns(px: int, kw: int, sw: int, dw: int) -> tuple[tuple[int, tuple[tuple[int, int], ...]], ...]:
    """The input columns (offsets from the first pixel's first tap) that ``px`` neighbouring
    pixels' taps read along a kernel row, each with the (pixel, tap) pairs reading it."""
    readers: dict[int, list[tuple[int, int]]] = {}
    for q in range(px):
        for t in range(kw):
            readers.setdefault(q * sw + t * dw, []).append((q, t))
    return tuple((col, tuple(readers[col])) for col in sorted(readers))


class ConvNhwcKernel(CKernel):
    kinds: tuple[str, ...] = (CONV_NHWC,)
    dynamic = True  # run-time batch and spatial sizes: tiling and threads decided in C

    def supports(self, node: Node) -> bool:
        if amx_conv(node):  # --precision bf16's weights (compiler/providers/c/conv_amx.py)
            return AMX_CONV.supports(node)
        g = _geometry(node)
        if len(node.inputs) > 4:  # a pre-scale (fuse_conv_prescale): the AMX kernel's only
            return False
        return g is not None and epilogue_operands_ok(node, g.m)

    def scratch_nbytes(self, node: Node) -> int | Expr:  # type: ignore[override]
        if amx_conv(node):
            return AMX_CONV.scratch_nbytes(node)
        g = claimed(_geometry(node), node)
        mode = tap_mode(g)
        if g.depthwise or mode != "copy":
            return 0
        xh, xw = _addressed(g, mode)
        return 4 * g.batch * xh * xw * g.c

    def overwritable_input(self, node: Node) -> int | None:
        """The residual (input 3) of the fp32 GEMM path: a tile reads its pixels' residual rows
        into its accumulators before it stores the same rows of the output, and no other tile
        reads them, so the output may take the residual's memory where it dies here (a write
        stream fewer: no line of the output fetched for ownership)."""
        g = None if amx_conv(node) or node.input(3) is None else _geometry(node)
        return None if g is None or g.depthwise else 3

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        if amx_conv(node):
            return AMX_CONV.build(step, target)
        if is_dynamic(node):
            return _build_dynamic(step, target, self.scratch_nbytes(node))
        g = claimed(ConvGeometry.from_node(node, "NHWC"), node)
        e, args, step_params = conv_operands(step, "w", self.scratch_nbytes(node))  # type: ignore[arg-type]
        head = (step_params, e, target.vector_bytes // 4)
        ctx = _depthwise_context(g, *head) if g.depthwise else _gemm_context(g, *head, tile_rows(target))
        return StepCode("c/conv_nhwc.c.j2", ctx, tuple(args))


def _geometry(node: Node) -> ConvGeometry | None:
    if is_dynamic(node):
        return ConvGeometry.from_symbolic_node(node, "NHWC")
    return ConvGeometry.from_node(node, "NHWC")


def inside_decls(name: str, size: object, out: object, kernel: int, stride: int, dilation: int,
                  begin: int) -> Decls:
    """C locals ``<name>LO`` / ``<name>HI``: the outputs whose windows lie inside the input
    (``runtime.kernels.window.inside`` at run time)."""
    lo, last = -(-begin // stride), f"({size} + {begin - (dilation * (kernel - 1) + 1)})"
    hi = f"({last} >= 0 ? ({last} / {stride} + 1 < {out} ? {last} / {stride} + 1 : {out}) : 0)"
    return ((f"{name}LO", f"({lo} < {out} ? {lo} : {out})"),
            (f"{name}HI", f"({hi} > {name}LO ? {hi} : {name}LO)"))  # fmt: skip


def _build_dynamic(step: GenStep, target: TargetInfo, scratch: int | Expr) -> StepCode:
    node = step.node
    g0 = claimed(ConvGeometry.from_symbolic_node(node, "NHWC"), node)
    e, args, step_params = dynamic_conv_operands(step, "w", scratch)
    g, decls = dynamic_geometry(g0, step.symbols)
    vw = target.vector_bytes // 4
    if g.depthwise:
        decls += inside_decls("OW", g.w, g.ow, g.kw, g.sw, g.dw, g.pl)  # output columns [OWLO, OWHI)
        dctx = _depthwise_context(g, step_params, e, vw, (DW_PIXELS, CDim("OWLO"), CDim("OWHI")))  # type: ignore[arg-type]
        dctx = replace(dctx, dyn=True, decls=decls, when=f" if({_work(g)} >= {PARALLEL_MIN_WORK})")
        return StepCode("c/conv_nhwc.c.j2", dctx, tuple(args))
    mode = tap_mode(g0)
    if mode == "copy":  # the zero-padded copy's rows and columns
        decls += (("XH", f"({g.pt} + {g.h} > {g.rows.reach} ? {g.pt} + {g.h} : {g.rows.reach})"),
                  ("XW", f"({g.pl} + {g.w} > {g.cols.reach} ? {g.pl} + {g.w} : {g.cols.reach})"))  # fmt: skip
    ctx = _dynamic_gemm_context(g, step_params, e, vw, tile_rows(target), mode, decls)
    return StepCode("c/conv_nhwc.c.j2", ctx, tuple(args))


def _work(g: ConvGeometry) -> int:
    return 2 * g.batch * g.oh * g.ow * g.m * g.kh * g.kw * g.cg


def _depthwise_context(g: ConvGeometry, step_params: tuple[Param, ...], e: Epilogue, vw: int,
                       inside: tuple[int, int, int] | None = None) -> DepthwiseNhwcContext:  # fmt: skip
    """The depthwise path; ``inside`` (pixels per step, the inside columns as C locals) for run-time sizes."""
    if inside is None:
        ow_lo, ow_hi = g.cols.inside()
        px = max(1, min(DW_PIXELS, ow_hi - ow_lo))
    else:
        px, ow_lo, ow_hi = inside
    return DepthwiseNhwcContext(
        method="depthwise",
        params=step_params,
        e=e,
        vw=vw,
        cbv=DW_VECTORS,
        px=px,
        columns=_columns(px, g.kw, g.sw, g.dw),
        ow_lo=ow_lo,
        ow_hi=ow_hi,
        g=g,
        parallel=inside is not None or _work(g) >= PARALLEL_MIN_WORK,
    )


def _segments(g: ConvGeometry, mode: str) -> tuple[bool, int, int]:
    """(row segments, segments, values per segment) of K."""
    row_segments = g.kw > 1 and g.groups == 1 and g.dw == 1 and mode != "check"
    return (row_segments, g.kh, g.kw * g.cg) if row_segments else (row_segments, g.kh * g.kw, g.cg)


def _chunks(g: ConvGeometry, pairs: bool) -> tuple[int, int, int]:
    """(panels per group, panels per chunk, chunks per group); with ``pairs`` (tiles of two
    panels) an even number of panels per chunk, past CHUNK_BYTES where K is large."""
    np_ = -(-g.mg // PANEL)
    pc = max(1, min(np_, CHUNK_BYTES // (4 * PANEL * g.k))) if np_ >= CHUNK_MIN_PANELS else 1
    if pairs and np_ >= CHUNK_MIN_PANELS:
        pc = min(np_, pc + pc % 2)
    nch = -(-np_ // pc)
    return np_, -(-np_ // nch), nch


def _panels_context(g: ConvGeometry, step_params: tuple[Param, ...], e: Epilogue, vw: int, mode: str,
                    xh: int | CDim, xw: int | CDim) -> ConvNhwcContext:  # fmt: skip
    """The GEMM path as its panels, its taps (``mode``, the addressed image ``xh`` x ``xw``) and K's
    segments decide it, the same for static and run-time sizes; the pixel tiling and the item order
    left 0 / False for the caller."""
    row_segments, nseg, seglen = _segments(g, mode)
    pairs = PAIR_PANELS and PANEL // vw == 1
    np_, pc, nch = _chunks(g, pairs)
    return ConvNhwcContext(
        method="gemm", params=step_params, e=e, vw=vw, nv=PANEL // vw, nvt=-(-(g.mg % PANEL) // vw),
        g=g, mode=mode, xh=xh, xw=xw,  # type: ignore[arg-type]
        flat=g.kh == g.kw == g.sh == g.sw == 1 and mode == "direct", row_segments=row_segments,
        nseg=nseg, seglen=seglen, np=np_, npf=g.mg // PANEL, mt=g.mg % PANEL, pixels=0, ntiles=0,
        q=0, rem=0, tb=0, nb=0, pc=pc, nch=nch, panels_outer=False, parallel=False,
        pair=pairs and pc >= 2, span=(2 if pc == 4 else min(SPAN_PANELS, pc)) if pairs and pc >= 2 else 1,
        prefetch=PREFETCH_K if pairs and seglen >= PREFETCH_MIN_K else 0,
    )  # fmt: skip


def _gemm_context(g: ConvGeometry, step_params: tuple[Param, ...], e: Epilogue, vw: int,
                  mr: int) -> ConvNhwcContext:  # fmt: skip
    mode = tap_mode(g)
    xh, xw = _addressed(g, mode)
    ctx = _panels_context(g, step_params, e, vw, mode, xh, xw)
    pixels = g.batch * g.oh * g.ow
    ntiles, q, rem, tb, nb = _pixel_tiling(pixels, g.k, g.groups * ctx.nch, mr)
    weights_bytes = 4 * g.groups * ctx.np * PANEL * g.k
    return replace(ctx, pixels=pixels, ntiles=ntiles, q=q, rem=rem, tb=tb, nb=nb,
                   panels_outer=weights_bytes > 4 * g.batch * g.h * g.w * g.c,
                   parallel=_work(g) >= PARALLEL_MIN_WORK)


def _dynamic_gemm_context(g: ConvGeometry, step_params: tuple[Param, ...], e: Epilogue, vw: int, mr: int,
                          mode: str, decls: Decls) -> ConvNhwcContext:  # fmt: skip
    """The GEMM path with run-time sizes: the pixel tiling and the item order are decided in C."""
    xh, xw = (CDim("XH"), CDim("XW")) if mode == "copy" else (g.h, g.w)
    ctx = _panels_context(g, step_params, e, vw, mode, xh, xw)
    tb_max = max(2, BLOCK_BYTES // (4 * g.k * mr))
    return replace(ctx, parallel=True, dyn=True, decls=decls, mr=mr, tb_max=tb_max,
                   weights_bytes=4 * g.groups * ctx.np * PANEL * g.k, min_items=MIN_ITEMS,
                   when=f" if({_work(g)} >= {PARALLEL_MIN_WORK})")


KERNELS = (ConvNhwcKernel(),)
