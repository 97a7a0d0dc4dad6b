"""``--precision bf16``: the NHWC convolutions' weights as bfloat16 codes in the AMX-BF16 layout.

After ``layout_nhwc``, each ``onnx_aot.ConvNhwc`` of one group with static shapes that the rules of
the compile's bf16 engine take (``compiler/passes/bf16_cost.py``: enough channels, or a stem's
taps, and enough products per output pixel; measured per engine, AMX-BF16 or vdpbf16ps) gets its
packed weights (``runtime/kernels/nhwc.py: pack_conv_weights``) replaced by the AMX pack of its
(K, M) matrix, k = (kh, kw, c) as the kernel gathers its input rows (``runtime/kernels/amx_pack.py``;
half the bytes), rounded to nearest even; the fp32 original is recorded for the golden cases
(``compiler/artifact/golden_precision.py``). The C kernel (``templates/c/conv_amx.c.j2``) computes
in bf16 on AMX-BF16 or vdpbf16ps and in fp32 elsewhere; the reference
kernel rounds the input as the AMX path does. A weight the model ships narrow keeps its form.
"""

from __future__ import annotations

import numpy as np

from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.passes.base import Pass
from compiler.passes.base import PassResult
from compiler.passes.base import add_constant
from compiler.passes.bf16_cost import RULES
from compiler.passes.bf16_cost import Bf16Rules
from compiler.passes.bf16_cost import takes_bf16
from compiler.precision import to_bf16
from runtime.contract import CONV_NHWC
from runtime.kernels.amx_pack import pack_amx_bf16
from runtime.kernels.nhwc import unpack_conv_weights

__all__ = ["PackConvBf16", "conv_matrix", "MIN_CHANNELS"]

MIN_CHANNELS = RULES["amx"].min_channels  # (the rules of each engine: compiler/passes/bf16_cost.py)


def conv_matrix(packed: np.ndarray, m: int) -> np.ndarray:
    """ConvNhwc's packed weights of ``m`` output channels (one group) as the (KH * KW * C, M) matrix."""
    w = unpack_conv_weights(packed, m)  # (M, C, KH, KW)
    return np.ascontiguousarray(w.transpose(2, 3, 1, 0).reshape(-1, m))


def _eligible(graph: Graph, node: Node, rules: Bf16Rules) -> bool:
    w, x, y = node.input(1), node.input(0), node.outputs[0]
    if node.kind != CONV_NHWC or int(node.attrs.get("group", 1)) != 1 or w is None or w.const is None:
        return False
    shapes = [v.shape for v in (*node.inputs, y) if v is not None]
    static = all(s is not None and all(isinstance(d, int) for d in s) for s in shapes)
    if not static or x is None or x.shape is None or y.shape is None or w.const.ndim != 6:
        return False
    kh, kw, c = (int(d) for d in w.const.shape[2:5])
    m, pixels = int(y.shape[3]), int(np.prod(y.shape[:3]))
    return (takes_bf16(rules, c, m, kh, kw, pixels) and w.const.dtype == np.float32
            and graph.narrowing.affine_of(w.const) is None and len(w.consumers()) == 1)


class PackConvBf16(Pass):
    """The pass, under the rules of ``engine`` (``bf16_cost.RULES``: "amx" or "dpbf16")."""

    name = "pack_conv_bf16"

    def __init__(self, engine: str = "amx") -> None:
        self.engine = engine

    def run(self, graph: Graph) -> PassResult:
        modified = False
        rules = RULES[self.engine]
        for node in list(graph):
            if not _eligible(graph, node, rules):
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
