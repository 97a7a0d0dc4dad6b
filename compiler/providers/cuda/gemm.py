"""CUDA kernels on a matrix-product core: Conv / FusedConv, Gemm / FusedGemm, MatMul.

- Conv: implicit GEMM on the tiled shared-memory SGEMM (``templates/cuda/tiled.cu.j2``): the
  filters of a group are A, the input patches are gathered into B's shared-memory slice on the
  fly (no im2col buffer), one grid z-slice per group; bias, residual Z and activation are
  applied in the kernel's epilogue. Few output channels per group (depthwise) use a direct
  kernel, one thread per output element, with the same epilogue.
- Gemm / MatMul: the same tile at general strides (transposes are strides; MatMul batches
  broadcast through the shared index math), or, with at most ``GEMV_MAX_ROWS`` rows, a
  bandwidth-bound matrix-vector kernel. Epilogue ``act(alpha * acc + beta * C)``.

Geometry comes from ``compiler/providers/geometry.py`` (``ConvGeometry``, ``MatmulProduct``) and
the attribute checks from the C provider's kernels: the op semantics are shared; the kernels are
not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from compiler.codegen.elementwise import broadcast_strides
from compiler.codegen.elementwise import literal
from compiler.codegen.elementwise import loop_nest
from compiler.codegen.elementwise import unflatten
from compiler.ir.graph import Node
from compiler.providers.base import StepPlan
from compiler.providers.base import shape_of
from compiler.providers.c.conv import ConvKernel
from compiler.providers.c.gemm import GemmKernel
from compiler.providers.c.gemm import activation
from compiler.providers.cuda.common import MAX_GRID_YZ
from compiler.providers.cuda.common import THREADS
from compiler.providers.cuda.common import CudaKernel
from compiler.providers.cuda.common import KernelCode
from compiler.providers.cuda.common import blocks
from compiler.providers.cuda.common import input_ptrs
from compiler.providers.cuda.common import output_ptrs
from compiler.providers.cuda.common import used_indices
from compiler.providers.geometry import ConvGeometry
from compiler.providers.geometry import MatmulProduct
from compiler.providers.geometry import claimed
from compiler.providers.kit import Param
from runtime.plan_schema import LaunchArg

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
    g: ConvGeometry | None  # conv
    has_res: bool
    # gemm
    p: MatmulProduct | None  # strides sam, sak (A) and sbk, sbn (B)
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
    params: tuple[Param, ...]
    threads: int
    mode: str  # "warp" | "split"
    p: MatmulProduct
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
    params: tuple[Param, ...]
    threads: int
    total: int
    index: tuple[tuple[str, str], ...]  # bi, oc, oy, ox from flat
    g: ConvGeometry
    has_bias: bool
    has_res: bool
    act: str


class CudaConvKernel(CudaKernel):
    claims_like = ConvKernel

    def supports(self, node: Node) -> bool:
        if not super().supports(node):
            return False
        g = ConvGeometry.from_node(node, "NCHW")
        return g is not None and g.groups <= MAX_GRID_YZ

    def build(self, step: StepPlan) -> tuple[KernelCode, ...]:
        node = step.node
        g = claimed(ConvGeometry.from_node(node, "NCHW"), node)
        has_bias, has_res = node.input(2) is not None, node.input(3) is not None
        names = ["x", "w"] + (["bias"] if has_bias else []) + (["z"] if has_res else []) + ["y"]
        restrict = [True, True] + ([True] if has_bias else []) + ([False] if has_res else []) + [False]
        params = tuple(Param(n, "float", n != "y", r) for n, r in zip(names, restrict, strict=True))
        args = (*input_ptrs(step), *output_ptrs(step))
        p = g.oh * g.ow
        act = activation(node)
        if g.mg <= DIRECT_MAX_CHANNELS:
            total = g.batch * g.m * p
            dims = (g.batch, g.m, g.oh, g.ow)
            dctx = DirectConvContext(
                params=params, threads=THREADS, total=total,
                index=unflatten(dims, ("bi", "oc", "oy", "ox"), "flat"), g=g, has_bias=has_bias,
                has_res=has_res, act=act,
            )  # fmt: skip
            grid = (blocks(total, THREADS), 1, 1)
            return (KernelCode("cuda/conv_direct.cu.j2", dctx, grid, (THREADS, 1, 1), 0, args),)
        n = g.batch * p
        t = _tile(g.mg, n, g.groups)
        ctx = TiledContext(
            params=params, threads=THREADS, mode="conv",
            bm=t.bm, bn=t.bn, bk=t.bk, tm=t.tm, tn=t.tn, m=g.mg, n=n, k=g.k, a_kfast=True, b_nfast=True,
            g=g, has_res=has_res, p=None, batch_index=(), a_batch="0", b_batch="0",
            alpha="", beta="", bias_sm=0, bias_sn=0, has_bias=has_bias, act=act,
        )  # fmt: skip
        grid = (blocks(n, t.bn), blocks(g.mg, t.bm), g.groups)
        return (KernelCode("cuda/tiled.cu.j2", ctx, grid, (THREADS, 1, 1), 0, args),)


@dataclass(frozen=True)
class _Batched:
    """The product with MatMul's (broadcast) batches as index math over blockIdx.z."""

    p: MatmulProduct
    batches: int
    index: tuple[tuple[str, str], ...]
    a_batch: str
    b_batch: str


def _batched(node: Node) -> _Batched | None:
    p = MatmulProduct.from_node(node)
    if p is None:
        return None
    if node.op_type != "MatMul":
        return _Batched(p, 1, (), "0", "0")
    sa = [s * p.m * p.k for s in p.a_batch]
    sb = [s * p.k * p.n for s in p.b_batch]
    nest = loop_nest(p.batch, [sa, sb])
    index = used_indices(unflatten(nest.dims, nest.names, "bz"), nest.in_index)
    return _Batched(p, math.prod(p.batch), index, nest.in_index[0], nest.in_index[1])


class CudaGemmKernel(CudaKernel):
    claims_like = GemmKernel

    def supports(self, node: Node) -> bool:
        if not super().supports(node):
            return False
        prod = _batched(node)
        return prod is not None and prod.batches <= MAX_GRID_YZ

    def build(self, step: StepPlan) -> tuple[KernelCode, ...]:
        node = step.node
        prod = claimed(_batched(node), node)
        p, c = prod.p, node.input(2)
        alpha = float(node.attrs["alpha"]) if node.op_type != "MatMul" else 1.0
        beta = float(node.attrs["beta"]) if node.op_type != "MatMul" else 1.0
        sm, sn = broadcast_strides(shape_of(c), (p.m, p.n)) if c is not None else (0, 0)
        names = ["a", "b"] + (["biasp"] if c is not None else []) + ["y"]
        params = tuple(Param(n, "float", n != "y", n != "y") for n in names)
        args: tuple[LaunchArg, ...] = (*input_ptrs(step), *output_ptrs(step))
        common = dict(
            params=params, p=p, batch_index=prod.index,
            a_batch=prod.a_batch, b_batch=prod.b_batch,
            alpha="" if alpha == 1.0 else f" * {literal(alpha)}",
            beta="" if beta == 1.0 else f"{literal(beta)} * ",
            bias_sm=sm, bias_sn=sn, has_bias=c is not None, act=activation(node),
        )  # fmt: skip
        if p.m <= GEMV_MAX_ROWS:
            if p.sbk == 1 and p.n > 1:
                gctx = GemvContext(threads=THREADS, mode="warp", **common)  # type: ignore[arg-type]
                grid = (blocks(p.n, THREADS // 32), 1, prod.batches)
                block = (THREADS, 1, 1)
            else:
                gctx = GemvContext(threads=THREADS, mode="split", **common)  # type: ignore[arg-type]
                grid = (blocks(p.n, 32), 1, prod.batches)
                block = (32, 8, 1)
            return (KernelCode("cuda/gemv.cu.j2", gctx, grid, block, 0, args),)
        t = _tile(p.m, p.n, prod.batches)
        ctx = TiledContext(
            threads=THREADS, mode="gemm", bm=t.bm, bn=t.bn, bk=t.bk, tm=t.tm, tn=t.tn, m=p.m, n=p.n, k=p.k,
            a_kfast=p.sak == 1, b_nfast=p.sbn == 1 or p.sbk != 1, g=None, has_res=False,
            **common,  # type: ignore[arg-type]
        )  # fmt: skip
        grid = (blocks(p.n, t.bn), blocks(p.m, t.bm), prod.batches)
        return (KernelCode("cuda/tiled.cu.j2", ctx, grid, (THREADS, 1, 1), 0, args),)


KERNELS = (CudaConvKernel(), CudaGemmKernel())
