"""``--precision bf16``: the NHWC convolutions' weights as bfloat16 codes in the AMX-BF16 layout.

After ``layout_nhwc``, each ``onnx_aot.ConvNhwc`` of one group with static shapes, at least
MIN_CHANNELS input channels (or STEM_MIN_TAPS taps) and MIN_PIXEL_PRODUCTS products per output
pixel (or a window of MIN_DEEP_K products into at least MIN_DEEP_M channels, MIN_SMALL_PRODUCTS)
gets its packed weights (``runtime/kernels/nhwc.py: pack_conv_weights``) replaced by the AMX pack
of its (K, M) matrix, k = (kh, kw, c) as the kernel gathers its input rows
(``runtime/kernels/amx_pack.py``; half the bytes), rounded to nearest even; the fp32 original is
recorded for the golden cases (``compiler/artifact/golden_precision.py``). The C kernel
(``templates/c/conv_amx.c.j2``) computes in bf16 on AMX-BF16 and in fp32 elsewhere; the reference
kernel rounds the input as the AMX path does. A weight the model ships narrow keeps its form.
"""

from __future__ import annotations

import numpy as np

from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.passes.base import Pass
from compiler.passes.base import PassResult
from compiler.passes.base import add_constant
from compiler.precision import to_bf16
from runtime.contract import CONV_NHWC
from runtime.kernels.amx_pack import pack_amx_bf16
from runtime.kernels.nhwc import unpack_conv_weights

__all__ = ["PackConvBf16", "conv_matrix", "MIN_CHANNELS"]

# Convs of fewer input channels stay fp32 unless their window has STEM_MIN_TAPS taps: a 7x7 stem of
# 3 channels gathered block by block (conv_amx_fused.c.j2) takes ResNet-50's 0.49 ms against fp32's
# 0.80 (gathered through memory first, 1.07 against 0.68).
MIN_CHANNELS = 16
STEM_MIN_TAPS = 9
# And convs of fewer products per output pixel (K x M), but for the rule below: with the windows
# rounded through memory, DenseNet-121's 1x1 64 -> 128 at 56x56 took 0.263 ms against fp32's 0.157.
MIN_PIXEL_PRODUCTS = 12288
# Or a window of at least MIN_DEEP_K products into at least MIN_DEEP_M channels, MIN_SMALL_PRODUCTS in
# all: their B stays in cache and the kernel gathers each block's windows on its stack
# (conv_amx_fused.c.j2). Median step times, alternating runs, 2 threads, this SPR (busy):
# SqueezeNet's 3x3 16 -> 64 at 55x55 (K 144) 0.067 ms against fp32's 0.190, its 1x1 256 -> 32 at
# 27x27 0.061 against 0.081, Inception v1's 256 -> 32 0.063 against 0.078, ResNet-50's 1x1 64 -> 64
# at 56x56 0.085 against 0.106, DenseNet-121's 64 -> 128 0.212 against 0.256 (with its BatchNorm +
# Relu folded in, fuse_conv_prescale). Still fp32: M 16 (Inception v1's 480 -> 16 0.026 against
# 0.016: half of each tile's columns unused), K under 64 (SqueezeNet's 1x1 16 -> 64 at 55x55 0.050
# against 0.029), and SqueezeNet's 3x3 stem (K 27: 0.208 against 0.175).
MIN_DEEP_K, MIN_DEEP_M, MIN_SMALL_PRODUCTS = 64, 32, 4096


def conv_matrix(packed: np.ndarray, m: int) -> np.ndarray:
    """ConvNhwc's packed weights of ``m`` output channels (one group) as the (KH * KW * C, M) matrix."""
    w = unpack_conv_weights(packed, m)  # (M, C, KH, KW)
    return np.ascontiguousarray(w.transpose(2, 3, 1, 0).reshape(-1, m))


def _eligible(graph: Graph, node: Node) -> bool:
    w, x, y = node.input(1), node.input(0), node.outputs[0]
    if node.kind != CONV_NHWC or int(node.attrs.get("group", 1)) != 1 or w is None or w.const is None:
        return False
    shapes = [v.shape for v in (*node.inputs, y) if v is not None]
    static = all(s is not None and all(isinstance(d, int) for d in s) for s in shapes)
    if not static or x is None or x.shape is None or y.shape is None or w.const.ndim != 6:
        return False
    k, m = int(np.prod(w.const.shape[2:5])), int(y.shape[3])  # (KH, KW, C) x M
    big = k * m >= MIN_PIXEL_PRODUCTS or (k >= MIN_DEEP_K and m >= MIN_DEEP_M and k * m >= MIN_SMALL_PRODUCTS)
    taps = int(w.const.shape[2]) * int(w.const.shape[3])
    return ((x.shape[3] >= MIN_CHANNELS or taps >= STEM_MIN_TAPS) and big and w.const.dtype == np.float32
            and graph.narrowing.affine_of(w.const) is None and len(w.consumers()) == 1)


class PackConvBf16(Pass):
    name = "pack_conv_bf16"

    def run(self, graph: Graph) -> PassResult:
        modified = False
        for node in list(graph):
            if not _eligible(graph, node):
                continue
            w = node.input(1)
            assert w is not None and w.const is not None and node.outputs[0].shape is not None
            matrix = conv_matrix(w.const, int(node.outputs[0].shape[3]))
            value = add_constant(graph, f"{w.name}_bf16", pack_amx_bf16(to_bf16(matrix).view(np.uint16)))
            assert value.const is not None
            graph.narrowing.rounded[id(value.const)] = (value.const, w.const)
            graph.set_input(node, 1, value)
            modified = True
        if modified:
            graph.prune_constants()
        return PassResult(graph, modified)
