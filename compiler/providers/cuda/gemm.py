"""CUDA kernels on a matrix-product core: Conv / FusedConv, Gemm / FusedGemm, MatMul.

- Conv: implicit GEMM on the tiled shared-memory SGEMM (``templates/cuda/tiled.cu.j2``): the
  filters of a group are A, the input patches are gathered into B's shared-memory slice on the
  fly (no im2col buffer), one grid z-slice per group; bias, residual Z and activation are
  applied in the kernel's epilogue. Few output channels per group (depthwise) use a direct
  kernel, one thread per output element, with the same epilogue.
- Gemm / MatMul: the same tile at general strides (transposes are strides; MatMul batches
  broadcast through the shared index math), or, with at most ``GEMV_MAX_ROWS`` rows, a
  bandwidth-bound matrix-vector kernel. Epilogue ``act(alpha * acc + beta * C)``.

Geometry and attribute checks are the C provider's (``c.conv.conv_geometry``,
``c.gemm`` products): the op semantics are shared; the kernels are not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from compiler.codegen.elementwise import broadcast_strides, literal, loop_nest, unflatten
from compiler.ir.graph import Node
from compiler.providers.base import StepPlan
from compiler.providers.c.conv import ConvKernel, conv_geometry
from compiler.providers.c.gemm import GemmKernel, _gemm_product, _matmul_product, activation
from compiler.providers.cuda.common import (
    MAX_GRID_YZ,
    THREADS,
    KArg,
    KernelCode,
    Param,
    blocks,
    comment,
    float32_node,
    input_ptrs,
    output_ptrs,
    register,
    shape_of,
)
from compiler.providers.cuda.elementwise import used_indices

__all__ = ["TiledContext", "GemvContext", "DirectConvContext", "GEMV_MAX_ROWS"]

GEMV_MAX_ROWS = 4
SM_COUNT = 132  # H100 SXM; only steers the choice of tile size
DIRECT_MAX_CHANNELS = 8  # output channels per group up to which a conv is direct


@dataclass(frozen=True)
class _Tile:
    bm: int
    bn: int
    bk: int
    tm: int
    tn: int


_BIG = _Tile(64, 64, 16, 4, 4)
_SMALL = _Tile(32, 32, 16, 2, 2)


def _tile(m: int, n: int, z: int) -> _Tile:
    """The 64 x 64 tile unless it leaves most of the GPU idle (then 32 x 32)."""
    big = blocks(m, _BIG.bm) * blocks(n, _BIG.bn) * z
    return _BIG if big >= 2 * SM_COUNT else _SMALL


@dataclass(frozen=True)
class TiledContext:
    name: str
    comment: str
    params: tuple[Param, ...]
    threads: int
    mode: str  # "conv" | "gemm"
    bm: int
    bn: int
    bk: int
    tm: int
    tn: int
    m: int  # rows per group / batch
    n: int
    k: int
    a_kfast: bool  # A staged with k the fastest-varying (A contiguous along k)
    b_nfast: bool  # B staged with n the fastest-varying (B contiguous along n)
    # conv
    groups: int
    mtot: int
    mg: int
    cg: int
    c: int
    h: int
    w: int
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
    has_res: bool
    # gemm
    sam: int
    sak: int
    sbk: int
    sbn: int
    batch_index: tuple[tuple[str, str], ...]
    a_batch: str
    b_batch: str
    alpha: str  # "" or " * <literal>"
    beta: str  # "" or "<literal> * "
    bias_sm: int
    bias_sn: int
    # epilogue
    has_bias: bool
    act: str  # C expression over v


@dataclass(frozen=True)
class GemvContext:
    name: str
    comment: str
    params: tuple[Param, ...]
    threads: int
    mode: str  # "warp" | "split"
    m: int
    n: int
    k: int
    sam: int
    sak: int
    sbk: int
    sbn: int
    batch_index: tuple[tuple[str, str], ...]
    a_batch: str
    b_batch: str
    alpha: str
    beta: str
    bias_sm: int
    bias_sn: int
    has_bias: bool
    act: str


@dataclass(frozen=True)
class DirectConvContext:
    name: str
    comment: str
    params: tuple[Param, ...]
    threads: int
    total: int
    index: tuple[tuple[str, str], ...]  # bi, oc, oy, ox from flat
    c: int
    h: int
    w: int
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
    has_bias: bool
    has_res: bool
    act: str


_CONV_ZERO = dict(groups=1, mtot=0, mg=0, cg=0, c=0, h=0, w=0, oh=0, ow=0, kh=0, kw=0, sh=0, sw=0,
                  pt=0, pl=0, dh=0, dw=0, has_res=False)  # fmt: skip


class CudaConvKernel:
    kinds = ConvKernel.kinds

    def supports(self, node: Node) -> bool:
        if not float32_node(node) or not ConvKernel().supports(node):
            return False
        g = conv_geometry(node)
        return g is not None and g.groups <= MAX_GRID_YZ

    def scratch_nbytes(self, node: Node) -> int:
        return 0

    def build(self, step: StepPlan) -> tuple[KernelCode, ...]:
        node = step.node
        g = conv_geometry(node)
        assert g is not None, node.describe()
        has_bias, has_res = node.input(2) is not None, node.input(3) is not None
        names = ["x", "w"] + (["bias"] if has_bias else []) + (["z"] if has_res else []) + ["y"]
        restrict = [True, True] + ([True] if has_bias else []) + ([False] if has_res else []) + [False]
        params = tuple(Param(n, "float", n != "y", r) for n, r in zip(names, restrict, strict=True))
        args = (*input_ptrs(step), *output_ptrs(step))
        mg, cg, p = g.m // g.groups, g.c // g.groups, g.oh * g.ow
        act = activation(node)
        if mg <= DIRECT_MAX_CHANNELS:
            total = g.batch * g.m * p
            dims = (g.batch, g.m, g.oh, g.ow)
            dctx = DirectConvContext(
                name="", comment=comment(node), params=params, threads=THREADS, total=total,
                index=unflatten(dims, ("bi", "oc", "oy", "ox"), "flat"), c=g.c, h=g.h, w=g.w, cg=cg,
                mg=mg, kh=g.kh, kw=g.kw, sh=g.sh, sw=g.sw, pt=g.pt, pl=g.pl, dh=g.dh, dw=g.dw,
                has_bias=has_bias, has_res=has_res, act=act,
            )  # fmt: skip
            grid = (blocks(total, THREADS), 1, 1)
            return (KernelCode("cuda/conv_direct.cu.j2", dctx, grid, (THREADS, 1, 1), 0, args),)
        n = g.batch * p
        t = _tile(mg, n, g.groups)
        ctx = TiledContext(
            name="", comment=comment(node), params=params, threads=THREADS, mode="conv",
            bm=t.bm, bn=t.bn, bk=t.bk, tm=t.tm, tn=t.tn, m=mg, n=n, k=g.k, a_kfast=True, b_nfast=True,
            groups=g.groups, mtot=g.m, mg=mg, cg=cg, c=g.c, h=g.h, w=g.w, oh=g.oh, ow=g.ow, kh=g.kh,
            kw=g.kw, sh=g.sh, sw=g.sw, pt=g.pt, pl=g.pl, dh=g.dh, dw=g.dw, has_res=has_res,
            sam=0, sak=0, sbk=0, sbn=0, batch_index=(), a_batch="0", b_batch="0", alpha="", beta="",
            bias_sm=0, bias_sn=0, has_bias=has_bias, act=act,
        )  # fmt: skip
        grid = (blocks(n, t.bn), blocks(mg, t.bm), g.groups)
        return (KernelCode("cuda/tiled.cu.j2", ctx, grid, (THREADS, 1, 1), 0, args),)


@dataclass(frozen=True)
class _Batched:
    m: int
    n: int
    k: int
    sam: int
    sak: int
    sbk: int
    sbn: int
    batches: int
    index: tuple[tuple[str, str], ...]
    a_batch: str
    b_batch: str


def _batched(node: Node) -> _Batched | None:
    """The product as strides, with MatMul's (broadcast) batches as index math over blockIdx.z."""
    if node.op_type != "MatMul":
        prod = _gemm_product(node)
        if prod is None:
            return None
        a_shape, b_shape = shape_of(node.input(0)), shape_of(node.input(1))
        ta, tb = int(node.attrs["transA"]), int(node.attrs["transB"])
        m, k = (a_shape[1], a_shape[0]) if ta else a_shape
        n = b_shape[0] if tb else b_shape[1]
        sam, sak = (1, m) if ta else (k, 1)
        sbk, sbn = (1, k) if tb else (n, 1)
        return _Batched(m, n, k, sam, sak, sbk, sbn, 1, (), "0", "0")
    if _matmul_product(node) is None:
        return None
    a_shape, b_shape = shape_of(node.input(0)), shape_of(node.input(1))
    a2 = (1, *a_shape) if len(a_shape) == 1 else a_shape
    b2 = (*b_shape, 1) if len(b_shape) == 1 else b_shape
    m, k = a2[-2:]
    n = b2[-1]
    batch = tuple(int(d) for d in np.broadcast_shapes(a2[:-2], b2[:-2]))
    sa = [s * m * k for s in broadcast_strides(a2[:-2], batch)]
    sb = [s * k * n for s in broadcast_strides(b2[:-2], batch)]
    nest = loop_nest(batch, [sa, sb])
    index = used_indices(unflatten(nest.dims, nest.names, "bz"), nest.in_index)
    return _Batched(m, n, k, k, 1, n, 1, math.prod(batch), index, nest.in_index[0], nest.in_index[1])


class CudaGemmKernel:
    kinds = GemmKernel.kinds

    def supports(self, node: Node) -> bool:
        if not float32_node(node) or not GemmKernel().supports(node):
            return False
        prod = _batched(node)
        return prod is not None and prod.batches <= MAX_GRID_YZ

    def scratch_nbytes(self, node: Node) -> int:
        return 0

    def build(self, step: StepPlan) -> tuple[KernelCode, ...]:
        node = step.node
        prod = _batched(node)
        assert prod is not None, node.describe()
        c = node.input(2)
        alpha = float(node.attrs["alpha"]) if node.op_type != "MatMul" else 1.0
        beta = float(node.attrs["beta"]) if node.op_type != "MatMul" else 1.0
        sm, sn = broadcast_strides(shape_of(c), (prod.m, prod.n)) if c is not None else (0, 0)
        names = ["a", "b"] + (["biasp"] if c is not None else []) + ["y"]
        params = tuple(Param(n, "float", n != "y", n != "y") for n in names)
        args: tuple[KArg, ...] = (*input_ptrs(step), *output_ptrs(step))
        common = dict(
            name="", comment=comment(node), params=params, m=prod.m, n=prod.n, k=prod.k,
            sam=prod.sam, sak=prod.sak, sbk=prod.sbk, sbn=prod.sbn, batch_index=prod.index,
            a_batch=prod.a_batch, b_batch=prod.b_batch,
            alpha="" if alpha == 1.0 else f" * {literal(alpha)}",
            beta="" if beta == 1.0 else f"{literal(beta)} * ",
            bias_sm=sm, bias_sn=sn, has_bias=c is not None, act=activation(node),
        )  # fmt: skip
        if prod.m <= GEMV_MAX_ROWS:
            if prod.sbk == 1 and prod.n > 1:
                gctx = GemvContext(threads=THREADS, mode="warp", **common)  # type: ignore[arg-type]
                grid = (blocks(prod.n, THREADS // 32), 1, prod.batches)
                block = (THREADS, 1, 1)
            else:
                gctx = GemvContext(threads=THREADS, mode="split", **common)  # type: ignore[arg-type]
                grid = (blocks(prod.n, 32), 1, prod.batches)
                block = (32, 8, 1)
            return (KernelCode("cuda/gemv.cu.j2", gctx, grid, block, 0, args),)
        t = _tile(prod.m, prod.n, prod.batches)
        ctx = TiledContext(
            threads=THREADS, mode="gemm", bm=t.bm, bn=t.bn, bk=t.bk, tm=t.tm, tn=t.tn,
            a_kfast=prod.sak == 1, b_nfast=prod.sbn == 1 or prod.sbk != 1,
            **_CONV_ZERO, **common,  # type: ignore[arg-type]
        )  # fmt: skip
        grid = (blocks(prod.n, t.bn), blocks(prod.m, t.bm), prod.batches)
        return (KernelCode("cuda/tiled.cu.j2", ctx, grid, (THREADS, 1, 1), 0, args),)


for _kernel in (CudaConvKernel(), CudaGemmKernel()):
    register(_kernel)
