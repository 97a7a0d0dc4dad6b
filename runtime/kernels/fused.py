"""Reference kernels for onnx-aot's own fused ops: FusedConv, WinogradConv, FusedGemm, FusedElementwise.

Each is the composition of the plain kernels' functions it replaces, so the reference provider
checks a fusion pass by running the same numbers both ways. The activation epilogue (""/Relu/
Clip/LeakyRelu with act_min / act_max / act_alpha) maps onto the elementwise table.
"""

from __future__ import annotations

from typing import Any

from runtime.errors import RuntimeKernelError, UnsupportedOpError
from runtime.kernels.common import finish
from runtime.kernels.conv import conv
from runtime.kernels.elementwise import apply_elementwise
from runtime.kernels.linalg import gemm
from runtime.kernels.registry import OutputSpec, register

__all__ = ["apply_activation", "run_program", "winograd_conv"]


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
    raise UnsupportedOpError(f"fused activation {activation!r} is not supported")


@register("onnx_aot.FusedConv")
def fused_conv_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """act(conv(X, W) + B + Z): Z, when present, is a residual with the output's shape."""
    x, w, *rest = inputs
    b = rest[0] if len(rest) > 0 else None
    z = rest[1] if len(rest) > 1 else None
    y = conv(xp, x, w, b, attrs)
    if z is not None:
        y = y + z
    return finish(xp, "onnx_aot.FusedConv", [apply_activation(xp, y, attrs)], outputs)


# Winograd F(2x2, 3x3): input transform B^T d B, output transform A^T m A (Lavin & Gray 2015).
_BT = ((1.0, 0.0, -1.0, 0.0), (0.0, 1.0, 1.0, 0.0), (0.0, -1.0, 1.0, 0.0), (0.0, 1.0, 0.0, -1.0))
_AT = ((1.0, 1.0, 1.0, 0.0), (0.0, 1.0, -1.0, -1.0))


def winograd_conv(xp: Any, x: Any, u: Any, attrs: dict[str, Any]) -> Any:
    """The 3x3, stride-1 convolution of ``x`` (N, C, H, W) with transformed weights ``u`` (16, M, C).

    Every 2x2 block of outputs is ``A^T [sum_c U_c * (B^T d_c B)] A`` over its 4x4 input patches
    ``d_c`` (zero outside the padded input), as the C kernel computes it.
    """
    n, c, h, w = (int(d) for d in x.shape)
    m = int(u.shape[1])
    pt, pl, pb, pr = (int(p) for p in attrs["pads"])
    oh, ow = h + pt + pb - 2, w + pl + pr - 2
    if u.shape != (16, m, c) or oh < 1 or ow < 1:
        raise RuntimeKernelError(
            f"WinogradConv: X {tuple(x.shape)}, U {tuple(u.shape)}, pads {attrs['pads']}"
        )
    th, tw = -(-oh // 2), -(-ow // 2)
    padded = xp.zeros((n, c, 2 * th + 2, 2 * tw + 2), dtype=x.dtype)
    padded[:, :, pt : pt + h, pl : pl + w] = x
    d = xp.stack([xp.stack([padded[:, :, i : i + 2 * th : 2, j : j + 2 * tw : 2] for j in range(4)], -1)
                  for i in range(4)], -2)  # (n, c, th, tw, 4, 4)
    bt = xp.asarray(_BT, dtype=x.dtype)
    at = xp.asarray(_AT, dtype=x.dtype)
    v = xp.einsum("ai,ncyxij,bj->abncyx", bt, d, bt)
    prod = xp.einsum("abmc,abncyx->abnmyx", u.reshape(4, 4, m, c), v)
    y = xp.einsum("pa,abnmyx,qb->nmypxq", at, prod, at).reshape(n, m, 2 * th, 2 * tw)
    return y[:, :, :oh, :ow]


@register("onnx_aot.WinogradConv")
def winograd_conv_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """FusedConv of a 3x3, stride-1 conv whose weights are Winograd-transformed: act(conv + B + Z)."""
    x, u, *rest = inputs
    b = rest[0] if len(rest) > 0 else None
    z = rest[1] if len(rest) > 1 else None
    y = winograd_conv(xp, x, u, attrs)
    if b is not None:
        y = y + b.reshape(1, -1, 1, 1)
    if z is not None:
        y = y + z
    return finish(xp, "onnx_aot.WinogradConv", [apply_activation(xp, y, attrs)], outputs)


@register("onnx_aot.FusedGemm")
def fused_gemm_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """act(alpha * op(A) @ op(B) + beta * C)."""
    a, b, *rest = inputs
    c = rest[0] if rest else None
    y = apply_activation(xp, gemm(xp, a, b, c, attrs), attrs)
    return finish(xp, "onnx_aot.FusedGemm", [y], outputs)


def _resolve(ref: Any, inputs: list[Any], results: list[Any]) -> Any:
    """The array a program reference ``"i<k>"`` (input k) or ``"t<k>"`` (instruction k) names."""
    if isinstance(ref, str) and len(ref) > 1 and ref[0] in "it" and ref[1:].isdigit():
        k = int(ref[1:])
        pool = inputs if ref[0] == "i" else results
        if k < len(pool):
            return pool[k]
    raise RuntimeKernelError(
        f"onnx_aot.FusedElementwise: bad reference {ref!r} ({len(inputs)} inputs,"
        f" {len(results)} earlier instructions)"
    )


def run_program(xp: Any, program: list[dict[str, Any]], inputs: list[Any]) -> Any:
    """Evaluate a FusedElementwise ``program``; the last instruction's result is returned."""
    if not program:
        raise RuntimeKernelError("onnx_aot.FusedElementwise: empty program")
    results: list[Any] = []
    for instruction in program:
        args = [_resolve(ref, inputs, results) for ref in instruction["args"]]
        results.append(apply_elementwise(xp, instruction["op"], args, instruction["attrs"]))
    return results[-1]


@register("onnx_aot.FusedElementwise")
def fused_elementwise_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """Run ``program`` over X0..Xn-1, broadcasting to the output shape."""
    y = run_program(xp, attrs["program"], inputs)
    return finish(xp, "onnx_aot.FusedElementwise", [y], outputs, broadcast=True)
