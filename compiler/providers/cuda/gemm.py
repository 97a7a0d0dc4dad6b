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

import dataclasses
import math
from dataclasses import dataclass

from compiler.codegen.elementwise import broadcast_strides
from compiler.codegen.elementwise import literal
from compiler.codegen.elementwise import loop_nest
from compiler.codegen.elementwise import unflatten
from compiler.ir.graph import Node
from compiler.providers.base import GenStep
from compiler.providers.base import shape_of
from compiler.providers.c.conv import ConvKernel
from compiler.providers.c.gemm import GemmKernel
from compiler.providers.c.gemm import activation
from compiler.providers.c.gemm import fused_ok
from compiler.providers.cuda.common import MAX_GRID_YZ
from compiler.providers.cuda.common import THREADS
from compiler.providers.cuda.common import CudaKernel
from compiler.providers.cuda.common import KernelCode
from compiler.providers.cuda.common import RunDims
from compiler.providers.cuda.common import blocks
from compiler.providers.cuda.common import input_ptrs
from compiler.providers.cuda.common import is_dynamic
from compiler.providers.cuda.common import max_of
from compiler.providers.cuda.common import output_ptrs
from compiler.providers.cuda.common import used_indices
from compiler.providers.geometry import ConvGeometry
from compiler.providers.geometry import MatmulProduct
from compiler.providers.geometry import claimed
from compiler.providers.kit import KernelContext
from compiler.providers.kit import Param
from runtime.contract import AOT_DOMAIN
from runtime.contract import FUSED_GEMM
from runtime.plan_schema import LaunchArg

__all__ = ["GemmOperands", "TiledContext", "GemvContext", "DirectConvContext", "GEMV_MAX_ROWS"]

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
class GemmOperands:
    """How the tiled and gemv kernels address a Gemm / MatMul: the product's sizes and strides
    (written with the run-time dims), its batch index math over ``blockIdx.z`` and the offsets of
    A and B in it, alpha and beta as C text and the bias's strides."""

    p: MatmulProduct  # strides sam, sak (A) and sbk, sbn (B)
    batch_index: tuple[tuple[str, str], ...]
    a_batch: str
    b_batch: str
    alpha: str  # "" or " * <literal>"
    beta: str  # "" or "<literal> * "
    bias_sm: int
    bias_sn: int


@dataclass(frozen=True)
class TiledContext(KernelContext):
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
    gemm: GemmOperands | None  # gemm
    # epilogue
    has_bias: bool
    act: str  # C expression over v
    dims: tuple[str, ...] = ()  # run-time dim parameters (a dynamic graph's product)


@dataclass(frozen=True)
class GemvContext(KernelContext):
    threads: int
    mode: str  # "warp" | "split"
    gemm: GemmOperands
    has_bias: bool
    act: str


@dataclass(frozen=True)
class DirectConvContext(KernelContext):
    threads: int
    total: int
    index: tuple[tuple[str, str], ...]  # bi, oc, oy, ox from flat
    g: ConvGeometry
    has_bias: bool
    has_res: bool
    act: str
    dims: tuple[str, ...] = ()  # run-time dim parameters (a dynamic graph's node)


class CudaConvKernel(CudaKernel):
    claims_like = ConvKernel
    dynamic = True  # run-time batch and spatial sizes (channels, window and weights static)

    def supports(self, node: Node) -> bool:
        if is_dynamic(node):
            return self._supports_dynamic(node)
        if not super().supports(node):
            return False
        g = ConvGeometry.from_node(node, "NCHW")
        return g is not None and g.groups <= MAX_GRID_YZ

    def _supports_dynamic(self, node: Node) -> bool:
        """X, W, B?, Z? (Z, the residual, FusedConv's only) with an epilogue the kernels have; a
        static bias of M."""
        if not self.operands_fit(node) or not fused_ok(node, vector_math=False) or len(node.outputs) != 1:
            return False
        if len(node.inputs) > (4 if node.domain == AOT_DOMAIN else 3):
            return False
        g = ConvGeometry.from_symbolic_node(node)
        if g is None or g.groups > MAX_GRID_YZ:
            return False
        b, z = node.input(2), node.input(3)
        if b is not None and (b.is_symbolic or shape_of(b) != (g.m,)):
            return False
        return z is None or shape_of(z, symbolic=True) == shape_of(node.outputs[0], symbolic=True)

    def build(self, step: GenStep) -> tuple[KernelCode, ...]:
        node = step.node
        rd = RunDims()
        if is_dynamic(node):
            return self._build(step, claimed(ConvGeometry.from_symbolic_node(node), node), rd)
        return self._build(step, claimed(ConvGeometry.from_node(node, "NCHW"), node), rd)

    def _build(self, step: GenStep, g: ConvGeometry, rd: RunDims) -> tuple[KernelCode, ...]:
        """The direct kernel (few output channels per group) or the implicit GEMM on the tile; a
        dynamic node's sizes written by ``rd`` (its tile chosen for the largest binding)."""
        node = step.node
        has_bias, has_res = node.input(2) is not None, node.input(3) is not None
        names = ["x", "w"] + (["bias"] if has_bias else []) + (["z"] if has_res else []) + ["y"]
        restrict = [True, True] + ([True] if has_bias else []) + ([False] if has_res else []) + [False]
        params = tuple(Param(n, "float", n != "y", r) for n, r in zip(names, restrict, strict=True))
        p = g.oh * g.ow
        act = activation(node)
        w = rd.geometry(g)
        if g.mg <= DIRECT_MAX_CHANNELS:
            total = g.batch * g.m * p
            dims = (w.batch, w.m, w.oh, w.ow)
            dctx = DirectConvContext(
                params=params, threads=THREADS, total=rd(total),
                index=unflatten(dims, ("bi", "oc", "oy", "ox"), "flat"), g=w, has_bias=has_bias,
                has_res=has_res, act=act, dims=rd.names,
            )  # fmt: skip
            grid = (blocks(total, THREADS), 1, 1)
            args = (*input_ptrs(step), *output_ptrs(step), *rd.args)
            return (KernelCode("cuda/conv_direct.cu.j2", dctx, grid, (THREADS, 1, 1), 0, args),)
        n = g.batch * p
        t = _tile(g.mg, max_of(n, node), g.groups)
        ctx = TiledContext(
            params=params, threads=THREADS, mode="conv",
            bm=t.bm, bn=t.bn, bk=t.bk, tm=t.tm, tn=t.tn, m=g.mg, n=rd(n), k=g.k, a_kfast=True, b_nfast=True,
            g=w, has_res=has_res, gemm=None, has_bias=has_bias, act=act, dims=rd.names,
        )  # fmt: skip
        grid = (blocks(n, t.bn), blocks(g.mg, t.bm), g.groups)
        args = (*input_ptrs(step), *output_ptrs(step), *rd.args)
        return (KernelCode("cuda/tiled.cu.j2", ctx, grid, (THREADS, 1, 1), 0, args),)


@dataclass(frozen=True)
class _Batched:
    """The product with MatMul's (broadcast) batches as index math over blockIdx.z."""

    p: MatmulProduct
    batches: int
    index: tuple[tuple[str, str], ...]
    a_batch: str
    b_batch: str


def _run_time_batched(node: Node) -> _Batched | None:
    """A dynamic graph's product: Gemm (transposes as strides), MatMul of A (rows..., k) by a 2-D B
    (the rows one run-time M), or MatMul's batches, broadcast where one side's batch dim is 1 (two
    different expressions on one axis are refused); m, n, k and the batches may be run-time."""
    a, b, y = (shape_of(v, symbolic=True) if v is not None else None
               for v in (node.input(0), node.input(1), node.outputs[0]))
    if a is None or b is None or y is None or len(a) < 2 or len(b) < 2:
        return None
    if node.op_type != "MatMul":
        p = MatmulProduct.from_node(node, symbolic=True)
        return None if p is None else _Batched(p, 1, (), "0", "0")
    (m, k), (kb, n) = a[-2:], b[-2:]
    if k != kb:
        return None
    if all(d == 1 for d in b[:-2]) and len(a) >= len(b):  # B one matrix: A's leading dims are rows
        rows = math.prod(a[:-1])
        if y != (*a[:-1], n):
            return None
        return _Batched(MatmulProduct(rows, n, k, k, 1, n, 1, (), (), ()), 1, (), "0", "0")
    rank = max(len(a), len(b)) - 2
    ab, bb = (1,) * (rank + 2 - len(a)) + a[:-2], (1,) * (rank + 2 - len(b)) + b[:-2]
    if any(x != z and 1 not in (x, z) for x, z in zip(ab, bb, strict=True)):
        return None
    batch = tuple(x if x != 1 else z for x, z in zip(ab, bb, strict=True))
    if y != (*batch, m, n):
        return None
    p = MatmulProduct(m, n, k, k, 1, n, 1, batch, broadcast_strides(ab, batch), broadcast_strides(bb, batch))
    return _Batched(p, math.prod(batch), (), "", "")


def _batch_index(prod: _Batched, write: RunDims) -> _Batched:
    """``prod`` with its batch index math (over ``bz``) written with the run-time dims ``write``."""
    p = prod.p
    if not p.batch:
        return prod
    sa = [s * p.m * p.k for s in p.a_batch]
    sb = [s * p.k * p.n for s in p.b_batch]
    nest = loop_nest(p.batch, [sa, sb], text=write)
    index = used_indices(unflatten(nest.dims, nest.names, "bz"), nest.in_index)
    return _Batched(p, prod.batches, index, nest.in_index[0], nest.in_index[1])


def _batched(node: Node) -> _Batched | None:
    if is_dynamic(node):
        return _run_time_batched(node)
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
    dynamic = True  # run-time m, n, k and batches (the tiled kernel, sizes as parameters)

    def supports(self, node: Node) -> bool:
        if not self.operands_fit(node):
            return False
        if is_dynamic(node):
            return self._supports_dynamic(node)
        if not super().supports(node):
            return False
        prod = _batched(node)
        return prod is not None and prod.batches <= MAX_GRID_YZ

    @staticmethod
    def _supports_dynamic(node: Node) -> bool:
        """Gemm / FusedGemm / MatMul (not PackedGemm) with an epilogue the kernel has and a static
        bias broadcast over the output."""
        if node.kind not in ("Gemm", FUSED_GEMM, "MatMul") or len(node.outputs) != 1:
            return False
        n_in = 2 if node.op_type == "MatMul" else 3
        if node.input(0) is None or node.input(1) is None or len(node.inputs) > n_in:
            return False
        if not fused_ok(node, vector_math=False):
            return False
        prod = _run_time_batched(node)
        if prod is None or max_of(prod.batches, node) > MAX_GRID_YZ:
            return False
        c = node.input(2)
        literals = all(isinstance(node.attrs.get(k), int | float) for k in ("alpha", "beta"))
        if node.op_type != "MatMul" and not literals:
            return False
        if c is None:
            return True
        try:
            broadcast_strides(shape_of(c, symbolic=True), (prod.p.m, prod.p.n))
        except ValueError:
            return False
        return not c.is_symbolic

    def build(self, step: GenStep) -> tuple[KernelCode, ...]:
        """The gemv kernels (a static product of few rows) or the tiled one; a dynamic node's m, n,
        k, strides and batch index math as kernel parameters (``RunDims``), its tile chosen for the
        largest binding."""
        node = step.node
        rd = RunDims()
        if is_dynamic(node):
            prod = _batch_index(claimed(_run_time_batched(node), node), rd)
        else:
            prod = claimed(_batched(node), node)
        gemm = _operands(node, prod, rd)
        has_bias, act = node.input(2) is not None, activation(node)
        names = ["a", "b"] + (["biasp"] if has_bias else []) + ["y"]
        params = tuple(Param(n, "float", n != "y", n != "y") for n in names)
        p = prod.p
        args: tuple[LaunchArg, ...] = (*input_ptrs(step), *output_ptrs(step), *rd.args)
        if not is_dynamic(node) and p.m <= GEMV_MAX_ROWS:
            mode = "warp" if p.sbk == 1 and p.n > 1 else "split"
            return (_gemv(GemvContext(params, THREADS, mode, gemm, has_bias, act), prod.batches, args),)
        t = _tile(max_of(p.m, node), max_of(p.n, node), max_of(prod.batches, node))
        ctx = TiledContext(
            params=params, threads=THREADS, mode="gemm", bm=t.bm, bn=t.bn, bk=t.bk, tm=t.tm, tn=t.tn,
            m=gemm.p.m, n=gemm.p.n, k=gemm.p.k, a_kfast=p.sak == 1, b_nfast=p.sbn == 1 or p.sbk != 1,
            g=None, has_res=False, gemm=gemm, has_bias=has_bias, act=act, dims=rd.names,
        )  # fmt: skip
        grid = (blocks(p.n, t.bn), blocks(p.m, t.bm), prod.batches)
        return (KernelCode("cuda/tiled.cu.j2", ctx, grid, (THREADS, 1, 1), 0, args),)


def _operands(node: Node, prod: _Batched, rd: RunDims) -> GemmOperands:
    """The operands of ``prod`` (its sizes and strides written by ``rd``), alpha and beta as C text
    and the bias's strides."""
    p, c = prod.p, node.input(2)
    alpha = float(node.attrs["alpha"]) if node.op_type != "MatMul" else 1.0
    beta = float(node.attrs["beta"]) if node.op_type != "MatMul" else 1.0
    sm, sn = broadcast_strides(shape_of(c, symbolic=True), (p.m, p.n)) if c is not None else (0, 0)
    sizes = ("m", "n", "k", "sam", "sak", "sbk", "sbn")
    return GemmOperands(
        p=dataclasses.replace(p, **{f: rd(getattr(p, f)) for f in sizes}), batch_index=prod.index,
        a_batch=prod.a_batch, b_batch=prod.b_batch, alpha="" if alpha == 1.0 else f" * {literal(alpha)}",
        beta="" if beta == 1.0 else f"{literal(beta)} * ", bias_sm=rd(sm), bias_sn=rd(sn),
    )  # fmt: skip


def _gemv(ctx: GemvContext, batches: int, args: tuple[LaunchArg, ...]) -> KernelCode:
    """A product of few rows: one warp per output column where B is contiguous along k ("warp"),
    else 32 x 8 threads splitting k ("split")."""
    n = ctx.gemm.p.n
    if ctx.mode == "warp":
        grid, block = (blocks(n, THREADS // 32), 1, batches), (THREADS, 1, 1)
    else:
        grid, block = (blocks(n, 32), 1, batches), (32, 8, 1)
    return KernelCode("cuda/gemv.cu.j2", ctx, grid, block, 0, args)


KERNELS = (CudaConvKernel(), CudaGemmKernel())
