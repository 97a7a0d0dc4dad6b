"""Convolution reference kernel: N-d (1-D, 2-D, 3-D), groups, strides, pads, dilations.

im2col by slicing: the padded input is copied, one kernel offset at a time, into a
(N, C * prod(kernel), prod(out)) column matrix, which one batched matmul per call multiplies
with the weights (groups become a batch axis). The convolutions of a ResNet-50 forward at batch 1
take about 0.5 s this way on a 2-core build machine. ``conv`` is shared with
``onnx_aot.FusedConv``.
"""

from __future__ import annotations

from typing import Any

from runtime.errors import RuntimeKernelError
from runtime.kernels.common import fill_optional
from runtime.kernels.common import finish
from runtime.kernels.common import pad_spatial
from runtime.kernels.common import prod
from runtime.kernels.common import window_slices
from runtime.kernels.registry import OutputSpec
from runtime.kernels.registry import register
from runtime.kernels.window import conv_out_size

__all__ = ["conv"]


def conv(xp: Any, x: Any, w: Any, b: Any | None, attrs: dict[str, Any]) -> Any:
    """ONNX Conv of ``x`` (N, C, *spatial) with ``w`` (M, C/group, *kernel) plus bias ``b``."""
    kernel_shape = [int(k) for k in attrs["kernel_shape"]]
    strides = [int(s) for s in attrs["strides"]]
    dilations = [int(d) for d in attrs["dilations"]]
    pads = [int(p) for p in attrs["pads"]]
    group = int(attrs["group"])
    nd = len(kernel_shape)
    begins, ends = pads[:nd], pads[nd:]
    n, c = int(x.shape[0]), int(x.shape[1])
    m = int(w.shape[0])
    if c % group or m % group or int(w.shape[1]) * group != c:
        raise RuntimeKernelError(f"Conv: X has {c} channels, W has shape {tuple(w.shape)}, group={group}")
    out_shape = [
        conv_out_size(int(size), k, s, d, bg, e)
        for size, k, s, d, bg, e in zip(
            x.shape[2:], kernel_shape, strides, dilations, begins, ends, strict=True
        )
    ]
    taps = prod(kernel_shape)
    pixels = prod(out_shape)
    if taps == 1 and all(s == 1 for s in strides) and not any(pads):
        cols = x.reshape(n, c, pixels)  # 1x1 convolution: X already is the column matrix
    else:
        padded = pad_spatial(xp, x, begins, ends, 0)
        cols = xp.empty((n, c, taps, *out_shape), dtype=x.dtype)
        for j, index in enumerate(window_slices(kernel_shape, strides, dilations, out_shape)):
            cols[:, :, j] = padded[index]
        cols = cols.reshape(n, c * taps, pixels)
    if group == 1:
        y = xp.matmul(w.reshape(m, c * taps), cols)
    else:
        per = (c // group) * taps
        weights = w.reshape(1, group, m // group, per)
        y = xp.matmul(weights, cols.reshape(n, group, per, pixels))
    y = y.reshape(n, m, *out_shape)
    if b is not None:
        y = y + b.reshape(1, m, *([1] * nd))
    return y


@register("Conv")
def conv_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """Conv: X, W, B? -> Y."""
    x, w, b = fill_optional("Conv", inputs, 3)
    return finish(xp, "Conv", [conv(xp, x, w, b, attrs)], outputs)
