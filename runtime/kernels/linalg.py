"""Matrix-product reference kernels: Gemm and MatMul (``gemm`` is shared with FusedGemm).

Products run in the inputs' dtype through ``xp.matmul`` (BLAS sgemm for float32), as ONNX
runtimes do.
"""

from __future__ import annotations

from typing import Any

from runtime.kernels.common import fill_optional
from runtime.kernels.common import finish
from runtime.kernels.registry import OutputSpec
from runtime.kernels.registry import register

__all__ = ["gemm"]


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


@register("Gemm")
def gemm_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """Gemm: A, B, C? -> Y (C broadcast to Y's shape)."""
    a, b, c = fill_optional("Gemm", inputs, 3)
    return finish(xp, "Gemm", [gemm(xp, a, b, c, attrs)], outputs)


@register("MatMul")
def matmul_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """MatMul with numpy semantics (1-D operands, batch broadcasting)."""
    return finish(xp, "MatMul", [xp.matmul(inputs[0], inputs[1])], outputs)
