"""A ``--precision bf16`` PackedGemm: B as bfloat16 codes in AMX-BF16's pair layout.

``compiler/passes/pack_gemm_weights.py`` stores such a B (uint16, ``runtime/kernels/amx_pack.py``)
for a Gemm with static rows. The kernel (``templates/c/gemm_amx.c.j2``) takes one of two paths at
run time: where ``onnx_aot_amx_usable(ONNX_AOT_AMX_BF16)`` holds, A is rounded to bfloat16 (to
nearest even) into scratch, rows padded to 32 and k to the pack's, and each 32 x 32 block of C is
four fp32 AMX tiles summed over ``tdpbf16ps`` of A and B tiles, then the Gemm's epilogue (alpha,
bias, activation); on AVX512_BF16 without AMX, where its dot product measures faster than fp32's FMA, the same
blocks by ``vdpbf16ps`` (``templates/c/gemm_dpbf16.c.j2``); elsewhere (no AMX, or
``$ONNX_AOT_NO_AMX``) the fp32 register tile reads the pack's bf16 pairs as they are, each
widened in registers (a shift or a mask, ``gemm_tile.c.j2``'s ``pairs``), A in fp32. So one
artifact runs on every CPU, at its fp32 speed where it has no bf16 unit, with half the weight bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.ir.graph import Node
from runtime.contract import PACKED_GEMM
from runtime.kernels.amx_pack import AMX_K
from runtime.kernels.amx_pack import amx_pack_shape
from runtime.kernels.linalg import B_PANEL

__all__ = ["AmxBf16", "amx_bf16", "bf16_packed", "bf16_scratch_nbytes", "AMX_BLOCK"]

AMX_BLOCK = 32  # rows and columns of C per block: 2 x 2 fp32 tiles of 16 x 16
# A B of at most this many bytes stays in L2 while a chunk's row blocks run over all its column
# blocks (rows outer: each block of A read once); a larger one is read once per chunk, column
# blocks outer (ResNet-50's 1x1 256 -> 128 at 56x56: 0.36 ms columns outer, A 1.6 MB re-read)
ROWS_OUTER_MAX_B = 512 * 1024


@dataclass(frozen=True)
class AmxBf16:
    """The AMX path's sizes: A's rows padded to AMX_BLOCK (``mp``), k to AMX_K (``kp``)."""

    mp: int
    kp: int
    mblocks: int  # row blocks of AMX_BLOCK
    nblocks: int  # column blocks of AMX_BLOCK holding at least one of the n columns
    panel: int  # uint16 codes per panel of B_PANEL columns (kp / 2 pair rows of B_PANEL pairs)
    rows_outer: bool  # blocks ordered row block first (B fits ROWS_OUTER_MAX_B)


def bf16_packed(node: Node) -> bool:
    """``node`` is a PackedGemm whose B is the uint16 AMX pack of a static-rows A (every other
    operand float32)."""
    a, b, y = node.input(0), node.input(1), node.outputs[0]
    if node.kind != PACKED_GEMM or a is None or b is None or b.dtype != np.uint16 or b.shape is None:
        return False
    if a.shape is None or len(a.shape) != 2 or not all(isinstance(d, int) for d in a.shape):
        return False
    others = [v for v in (*node.inputs, *node.outputs) if v is not None and v is not b]
    n = int(node.attrs.get("n", -1))
    return (all(v.dtype == np.float32 and v.shape is not None for v in others)
            and tuple(b.shape) == amx_pack_shape(int(a.shape[1]), n) and y.shape == (a.shape[0], n))


def amx_bf16(m: int, n: int, k: int) -> AmxBf16:
    mp = -(-m // AMX_BLOCK) * AMX_BLOCK
    kp = -(-k // AMX_K) * AMX_K
    panel = kp * B_PANEL
    return AmxBf16(mp=mp, kp=kp, mblocks=mp // AMX_BLOCK, nblocks=-(-n // AMX_BLOCK), panel=panel,
                   rows_outer=2 * panel * -(-n // B_PANEL) <= ROWS_OUTER_MAX_B)


def bf16_scratch_nbytes(m: int, n: int, k: int, a_blocks: int) -> int:
    """The bf16 paths' rounded A, or the fallback's A blocks (``a_blocks`` bytes: the fp32 path's
    k-major copy of A, or a conv's fp32 windows), whichever is larger."""
    amx = amx_bf16(m, n, k)
    return max(2 * amx.mp * amx.kp, a_blocks)
