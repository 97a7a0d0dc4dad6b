"""The AMX-BF16 layout of a ``--precision bf16`` PackedGemm's B (``templates/c/gemm_amx.c.j2``).

B (K, N) as bfloat16 codes (uint16, the high half of each float32) in ``P = ceil(N / B_PANEL)``
column panels of ``B_PANEL`` columns, each panel ``ceil(K / AMX_K) * AMX_K / 2`` rows of k pairs:
``pack[p, kp, j, e] = B[2 kp + e, p * B_PANEL + j]``, zeros past K and N. Sixteen pair rows of
sixteen columns are one AMX B tile (64 bytes a row, ``tdpbf16ps``'s operand); a panel row holds
four of them side by side. Such a Gemm multiplies bfloat16 by bfloat16 into float32 sums: the
reference kernel rounds A as the AMX path does (``round_bf16``); it and the C kernel's fallback (a
CPU without AMX-BF16, A kept float32) widen B back to float32: the codes shifted into the high
half, exactly.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from runtime.errors import RuntimeKernelError
from runtime.kernels.linalg import B_PANEL

__all__ = ["AMX_K", "pack_amx_bf16", "unpack_amx_bf16", "unpack_amx_conv", "amx_pack_shape", "round_bf16"]

AMX_K = 32  # k per A tile (16 rows of 32 bfloat16: 64 bytes) and per B tile (16 rows of pairs)


def amx_pack_shape(k: int, n: int) -> tuple[int, int, int, int]:
    """The packed shape of a (k, n) B."""
    return (-(-n // B_PANEL), -(-k // AMX_K) * AMX_K // 2, B_PANEL, 2)


def pack_amx_bf16(codes: np.ndarray) -> np.ndarray:
    """(K, N) bfloat16 codes (uint16) -> the packed uint16 array (see the module docstring)."""
    assert codes.dtype == np.uint16 and codes.ndim == 2
    k, n = (int(d) for d in codes.shape)
    p, kp, _, _ = amx_pack_shape(k, n)
    padded = np.zeros((2 * kp, p * B_PANEL), np.uint16)
    padded[:k, :n] = codes
    return np.ascontiguousarray(padded.reshape(kp, 2, p, B_PANEL).transpose(2, 0, 3, 1))


def unpack_amx_bf16(xp: Any, pack: Any, k: int, n: int) -> Any:
    """B (k, n) in float32 from its pack (numpy or cupy)."""
    if tuple(pack.shape) != amx_pack_shape(k, n) or pack.dtype != np.uint16:
        raise RuntimeKernelError(f"PackedGemm: bf16 pack {tuple(pack.shape)} {pack.dtype} does not hold a "
                                 f"{k} x {n} B (expected {amx_pack_shape(k, n)} uint16)")
    p, kp, _, _ = (int(d) for d in pack.shape)
    rows = pack.transpose(1, 3, 0, 2).reshape(2 * kp, p * B_PANEL)[:k, :n]
    return (rows.astype(xp.uint32) << 16).view(xp.float32)


def unpack_amx_conv(xp: Any, pack: Any, c: int, m: int, kernel: tuple[int, int]) -> Any:
    """A ConvNhwc's (M, C, KH, KW) float32 weights from the pack of its (KH * KW * C, M) matrix."""
    kh, kw = kernel
    return unpack_amx_bf16(xp, pack, kh * kw * c, m).reshape(kh, kw, c, m).transpose(3, 2, 0, 1)


def round_bf16(xp: Any, a: Any) -> Any:
    """float32 ``a`` rounded to bfloat16, to nearest even (NaN stays NaN), as float32: what the C
    kernel's AMX path does to A."""
    u = xp.ascontiguousarray(a, dtype=xp.float32).view(xp.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    rounded = (u + (0x7FFF + ((u >> 16) & 1))) & 0xFFFF0000
    return xp.where(nan, u | 0x00400000, rounded).astype(xp.uint32).view(xp.float32)
