"""C kernel for ``onnx_aot.ConvNhwc``: a channels-last convolution on weights packed ahead of time.

The conv is a GEMM per group: rows are output pixels (all images, flattened), columns the
group's output channels, K = (kh, kw, c). ``templates/c/conv_nhwc.c.j2`` keeps a register tile
of ``mr`` pixels x one panel of 16 output channels (``runtime/kernels/nhwc.py: PANEL``; 2 AVX2
vectors, 1 AVX-512 vector, 4 SSE ones), loads the weights straight from their packed panel
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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from compiler.codegen.toolchain import TargetInfo
from compiler.ir.graph import Node
from compiler.providers.base import StepPlan
from compiler.providers.c.common import (
    PARALLEL_MIN_WORK,
    Param,
    StepCode,
    comment,
    fn_name,
    register,
    shape_of,
)
from compiler.providers.c.conv import conv_operands, epilogue_operands_ok
from compiler.providers.c.gemm import Epilogue
from runtime.kernels.nhwc import PANEL

__all__ = ["ConvNhwcContext", "DepthwiseNhwcContext", "ConvNhwcKernel", "nhwc_geometry"]

BLOCK_BYTES = 256 * 1024  # input rows of one pixel block (L2)
MIN_ITEMS = 32  # work items to aim for, so threads get balanced shares
CHUNK_BYTES = 128 * 1024  # weights of the panels a pixel tile runs over before the next tile (L2)
CHUNK_MIN_PANELS = 4  # groups with fewer panels run a panel over the block's tiles (no chunks)
COPY_MAX_CHANNELS = 16  # padded convs with fewer channels per tap copy the input into scratch
MAX_ROWS = 8  # pixel rows per tile: each holds a row pointer (general-purpose registers)
DW_VECTORS = 2  # channel vectors per step of the depthwise path
DW_PIXELS = 6  # pixels per step of its interior (at most)


@dataclass(frozen=True)
class NhwcGeometry:
    """A ConvNhwc as sizes: input (N, H, W, C), output (N, OH, OW, M)."""

    batch: int
    h: int
    w: int
    c: int
    m: int
    oh: int
    ow: int
    groups: int
    kh: int
    kw: int
    sh: int
    sw: int
    pt: int
    pl: int
    dh: int
    dw: int
    depthwise: bool

    @property
    def cg(self) -> int:
        return self.c // self.groups

    @property
    def mg(self) -> int:
        return self.m // self.groups

    @property
    def k(self) -> int:
        return self.kh * self.kw * self.cg

    @property
    def padded(self) -> bool:
        """Whether some tap of some output pixel falls outside the input."""
        last_h = (self.oh - 1) * self.sh + (self.kh - 1) * self.dh - self.pt
        last_w = (self.ow - 1) * self.sw + (self.kw - 1) * self.dw - self.pl
        return self.pt > 0 or self.pl > 0 or last_h >= self.h or last_w >= self.w

    @property
    def mode(self) -> str:
        """How taps in the padding are read: "direct" (none are), "check" or "copy"."""
        if not self.padded:
            return "direct"
        return "check" if self.cg >= COPY_MAX_CHANNELS else "copy"

    @property
    def xh(self) -> int:
        """Rows of the image the kernel addresses (the zero-padded copy's in "copy" mode)."""
        if self.mode != "copy":
            return self.h
        return max(self.pt + self.h, (self.oh - 1) * self.sh + (self.kh - 1) * self.dh + 1)

    @property
    def xw(self) -> int:
        if self.mode != "copy":
            return self.w
        return max(self.pl + self.w, (self.ow - 1) * self.sw + (self.kw - 1) * self.dw + 1)

    @property
    def row_segments(self) -> bool:
        """K segments are whole kernel rows (KW * C contiguous values) rather than single taps."""
        return self.kw > 1 and self.groups == 1 and self.dw == 1 and self.mode != "check"


def nhwc_geometry(node: Node) -> NhwcGeometry | None:
    """The node's conv as sizes, or None when its shapes, weights or attributes do not fit."""
    x, wv = node.input(0), node.input(1)
    if x is None or wv is None or len(node.outputs) != 1:
        return None
    xs, ws, ys = shape_of(x), shape_of(wv), shape_of(node.outputs[0])
    a = node.attrs
    try:
        ks = [int(v) for v in a["kernel_shape"]]
        strides = [int(v) for v in a["strides"]]
        pads = [int(v) for v in a["pads"]]
        dil = [int(v) for v in a["dilations"]]
        group = int(a["group"])
    except (KeyError, TypeError, ValueError):
        return None
    if len(xs) != 4 or len(ys) != 4 or len(ks) != 2 or len(strides) != 2 or len(dil) != 2 or len(pads) != 4:
        return None
    if group < 1 or min(strides) < 1 or min(dil) < 1 or min(pads) < 0 or min(ks) < 1:
        return None
    n, h, w, c = xs
    m = ys[3]
    if ys[0] != n or c % group or m % group:
        return None
    for d, size in enumerate((h, w)):
        span = (ks[d] - 1) * dil[d] + 1
        if ys[1 + d] != (size + pads[d] + pads[2 + d] - span) // strides[d] + 1 or ys[1 + d] < 1:
            return None
    depthwise = len(ws) == 3
    if depthwise:
        if group != c or m != c or ws != (ks[0], ks[1], m) or group < 2:
            return None
    elif ws != (group, -(-(m // group) // PANEL), ks[0], ks[1], c // group, PANEL):
        return None
    return NhwcGeometry(n, h, w, c, m, ys[1], ys[2], group, ks[0], ks[1], strides[0], strides[1],
                        pads[0], pads[1], dil[0], dil[1], depthwise)  # fmt: skip


@dataclass(frozen=True)
class ConvNhwcContext:
    """The GEMM path. Pixel tiles: ``ntiles`` of them, the first ``rem`` with ``q + 1`` rows, the
    rest ``q``; ``tb`` tiles per pixel block, ``nb`` blocks. K: ``nseg`` segments of ``seglen``
    values."""

    method: str  # "gemm"
    fn: str
    comment: str
    params: tuple[Param, ...]
    e: Epilogue
    vw: int
    nv: int  # vectors per panel
    nvt: int  # vectors holding the partial panel's channels
    batch: int
    h: int
    w: int
    c: int
    m: int
    oh: int
    ow: int
    groups: int
    cg: int
    mg: int
    kh: int
    kw: int
    sh: int
    sw: int
    pt: int
    pl: int
    dh: int
    dw: int
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


@dataclass(frozen=True)
class DepthwiseNhwcContext:
    method: str  # "depthwise"
    fn: str
    comment: str
    params: tuple[Param, ...]
    e: Epilogue
    vw: int
    cbv: int  # channel vectors per step
    px: int  # pixels per step where every tap lies inside the input (one vector of channels)
    columns: tuple[tuple[int, tuple[tuple[int, int], ...]], ...]  # see dw_interior in the template
    ow_lo: int  # output columns ow_lo .. ow_hi - 1 have every tap inside the input row
    ow_hi: int
    batch: int
    h: int
    w: int
    c: int
    oh: int
    ow: int
    kh: int
    kw: int
    sh: int
    sw: int
    pt: int
    pl: int
    dh: int
    dw: int
    parallel: bool


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


class ConvNhwcKernel:
    kinds: tuple[str, ...] = ("onnx_aot.ConvNhwc",)

    def supports(self, node: Node) -> bool:
        g = nhwc_geometry(node)
        return g is not None and epilogue_operands_ok(node, g.m)

    def scratch_nbytes(self, node: Node) -> int:
        g = nhwc_geometry(node)
        assert g is not None, node.describe()
        return 4 * g.batch * g.xh * g.xw * g.c if not g.depthwise and g.mode == "copy" else 0

    def build(self, step: StepPlan, target: TargetInfo) -> StepCode:
        node = step.node
        g = nhwc_geometry(node)
        assert g is not None, node.describe()
        e, args, step_params = conv_operands(step, "w", self.scratch_nbytes(node))
        vw = target.vector_bytes // 4
        work = 2 * g.batch * g.oh * g.ow * g.m * g.kh * g.kw * g.cg
        if g.depthwise:
            ow_lo = -(-g.pl // g.sw)
            ow_hi = min(g.ow, (g.w - 1 - (g.kw - 1) * g.dw + g.pl) // g.sw + 1)
            px = max(1, min(DW_PIXELS, ow_hi - ow_lo))
            dctx = DepthwiseNhwcContext(
                method="depthwise",
                fn=fn_name(step),
                comment=comment(node),
                params=step_params,
                e=e,
                vw=vw,
                cbv=DW_VECTORS,
                px=px,
                columns=_columns(px, g.kw, g.sw, g.dw),
                ow_lo=ow_lo,
                ow_hi=max(ow_lo, ow_hi),
                batch=g.batch,
                h=g.h,
                w=g.w,
                c=g.c,
                oh=g.oh,
                ow=g.ow,
                kh=g.kh,
                kw=g.kw,
                sh=g.sh,
                sw=g.sw,
                pt=g.pt,
                pl=g.pl,
                dh=g.dh,
                dw=g.dw,
                parallel=work >= PARALLEL_MIN_WORK,
            )
            return StepCode("c/conv_nhwc.c.j2", dctx, dctx.fn, tuple(args))
        mr = tile_rows(target)
        if g.row_segments:
            nseg, seglen = g.kh, g.kw * g.cg
        else:
            nseg, seglen = g.kh * g.kw, g.cg
        np_ = -(-g.mg // PANEL)
        pixels = g.batch * g.oh * g.ow
        pc = max(1, min(np_, CHUNK_BYTES // (4 * PANEL * g.k))) if np_ >= CHUNK_MIN_PANELS else 1
        nch = -(-np_ // pc)
        pc = -(-np_ // nch)
        ntiles, q, rem, tb, nb = _pixel_tiling(pixels, g.k, g.groups * nch, mr)
        weights_bytes = 4 * g.groups * np_ * PANEL * g.k
        ctx = ConvNhwcContext(
            method="gemm",
            fn=fn_name(step),
            comment=comment(node),
            params=step_params,
            e=e,
            vw=vw,
            nv=PANEL // vw,
            nvt=-(-(g.mg % PANEL) // vw),
            batch=g.batch,
            h=g.h,
            w=g.w,
            c=g.c,
            m=g.m,
            oh=g.oh,
            ow=g.ow,
            groups=g.groups,
            cg=g.cg,
            mg=g.mg,
            kh=g.kh,
            kw=g.kw,
            sh=g.sh,
            sw=g.sw,
            pt=g.pt,
            pl=g.pl,
            dh=g.dh,
            dw=g.dw,
            mode=g.mode,
            xh=g.xh,
            xw=g.xw,
            flat=g.kh == g.kw == g.sh == g.sw == 1 and g.mode == "direct",
            row_segments=g.row_segments,
            nseg=nseg,
            seglen=seglen,
            np=np_,
            npf=g.mg // PANEL,
            mt=g.mg % PANEL,
            pixels=pixels,
            ntiles=ntiles,
            q=q,
            rem=rem,
            tb=tb,
            nb=nb,
            pc=pc,
            nch=nch,
            panels_outer=weights_bytes > 4 * g.batch * g.h * g.w * g.c,
            parallel=work >= PARALLEL_MIN_WORK,
        )
        return StepCode("c/conv_nhwc.c.j2", ctx, ctx.fn, tuple(args))


register(ConvNhwcKernel())
