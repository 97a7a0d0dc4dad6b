"""Winograd convolution F(m x m, 3 x 3): the transform matrices and the ``onnx_aot.WinogradConv``
reference kernel.

For output tiles of m x m pixels (m = 2 or 4) each input patch is a x a, a = m + 2. With the
weights transformed ahead of time, U = G g G^T (the compiler does it: ``use_winograd``), every
output tile is ``A^T [sum_c U_c * (B^T d_c B)] A``: a^2 products per tile and channel pair instead
of 9 m^2 (m = 2: 2.25x fewer, m = 4: 4x fewer). The matrices are Lavin & Gray's ("Fast
Algorithms for Convolutional Neural Networks", 2015), with interpolation points 0, +-1 (m = 2) and
0, +-1, +-2 (m = 4). The C kernel (templates/c/winograd.c.j2) computes exactly this algorithm;
here it is written against ``xp`` so it runs on numpy and cupy alike.
"""

from __future__ import annotations

from typing import Any

from runtime.contract import WINOGRAD_CONV
from runtime.errors import RuntimeKernelError
from runtime.kernels.common import fill_optional
from runtime.kernels.common import finish
from runtime.kernels.fused import conv_epilogue
from runtime.kernels.registry import OutputSpec
from runtime.kernels.registry import register
from runtime.kernels.window import conv_out_size

__all__ = ["MATRICES", "tile_of", "winograd_conv"]

Matrix = tuple[tuple[float, ...], ...]

# m -> (B^T: a x a, G: a x 3, A^T: m x a)
MATRICES: dict[int, tuple[Matrix, Matrix, Matrix]] = {
    2: (
        ((1.0, 0.0, -1.0, 0.0), (0.0, 1.0, 1.0, 0.0), (0.0, -1.0, 1.0, 0.0), (0.0, 1.0, 0.0, -1.0)),
        ((1.0, 0.0, 0.0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0.0, 0.0, 1.0)),
        ((1.0, 1.0, 1.0, 0.0), (0.0, 1.0, -1.0, -1.0)),
    ),
    4: (
        (
            (4.0, 0.0, -5.0, 0.0, 1.0, 0.0),
            (0.0, -4.0, -4.0, 1.0, 1.0, 0.0),
            (0.0, 4.0, -4.0, -1.0, 1.0, 0.0),
            (0.0, -2.0, -1.0, 2.0, 1.0, 0.0),
            (0.0, 2.0, -1.0, -2.0, 1.0, 0.0),
            (0.0, 4.0, 0.0, -5.0, 0.0, 1.0),
        ),
        (
            (1 / 4, 0.0, 0.0),
            (-1 / 6, -1 / 6, -1 / 6),
            (-1 / 6, 1 / 6, -1 / 6),
            (1 / 24, 1 / 12, 1 / 6),
            (1 / 24, -1 / 12, 1 / 6),
            (0.0, 0.0, 1.0),
        ),
        (
            (1.0, 1.0, 1.0, 1.0, 1.0, 0.0),
            (0.0, 1.0, -1.0, 2.0, -2.0, 0.0),
            (0.0, 1.0, 1.0, 4.0, 4.0, 0.0),
            (0.0, 1.0, -1.0, 8.0, -8.0, 1.0),
        ),
    ),
}


def tile_of(transformed_rows: int) -> int:
    """The output tile size m of transformed weights with ``(m + 2)^2`` rows."""
    for m in MATRICES:
        if (m + 2) ** 2 == transformed_rows:
            return m
    raise RuntimeKernelError(f"WinogradConv: {transformed_rows} transformed weight rows fit no tile size")


def winograd_conv(xp: Any, x: Any, u: Any, attrs: dict[str, Any]) -> Any:
    """The 3x3, stride-1 convolution of ``x`` (N, C, H, W) with transformed weights ``u`` (a^2, M, C)."""
    n, c, h, w = (int(d) for d in x.shape)
    m = tile_of(int(u.shape[0]))
    a = m + 2
    out_c = int(u.shape[1])
    pt, pl, pb, pr = (int(p) for p in attrs["pads"])
    oh, ow = conv_out_size(h, 3, 1, 1, pt, pb), conv_out_size(w, 3, 1, 1, pl, pr)
    if tuple(u.shape) != (a * a, out_c, c) or oh < 1 or ow < 1:
        raise RuntimeKernelError(
            f"WinogradConv: X {tuple(x.shape)}, U {tuple(u.shape)}, pads {attrs['pads']}"
        )
    th, tw = -(-oh // m), -(-ow // m)
    padded = xp.zeros((n, c, m * th + 2, m * tw + 2), dtype=x.dtype)
    padded[:, :, pt : pt + h, pl : pl + w] = x
    rows = [xp.stack([padded[:, :, i : i + m * th : m, j : j + m * tw : m] for j in range(a)], -1)
            for i in range(a)]
    d = xp.stack(rows, -2)  # (n, c, th, tw, a, a)
    bt_m, _, at_m = MATRICES[m]
    bt = xp.asarray(bt_m, dtype=x.dtype)
    at = xp.asarray(at_m, dtype=x.dtype)
    v = xp.einsum("ai,ncyxij,bj->abncyx", bt, d, bt)
    prod = xp.einsum("abmc,abncyx->abnmyx", u.reshape(a, a, out_c, c), v)
    y = xp.einsum("pa,abnmyx,qb->nmypxq", at, prod, at).reshape(n, out_c, m * th, m * tw)
    return y[:, :, :oh, :ow]


@register(WINOGRAD_CONV)
def winograd_conv_kernel(
    xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]
) -> list[Any]:
    """FusedConv of a 3x3, stride-1 conv whose weights are Winograd-transformed: act(conv + B + Z)."""
    x, u, b, z = fill_optional(WINOGRAD_CONV, inputs, 4)
    y = conv_epilogue(xp, winograd_conv(xp, x, u, attrs), b, z, attrs)
    return finish(xp, WINOGRAD_CONV, [y], outputs)
