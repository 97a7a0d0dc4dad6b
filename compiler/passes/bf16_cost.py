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
the ``"dpbf16"`` rules a 3x3 stride-1 conv keeps Winograd (and so fp32) where Winograd's time
against fp32's direct conv (``WINOGRAD_VS_DIRECT``, by its output tile) is below bf16 direct's
(``dpbf16_vs_direct``), or where the conv would not go bf16 at all (``keeps_winograd``).

``"amx"`` (Sapphire Rapids, 2 threads; medians of step times, alternating runs): SqueezeNet's 3x3
16 -> 64 at 55x55 (K 144) 0.067 ms against fp32's 0.190, its 1x1 256 -> 32 at 27x27 0.061 against
0.081, Inception v1's 256 -> 32 0.063 against 0.078, ResNet-50's 1x1 64 -> 64 at 56x56 0.085
against 0.106, DenseNet-121's 64 -> 128 0.212 against 0.256 (BatchNorm + Relu folded in); a 7x7
stem of 3 channels 0.49 against 0.80. Still fp32: M 16 (Inception v1's 480 -> 16 0.026 against
0.016), K under 64 (SqueezeNet's 1x1 16 -> 64 at 55x55 0.050 against 0.029), SqueezeNet's 3x3 stem
(K 27: 0.208 against 0.175); DenseNet-121's 1x1 64 -> 128 at 56x56 with its windows rounded through
memory 0.263 against 0.157 (min_pixel_products). Winograd: none (the tiles beat it everywhere).

``"dpbf16"`` (AMD EPYC Zen 4, 2 cores, no AMX; 2026-12-08, ``scripts.bench_bf16_steps --runs 15``
over the six models, medians of the step times in us, fp32 Winograd / fp32 direct / bf16 direct;
"dir.": bf16's time over fp32 direct's; the DenseNet 3x3 cells are fp32 Winograd / fp32 direct / bf16 at
56x56 / 28x28 / 14x14, 6 / 12 / 24 convs each):

| convs (model) | fp32 Winograd | fp32 direct | bf16 | bf16 / Winograd |
|---|---|---|---|---|
| 3x3 64 -> 64 at 56x56, 4x4 tiles (ResNet-50, 3) | 520-577 | 1281-1311 | 806-880 | 1.40-1.67 |
| 3x3 128 -> 128 at 28x28, 4x4 tiles (ResNet-50, 3) | 509-550 | 1221-1236 | 725-751 | 1.35-1.46 |
| 3x3 256 -> 256 at 14x14, 4x4 tiles (ResNet-50, 5) | 706-762 | 1230-1277 | 812-866 | 1.11-1.22 |
| 3x3 128 -> 32, 4x4 (DenseNet-121) | 503-546 / 196-227 / 132-157 | | | 1.52-1.88 / 1.19-1.77 / 0.98-1.19 |
| 3x3 16..64 -> 64..256 at 55 / 27 / 13, 4x4 tiles (SqueezeNet, 8) | 147-194 | 231-355 | 171-282 | 1.15-1.54 |
| 3x3 64..192 -> 64..256 at 56 / 28 / 14, 4x4 tiles (Inception v2, 20) | | | | 1.08-2.07 |
| 3x3 512 -> 512 at 7x7, 2x2 tiles (ResNet-50, 2) | 1142-1218 | 1322-1362 | 1067-1089 | 0.89-0.93 |
| 3x3 160..224 -> 224..320 at 7x7, 2x2 (Inception v2, 5) | 275-395 | 250-555 | 294-442 | 0.82-1.18 |
| 7x7 / 2 stems 3 -> 64 (ResNet-50, Inception v1, v2, DenseNet)| - | 1366-1424 | 1457-1712 | (1.07-1.20 dir) |
| 1x1 at 6x6 / 7x7, K x M 27k-663k (Inception v1 / v2, DenseNet; 20) | - | | | (0.87-1.36 dir., most > 1) |
| 1x1 at 7x7, K x M >= 2^20 (ResNet-50, 5) | - | 660-695 | 566-584 | (0.81-0.87 dir.) |
| 1x1 at 13x13..56x56, K x M >= 12288 (all) | - | | | (0.49-1.07 dir., most 0.7-0.9) |
| M 16, or K < 64 at K x M < 12288 (SqueezeNet, Inception v1) | - | | | (1.12-1.62 dir.) |

So under ``"dpbf16"``: the 3x3 stride-1 convs whose Winograd takes 4x4 tiles stay fp32 Winograd
(bf16 / Winograd 1.08-2.07 on all 4x4-tile convs measured but one), those of 2x2 tiles go bf16
where bf16 takes them; stems stay fp32; a conv of under 64 output pixels goes bf16 only from 2^20 products
per pixel; the other thresholds as for AMX (their crossovers, M 16 and K x M 12288, held here too).
One outlier: Inception v1's 3x3 64 -> 192 at 55x55, bf16 0.56x its Winograd in one run (fp32 twice
its usual time); a rerun: 1.58x, and Inception v1's other 3x3s 1.04-1.27x (13x13: 4x4 tiles; 6x6:
2x2 tiles under 2^20 products, fp32 Winograd by the small-image rule).
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
