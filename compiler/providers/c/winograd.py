"""C kernel for ``onnx_aot.WinogradConv``: a 3x3, stride-1 conv as Winograd F(m x m, 3x3), m = 2 or 4.

The node comes from ``compiler/passes/use_winograd.py`` with its weights already transformed
(``U``: a^2 x M x C, a = m + 2). Per image, ``templates/c/winograd.c.j2`` transforms every a x a
input patch into a^2 matrices (C x tiles), runs the a^2 products U_k V_k on the GEMM tile
(``gemm``, B read in place), and transforms each tile's a^2 values back into its m x m outputs
with bias, residual and activation applied as they are stored. The transforms are unrolled from
the matrices in ``runtime/kernels/winograd.py``. Both transforms work a row of tiles at a time on
contiguous runs (even and odd input columns split first) so the compiler vectorizes them.
Scratch holds the transformed input and the 16 products. A dynamic graph's node (run-time batch
and spatial sizes, C locals from the binding) has its tile counts, rows and the products' columns
(a run-time count on the register tile chosen for many columns) decided in C; its scratch is an
expression of the tiles.
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.codegen.cdims import CDim
from compiler.codegen.elementwise import literal
from compiler.codegen.toolchain import TargetInfo
from compiler.ir.graph import Node
from compiler.providers.base import GenStep
from compiler.providers.c.common import CKernel
from compiler.providers.c.common import StepCode
from compiler.providers.c.conv import Decls
from compiler.providers.c.conv import conv_operands
from compiler.providers.c.conv import dynamic_conv_operands
from compiler.providers.c.conv import dynamic_geometry
from compiler.providers.c.conv import epilogue_operands_ok
from compiler.providers.c.conv import is_dynamic
from compiler.providers.c.conv import pool_condition
from compiler.providers.c.gemm import MAX_PANEL
from compiler.providers.c.gemm import Epilogue
from compiler.providers.c.gemm import Tiling
from compiler.providers.c.gemm import choose_tiling
from compiler.providers.c.gemm import run_time_columns
from compiler.providers.geometry import WinogradGeometry
from compiler.providers.geometry import claimed
from compiler.providers.kit import KernelContext
from runtime.contract import WINOGRAD_CONV
from runtime.kernels.winograd import MATRICES
from runtime.symbolic import Expr

__all__ = ["WinogradContext", "WinogradKernel"]


@dataclass(frozen=True)
class WinogradContext(KernelContext):
    t: Tiling  # one of the 16 products: M x tiles x C
    e: Epilogue  # applied by the output transform
    plain: Epilogue  # the products' tiles store plain sums
    g: WinogradGeometry  # g.tile outputs per tile side; input patches are (tile + 2) x (tile + 2)
    bt: tuple[tuple[tuple[int, str], ...], ...]  # B^T: per entry (sign, literal of |value|, "" for 1)
    at: tuple[tuple[tuple[int, str], ...], ...]  # A^T, the same way
    rowpad: int  # floats in one zero-padded input row: the m * (tw + 1) columns the phases read
    tp: int  # row stride of the transformed input: tiles rounded up to ROW_ALIGN
    pool: str  # C condition: the phases run on the worker pool (threads only for enough work)
    th: int  # rows of tiles, tiles per row
    tw: int
    # A dynamic node's (run-time batch and spatial sizes): C locals declared by ``decls`` (the
    # sizes above then C text, the products' columns run-time ones).
    decls: Decls = ()


# Rows of the transformed input are padded to a multiple of the widest vector (16 floats on any
# target), so the GEMM tile reads its last panel as whole vectors without a bounds copy.
ROW_ALIGN = 16


def _padded(tiles: int | Expr) -> int | Expr:
    return -(-tiles // ROW_ALIGN) * ROW_ALIGN


def _signed(matrix: tuple[tuple[float, ...], ...]) -> tuple[tuple[tuple[int, str], ...], ...]:
    """Each entry as (sign, C literal of its magnitude; "" when the magnitude is 1)."""
    def entry(v: float) -> tuple[int, str]:
        sign = (v > 0) - (v < 0)
        return sign, "" if abs(v) == 1.0 else literal(abs(v))

    return tuple(tuple(entry(v) for v in row) for row in matrix)


class WinogradKernel(CKernel):
    kinds: tuple[str, ...] = (WINOGRAD_CONV,)
    dynamic = True  # run-time batch and spatial sizes: tile counts, rows and products' columns in C

    def supports(self, node: Node) -> bool:
        g = WinogradGeometry.from_node(node, "NCHW", is_dynamic(node))
        return g is not None and epilogue_operands_ok(node, g.m)

    def scratch_nbytes(self, node: Node) -> int | Expr:  # type: ignore[override]
        g = claimed(WinogradGeometry.from_node(node, "NCHW", is_dynamic(node)), node)
        # transformed input (a^2 x C x padded tiles) and the a^2 products (a^2 x M x tiles)
        tiles = g.th * g.tw
        return 4 * (g.tile + 2) ** 2 * (g.c * _padded(tiles) + g.m * tiles)

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        if is_dynamic(node):
            return _build_dynamic(step, target, self.scratch_nbytes(node))
        g = claimed(WinogradGeometry.from_node(node, "NCHW"), node)
        e, args, step_params = conv_operands(step, "u", self.scratch_nbytes(node))  # type: ignore[arg-type]
        plain = Epilogue("", False, "", 0, 0, False, "v", "v")
        tiles = g.th * g.tw
        t = choose_tiling(g.m, tiles, g.c, target)
        ctx = WinogradContext(
            params=step_params,
            t=t,
            e=e,
            plain=plain,
            g=g,
            bt=_signed(MATRICES[g.tile][0]),
            at=_signed(MATRICES[g.tile][2]),
            rowpad=max(g.tile * (g.tw + 1), g.pl + g.w),
            tp=_padded(tiles),  # type: ignore[arg-type]
            pool=pool_condition(2 * (g.tile + 2) ** 2 * g.batch * g.m * g.c * tiles),
            th=g.th,
            tw=g.tw,
        )
        return StepCode("c/winograd.c.j2", ctx, tuple(args))


def _build_dynamic(step: GenStep, target: TargetInfo, scratch: int | Expr) -> StepCode:
    """Run-time sizes as C locals; the products' columns (an image's tiles) a run-time count on the
    register tile chosen for many columns (``run_time_columns``)."""
    node = step.node
    g0 = claimed(WinogradGeometry.from_node(node, "NCHW", True), node)
    e, args, step_params = dynamic_conv_operands(step, "u", scratch)
    g, decls = dynamic_geometry(g0, step.symbols)
    m = g.tile
    decls += (("TH", f"(({g.oh} + {m - 1}) / {m})"), ("TW", f"(({g.ow} + {m - 1}) / {m})"),
              ("TILES", "(TH * TW)"), ("TP", f"((TILES + {ROW_ALIGN - 1}) / {ROW_ALIGN} * {ROW_ALIGN})"),
              ("RP", f"({m} * (TW + 1) > {g.pl} + {g.w} ? {m} * (TW + 1) : {g.pl} + {g.w})"))  # fmt: skip
    t = run_time_columns(choose_tiling(g.m, 64 * MAX_PANEL, g.c, target), CDim("TILES"))
    work = f"{2 * (m + 2) ** 2 * g.m * g.c} * {g.batch} * TILES"
    ctx = WinogradContext(
        params=step_params,
        t=t,
        e=e,
        plain=Epilogue("", False, "", 0, 0, False, "v", "v"),
        g=g,
        bt=_signed(MATRICES[m][0]),
        at=_signed(MATRICES[m][2]),
        rowpad=CDim("RP"),  # type: ignore[arg-type]
        tp=CDim("TP"),  # type: ignore[arg-type]
        pool=pool_condition(CDim(work)),
        th=CDim("TH"),  # type: ignore[arg-type]
        tw=CDim("TW"),  # type: ignore[arg-type]
        decls=decls,
    )
    return StepCode("c/winograd.c.j2", ctx, tuple(args))


KERNELS = (WinogradKernel(),)
