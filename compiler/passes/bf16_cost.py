"""Which convs of a ``--precision bf16`` compile run bf16, per bf16 engine: the cost model's constants.

The bf16 conv kernel (``templates/c/conv_amx.c.j2``) picks its engine at run time -- AMX-BF16
tiles, else AVX512_BF16's ``vdpbf16ps`` blocks (``gemm_dpbf16.c.j2``), else fp32 on the widened
weights -- but which convs are worth packing, and whether a 3x3 stride-1 conv keeps fp32's
Winograd form instead, depends on that engine's speed, so the compile picks rules for the engine
its ``--cpu`` target will take (``compiler/precision.py: bf16_engine``): ``"amx"`` where the
target has AMX-BF16, and for every target that names neither unit (today's rules, measured on an
Intel Sapphire Rapids), ``"dpbf16"`` where it has AVX512_BF16 without AMX. Each rule set is one
``Bf16Rules`` in ``RULES``; re-tune by re-measuring with ``python -m scripts.bench_bf16_steps``
(each conv of the compute-bound zoo models as fp32 Winograd, fp32 direct and bf16, per step,
alternating runs) and changing the numbers here.

A conv of one group with static shapes, K = KH x KW x C products into M channels per output pixel,
goes bf16 where (C >= min_channels or KH x KW >= stem_min_taps) and (K x M >= min_pixel_products
or (K >= min_deep_k and M >= min_deep_m and K x M >= min_small_products)) (``takes_bf16``). Under
the ``"dpbf16"`` rules a 3x3 stride-1 conv keeps Winograd (and so fp32) where the conv would not go
bf16 at all, or, for 4x4 output tiles and fewer output pixels than ``tile4_small_pixels`` (14x14
and 13x13 images: edge tiles), where K x M is under ``tile4_small_min_products``, else where
Winograd's time against fp32's direct conv (``WINOGRAD_VS_DIRECT``, by its output tile) is below
bf16 direct's (``dpbf16_vs_direct``) (``keeps_winograd``).

``"amx"`` (Sapphire Rapids, 2 threads; medians of step times, alternating runs): SqueezeNet's 3x3
16 -> 64 at 55x55 (K 144) 0.067 ms against fp32's 0.190, its 1x1 256 -> 32 at 27x27 0.061 against
0.081, Inception v1's 256 -> 32 0.063 against 0.078, ResNet-50's 1x1 64 -> 64 at 56x56 0.085
against 0.106, DenseNet-121's 64 -> 128 0.212 against 0.256 (BatchNorm + Relu folded in); a 7x7
stem of 3 channels 0.49 against 0.80. Still fp32: M 16 (Inception v1's 480 -> 16 0.026 against
0.016), K under 64 (SqueezeNet's 1x1 16 -> 64 at 55x55 0.050 against 0.029), SqueezeNet's 3x3 stem
(K 27: 0.208 against 0.175); DenseNet-121's 1x1 64 -> 128 at 56x56 with its windows rounded through
memory 0.263 against 0.157 (min_pixel_products). Winograd: none (the tiles beat it everywhere).

``"dpbf16"`` (AMD EPYC Zen 4, 2 cores, no AMX; 2026-12-08 after the faster vdpbf16ps kernels of
branch bf16kern, ``scripts.bench_bf16_steps --runs 15`` over the six models, medians of the step
times in us, fp32 Winograd / fp32 direct / bf16 direct; "dir.": bf16's time over fp32 direct's):

| convs (model) | fp32 Winograd | fp32 direct | bf16 | bf16 / Winograd |
|---|---|---|---|---|
| 3x3 64 -> 64 at 56x56, 4x4 tiles (ResNet-50, 3) | 472-506 | 1266-1302 | 700-714 | 1.40-1.48 |
| 3x3 128 -> 128 at 28x28, 4x4 tiles (ResNet-50, 3) | 486-511 | 1181-1197 | 632-646 | 1.26-1.31 |
| 3x3 16..128 -> 64..192 at 56 .. 27, 4x4 (Inception v1 / v2, SqueezeNet; 15) | | | | 1.17-1.52 |
| 3x3 128 -> 32 at 56 / 28 / 14 (DenseNet-121; 6 / 12 / 24) | | | | 1.27-1.41 / 1.15-1.32 / 1.00-1.19 |
| 3x3 at 14x14 / 13x13, 4x4, K x M < 2^18 (Inception v1 / v2, SqueezeNet; 16) | | | | 1.00-1.21 |
| 3x3 at 14x14 / 13x13, 4x4, K x M 2^18 .. 460800 (Inception v1 / v2; 6) | | | | 0.94-1.01 |
| 3x3 256 -> 256 at 14x14, 4x4 tiles (ResNet-50, 5: K x M 2^19+) | 711-748 | 1174-1212 | 684-697 | 0.93-0.97 |
| 3x3 512 -> 512 at 7x7, 2x2 tiles (ResNet-50, 2) | 1187-1200 | 1290-1299 | 872-875 | 0.73 |
| 3x3 160..224 -> 224..320 at 7x7, 2x2 (Inception v2, 5) | 233-338 | 260-403 | 234-298 | 0.86-1.00 |
| 7x7 / 2 stems 3 -> 64 (ResNet-50, Inception v1, v2, DenseNet) | - | 1303-1456 | 920-974 | (0.67-0.71 dir.) |
| under 64 pixels, K x M 2^16 .. 2^20 (Inception v1, v2, DenseNet; 43) | | | | (0.71-0.97 dir., med. 0.89) |
| under 64 pixels, K x M < 2^16 (Inception v1, DenseNet; 18) | | | | (0.94-1.08 dir., med. 1.03) |
| 1x1 at 7x7, K x M >= 2^20 (ResNet-50, 6) | - | | | (0.67-0.71 dir.) |
| 1x1 at 13x13..56x56, K x M >= 12288 (all; 131) | - | | | (0.55-1.10 dir., median 0.76) |
| M 16, or K < 64 at K x M < 12288 (all; 11) | - | | | (0.92-1.39 dir., median 1.06) |

So under ``"dpbf16"``: the 3x3 stride-1 convs whose Winograd takes 4x4 tiles at 28x28 and over
stay fp32 Winograd (bf16 / Winograd 1.15-1.52; Winograd 0.29-0.57x direct there, bf16 0.37-0.75x);
at 14x14 / 13x13 (Winograd 0.56-0.81x direct, bf16 0.57-0.92x) they go bf16 from K x M 2^18, where
the two cross (under it 1.00-1.21, from it 0.93-1.01); those of 2x2 tiles go bf16 where bf16 takes
them; the 7x7 stems go bf16 (were 1.07-1.20x fp32 direct before bf16kern; SqueezeNet's and
ShuffleNet's 3x3 stems, K 27, stay fp32 by min_pixel_products: 0.95 and 1.11 dir.); a conv of under
64 output pixels goes bf16 from K x M 2^16 (was 2^20); the other thresholds as for AMX (their
crossovers, M 16 and K x M 12288, held here too). Single runs of 15 (shared machine): two fp32
artifacts' identical steps differ by up to 8%, so the crossovers are +-0.05.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ENGINES", "RULES", "Bf16Rules", "WINOGRAD_VS_DIRECT", "keeps_winograd", "takes_bf16"]

ENGINES = ("amx", "dpbf16")


@dataclass(frozen=True)
class Bf16Rules:
    """The bf16 choice for one engine (the module's docstring says what each threshold gates)."""

    min_channels: int
    stem_min_taps: int
    min_pixel_products: int
    min_deep_k: int
    min_deep_m: int
    min_small_products: int
    # and a conv of fewer output pixels (N x OH x OW) than small_pixels only from small_min_products
    small_pixels: int = 0
    small_min_products: int = 0
    # bf16 direct's time against fp32 direct on a 3x3 stride-1 conv; None: Winograd never kept
    dpbf16_vs_direct: float | None = None
    # but a conv of 4x4 Winograd tiles and fewer output pixels than tile4_small_pixels (where
    # Winograd's edge tiles cost it most) goes bf16 where K x M >= tile4_small_min_products
    tile4_small_pixels: int = 0
    tile4_small_min_products: int = 0


RULES: dict[str, Bf16Rules] = {
    "amx": Bf16Rules(min_channels=16, stem_min_taps=9, min_pixel_products=12288, min_deep_k=64, min_deep_m=32,
                     min_small_products=4096),
    # 7x7 stems go bf16 (0.67-0.71x fp32 direct); bf16 direct on ResNet-50's 13 3x3 stride-1 convs
    # took 0.53-0.68x fp32 direct (median 0.58); at 14x14 from K x M 2^18 it beats 4x4 Winograd
    "dpbf16": Bf16Rules(min_channels=16, stem_min_taps=9, min_pixel_products=12288, min_deep_k=64,
                        min_deep_m=32, min_small_products=4096, small_pixels=64, small_min_products=1 << 16,
                        dpbf16_vs_direct=0.58, tile4_small_pixels=784, tile4_small_min_products=1 << 18),
}

# fp32 Winograd's time against fp32 direct by output tile (use_winograd.tile_for), Zen 4, the
# table above: 4x4 tiles on ResNet-50 0.37-0.43 at 56x56 and 28x28 (at 14x14 0.60-0.62, Inception
# v2's 0.61-0.67, DenseNet-121's 128 -> 32 0.76-0.81: Bf16Rules.tile4_small_pixels decides there);
# 2x2 tiles on ResNet-50 0.91-0.93.
WINOGRAD_VS_DIRECT = {4: 0.43, 2: 0.92}


def takes_bf16(rules: Bf16Rules, c: int, m: int, kh: int, kw: int, pixels: int) -> bool:
    """Whether a one-group conv of ``c`` -> ``m`` channels, a ``kh`` x ``kw`` window and ``pixels``
    output pixels (N x OH x OW) goes bf16."""
    k, taps = kh * kw * c, kh * kw
    big = k * m >= rules.min_pixel_products or (k >= rules.min_deep_k and m >= rules.min_deep_m
                                                and k * m >= rules.min_small_products)
    small = pixels < rules.small_pixels and k * m < rules.small_min_products
    return (c >= rules.min_channels or taps >= rules.stem_min_taps) and big and not small


def keeps_winograd(rules: Bf16Rules | None, c: int, m: int, pixels: int, tile: int, static: bool) -> bool:
    """Whether a 3x3 stride-1 conv that Winograd takes keeps it in a bf16 compile under ``rules``
    (None: fp32, always): where bf16 would not take the conv (``static`` False: run-time shapes,
    which pack_conv_bf16 leaves fp32), or where Winograd's ``tile`` beats bf16 direct."""
    if rules is None:
        return True
    if rules.dpbf16_vs_direct is None:
        return False
    if not static or not takes_bf16(rules, c, m, 3, 3, pixels):
        return True
    if tile == 4 and pixels < rules.tile4_small_pixels:
        return 9 * c * m < rules.tile4_small_min_products
    return WINOGRAD_VS_DIRECT[tile] < rules.dpbf16_vs_direct
