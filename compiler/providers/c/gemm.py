"""C kernels on the register-blocked GEMM tile: Gemm / FusedGemm, MatMul, and the tile's planning.

The tile (``templates/c/gemm_tile.c.j2``) keeps ``mr`` rows x ``nv`` vectors of accumulators in
registers, broadcasting A (the weights, for a conv) and loading B along the output columns
(pixels, for a conv); its sizes come from the target's vector width and register count, its
loop bounds are compile-time constants, and bias, residual and activation are applied in its
epilogue. ``conv`` feeds it im2col panels. Gemm reads B in place when it is not transposed,
packs B^T into panels in scratch when it is, and takes a dot-product path when there are few
rows (or one column) and both operands are contiguous along K. MatMul broadcasts batches through
static tables of batch offsets.

Scratch sizes must not depend on the target (``scratch_nbytes`` sees only the node), so they
are bounded for any panel width up to ``MAX_PANEL`` floats.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.codegen.cdims import CDim
from compiler.codegen.cdims import kernel_dims
from compiler.codegen.elementwise import ACTIVATIONS
from compiler.codegen.elementwise import activation_expr
from compiler.codegen.elementwise import broadcast_strides
from compiler.codegen.elementwise import literal
from compiler.codegen.elementwise import vector_activation_expr
from compiler.codegen.toolchain import TargetInfo
from compiler.ir.graph import Node
from compiler.providers.base import GenStep
from compiler.providers.base import shape_of
from compiler.providers.c.common import PARALLEL_MIN_WORK
from compiler.providers.c.common import Arg
from compiler.providers.c.common import CKernel
from compiler.providers.c.common import StepCode
from compiler.providers.c.common import all_float32
from compiler.providers.c.common import arg
from compiler.providers.c.common import dyn_arg
from compiler.providers.c.common import input_args
from compiler.providers.c.common import output_args
from compiler.providers.c.common import params
from compiler.providers.c.common import scratch_arg
from compiler.providers.c.gemm_bf16 import AmxBf16
from compiler.providers.c.gemm_bf16 import amx_bf16
from compiler.providers.c.gemm_bf16 import bf16_packed
from compiler.providers.c.gemm_bf16 import bf16_scratch_nbytes
from compiler.providers.geometry import MatmulProduct
from compiler.providers.geometry import claimed
from compiler.providers.kit import KernelContext
from compiler.providers.kit import Param
from runtime.contract import AOT_DOMAIN
from runtime.contract import FUSED_GEMM
from runtime.contract import PACKED_GEMM
from runtime.errors import CompileError
from runtime.kernels.linalg import B_PANEL
from runtime.symbolic import Dim
from runtime.symbolic import Expr

__all__ = ["Tiling", "Epilogue", "GemmContext", "choose_tiling", "run_time_rows", "packed_nbytes",
           "activation", "fused_ok", "sized_scratch"]

MAX_PANEL = 64  # widest panel (floats) any target's tiling uses
DOT_MAX_ROWS = 8  # Gemm with at most this many rows (and k-contiguous operands) uses dot products
# B read in place has a stride of N floats between k rows (often a power of two, which thrashes
# the caches); with at least this many rows to amortize the copy, B is packed into panels.
PACK_MIN_ROWS = 16
ROWS_OUTER_MAX_PANELS = 8  # up to this many panels, threads split the rows rather than the panels
# ... and only while B stays in L2: row block first, each row block walks all of B's panels, so a
# larger B streams from L3 once per row block (MiniLM's FFN down, 128 x 1536 by 1536 x 384, 2.4
# MB: 0.87 -> 0.52 ms with the panels outer on an Intel Xeon, the encoder 14.6 -> 12.6 ms).
ROWS_OUTER_MAX_B_BYTES = 256 * 1024
MAX_ROWS = 12  # the most rows any target's tile has (choose_tiling)
# A's rows this many bytes apart (or a multiple) fall into one L1 set: the tile's mr row streams
# evict each other (a 64 x 1024 by 1024 x 8210 product ran at 65 GFLOPS, at 75 with K = 1040).
# The packed path then also copies A, row block by row block, into k-major blocks.
ALIASING_BYTES = 4096


@dataclass(frozen=True)
class Tiling:
    """Register tile and loop bounds for an M x N x K product."""

    vw: int  # floats per vector
    nv: int  # vectors per tile row
    mr: int  # rows per tile
    nr: int  # columns per panel (nv * vw)
    m: int | CDim  # the rows and their blocks: C text where the rows are a run-time dim
    n: int
    k: int  # a CDim (C text) in attention's output tile, whose k loop runs over run-time keys
    nmb: int | CDim  # row blocks
    mfull: int | CDim  # full row blocks
    mrt: int | CDim  # rows in the tail block (0: none)
    np: int  # panels
    nfull: int  # full panels
    nt: int  # columns in the tail panel (0: none)
    nvt: int  # vectors in the tail panel
    rows_outer: bool  # work items ordered row block first (few panels: balances tail panels)


@dataclass(frozen=True)
class Epilogue:
    """What the tile applies to each accumulator ``v`` before storing it."""

    alpha: str  # "" or " * <literal>"
    bias: bool
    beta: str  # "" or "<literal> * "
    bias_sm: int  # bias element of (m, n) is bias[m * bias_sm + n * bias_sn]
    bias_sn: int
    residual: bool
    act: str  # C expression over v
    vact: str = "v"  # the same over a vector v (type vf): applied in registers by full tiles


@dataclass(frozen=True)
class GemmContext(KernelContext):
    t: Tiling
    e: Epilogue
    path: str  # "dot" | "direct" | "packed" | "prepacked" (B packed ahead of time: PackedGemm)
    pack_a: bool  # the packed path also copies A into k-major row blocks (after B's panels)
    b_floats: int  # scratch floats reserved for B's panels (A's blocks follow)
    p: MatmulProduct  # A(m, k) = a[m * p.sam + k * p.sak], B(k, n) = b[k * p.sbk + n * p.sbn]
    nb: int  # batches (MatMul)
    a_off: tuple[int, ...]  # per-batch element offsets into A and B
    b_off: tuple[int, ...]
    parallel: bool
    parallel_if: str = ""  # run-time rows: the threads start when the run's work is large enough
    amx: AmxBf16 | None = None  # a bf16 PackedGemm (compiler/providers/c/gemm_bf16.py)


def choose_tiling(m: int, n: int, k: int, target: TargetInfo, panel: int | None = None) -> Tiling:
    """Tile sizes: as many accumulators as registers allow, panel no wider than N needs (and,
    with ``panel``, a width that divides it: B packed ahead of time in panels of that many columns)."""
    vw = target.vector_bytes // 4
    wide = target.vector_registers >= 32
    nv = max(1, min(4 if wide else 2, math.ceil(n / vw)))
    while panel is not None and panel % (nv * vw):
        nv -= 1
    mr = max(1, min((24 if wide else 12) // nv, 12, m))
    nr = nv * vw
    nfull, nt = divmod(n, nr)
    mfull, mrt = divmod(m, mr)
    return Tiling(
        vw=vw,
        nv=nv,
        mr=mr,
        nr=nr,
        m=m,
        n=n,
        k=k,
        nmb=mfull + (1 if mrt else 0),
        mfull=mfull,
        mrt=mrt,
        np=nfull + (1 if nt else 0),
        nfull=nfull,
        nt=nt,
        nvt=math.ceil(nt / vw),
        rows_outer=nfull + (1 if nt else 0) <= ROWS_OUTER_MAX_PANELS and 4 * k * n <= ROWS_OUTER_MAX_B_BYTES,
    )


def run_time_rows(t: Tiling, m: CDim) -> Tiling:
    """``t`` (chosen for ``MAX_ROWS`` or more rows) for ``m`` rows known at run time only: the row
    block counts become C text, the tail block's rows a run-time value (``gemm_tile.c.j2``'s
    ``tiles`` switches on it)."""
    return dataclasses.replace(t, m=m, nmb=CDim(f"(({m} + {t.mr - 1}) / {t.mr})"),
                               mfull=CDim(f"({m} / {t.mr})"), mrt=CDim(f"({m} % {t.mr})"))


def run_time_columns(t: Tiling, n: CDim) -> Tiling:
    """``t`` (chosen for a panel's width or more columns) for ``n`` columns known at run time only:
    the panel counts become C text and the tail panel's columns a run-time value, run with the full
    panel's vectors over a zero-padded copy of each B row (``gemm_tile.c.j2``'s ``panel_tiles``).
    The column fields (n, np, nfull, nt, nvt) then hold ``CDim``s."""
    cols: dict[str, Any] = {"n": n, "np": CDim(f"(({n} + {t.nr - 1}) / {t.nr})"),
                            "nfull": CDim(f"({n} / {t.nr})"), "nt": CDim(f"({n} % {t.nr})"), "nvt": t.nv}
    return dataclasses.replace(t, **cols)


def packed_nbytes(k: int, n: int) -> int:
    return 4 * k * (n + MAX_PANEL)


def _pack_a(prod: _Product) -> bool:
    """Whether the packed path copies A too: A's rows contiguous along k, and a multiple of
    ALIASING_BYTES apart."""
    p = prod.p
    return prod.path in ("packed", "prepacked") and p.sak == 1 and (4 * p.sam) % ALIASING_BYTES == 0


def activation(node: Node, vector: bool = False) -> str:
    """The node's fused activation as a C expression over ``v`` (a float, or a ``vf`` vector)."""
    if node.domain != AOT_DOMAIN:
        return "v"
    make = vector_activation_expr if vector else activation_expr
    return make(
        str(node.attrs["activation"]),
        float(node.attrs["act_min"]),
        float(node.attrs["act_max"]),
        float(node.attrs["act_alpha"]),
        "v",
    )


def fused_ok(node: Node, vector_math: bool = True) -> bool:
    """Whether the node's epilogue attributes are complete and name an activation the kernels
    have; without ``vector_math`` (templates/c/vmath.c.j2: CUDA has none) not Silu."""
    if node.domain != AOT_DOMAIN:
        return True
    keys = ("activation", "act_min", "act_max", "act_alpha")
    if not all(k in node.attrs for k in keys):
        return False
    act = node.attrs["activation"]
    return act in ACTIVATIONS and (vector_math or act != "Silu")


# -- Gemm / MatMul ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Product:
    """The product as the kernel runs it: ``p`` with a dot path's immaterial strides set to 1,
    each batch's element offsets into A and B, and the path."""

    p: MatmulProduct
    a_off: tuple[int, ...]
    b_off: tuple[int, ...]
    path: str
    batches: Dim = 1  # run-time dims: the batches (an Expr, or an int), each m x k of A by k x n of B
    # run-time batches: per batch axis (outermost first) its size and A's, B's strides in matrices
    axes: tuple[tuple[Dim, Dim, Dim], ...] = ()


def _path(node: Node, p: MatmulProduct, b_off: list[int], batches: int) -> str:
    """"dot" (dot products: one row or column, or few rows on k-contiguous operands), "packed"
    (B packed into the tile's panels once) or "direct"."""
    if node.op_type == "MatMul":
        if p.n == 1:
            return "dot"
        return "packed" if len(set(b_off)) == 1 and p.m * batches >= PACK_MIN_ROWS else "direct"
    if (p.sak == 1 or p.m == 1) and (p.sbk == 1 or p.n == 1) and (p.m <= DOT_MAX_ROWS or p.n <= 2):
        return "dot"
    return "packed" if int(node.attrs["transB"]) or p.m >= PACK_MIN_ROWS else "direct"


def _packed_product(node: Node) -> _Product | None:
    """PackedGemm (onnx_aot): A (m, k) times B packed in (ceil(n / B_PANEL), k, B_PANEL) panels."""
    a, bp, y = node.input(0), node.input(1), node.outputs[0]
    if a is None or bp is None or a.shape is None or bp.shape is None or y.shape is None:
        return None
    (m, k), n = a.shape, int(node.attrs.get("n", -1))
    fp32 = bp.shape == (-(-n // B_PANEL), k, B_PANEL)
    if len(a.shape) != 2 or not (fp32 or bf16_packed(node)) or y.shape != (m, n):
        return None
    return _Product(MatmulProduct(m, n, k, k, 1, B_PANEL, 1, (), (), ()), (0,), (0,), "prepacked")


def _product(node: Node) -> _Product | None:
    """The node's product with its batches' A / B offsets (one B for every batch: packed once)."""
    if _dynamic(node):
        return _run_time_product(node)
    if node.kind == PACKED_GEMM:
        return _packed_product(node)
    p = MatmulProduct.from_node(node)
    if p is None:
        return None
    if node.op_type != "MatMul" and _literals(node) is None:
        return None
    a_off, b_off = [], []
    for idx in np.ndindex(*p.batch):
        a_off.append(sum(i * s for i, s in zip(idx, p.a_batch, strict=True)) * p.m * p.k)
        b_off.append(sum(i * s for i, s in zip(idx, p.b_batch, strict=True)) * p.k * p.n)
    path = _path(node, p, b_off, len(a_off))
    if path == "dot":  # one row (column): the other stride is immaterial
        p = dataclasses.replace(p, sak=1, sbk=1)
    return _Product(p, tuple(a_off), tuple(b_off), path)


def _dynamic(node: Node) -> bool:
    return any(v is not None and v.is_symbolic for v in (*node.inputs, *node.outputs))


def _run_time_product(node: Node) -> _Product | None:
    """A product with run-time dims (issue 17), K static, on the tile: A (rows..., K) by a static B
    (A's leading dims are all rows: M; PackedGemm's panels, B^T packed at each run, B read in place
    otherwise; MatMul's B 2-D or with leading 1s), or MatMul's batches of A (m, K) by B (K, n) with
    the same batch dims, B read in place (batches, m and n may be run-time)."""
    a, b, y = node.input(0), node.input(1), node.outputs[0]
    if a is None or b is None or a.shape is None or b.shape is None or y.shape is None:
        return None
    b_matrix = len(a.shape) >= len(b.shape) >= 2 and all(d == 1 for d in b.shape[:-2])
    if node.op_type == "MatMul" and len(a.shape) >= 2 and len(b.shape) >= 3 and not b_matrix:
        return _run_time_batches(tuple(a.shape), tuple(b.shape), tuple(y.shape))
    if b.is_symbolic:
        return None
    if node.kind == PACKED_GEMM:
        n = int(node.attrs.get("n", -1))
        k = b.shape[1] if len(b.shape) == 3 else -1
        if len(a.shape) != 2 or tuple(b.shape) != (-(-n // B_PANEL), k, B_PANEL) or a.shape[1] != k:
            return None
        sbk, sbn, path = B_PANEL, 1, "prepacked"
    elif node.op_type == "MatMul":
        if not b_matrix:  # B (k, n), or (1, ..., k, n) broadcast over every batch of A
            return None
        k, n = b.shape[-2:]
        sbk, sbn, path = n, 1, "direct"
    else:
        if len(a.shape) != 2 or len(b.shape) != 2 or node.attrs.get("transA") != 0 or _literals(node) is None:
            return None
        tb = node.attrs.get("transB")
        if tb not in (0, 1):
            return None
        k, n = b.shape[::-1] if tb else b.shape
        sbk, sbn, path = (1, k, "packed") if tb else (n, 1, "direct")  # B^T: packed at each run
    rows = a.shape[:-1]
    m = math.prod(rows)
    if a.shape[-1] != k or tuple(y.shape) != (*rows, n) or not isinstance(m, Expr):
        return None
    return _Product(MatmulProduct(m, n, k, k, 1, sbk, sbn, (), (), ()), (0,), (0,), path)


def _run_time_batches(a: tuple[Dim, ...], b: tuple[Dim, ...], y: tuple[Dim, ...]) -> _Product | None:
    """MatMul of A (batch..., m, k) by B (batch..., k, n), batch dims broadcasting where one side's
    is 1 (equal otherwise: two different expressions are refused); any of them run-time (k:
    attention's P V over the keys)."""
    (m, k), n = a[-2:], b[-1]
    rank = max(len(a), len(b)) - 2
    ab, bb = (1,) * (rank + 2 - len(a)) + a[:-2], (1,) * (rank + 2 - len(b)) + b[:-2]
    sizes = [x if x != 1 else z for x, z in zip(ab, bb, strict=True)]
    if any(x != z and 1 not in (x, z) for x, z in zip(ab, bb, strict=True)):
        return None
    if b[-2] != k or y != (*sizes, m, n) or (isinstance(k, int) and k < 1):
        return None
    axes = tuple(zip(sizes, _matrix_strides(ab), _matrix_strides(bb), strict=True))
    product = MatmulProduct(m, n, k, k, 1, n, 1, (), (), ())  # type: ignore[arg-type]  # sam / sbk: Exprs too
    return _Product(product, (0,), (0,), "direct", math.prod(sizes), axes)


def _matrix_strides(batch: tuple[Dim, ...]) -> list[Dim]:
    """Strides (in matrices) of batch dims ``batch``, 0 along a dim of 1 (broadcast)."""
    out: list[Dim] = []
    inner: Dim = 1
    for size in reversed(batch):
        out.insert(0, 0 if size == 1 else inner)
        inner = inner * size
    return out


def _batch_offset(axes: tuple[tuple[Dim, Dim, Dim], ...], side: int, matrix: Dim,
                  dims: Callable[[object], int | CDim]) -> CDim:
    """C text: the element offset of batch ``bi``'s matrix (``matrix`` elements) in A (``side`` 1)
    or B (2): each batch axis's index taken from ``bi`` times that side's stride."""
    terms: list[str] = []
    inner: Dim = 1
    for axis in reversed(axes):
        if axis[side] != 0:
            terms.append(f"((bi / {dims(inner)}) % {dims(axis[0])}) * {dims(axis[side] * matrix)}")
        inner = inner * axis[0]
    return CDim(" + ".join(terms) if terms else "0")


def _literals(node: Node) -> tuple[float, float] | None:
    try:
        return float(node.attrs["alpha"]), float(node.attrs["beta"])
    except (KeyError, TypeError, ValueError):
        return None


def _epilogue(node: Node, p: MatmulProduct) -> Epilogue:
    c = node.input(2)
    alpha = float(node.attrs["alpha"]) if node.op_type != "MatMul" else 1.0
    beta = float(node.attrs["beta"]) if node.op_type != "MatMul" else 1.0
    sm, sn = broadcast_strides(shape_of(c, symbolic=True), (p.m, p.n)) if c is not None else (0, 0)
    return Epilogue(
        alpha="" if alpha == 1.0 else f" * {literal(alpha)}",
        bias=c is not None,
        beta="" if beta == 1.0 else f"{literal(beta)} * ",
        bias_sm=sm,
        bias_sn=sn,
        residual=False,
        act=activation(node),
        vact=activation(node, vector=True),
    )


class GemmKernel(CKernel):
    kinds: tuple[str, ...] = ("Gemm", FUSED_GEMM, PACKED_GEMM, "MatMul")
    dynamic = True  # run-time rows (M): _run_time_product

    def supports(self, node: Node) -> bool:
        if not (all_float32(node) or bf16_packed(node)) or not fused_ok(node) or len(node.outputs) != 1:
            return False
        n_in = 2 if node.op_type == "MatMul" else 3
        if node.input(0) is None or node.input(1) is None or len(node.inputs) > n_in:
            return False
        prod = _product(node)
        if prod is None or not all(isinstance(d, Expr) or d >= 1 for d in (prod.p.m, prod.p.n, prod.p.k)):
            return False
        c = node.input(2)
        if c is not None:
            if c.is_symbolic:
                return False
            try:
                strides = broadcast_strides(shape_of(c), (prod.p.m, prod.p.n))
            except ValueError:
                return False
            return all(isinstance(x, int) for x in strides)
        return True

    def scratch_nbytes(self, node: Node) -> Dim:  # type: ignore[override]  # an Expr: run-time scratch
        prod = claimed(_product(node), node)
        a_blocks = 4 * len(prod.a_off) * (prod.p.m + MAX_ROWS - 1) * prod.p.k if _pack_a(prod) else 0
        if bf16_packed(node):
            return bf16_scratch_nbytes(prod.p.m, prod.p.n, prod.p.k, a_blocks)  # type: ignore[arg-type]
        return a_blocks + (packed_nbytes(prod.p.k, prod.p.n) if prod.path == "packed" else 0)

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        prod = claimed(_product(node), node)
        p = prod.p
        run_time = _dynamic(node)
        t = _tiling(prod, target, kernel_dims(step.symbols) if run_time else None)
        c = node.input(2)
        ins = input_args(step)
        amx = amx_bf16(p.m, p.n, p.k) if bf16_packed(node) else None  # type: ignore[arg-type]
        if amx is not None:  # B: bfloat16 codes
            ins[1] = dataclasses.replace(ins[1], ctype="uint16_t")
        scratch = sized_scratch(step, self.scratch_nbytes(node))
        args = [*ins, *output_args(step), *scratch]
        names = ["a", "b"] + (["biasp"] if c is not None else []) + ["y"] + (["scratch"] if scratch else [])
        restrict = [True] * len(ins) + [False] + ([True] if scratch else [])
        prms = params(names, args, restrict)
        if run_time:  # the binding: the run-time dims are C over it
            args.append(dyn_arg(step))
            prms = (*prms, Param("dyn", "int64_t", True, True))
        ctx = GemmContext(
            params=prms,
            t=t,
            e=_epilogue(node, p),
            path=prod.path,
            pack_a=_pack_a(prod),
            b_floats=_b_floats(prod, amx is not None),
            amx=amx,
            p=p,
            nb=len(prod.a_off),
            a_off=prod.a_off,
            b_off=prod.b_off,
            parallel=run_time or 2 * len(prod.a_off) * p.m * p.n * p.k >= PARALLEL_MIN_WORK,
        )
        if run_time:
            ctx = dataclasses.replace(ctx, **_run_time_context(prod, kernel_dims(step.symbols)))
        return StepCode("c/gemm.c.j2", ctx, tuple(args))


def _b_floats(prod: _Product, bf16: bool) -> int:
    """Scratch floats ahead of A's blocks: B's panels packed per run (a bf16 B is read as it is)."""
    if bf16:
        return 0
    return packed_nbytes(prod.p.k, prod.p.n) // 4 if prod.path == "packed" else 0  # type: ignore[arg-type]


def _tiling(prod: _Product, target: TargetInfo, dims: Callable[[object], int | CDim] | None) -> Tiling:
    """The tile for ``prod``; with run-time rows or columns (``dims`` writes them as C), chosen for
    a full tile and panel and the run-time counts filled in."""
    p = prod.p
    panel = B_PANEL if prod.path == "prepacked" else None
    if dims is None:
        return choose_tiling(p.m, p.n, p.k, target, panel)  # type: ignore[arg-type]
    m, n, k = dims(p.m), dims(p.n), dims(p.k)
    t = choose_tiling(m if isinstance(m, int) else MAX_ROWS, n if isinstance(n, int) else MAX_PANEL,
                      k if isinstance(k, int) else 1, target, panel)
    t = run_time_rows(t, m) if isinstance(m, CDim) else t
    t = run_time_columns(t, n) if isinstance(n, CDim) else t
    depth: dict[str, Any] = {"k": k}  # C text where K is run-time: the tile's k loop
    return dataclasses.replace(t, **depth)


def _run_time_context(prod: _Product, dims: Callable[[object], int | CDim]) -> dict[str, Any]:
    """A dynamic product's batch count and offsets (batch ``bi``'s A and B: C text) and the OpenMP
    if clause over its run-time work."""
    p = prod.p
    work = dims(2 * prod.batches * p.m * p.n * p.k)
    stride: dict[str, Any] = {"sbk": dims(p.sbk), "sam": dims(p.sam)}  # row strides as C (n, k run-time)
    out: dict[str, Any] = {"parallel_if": f"{work} >= {PARALLEL_MIN_WORK}",
                           "p": dataclasses.replace(p, **stride)}
    if prod.batches != 1:
        out.update(nb=dims(prod.batches), a_off=(_batch_offset(prod.axes, 1, p.m * p.k, dims),),
                   b_off=(_batch_offset(prod.axes, 2, p.k * p.n, dims),))
    return out


def sized_scratch(step: GenStep, needed: Dim) -> list[Arg]:
    """``scratch_arg``, for a size that may be an expression of the symbols (run-time rows)."""
    if not isinstance(needed, Expr):
        return scratch_arg(step, needed)
    if step.scratch is None or step.scratch_nbytes != needed:
        raise CompileError(f"{step.node.describe()}: needs {needed} bytes of scratch, plan gives "
                           f"{step.scratch_nbytes}")
    return [arg(step.scratch, "float", False, step, "scratch")]


KERNELS = (GemmKernel(),)
