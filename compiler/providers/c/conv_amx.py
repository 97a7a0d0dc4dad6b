"""C kernel for a ``--precision bf16`` ConvNhwc: weights in the AMX-BF16 pack (``compiler/passes/
pack_conv_bf16.py``), one group, static shapes.

The conv is a GEMM of P = N * OH * OW output pixels by M channels over K = KH * KW * C: each
pixel's window (its taps' channel rows, zeros in the padding) is gathered into scratch, rounded to
bfloat16 for the AMX path (``templates/c/gemm_amx.c.j2``, shared with PackedGemm) or in fp32 for
the fallback (the register tile of ``gemm_tile.c.j2`` on the pack widened to fp32 panels), then
bias (per channel), residual and activation as the output is stored (NHWC: the output is the
GEMM's P x M result as it is).

A tensor in the arena that such a conv writes and only such convs read, each as its X and without a
pre-scale, or a MaxPool between them (``bf16_link``, ``pool_bf16.py``), is stored as bfloat16
codes: the writer rounds its epilogue's result (nearest even, as the readers rounded it before),
the readers take the codes as they are (the fallback widens them), so the AMX path computes the
same bits with half the bytes moved.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from compiler.codegen.toolchain import TargetInfo
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.providers.base import GenStep
from compiler.providers.c.common import PARALLEL_MIN_WORK
from compiler.providers.c.common import Arg
from compiler.providers.c.common import CKernel
from compiler.providers.c.common import StepCode
from compiler.providers.c.common import params
from compiler.providers.c.common import scratch_arg
from compiler.providers.c.common import step_args
from compiler.providers.c.gemm import Epilogue
from compiler.providers.c.gemm import Tiling
from compiler.providers.c.gemm import activation
from compiler.providers.c.gemm import choose_tiling
from compiler.providers.c.gemm import fused_ok
from compiler.providers.c.gemm_bf16 import AmxBf16
from compiler.providers.c.gemm_bf16 import amx_bf16
from compiler.providers.c.gemm_bf16 import bf16_scratch_nbytes
from compiler.providers.geometry import ConvGeometry
from compiler.providers.geometry import PoolGeometry
from compiler.providers.geometry import _conv
from compiler.providers.geometry import claimed
from compiler.providers.kit import KernelContext
from runtime.contract import CONV_NHWC
from runtime.contract import MAX_POOL_NHWC
from runtime.kernels.amx_pack import amx_pack_shape
from runtime.kernels.linalg import B_PANEL

__all__ = ["ConvAmxContext", "AMX_CONV", "amx_conv", "bf16_link"]


TAPS_MIN_WIDTH = 7  # output rows at least this wide read their taps in place (16-pixel tiles; 3x3 512
# channels at 7x7: 244 us in place, 343 us gathered, 2 threads)


@dataclass(frozen=True)
class AmxTaps:
    """The AMX path that reads each tap's A tiles in place from a zero-padded bfloat16 copy of the
    input (``hp`` x ``wp`` pixels per image, then slack for the tiles' rows past the output: never
    stored): a block is 16 pixels of two neighbouring output rows, k steps of 32 channels of one
    tap. Taken where C is a multiple of 32 and the output rows are TAPS_MIN_WIDTH wide or more."""

    hp: int
    wp: int
    ohp: int  # output row pairs
    owb: int  # 16-pixel blocks per output row
    pblocks: int  # pixel blocks: images x row pairs x row blocks
    elems: int  # the copy's bfloat16 elements, slack included


def amx_taps(g: ConvGeometry) -> AmxTaps | None:
    n, c, ow = int(g.batch), int(g.c), int(g.ow)
    if c % 32 or ow < TAPS_MIN_WIDTH or (g.kh * g.kw == 1 and g.sh == g.sw == 1 and not g.rows.padded
                                         and not g.cols.padded):
        return None  # (a 1x1 stride-1 conv's rows are the image's: the gathered path reads them so)
    hp, wp = int(g.h + g.pt + g.pb), int(g.w + g.pl + g.pr)
    ohp, owb = -(-int(g.oh) // 2), -(-ow // 16)
    last_row = (n - 1) * hp + (2 * ohp - 1) * g.sh + (g.kh - 1) * g.dh
    last_col = (16 * owb - 1) * g.sw + (g.kw - 1) * g.dw
    elems = max(n * hp * wp, last_row * wp + last_col + 1) * c
    return AmxTaps(hp=hp, wp=wp, ohp=ohp, owb=owb, pblocks=n * ohp * owb, elems=int(elems))


FUSED_MAX_KP = 512  # the fused path's windows of one block (32 x kp bf16, 32 KiB) on the stack


def amx_fused(g: ConvGeometry, amx: AmxBf16) -> bool:
    """The AMX path that gathers each block's windows into a stack buffer
    (``templates/c/conv_amx_fused.c.j2``: from a bf16 copy of the input, or a 1x1's rows rounded
    from the input itself): windows not read in place, B small enough that every block runs over
    all of it."""
    return amx_taps(g) is None and amx.rows_outer and amx.kp <= FUSED_MAX_KP and g.dw == 1


@dataclass(frozen=True)
class DpbfImage:
    """The vdpbf16ps path's windows read in place (``templates/c/gemm_dpbf16.c.j2``, "dpbfc"): each
    output pixel's taps from a bfloat16 image of ``hp`` x ``wp`` pixels per image, zeros in the
    padding ("dpbfimg" rounds the input into scratch so), or from the input itself (``in_place``:
    bfloat16 codes already; a tap in the padding reads a row of zeros). Taken where C is even (a
    pair of k never straddles two taps) and the image costs no more than the gathered windows (not
    a 1x1 of an fp32 input that is strided, reading a fraction of its pixels, or gathered block by
    block, rounding its rows on the stack). ``toff``: each tap's offset in codes
    from its window's first, (kh, kw) in the pack's order."""

    hp: int
    wp: int
    in_place: bool
    toff: tuple[int, ...]


def dpbf_image(g: ConvGeometry, a_bf16: bool, fused: bool) -> DpbfImage | None:
    c = int(g.c)
    if c % 2 or (g.kh * g.kw == 1 and (fused or g.sh > 1 or g.sw > 1) and not a_bf16):
        return None  # (a fused 1x1 of fp32 X rounds each block's rows on the stack: no image)
    flat = not g.rows.padded and not g.cols.padded
    hp = int(g.h) if flat else max(int(g.pt + g.h), int(g.rows.reach))
    wp = int(g.w) if flat else max(int(g.pl + g.w), int(g.cols.reach))
    toff = tuple((kh * g.dh * wp + kw * g.dw) * c for kh in range(int(g.kh)) for kw in range(int(g.kw)))
    return DpbfImage(hp=hp, wp=wp, in_place=a_bf16, toff=tuple(int(t) for t in toff))


def _dpbf_image_nbytes(g: ConvGeometry) -> int:
    d = dpbf_image(g, False, False)
    return 2 * int(g.batch) * d.hp * d.wp * int(g.c) if d is not None else 0


@dataclass(frozen=True)
class ConvAmxContext(KernelContext):
    t: Tiling  # the fallback's tile over P x M x K (also the AMX path's sizes: t.m, t.n, t.k)
    e: Epilogue
    amx: AmxBf16
    conv: ConvGeometry
    parallel: bool
    taps: AmxTaps | None = None
    fused: bool = False
    pre_relu: int | None = None  # X * S + T (then Relu where 1) in the input pass (fuse_conv_prescale)
    a_bf16: bool = False  # X is bfloat16 codes (bf16_link)
    y_bf16: bool = False  # the output is stored as bfloat16 codes
    dimg: DpbfImage | None = None  # the vdpbf16ps path reads its windows in place


def _geometry(node: Node) -> ConvGeometry | None:
    """The conv, when ``node`` is a ConvNhwc of one group on an AMX pack with static float32
    operands otherwise."""
    w = node.input(1)
    if node.kind != CONV_NHWC or w is None or w.dtype != np.uint16 or w.shape is None or w.is_symbolic:
        return None
    if any(v is not None and (v.is_symbolic or v.dtype != np.float32 or v.shape is None)
           for v in (*node.inputs, *node.outputs) if v is not w):
        return None
    g = _conv(node, "NHWC", (2,))
    if g is None or g.groups != 1 or tuple(w.shape) != amx_pack_shape(int(g.k), int(g.m)):
        return None
    return g


def _prescale_ok(node: Node, g: ConvGeometry) -> bool:
    """No S / T (``fuse_conv_prescale``), or both, (C,), on a 1x1 conv without padding (its
    gathered rows are the input's pixels, the channels in order)."""
    s, t = node.input(4), node.input(5)
    if s is None and t is None:
        return True
    return (s is not None and t is not None and s.shape == t.shape == (g.c,) and g.kh == g.kw == 1
            and not g.rows.padded and not g.cols.padded and amx_taps(g) is None)


def _pixels(g: ConvGeometry) -> int:
    return int(g.batch * g.oh * g.ow)


def amx_conv(node: Node) -> bool:
    """``node`` is a ConvNhwc whose weights are an AMX pack (``ConvNhwcKernel`` hands it to AMX_CONV)."""
    w = node.input(1)
    return node.kind == CONV_NHWC and w is not None and w.dtype == np.uint16


BF16_LINKS = True  # (False: every tensor fp32, as before bf16_link; the tests compare the two)


def _amx_step(node: Node) -> bool:
    return amx_conv(node) and AMX_CONV.supports(node)


def _reads_bf16(node: Node, index: int) -> bool:
    """``node`` takes input ``index`` as bfloat16 codes where it is stored so: a bf16 ConvNhwc's X
    without a pre-scale (``fuse_conv_prescale``: the affine is applied to the fp32 value), or a
    static MaxPoolNhwc's input whose output only such steps read (``pool_bf16.py``)."""
    if index != 0:
        return False
    if _amx_step(node):
        return node.input(4) is None
    y = node.outputs[0]
    return (node.kind == MAX_POOL_NHWC and len(node.outputs) == 1 and y.dtype == np.float32
            and y.shape is not None and not y.is_symbolic and PoolGeometry.from_node(node, "NHWC") is not None
            and _read_bf16(y))


def _read_bf16(value: Value) -> bool:
    """Every reader of ``value`` takes it as bfloat16, in its graph, which does not return it."""
    graph = value.producer.graph if value.producer is not None else None
    return (graph is not None and bool(value.uses) and all(value is not v for v in graph.outputs)
            and all(u.node.graph is graph and _reads_bf16(u.node, u.index) for u in value.uses))


def bf16_link(value: Value) -> bool:
    """``value`` is stored as bfloat16 codes: the output of a bf16 ConvNhwc (or of a MaxPoolNhwc
    whose input is so stored) that only steps rounding it to bfloat16 anyway read (``_reads_bf16``)."""
    p = value.producer
    if not BF16_LINKS or p is None or p.outputs[0] is not value or not _read_bf16(value):
        return False
    x = p.input(0)
    return _amx_step(p) or (p.kind == MAX_POOL_NHWC and x is not None and bf16_link(x))


def _narrowed(node: Node, args: list[Arg], y: int) -> tuple[bool, bool]:
    """Whether X (``args[0]``) and the output (``args[y]``) are bfloat16 codes (``bf16_link``, in
    the arena), their args made uint16_t pointers where they are."""
    x = node.input(0)
    a_bf16 = x is not None and args[0].kind == "arena" and bf16_link(x)
    y_bf16 = args[y].kind == "arena" and bf16_link(node.outputs[0])
    for i, narrow in ((0, a_bf16), (y, y_bf16)):
        args[i] = dataclasses.replace(args[i], ctype="uint16_t") if narrow else args[i]
    return a_bf16, y_bf16


class ConvAmxKernel(CKernel):
    kinds: tuple[str, ...] = ()  # (not registered: ConvNhwcKernel's part for AMX packs)

    def supports(self, node: Node) -> bool:
        g = _geometry(node)
        if g is None or not fused_ok(node) or len(node.inputs) > 6 or len(node.outputs) != 1:
            return False
        b, z = node.input(2), node.input(3)
        return ((b is None or b.shape == (g.m,)) and (z is None or z.shape == node.outputs[0].shape)
                and _prescale_ok(node, g))

    def scratch_nbytes(self, node: Node) -> int:
        g = claimed(_geometry(node), node)
        taps = amx_taps(g)
        gathered = bf16_scratch_nbytes(_pixels(g), int(g.m), int(g.k), 4 * _pixels(g) * int(g.k))
        image = 2 * int(g.batch * g.h * g.w * g.c)  # the fused path's bf16 copy of the input
        wide = 4 * _pixels(g) * (int(g.k) + int(g.m)) if bf16_link(node.outputs[0]) else 0  # (fallback)
        return max(gathered, 2 * taps.elems if taps is not None else 0, image, wide, _dpbf_image_nbytes(g))

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        g = claimed(_geometry(node), node)
        has_bias, has_res, pre = (node.input(i) is not None for i in (2, 3, 4))
        e = Epilogue("", has_bias, "", 0, 1, has_res, activation(node), activation(node, vector=True))
        scratch = scratch_arg(step, self.scratch_nbytes(node))
        args = [*step_args(step), *scratch]
        args[1] = dataclasses.replace(args[1], ctype="uint16_t")
        a_bf16, y_bf16 = _narrowed(node, args, len(args) - 1 - len(scratch))
        names = (["a", "b"] + (["biasp"] if has_bias else []) + (["zp"] if has_res else [])
                 + (["pres", "pret"] if pre else []) + ["y", "scratch"])
        restrict = [True, True] + [True] * has_bias + [False] * has_res + [True, True] * pre + [False, True]
        p, m, k = _pixels(g), int(g.m), int(g.k)
        amx = amx_bf16(p, m, k)
        fused = amx_fused(g, amx)
        ctx = ConvAmxContext(params=params(names, args, restrict), t=choose_tiling(p, m, k, target, B_PANEL),
                             e=e, amx=amx, conv=g,
                             parallel=2 * p * m * k >= PARALLEL_MIN_WORK, taps=amx_taps(g),
                             fused=fused,
                             pre_relu=int(node.attrs.get("pre_relu", 0)) if pre else None,
                             a_bf16=a_bf16, y_bf16=y_bf16, dimg=dpbf_image(g, a_bf16, fused))
        return StepCode("c/conv_amx.c.j2", ctx, tuple(args))


AMX_CONV = ConvAmxKernel()
