"""Channels-last (NHWC) ops of the layout pass and their weight layouts; reference kernels.

The layout pass (``compiler/passes/layout_nhwc.py``, optimization level 3, CPU target) keeps the
activations of a region of convolutions, pools and elementwise ops in NHWC, with Transposes only
at the region's edges. Inside, these ops read and write ``(N, H, W, C)`` tensors:

- ``onnx_aot.ConvNhwc(X, W, B?, Z?)``: FusedConv's attributes and epilogue (bias, residual Z with
  the output's shape, activation); ``W`` packed by :func:`pack_conv_weights`.
- ``onnx_aot.WinogradConvNhwc(X, U, B?, Z?)``: WinogradConv's, ``U`` packed by
  :func:`pack_winograd_weights`.
- ``onnx_aot.MaxPoolNhwc(X)``, ``onnx_aot.AveragePoolNhwc(X)``: MaxPool (one output) / AveragePool
  with the ONNX attributes; ``onnx_aot.GlobalAveragePoolNhwc(X)`` -> (N, 1, 1, C);
  ``onnx_aot.LRNNhwc(X)``: LRN across the last axis.

Weights are packed ahead of time into panels of ``PANEL`` output channels, the column width of
the C kernels' register tile on every x86 level (2 AVX2 vectors, 1 AVX-512 vector, 4 SSE ones),
so one weights.bin serves every CPU build of an artifact. The last panel is zero-padded. Each
reference kernel here is the NCHW kernel between two transposes, so the C kernels are checked
against the same numbers as their NCHW counterparts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from runtime.contract import AVERAGE_POOL_NHWC
from runtime.contract import CONV_NHWC
from runtime.contract import GLOBAL_AVERAGE_POOL_NHWC
from runtime.contract import LRN_NHWC
from runtime.contract import MAX_POOL_NHWC
from runtime.contract import WINOGRAD_CONV_NHWC
from runtime.contract import op_name
from runtime.errors import RuntimeKernelError
from runtime.kernels.amx_pack import round_bf16
from runtime.kernels.amx_pack import unpack_amx_conv
from runtime.kernels.common import fill_optional
from runtime.kernels.common import finish
from runtime.kernels.conv import conv
from runtime.kernels.fused import conv_epilogue
from runtime.kernels.normalization import lrn_kernel
from runtime.kernels.pool import average_pool
from runtime.kernels.pool import max_pool
from runtime.kernels.registry import Kernel
from runtime.kernels.registry import OutputSpec
from runtime.kernels.registry import register
from runtime.kernels.winograd import winograd_conv

__all__ = [
    "PANEL",
    "TO_NCHW",
    "TO_NHWC",
    "is_depthwise",
    "pack_conv_weights",
    "pack_winograd_weights",
    "unpack_conv_weights",
    "unpack_winograd_weights",
]

PANEL = 16
TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)


def _panels(m: int) -> int:
    return -(-m // PANEL)


def is_depthwise(w_shape: tuple[int, ...], group: int) -> bool:
    """Whether ONNX conv weights of ``w_shape`` with ``group`` groups are depthwise: one input
    and one output channel per group (M = C = group)."""
    return group > 1 and int(w_shape[0]) == group and int(w_shape[1]) == 1


def pack_conv_weights(w: np.ndarray, group: int) -> np.ndarray:
    """(M, C/g, KH, KW) ONNX weights -> (g, P, KH, KW, C/g, PANEL), P = ceil(M/g / PANEL).

    ``packed[gi, p, kh, kw, c, j]`` is the weight of output channel ``gi * M/g + p * PANEL + j``
    (zero past M/g), so a panel is read front to back by the tile's k loop (k = (kh, kw, c)).
    Depthwise weights (:func:`is_depthwise`) are (KH, KW, M) instead: a vector of channels per tap.
    """
    m, cg, kh, kw = (int(d) for d in w.shape)
    if group < 1 or m % group:
        raise ValueError(f"{m} output channels do not split into {group} groups")
    if is_depthwise(w.shape, group):
        return np.ascontiguousarray(w.reshape(m, kh, kw).transpose(1, 2, 0))
    mg = m // group
    p = _panels(mg)
    padded = np.zeros((group, p * PANEL, cg, kh, kw), dtype=w.dtype)
    padded[:, :mg] = w.reshape(group, mg, cg, kh, kw)
    panels = padded.reshape(group, p, PANEL, cg, kh, kw)
    return np.ascontiguousarray(panels.transpose(0, 1, 4, 5, 3, 2))


def unpack_conv_weights(packed: Any, m: int) -> Any:
    """The inverse of :func:`pack_conv_weights` for ``m`` output channels (numpy or cupy)."""
    if packed.ndim == 3:
        kh, kw, channels = (int(d) for d in packed.shape)
        if channels != m:
            raise RuntimeKernelError(
                f"ConvNhwc: depthwise weights {tuple(packed.shape)} do not hold {m} channels"
            )
        return packed.transpose(2, 0, 1).reshape(m, 1, kh, kw)
    group, p, kh, kw, cg, panel = (int(d) for d in packed.shape)
    if panel != PANEL or m % group or _panels(m // group) != p:
        raise RuntimeKernelError(f"ConvNhwc: packed weights {tuple(packed.shape)} do not hold {m} channels")
    mg = m // group
    w = packed.transpose(0, 1, 5, 4, 2, 3).reshape(group, p * PANEL, cg, kh, kw)[:, :mg]
    return w.reshape(m, cg, kh, kw)


def pack_winograd_weights(u: np.ndarray) -> np.ndarray:
    """(a^2, M, C) transformed weights (``use_winograd``) -> (a^2, P, C, PANEL), P = ceil(M / PANEL)."""
    aa, m, c = (int(d) for d in u.shape)
    p = _panels(m)
    padded = np.zeros((aa, p * PANEL, c), dtype=u.dtype)
    padded[:, :m] = u
    return np.ascontiguousarray(padded.reshape(aa, p, PANEL, c).transpose(0, 1, 3, 2))


def unpack_winograd_weights(packed: Any, m: int) -> Any:
    """The inverse of :func:`pack_winograd_weights` for ``m`` output channels (numpy or cupy)."""
    aa, p, c, panel = (int(d) for d in packed.shape)
    if panel != PANEL or _panels(m) != p:
        raise RuntimeKernelError(
            f"WinogradConvNhwc: packed weights {tuple(packed.shape)} do not hold {m} channels"
        )
    return packed.transpose(0, 1, 3, 2).reshape(aa, p * PANEL, c)[:, :m]


def _nchw(xp: Any, x: Any, kind: str) -> Any:
    if x.ndim != 4:
        raise RuntimeKernelError(f"{kind}: expected a 4-D NHWC input, got shape {tuple(x.shape)}")
    return xp.ascontiguousarray(x.transpose(TO_NCHW))


def _nhwc(xp: Any, y: Any) -> Any:
    return xp.ascontiguousarray(y.transpose(TO_NHWC))


def prescale(xp: Any, x: Any, s: Any, t: Any, relu: int) -> Any:
    """ConvNhwc's X * S + T per channel (the last axis), then Relu where ``relu``, as the C kernel
    computes it (one rounding: the product of two float32 is exact in float64)."""
    y = (x.astype(xp.float64) * s.reshape(-1).astype(xp.float64) + t.reshape(-1)).astype(xp.float32)
    return xp.maximum(y, xp.float32(0)) if relu else y


def _conv_nhwc_kernel(
    kind: str, unpack: Callable[[Any, int], Any], conv_nchw: Callable[[Any, Any, Any, dict[str, Any]], Any]
) -> Kernel:
    """The kernel of ``kind`` (X, W, B?, Z?, S?, T?): act(conv(pre(X), W) + B + Z) in NHWC (pre: X * S
    + T, Relu where pre_relu, when S is given; :func:`prescale`), the packed
    weights unpacked by ``unpack(packed, M)`` for the NCHW ``conv_nchw(xp, x, w, attrs)`` between two
    transposes, then the fused epilogue (:func:`conv_epilogue`) on the NHWC result."""

    def kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
        x, packed, b, z, s, t = fill_optional(kind, inputs, 6)
        x = x if s is None else prescale(xp, x, s, t, int(attrs.get("pre_relu", 0)))
        if packed.dtype == xp.uint16:  # --precision bf16: bf16 products (runtime/kernels/amx_pack.py)
            kh, kw = (int(d) for d in attrs["kernel_shape"])
            x, w = round_bf16(xp, x), unpack_amx_conv(xp, packed, int(x.shape[3]), int(outputs[0][0][3]),
                                                      (kh, kw))
        else:
            w = unpack(packed, int(outputs[0][0][3]))
        y = _nhwc(xp, conv_nchw(xp, _nchw(xp, x, op_name(kind)), w, attrs))
        y = conv_epilogue(xp, y, b, z, attrs, channel_axis=3)
        return finish(xp, kind, [y], outputs)

    return kernel


# FusedConv with W packed by pack_conv_weights; WinogradConv with U packed by pack_winograd_weights.
register(CONV_NHWC)(
    _conv_nhwc_kernel(CONV_NHWC, unpack_conv_weights, lambda xp, x, w, attrs: conv(xp, x, w, None, attrs))
)
register(WINOGRAD_CONV_NHWC)(
    _conv_nhwc_kernel(
        WINOGRAD_CONV_NHWC,
        unpack_winograd_weights,
        lambda xp, x, u, attrs: winograd_conv(xp, x, xp.ascontiguousarray(u), attrs),
    )
)


def _pool_nhwc_kernel(kind: str, pool: Callable[[Any, Any, dict[str, Any]], Any]) -> Kernel:
    """The kernel of ``kind``: the NCHW ``pool`` over the H and W axes of an NHWC
    tensor, between two transposes."""

    def kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
        y = pool(xp, _nchw(xp, inputs[0], op_name(kind)), attrs)
        return finish(xp, kind, [_nhwc(xp, y)], outputs)

    return kernel


# MaxPool (one output) and AveragePool over the H and W axes of an NHWC tensor.
register(MAX_POOL_NHWC)(_pool_nhwc_kernel(MAX_POOL_NHWC, max_pool))
register(AVERAGE_POOL_NHWC)(_pool_nhwc_kernel(AVERAGE_POOL_NHWC, average_pool))


@register(GLOBAL_AVERAGE_POOL_NHWC)
def global_average_pool_nhwc_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """Mean over H and W of an NHWC tensor -> (N, 1, 1, C)."""
    x = inputs[0]
    if x.ndim != 4:
        raise RuntimeKernelError(f"GlobalAveragePoolNhwc: expected a 4-D input, got {tuple(x.shape)}")
    return finish(xp, GLOBAL_AVERAGE_POOL_NHWC, [xp.mean(x, axis=(1, 2), keepdims=True)], outputs)


@register(LRN_NHWC)
def lrn_nhwc_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """LRN across the channels (last axis) of an NHWC tensor."""
    shape, dtype = outputs[0]
    nchw_shape = tuple(int(shape[i]) for i in TO_NCHW)
    (y,) = lrn_kernel(xp, [_nchw(xp, inputs[0], op_name(LRN_NHWC))], attrs, [(nchw_shape, dtype)])
    return finish(xp, LRN_NHWC, [_nhwc(xp, y)], outputs)
