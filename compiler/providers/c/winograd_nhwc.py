"""C kernel for ``onnx_aot.WinogradConvNhwc``: a 3x3, stride-1 conv on NHWC tensors as Winograd
F(m x m, 3x3), m = 2 or 4, vectorized over channels.

The tiles of all images (in raster order, image by image) are processed in blocks. For a block,
``templates/c/winograd_nhwc.c.j2``

1. transforms each tile's a x a input patch (a = m + 2; zero outside the image) a vector of
   channels at a time into ``V[tile][xi][c]``, the a^2 values of B^T d B per channel;
2. runs, per xi, the product ``V[xi]`` (tiles x C) ``U[xi]`` (C x M; the weights packed in
   panels of 16 output channels by ``runtime.kernels.nhwc.pack_winograd_weights``) on a register
   tile (rows are tiles, the panel's 16 columns one or more vectors; ``gemm_tile.c.j2``'s loop
   with a software prefetch of the next panel, spread over the row tiles for big weights) into
   ``S[tile][xi][m]``;
3. transforms each tile's a^2 products back, a vector of output channels at a time, into its
   m x m output pixels with bias, residual and activation applied as the NHWC rows are stored
   (tiles overhanging the output's bottom and right edges store only their pixels inside).

Blocks are sized so that a block's V and S stay in the L2 cache, but big enough that the
weights (all read once per block) are amortized. With at least ``MIN_SHARE`` tiles per thread,
each thread takes blocks in turn into its own slot of scratch (guided: a shrinking share of the
tiles left, so a thread slowed by another process takes fewer); with fewer, the threads share
one block at a time, each phase split between them (the products by xi and panel: each thread
streams its part of the weights). Every tile is computed the same way whichever thread or block
runs it, so the result does not depend on the thread count.

The transforms are unrolled from the matrices of ``runtime/kernels/winograd.py`` as short
programs (:func:`transform_program`) that share sums and differences of rows and columns
(e.g. F(4x4, 3x3)'s B^T rows 1 and 2 are E + O and E - O): 12 and 10 vector operations per
1-D transform of F(4x4, 3x3) instead of 16 and 14.

A dynamic graph's node (run-time batch and spatial sizes) decides the tile count, the number of
blocks and the path (serial, per-thread slots, shared phases) in C; blocks hold the same most
tiles for any count and the scratch is an expression of the tiles (a slot per thread they allow).

Measured on the Zen 3 build machine (1 thread, quiet): 0.45-0.65x the time of the NCHW
``WinogradConv`` kernel for 16-128 channels, 0.6-0.9x for 256-512 channels (their transformed
weights stream from memory), 0.3-0.5x onnxruntime's direct convolution.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from compiler.codegen.cdims import CDim
from compiler.codegen.elementwise import literal
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
from compiler.providers.c.gemm import Epilogue
from compiler.providers.geometry import WinogradGeometry
from compiler.providers.geometry import claimed
from compiler.providers.kit import KernelContext
from runtime.contract import WINOGRAD_CONV_NHWC
from runtime.kernels.nhwc import PANEL
from runtime.kernels.winograd import MATRICES
from runtime.symbolic import Expr
from runtime.symbolic import max_
from runtime.symbolic import min_

__all__ = ["Term", "Program", "transform_program", "WinogradNhwcContext", "WinogradNhwcKernel"]

# Block sizing. A tile's V and S take a^2 (C + M) floats; a block holds as many tiles as fit
# L2_BUDGET bytes, but at least MIN_BLOCK (the weights, a^2 C M floats, are read once per block:
# fewer tiles per block would make the products wait on them) and at most all tiles.
L2_BUDGET = 256 * 1024
MIN_BLOCK = 24
BLOCK_ROUND = 12  # blocks are a multiple of this many tiles (of every target's tile height)
# With at least MIN_SHARE tiles per thread (and at most MAX_SLOTS threads: one scratch slot each)
# each thread runs its share of the tiles alone; otherwise the threads share each block's phases.
MIN_SHARE = 24
# A thread takes a share of the tiles left, at least MIN_CHUNK (MIN_BLOCK when the weights are
# over BIG_WEIGHTS bytes: they come from memory, not the L3 cache, for every block).
MIN_CHUNK = 12
BIG_WEIGHTS = 8 << 20
MAX_SLOTS = 4
SPREAD_WEIGHTS = 4 << 20  # weights over this many bytes: prefetched across all row tiles
SKEW = 16  # floats added to V's and S's per-tile strides so tiles do not alias in the L1 sets


@dataclass(frozen=True)
class Term:
    """``sign * lit * value[src]`` (``lit`` "" for 1); values are a program's inputs, then its temps."""

    sign: int
    lit: str
    src: int


@dataclass(frozen=True)
class Program:
    """A 1-D transform ``y = T x`` as straight-line code: temps (each a sum of terms over the
    inputs and earlier temps), then the outputs, each a sum of terms."""

    n_in: int
    temps: tuple[tuple[Term, ...], ...]
    outs: tuple[tuple[Term, ...], ...]


def _term(coef: float, src: int) -> Term:
    sign = 1 if coef > 0 else -1
    return Term(sign, "" if abs(coef) == 1.0 else literal(abs(coef)), src)


def transform_program(matrix: tuple[tuple[float, ...], ...]) -> Program:
    """``matrix`` (rows x inputs) as a :class:`Program` sharing common sums and differences.

    Two columns of equal magnitudes (in at least two rows) become their sum and difference,
    which the rows then use; then two rows on the same values whose coefficients are equal on
    some (E) and opposite on the others (O) become E + O and E - O.
    """
    n_in = len(matrix[0])
    temps: list[tuple[Term, ...]] = []
    rows: list[dict[int, float]] = [{k: v for k, v in enumerate(row) if v != 0.0} for row in matrix]

    def new_temp(terms: tuple[Term, ...]) -> int:
        temps.append(terms)
        return n_in + len(temps) - 1

    for k in range(n_in):
        for k2 in range(k + 1, n_in):
            users = [r for r in rows if k in r or k2 in r]
            if len(users) < 2 or any(abs(r.get(k, 0.0)) != abs(r.get(k2, 0.0)) for r in users):
                continue
            same = [r[k] == r[k2] for r in users]
            plus = new_temp((Term(1, "", k), Term(1, "", k2))) if any(same) else -1
            minus = new_temp((Term(1, "", k), Term(-1, "", k2))) if not all(same) else -1
            for r, is_same in zip(users, same, strict=True):
                coef = r.pop(k)
                r.pop(k2)
                r[plus if is_same else minus] = coef
    outs: list[tuple[Term, ...] | None] = [None] * len(rows)
    for i, row in enumerate(rows):
        for i2 in range(i + 1, len(rows)):
            other = rows[i2]
            if outs[i] is not None or outs[i2] is not None or set(row) != set(other) or len(row) < 2:
                continue
            even = {k: v for k, v in row.items() if other[k] == v}
            odd = {k: v for k, v in row.items() if other[k] == -v}
            if not even or not odd or len(even) + len(odd) != len(row):
                continue
            e = new_temp(tuple(_term(v, k) for k, v in sorted(even.items())))
            o = new_temp(tuple(_term(v, k) for k, v in sorted(odd.items())))
            outs[i] = (Term(1, "", e), Term(1, "", o))
            outs[i2] = (Term(1, "", e), Term(-1, "", o))
    done = tuple(out if out is not None else tuple(_term(v, k) for k, v in sorted(row.items()))
                 for out, row in zip(outs, rows, strict=True))
    if any(not out for out in done):
        raise ValueError("a transform matrix has a zero row")
    return Program(n_in, tuple(temps), done)


@dataclass(frozen=True)
class WinogradNhwcContext(KernelContext):
    e: Epilogue  # applied by the output transform
    vw: int  # floats per vector
    mr: int  # rows (tiles) per register tile
    nv: int  # vectors per register tile row
    nr: int  # columns per register tile (nv * vw; PANEL is a multiple)
    spread: bool  # the products' row tiles prefetch a share of the next panel each (big weights)
    g: WinogradGeometry  # g.tile outputs per tile side; input patches are a x a, a = tile + 2
    bt: Program  # B^T
    at: Program  # A^T
    tiles: int  # all images' tiles
    block: int  # most tiles per block
    nblocks: int  # blocks when the threads share them
    cs: int  # floats per xi in V (C, at least a vector of the widest target)
    panels: int
    vt: int  # floats per tile in V
    st: int  # floats per tile in S
    slot: int  # floats per scratch slot (V then S)
    slots: int  # threads that can run their share of the tiles alone
    min_share: int  # tiles per thread they need for it
    min_chunk: int  # fewest tiles a thread takes at once
    serial: bool  # too little work for threads
    th: int  # rows of tiles per image, tiles per row
    tw: int
    # A dynamic node's (run-time batch and spatial sizes): C locals declared by ``decls`` (in the
    # helpers too, which then take ``dyn``); ``tiles`` and ``nblocks`` run-time, ``block`` the most
    # tiles a block holds, the serial path where ``serial_if`` holds (too little work for threads).
    dyn: bool = False
    decls: Decls = ()
    serial_if: str = ""


@dataclass(frozen=True)
class _Blocks:
    """How the kernel blocks a conv's tiles and lays out its scratch."""

    g: WinogradGeometry

    @property
    def a2(self) -> int:
        return (self.g.tile + 2) ** 2

    @property
    def tiles(self) -> int:
        return self.g.batch * self.g.th * self.g.tw

    @property
    def panels(self) -> int:
        return -(-self.g.m // PANEL)

    @property
    def cs(self) -> int:
        return max(self.g.c, PANEL)

    @property
    def vt(self) -> int:
        return self.a2 * self.cs + SKEW

    @property
    def st(self) -> int:
        return self.a2 * self.panels * PANEL + SKEW

    @property
    def block(self) -> int:
        return min(self.tiles, self.most)

    @property
    def nblocks(self) -> int:
        return -(-self.tiles // self.block)

    @property
    def slots(self) -> int:
        return max(1, min(MAX_SLOTS, self.tiles // MIN_SHARE))

    @property
    def weights_nbytes(self) -> int:
        return 4 * self.a2 * self.g.c * self.panels * PANEL

    @property
    def min_chunk(self) -> int:
        return min(self.block, MIN_CHUNK if self.weights_nbytes <= BIG_WEIGHTS else MIN_BLOCK)

    @property
    def serial(self) -> bool:
        return 2 * self.a2 * self.tiles * self.g.c * self.g.m < PARALLEL_MIN_WORK


    @property
    def most(self) -> int:
        """Most tiles per block for any number of tiles (``block`` is this capped by the tiles)."""
        fit = L2_BUDGET // (4 * (self.vt + self.st))
        return max(MIN_BLOCK, fit // BLOCK_ROUND * BLOCK_ROUND)

    def scratch_nbytes(self) -> int | Expr:
        """A slot per thread that runs its share alone, one when they share the blocks or run serially."""
        if isinstance(self.tiles, Expr):  # run-time tiles: as many slots as they allow, full blocks
            slots = max_(1, min_(MAX_SLOTS, self.tiles // MIN_SHARE))
            return 4 * slots * self.most * (self.vt + self.st)
        return 4 * (1 if self.serial else self.slots) * self.block * (self.vt + self.st)


def _blocks(node: Node) -> _Blocks | None:
    g = WinogradGeometry.from_node(node, "NHWC", is_dynamic(node))
    return None if g is None else _Blocks(g)


class WinogradNhwcKernel(CKernel):
    kinds: tuple[str, ...] = (WINOGRAD_CONV_NHWC,)
    dynamic = True  # run-time batch and spatial sizes: tiles, blocks and threads decided in C

    def supports(self, node: Node) -> bool:
        b = _blocks(node)
        return b is not None and epilogue_operands_ok(node, b.g.m)

    def scratch_nbytes(self, node: Node) -> int | Expr:  # type: ignore[override]
        return claimed(_blocks(node), node).scratch_nbytes()

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        b = claimed(_blocks(node), node)
        if is_dynamic(node):
            e, args, step_params = dynamic_conv_operands(step, "u", b.scratch_nbytes())
        else:
            e, args, step_params = conv_operands(step, "u", b.scratch_nbytes())  # type: ignore[arg-type]
        vw = target.vector_bytes // 4
        wide = target.vector_registers >= 32
        nv = min(2, PANEL // vw)  # SSE: two of a panel's four vectors per tile, 6 rows
        mr = min(12, (24 if wide else 12) // nv)
        ctx = WinogradNhwcContext(
            params=step_params,
            e=e,
            vw=vw,
            mr=mr,
            nv=nv,
            nr=nv * vw,
            spread=b.weights_nbytes > SPREAD_WEIGHTS,
            bt=transform_program(MATRICES[b.g.tile][0]),
            at=transform_program(MATRICES[b.g.tile][2]),
            cs=b.cs,
            panels=b.panels,
            vt=b.vt,
            st=b.st,
            min_share=MIN_SHARE,
            **(_dynamic_fields(b, step.symbols) if is_dynamic(node) else _static_fields(b)),
        )
        return StepCode("c/winograd_nhwc.c.j2", ctx, tuple(args))


def _static_fields(b: _Blocks) -> dict[str, Any]:
    return {"g": b.g, "tiles": b.tiles, "block": b.block, "nblocks": b.nblocks,
            "slot": b.block * (b.vt + b.st), "slots": b.slots, "min_chunk": b.min_chunk, "serial": b.serial,
            "th": b.g.th, "tw": b.g.tw}


def _dynamic_fields(b: _Blocks, symbols: tuple[str, ...]) -> dict[str, Any]:
    """Run-time tiles: the block size is the most for any tile count (a block of fewer tiles than
    that is the same work, as in ``_range``), every thread count up to MAX_SLOTS is checked at run
    time against the tiles, and the serial path is taken in C."""
    g, decls = dynamic_geometry(b.g, symbols)
    tile = g.tile
    most = b.most
    decls += (("TH", f"(({g.oh} + {tile - 1}) / {tile})"), ("TW", f"(({g.ow} + {tile - 1}) / {tile})"),
              ("TILES", f"({g.batch} * TH * TW)"), ("NBLK", f"((TILES + {most - 1}) / {most})"))  # fmt: skip
    chunk = min(most, MIN_CHUNK if b.weights_nbytes <= BIG_WEIGHTS else MIN_BLOCK)
    return {"g": g, "tiles": CDim("TILES"), "block": most, "nblocks": CDim("NBLK"),
            "slot": most * (b.vt + b.st), "slots": MAX_SLOTS, "min_chunk": chunk, "serial": False,
            "th": CDim("TH"), "tw": CDim("TW"), "dyn": True, "decls": decls,
            "serial_if": f"{2 * b.a2 * b.g.c * b.g.m}L * TILES < {PARALLEL_MIN_WORK}"}



KERNELS = (WinogradNhwcKernel(),)
