"""Matrix-product reference kernels: Gemm and MatMul (``gemm`` is shared with FusedGemm).

Products run in the inputs' dtype through ``xp.matmul`` (BLAS sgemm for float32), as ONNX
runtimes do.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from runtime.errors import RuntimeKernelError
from runtime.kernels.common import fill_optional
from runtime.kernels.common import finish
from runtime.kernels.registry import OutputSpec
from runtime.kernels.registry import register

__all__ = ["B_PANEL", "gemm", "pack_b_panels", "unpack_b_panels"]

# Columns per panel of a Gemm's constant B packed ahead of time (onnx_aot.PackedGemm): every
# target's register tile is 4, 8, 16, 32 or 64 columns wide, so one panel serves them all.
B_PANEL = 64


def gemm(xp: Any, a: Any, b: Any, c: Any | None, attrs: dict[str, Any]) -> Any:
    """alpha * op(A) @ op(B) + beta * C, op transposing when transA / transB is set."""
    if int(attrs["transA"]):
        a = a.T
    if int(attrs["transB"]):
        b = b.T
    y = xp.matmul(a, b)
    alpha, beta = attrs["alpha"], attrs["beta"]
    if alpha != 1.0:
        y = y * alpha
    if c is not None and beta != 0.0:
        y = y + (c if beta == 1.0 else c * beta)
    return y


def pack_b_panels(b: np.ndarray) -> np.ndarray:
    """(K, N) -> (P, K, B_PANEL), P = ceil(N / B_PANEL): column panels, zero-padded, each row of a
    panel contiguous (what the C tile loads along the output columns)."""
    k, n = (int(d) for d in b.shape)
    p = -(-n // B_PANEL)
    padded = np.zeros((k, p * B_PANEL), dtype=b.dtype)
    padded[:, :n] = b
    return np.ascontiguousarray(padded.reshape(k, p, B_PANEL).transpose(1, 0, 2))


def unpack_b_panels(xp: Any, packed: Any, n: int) -> Any:
    """The inverse of :func:`pack_b_panels` for ``n`` columns (numpy or cupy)."""
    if packed.ndim != 3 or packed.shape[2] != B_PANEL or packed.shape[0] != -(-n // B_PANEL):
        raise RuntimeKernelError(f"PackedGemm: packed B {tuple(packed.shape)} does not hold {n} columns")
    p, k, _ = (int(d) for d in packed.shape)
    return xp.ascontiguousarray(packed.transpose(1, 0, 2).reshape(k, p * B_PANEL)[:, :n])


@register("Gemm")
def gemm_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """Gemm: A, B, C? -> Y (C broadcast to Y's shape)."""
    a, b, c = fill_optional("Gemm", inputs, 3)
    return finish(xp, "Gemm", [gemm(xp, a, b, c, attrs)], outputs)


@register("MatMul")
def matmul_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """MatMul with numpy semantics (1-D operands, batch broadcasting)."""
    return finish(xp, "MatMul", [xp.matmul(inputs[0], inputs[1])], outputs)
