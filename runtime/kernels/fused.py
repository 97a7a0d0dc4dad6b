"""Reference kernels for onnx-aot's own fused ops: FusedConv, FusedGemm, FusedElementwise,
PackedGemm and MultiHeadAttention.

Each is the composition of the plain kernels' functions it replaces, so the reference provider
checks a fusion pass by running the same numbers both ways. The activation epilogue (""/Relu/
Clip/LeakyRelu with act_min / act_max / act_alpha, Silu) maps onto the elementwise table; a fused conv's
whole epilogue (bias, residual, activation: :func:`conv_epilogue`) is shared with WinogradConv and
the NHWC convs.
"""

from __future__ import annotations

from typing import Any

from runtime.contract import FUSED_CONV
from runtime.contract import FUSED_ELEMENTWISE
from runtime.contract import FUSED_GEMM
from runtime.contract import MULTI_HEAD_ATTENTION
from runtime.contract import PACKED_GEMM
from runtime.errors import RuntimeKernelError
from runtime.errors import UnsupportedOpError
from runtime.kernels.amx_pack import round_bf16
from runtime.kernels.amx_pack import unpack_amx_bf16
from runtime.kernels.common import fill_optional
from runtime.kernels.common import finish
from runtime.kernels.conv import conv
from runtime.kernels.elementwise import apply_elementwise
from runtime.kernels.linalg import gemm
from runtime.kernels.linalg import unpack_b_panels
from runtime.kernels.normalization import softmax
from runtime.kernels.registry import OutputSpec
from runtime.kernels.registry import register

__all__ = ["apply_activation", "conv_epilogue", "run_program"]


def apply_activation(xp: Any, y: Any, attrs: dict[str, Any]) -> Any:
    """The fused epilogue named by ``attrs["activation"]`` applied to ``y``."""
    activation = attrs["activation"]
    if activation == "":
        return y
    if activation == "Relu":
        return apply_elementwise(xp, "Relu", [y], {})
    if activation == "Clip":
        return apply_elementwise(xp, "Clip", [y], {"min": attrs["act_min"], "max": attrs["act_max"]})
    if activation == "LeakyRelu":
        return apply_elementwise(xp, "LeakyRelu", [y], {"alpha": attrs["act_alpha"]})
    if activation == "Silu":
        return y * apply_elementwise(xp, "Sigmoid", [y], {})
    raise UnsupportedOpError(f"fused activation {activation!r} is not supported")


def conv_epilogue(
    xp: Any, y: Any, b: Any | None, z: Any | None, attrs: dict[str, Any], *, channel_axis: int = 1
) -> Any:
    """act(y + B + Z) of a fused conv's output ``y``: the bias ``b`` (M,) along ``channel_axis``, the
    residual ``z`` with y's shape, each when present, then the activation of ``attrs``."""
    if b is not None:
        y = y + b.reshape([-1 if axis == channel_axis else 1 for axis in range(y.ndim)])
    if z is not None:
        y = y + z
    return apply_activation(xp, y, attrs)


@register(FUSED_CONV)
def fused_conv_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """act(conv(X, W) + B + Z): Z, when present, is a residual with the output's shape."""
    x, w, b, z = fill_optional(FUSED_CONV, inputs, 4)
    y = conv_epilogue(xp, conv(xp, x, w, None, attrs), b, z, attrs)
    return finish(xp, FUSED_CONV, [y], outputs)


@register(FUSED_GEMM)
def fused_gemm_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """act(alpha * op(A) @ op(B) + beta * C)."""
    a, b, c = fill_optional(FUSED_GEMM, inputs, 3)
    y = apply_activation(xp, gemm(xp, a, b, c, attrs), attrs)
    return finish(xp, FUSED_GEMM, [y], outputs)


@register(PACKED_GEMM)
def packed_gemm_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """FusedGemm (transA 0, transB 0) with B packed ahead of time in column panels (attribute
    ``n``: B's columns; ``runtime/kernels/linalg.py: pack_b_panels``)."""
    a, bp, c = fill_optional(PACKED_GEMM, inputs, 3)
    n = int(attrs["n"])  # a bf16 artifact's B: uint16 codes in the AMX layout (runtime/kernels/amx_pack.py)
    if bp.dtype == xp.uint16:
        a, b = round_bf16(xp, a), unpack_amx_bf16(xp, bp, int(a.shape[-1]), n)
    else:
        b = unpack_b_panels(xp, bp, n)
    y = apply_activation(xp, gemm(xp, a, b, c, {**attrs, "transA": 0, "transB": 0}), attrs)
    return finish(xp, PACKED_GEMM, [y], outputs)


@register(MULTI_HEAD_ATTENTION)
def multi_head_attention_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """softmax(Q K^T * scale + mask) V per batch and head, with Q, K, V and the output in the
    layout the heads were split into, (batch, seq, heads, head size), not transposed; the mask
    broadcasts to (batch, heads, query, key)."""
    q, k, v, mask = fill_optional(MULTI_HEAD_ATTENTION, inputs, 4)
    scores = xp.matmul(xp.transpose(q, (0, 2, 1, 3)), xp.transpose(k, (0, 2, 3, 1)))
    scores = scores * xp.asarray(attrs["scale"], dtype=scores.dtype)
    if mask is not None:
        scores = scores + mask
    context = xp.matmul(softmax(xp, scores, -1), xp.transpose(v, (0, 2, 1, 3)))
    return finish(xp, MULTI_HEAD_ATTENTION, [xp.transpose(context, (0, 2, 1, 3))], outputs)


def _resolve(ref: Any, inputs: list[Any], results: list[Any]) -> Any:
    """The array a program reference ``"i<k>"`` (input k) or ``"t<k>"`` (instruction k) names."""
    if isinstance(ref, str) and len(ref) > 1 and ref[0] in "it" and ref[1:].isdigit():
        k = int(ref[1:])
        pool = inputs if ref[0] == "i" else results
        if k < len(pool):
            return pool[k]
    raise RuntimeKernelError(
        f"{FUSED_ELEMENTWISE}: bad reference {ref!r} ({len(inputs)} inputs,"
        f" {len(results)} earlier instructions)"
    )


def run_program(xp: Any, program: list[dict[str, Any]], inputs: list[Any]) -> Any:
    """Evaluate a FusedElementwise ``program``; the last instruction's result is returned."""
    if not program:
        raise RuntimeKernelError(f"{FUSED_ELEMENTWISE}: empty program")
    results: list[Any] = []
    for instruction in program:
        args = [_resolve(ref, inputs, results) for ref in instruction["args"]]
        results.append(apply_elementwise(xp, instruction["op"], args, instruction["attrs"]))
    return results[-1]


@register(FUSED_ELEMENTWISE)
def fused_elementwise_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """Run ``program`` over X0..Xn-1, broadcasting to the output shape."""
    y = run_program(xp, attrs["program"], inputs)
    return finish(xp, FUSED_ELEMENTWISE, [y], outputs, broadcast=True)
