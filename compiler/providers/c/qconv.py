"""C kernels for ``onnx_aot.PackedQConv`` (QLinearConv / ConvInteger on weights packed ahead of
time by ``compiler/passes/pack_qconv_weights.py``; the op is stated in runtime/kernels/qconv.py).

The layout stays NCHW: the graph's tensors around an integer conv (pools, QLinearAdd, Concat of
QOperator files) are NCHW, and a conv pays its own repacking once per image instead of Transposes
around every node. Two methods, as the lowering chose:

- "gemm" (``templates/c/qconv.c.j2``): im2col into VNNI panels in scratch -- 4 k values per pixel
  contiguous, ``np`` pixels a panel -- then a register tile of ``MR`` output channels x ``nv``
  vectors of 16 pixels (AVX512-VNNI ``vpdpbusd``, or a portable loop), the zero-point corrections
  and the requantizing store in its epilogue; 1x1 convs are the same GEMM with a copy-free K;
- "depthwise" (``templates/c/qconv_depthwise.c.j2``): a direct loop per output plane in int16 x
  int16 -> int32, vectorized along the output row.

Every loop splits its work on the run-time pool by output blocks (planes; panels x channel blocks),
so the results are the same at any thread count. Static shapes only (a dynamic graph's integer conv
runs on the reference kernels).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from compiler.codegen.toolchain import TargetInfo
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.providers.base import GenStep
from compiler.providers.c.common import Arg
from compiler.providers.c.common import CKernel
from compiler.providers.c.common import StepCode
from compiler.providers.c.common import arg
from compiler.providers.c.common import params
from compiler.providers.c.conv import pool_condition
from compiler.providers.c.qgemm import add_literals
from compiler.providers.c.qgemm import amx_target
from compiler.providers.geometry import ConvGeometry
from compiler.providers.geometry import _conv
from compiler.providers.geometry import claimed
from compiler.providers.kit import KernelContext
from compiler.providers.kit import Param
from runtime.contract import PACKED_QCONV
from runtime.kernels.qoperator import binary_codes
from runtime.kernels.qoperator import binary_ratios

__all__ = ["QConvContext", "QDepthwiseContext", "QConvKernel", "QAdd", "Requant", "MR", "fixed_add",
           "qconv_add"]

MR = 6  # output channels per register tile (x 4 vectors of 16 pixels: 24 accumulators)
MIN_ITEMS = 8  # work items a conv aims for, so that threads get balanced shares
PREPACK_ITEMS = 4  # "prepack"'s items, at least: each packs a range of k of a panel
AMX_MIN_ITEMS = 4  # the AMX loop's: its items cost mostly their packing, done once per item
_CTYPES = {np.dtype(np.uint8): "uint8_t", np.dtype(np.int8): "int8_t", np.dtype(np.int32): "int32_t"}


@dataclass(frozen=True)
class QAdd:
    """QBinary's Add in the store (qconv_common.c.j2: ``add16``, ``store_scalar``): each code q becomes
    saturate(rint(ry (q - az) + ra (addend - za) + zc)) in float64, in [lo, hi]."""

    ry: str  # C double literals: the float32 ratios A_scale / Out_scale, Addend_scale / Out_scale
    ra: str
    az: int  # the zero points: the codes' (as the Add reads them), the addend's, the output's
    za: int
    zc: int
    lo: int  # the output type's range
    hi: int
    fixed: tuple[int, int, int, int, int, int] | None = None  # the integer form's constants: ``fixed_add``


@dataclass(frozen=True)
class Requant:
    """The output's arithmetic (qconv_common.c.j2): y = clip(rint(acc * scale[m]) + yz, qmin, qmax)
    when ``scaled`` (QLinearConv), else acc itself (ConvInteger)."""

    scaled: bool
    yz: int
    qmin: int
    qmax: int
    out_ctype: str
    lut: bool = False  # the code then mapped through the channel's row of Lut (M x 256, + 4 bytes)
    small: bool = False  # every |scale| < SMALL_SCALE (the vector store's int32 rounding then holds)
    add: QAdd | None = None  # the codes then through QBinary's Add with `addend` (the output's shape)


SMALL_SCALE = 0.999  # |acc * scale| < 2^31 - 2^21 for any int32 acc: rint(product) + y_zero fits int32


def small_scales(scale: Value | None) -> bool:
    """The requantizing scales are constants, finite, all of magnitude under SMALL_SCALE."""
    if scale is None or scale.const is None:
        return False
    s = np.asarray(scale.const, dtype=np.float64)
    return bool(np.all(np.isfinite(s)) and np.all(np.abs(s) < SMALL_SCALE))


@dataclass(frozen=True)
class QConvContext(KernelContext):
    g: ConvGeometry
    k: int  # products per output: cg * kh * kw
    k4: int  # k padded to a multiple of 4 (a weight row's bytes)
    kq: int  # k4 / 4
    kq16: int  # kq rounded up to 16: a panel's rows of 4 k (AMX reads whole tiles of 16; the rest unused)
    nv: int  # vectors of 16 pixels per panel
    np: int  # pixels per panel (16 * nv)
    npanels: int
    panel_bytes: int  # one panel in scratch: kq16 * 4 * np bytes, then np int32 sums with a weight zero point
    panels_at: int  # where the panels start in scratch (after the padded images)
    padded: bool  # the input is copied with its padding first ("pad")
    flat: bool  # 1x1, stride 1, unpadded: a panel's pixels are one run in each plane
    hs: int  # rows / columns of the image "pack" reads (the padded copy's, or X's)
    ws: int
    flip: int  # XOR making X unsigned (0x80 for int8)
    xz: int  # X's zero point, shifted like X
    q: Requant
    mr: int
    mblocks: int
    cb: int  # channel blocks per item
    nchunks: int  # items per panel: ceil(mblocks / cb)
    rem: int  # rows of the last channel block (0: mr)
    has_wz: bool
    pool_pad: str
    pool: str
    ksplit: int = 0  # panels split over several items: "prepack" packs each once first, in ksplit items of k
    dispatch: bool = False  # AVX-512BW without VNNI: the VNNI loop too, taken where the CPU has AVX512-VNNI
    amx: bool = False  # the AMX-INT8 loop too (x86-64 AVX-512), taken where onnx_aot_amx_usable says so
    amx_cc: int = 0  # its items' channels (a multiple of 32)
    amx_nchunks: int = 0  # its items per panel (<= nchunks: scratch has a slot for each)


@dataclass(frozen=True)
class QDepthwiseContext(KernelContext):
    g: ConvGeometry
    wq: int  # a band row's values per column phase: OW + the widest tap's offset in the phase
    phases: tuple[tuple[int, int, int], ...]  # (p, first j, end j) of the columns j*sw+p in the image
    taps: tuple[tuple[int, int], ...]  # per tap (kh, kw order): (phase index, offset in the band)
    bh: int  # output rows per band
    rb: int  # band rows: bh * sh + (kh - 1) * dh + 1
    acc_t: str  # "float" where every sum is exact in float, else "int32_t"
    x_ctype: str
    xz: int
    q: Requant
    pool: str


DW_BAND_BYTES = 32 * 1024  # a depthwise band's buffers (rows, sums, outputs): about an L1 data cache
FLOAT_EXACT = 1 << 24  # integers below this add and multiply exactly in float32


def _depthwise_context(g: ConvGeometry, step_params: tuple[Param, ...], x_ctype: str, xz: int,
                       quant: Requant, work: int) -> QDepthwiseContext:
    """The band layout of the "depthwise" loop (templates/c/qconv_depthwise.c.j2)."""
    offsets = [(kw * g.dw % g.sw, kw * g.dw // g.sw) for kw in range(g.kw)]
    used = sorted({p for p, _ in offsets})
    wq = g.ow + max(d for _, d in offsets)
    phases = []
    for p in used:
        jlo = max(0, -(-(g.pl - p) // g.sw))
        jhi = max(jlo, min(wq, -(-(g.w + g.pl - p) // g.sw)))
        phases.append((p, jlo, jhi))
    taps = tuple((used.index(p), kh * g.dh * wq + d) for kh in range(g.kh) for p, d in offsets)
    extra = (g.kh - 1) * g.dh + 1
    row = 4 * wq
    per_out = len(used) * g.sh * row + g.sh * row + 4 * g.ow
    bh = max(1, min(g.oh, (DW_BAND_BYTES - len(used) * extra * row) // per_out))
    exact = g.kh * g.kw * 255 * 255 < FLOAT_EXACT
    return QDepthwiseContext(step_params, g, wq, tuple(phases), taps, bh, bh * g.sh + extra,
                             "float" if exact else "int32_t", x_ctype, xz, quant, pool_condition(work))


def _geometry(node: Node) -> ConvGeometry | None:
    """The conv's geometry (the packed weights are checked against it by ``_weights_ok``)."""
    return _conv(node, "NCHW", (1, 2))


def _shape(value: Value | None) -> tuple[int, ...] | None:
    return None if value is None or value.shape is None else tuple(int(d) for d in value.shape)


def _weights_ok(node: Node, g: ConvGeometry) -> bool:
    method = node.attrs["method"]
    if method == "depthwise":
        return g.one_channel_groups and _shape(node.input(1)) == (g.m, g.kh * g.kw)
    k4 = -(-g.k // 4) * 4
    return method == "gemm" and _shape(node.input(1)) == (g.groups, g.mg, k4)


def _scratch(g: ConvGeometry, nv: int, has_wz: bool) -> tuple[int, int, int, int, int]:
    """(padded image bytes, panel bytes, panels per image and group, hs, ws)."""
    np_ = 16 * nv
    padded = max(g.pt, g.pb, g.pl, g.pr) > 0
    hs = max(g.pt + g.h, g.rows.reach) if padded else g.h
    ws = max(g.pl + g.w, g.cols.reach) if padded else g.w
    # the padded copy, and 64 bytes that the packing's 16-byte copies may read past its end
    image = -(-(g.batch * g.c * hs * ws) // 64) * 64 + 64 if padded else 0
    panel = _kq16(g) * 4 * np_ + (4 * np_ if has_wz else 0)
    return image, panel, -(-(g.oh * g.ow) // np_), hs, ws


def _kq16(g: ConvGeometry) -> int:
    return -(-g.k // 64) * 16


def _chunks(g: ConvGeometry, npanels: int) -> tuple[int, int]:
    """(channel blocks per item, items per panel): every block of a panel in one item, unless the
    panels are fewer than MIN_ITEMS -- then the blocks are split so that there are about as many
    items (each item packs its panel again)."""
    mblocks = -(-g.mg // MR)
    panels = g.batch * g.groups * npanels
    want = min(mblocks, -(-MIN_ITEMS // panels))
    cb = -(-mblocks // want)
    return cb, -(-mblocks // cb)


def _amx_chunks(g: ConvGeometry, npanels: int, nchunks: int) -> tuple[int, int]:
    """The AMX loop's (channels per item, items per panel): about AMX_MIN_ITEMS items, at most
    ``nchunks`` a panel, whole blocks of 32 channels."""
    panels = g.batch * g.groups * npanels
    want = max(1, min(nchunks, -(-g.mg // 32), -(-AMX_MIN_ITEMS // panels)))
    per_item = -(-g.mg // want)
    cc = -(-per_item // 32) * 32
    return cc, -(-g.mg // cc)


def _flat(g: ConvGeometry) -> bool:
    return g.kh == g.kw == 1 and g.sh == g.sw == 1 and max(g.pt, g.pb, g.pl, g.pr) == 0


def _vectors(g: ConvGeometry) -> int:
    """Vectors of 16 pixels per panel: 4, fewer for small images (less padding in the last panel)."""
    return max(1, min(4, -(-(g.oh * g.ow) // 16)))


class QConvKernel(CKernel):
    kinds: tuple[str, ...] = (PACKED_QCONV,)

    def supports(self, node: Node) -> bool:
        g = _geometry(node)
        x, y = node.input(0), node.outputs[0]
        if g is None or x is None or x.dtype not in _CTYPES or y.dtype not in _CTYPES:
            return False
        if x.dtype == np.int32 or len(node.inputs) > 13 or not _weights_ok(node, g):
            return False
        if node.input(6) is not None and (node.input(4) is None or not _addend_ok(node)):
            return False
        corr, wz, scale = node.input(2), node.input(3), node.input(4)
        if _shape(corr) != (g.m,) or (wz is not None and _shape(wz) != (g.m,)):
            return False
        if scale is None:
            return y.dtype == np.int32 and len(node.inputs) < 6
        lut = node.input(5)
        if lut is not None and (lut.dtype != y.dtype or _shape(lut) != (g.m * 256 + 4,)):
            return False
        return _shape(scale) == (g.m,) and scale.dtype == np.float32 and y.dtype != np.int32

    def scratch_nbytes(self, node: Node) -> int:
        g = claimed(_geometry(node), node)
        if node.attrs["method"] == "depthwise":
            return 0
        image, panel, npanels, _, _ = _scratch(g, _vectors(g), node.input(3) is not None)
        return image + g.batch * g.groups * npanels * _chunks(g, npanels)[1] * panel

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        g = claimed(_geometry(node), node)
        args, step_params = _operands(step)
        x, y = node.input(0), node.outputs[0]
        assert x is not None and x.dtype is not None and y.dtype is not None
        a = node.attrs
        quant = Requant(node.input(4) is not None, int(a["y_zero"]), int(a["qmin"]), int(a["qmax"]),
                        _CTYPES[y.dtype], node.input(5) is not None, small_scales(node.input(4)),
                        qconv_add(node))
        work = 2 * g.batch * g.m * g.oh * g.ow * g.k
        if a["method"] == "depthwise":
            ctx = _depthwise_context(g, step_params, _CTYPES[x.dtype], int(a["x_zero"]), quant, work)
            return StepCode("c/qconv_depthwise.c.j2", ctx, tuple(args))
        gemm = dataclasses.replace(_gemm_context(node, g, step_params, quant, work),
                                   dispatch=target.int8_dot == "avx512bw")
        if amx_target(target):
            cc, nchunks = _amx_chunks(g, gemm.npanels, gemm.nchunks)
            gemm = dataclasses.replace(gemm, amx=True, amx_cc=cc, amx_nchunks=nchunks)
        return StepCode("c/qconv.c.j2", gemm, tuple(args))


def _gemm_context(node: Node, g: ConvGeometry, step_params: tuple[Param, ...], quant: Requant,
                  work: int) -> QConvContext:
    x = node.input(0)
    assert x is not None
    nv, has_wz = _vectors(g), node.input(3) is not None
    image, panel, npanels, hs, ws = _scratch(g, nv, has_wz)
    k4 = -(-g.k // 4) * 4
    flip = 128 if x.dtype == np.int8 else 0
    mblocks = -(-g.mg // MR)
    cb, nchunks = _chunks(g, npanels)
    panels = g.batch * g.groups * npanels
    # rows of 4 k per "prepack" item: a few items a panel, one where the pixel sums over k follow
    ksplit = 0 if nchunks == 1 else 1 if has_wz else min(k4 // 4, -(-PREPACK_ITEMS // panels))
    return QConvContext(
        params=step_params, g=g, k=g.k, k4=k4, kq=k4 // 4, kq16=_kq16(g), nv=nv, np=16 * nv, npanels=npanels,
        panel_bytes=panel, panels_at=image, padded=image > 0, flat=_flat(g), hs=hs, ws=ws, flip=flip,
        xz=int(node.attrs["x_zero"]) + flip, q=quant, mr=MR, mblocks=mblocks, cb=cb, nchunks=nchunks,
        rem=g.mg % MR, has_wz=has_wz, ksplit=ksplit,
        pool_pad=pool_condition(4 * image), pool=pool_condition(work),
    )


def _addend_ok(node: Node) -> bool:
    """Addend: codes of the output's type and shape; A_scale, Addend_scale, Out_scale constant
    float32 scalars, the zero points absent or constant scalars of the output's type."""
    y, addend = node.outputs[0], node.input(6)
    if addend is None or addend.dtype != y.dtype or addend.shape != y.shape or y.dtype not in _CTYPES:
        return False
    scales = [node.input(k) for k in (7, 9, 11)]
    zeros = [node.input(k) for k in (8, 10, 12)]
    return (all(v is not None and v.const is not None and v.const.size == 1 and v.dtype == np.float32
                for v in scales)
            and all(v is None or (v.const is not None and v.const.size == 1 and v.dtype == y.dtype)
                    for v in zeros))


def qconv_add(node: Node) -> QAdd | None:
    """The store's Add (``Requant.add``), None without an Addend."""
    if node.input(6) is None:
        return None
    ry, ra, za, zc = add_literals(*(node.input(k) for k in (7, 9, 10, 11, 12)))
    az_value = node.input(8)
    az = 0 if az_value is None else int(np.asarray(az_value.const).reshape(-1)[0])
    dtype = np.dtype(node.outputs[0].dtype)
    info = np.iinfo(dtype)
    params = [None if v is None else v.const for v in (node.input(k) for k in range(7, 13))]
    return QAdd(ry, ra, az, za, zc, int(info.min), int(info.max), fixed_add(params, dtype))


def fixed_add(params: list[np.ndarray | None], dtype: np.dtype) -> tuple[int, int, int, int, int, int] | None:
    """QBinary's Add of two 8-bit codes in int32 lanes (qconv_common.c.j2, add16): with ry = A / 2^E
    and ra = B / 2^E (the float32 ratios, A and B integers), N = A (q - az) + B (b - za) + zc 2^E +
    2^(E-1) is floor-divided by 2^E (ties, N a multiple of 2^E, back to even), A, B and N split at
    bit 15 so that vpmaddwd forms the products: the constants (B_hi:A_hi, B_lo:A_lo as pairs of
    int16, C_lo, C_hi, E - 15, 2^(E-15) - 1). Taken only where it gives ``binary_codes``' result for
    every one of the 65536 pairs of codes (checked here: the same bits), else None (float64)."""
    ratios = binary_ratios("Add", params[0], params[2], params[4])
    exp = max(15, *(24 - math.frexp(r)[1] for r in ratios if r != 0.0))
    big = [round(r * 2.0**exp) for r in ratios]
    zeros = [0 if z is None else int(np.asarray(z).reshape(-1)[0]) for z in params[1::2]]
    c = zeros[2] * 2**exp + 2 ** (exp - 1)
    if any(v != r * 2.0**exp or abs(v) >= 2**29 for v, r in zip(big, ratios, strict=True)) or abs(c) >= 2**44:
        return None
    codes = np.arange(256).astype(np.uint8).view(dtype)
    q, b = np.meshgrid(codes, codes, indexing="ij")
    n = big[0] * (q.astype(np.int64) - zeros[0]) + big[1] * (b.astype(np.int64) - zeros[1]) + c
    r = n >> exp
    r -= ((n & (2**exp - 1)) == 0) & (r & 1 == 1)
    info = np.iinfo(dtype)
    want = binary_codes("Add", q, b, list(params), dtype)
    if not np.array_equal(np.clip(r, info.min, info.max), want.astype(np.int64)):
        return None
    hi_pair = ((big[1] >> 15) << 16) | ((big[0] >> 15) & 0xFFFF)
    lo_pair = ((big[1] & 0x7FFF) << 16) | (big[0] & 0x7FFF)
    if (c >> 15) + 2**24 >= 2**31:
        return None
    return (_int32(hi_pair), _int32(lo_pair), c & 0x7FFF, c >> 15, exp - 15, 2 ** (exp - 15) - 1)


def _int32(bits: int) -> int:
    """The int32 of these 32 bits."""
    bits &= 0xFFFFFFFF
    return bits - 2**32 if bits >= 2**31 else bits


def _operands(step: GenStep) -> tuple[list[Arg], tuple[Param, ...]]:
    """x, wp, corr, wz?, scale?, lut?, addend?, y, scratch? as the step function's parameters (the
    Add's scales and zero points are literals in the code)."""
    node = step.node
    x, y = node.input(0), node.outputs[0]
    assert x is not None and x.dtype is not None and y.dtype is not None
    wtype = "int16_t" if node.attrs["method"] == "depthwise" else "int8_t"
    roles = [("x", _CTYPES[x.dtype]), ("wp", wtype), ("corr", "int32_t"), ("wz", "int32_t"),
             ("scale", "float"), ("lut", _CTYPES[y.dtype]), ("addend", _CTYPES[y.dtype])]
    names: list[str] = []
    args: list[Arg] = []
    for i, (name, ctype) in enumerate(roles):
        value = node.input(i)
        if value is None:
            continue
        args.append(arg(step.inputs[i], ctype, True, step, f"input {i} ({value.name})"))
        names.append(name)
    args.append(arg(step.outputs[0], _CTYPES[y.dtype], False, step, f"output 0 ({y.name})"))
    names.append("y")
    if step.scratch_nbytes:
        args.append(arg(step.scratch, "uint8_t", False, step, "scratch"))
        names.append("scratch")
    return args, params(names, args, [True] * len(args))


KERNELS = (QConvKernel(),)
