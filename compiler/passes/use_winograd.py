"""Lower 3x3 stride-1 convolutions to Winograd F(4x4, 3x3) or F(2x2, 3x3): 4x / 2.25x fewer
multiplications.

A Conv / FusedConv with a 3x3 kernel, stride 1, dilation 1, one group, float32, constant weights,
pads of at most 2 and at least ``MIN_CHANNELS`` input and output channels becomes
``onnx_aot.WinogradConv(X, U, B?, Z?)`` with the conv's attributes (and the fused epilogue's).
``U`` holds the weights already transformed, ``U[xi * a + nu, m, c] = (G g[m, c] G^T)[xi, nu]``
(a = tile + 2; the tile size is implied by U's first dimension, a^2), computed here in float64,
once, ahead of time. Each tile x tile block of output pixels is then
``A^T [sum_c U[:, :, m, c] * (B^T d_c B)] A`` over the a x a input patches ``d_c``: the products
over channels are a^2 matrix products (M x C by C x tiles), which the C provider runs on its GEMM
tile, and the transforms around them are a few multiply-adds per value (runtime/kernels/
winograd.py has the matrices; Lavin & Gray, "Fast Algorithms for Convolutional Neural
Networks", 2015). 4x4 tiles where the output has at least 16 of them, else 2x2.

This is a lowering for the C target, not an optimization every provider understands: it runs
once, after the fusions of level 2 have reached their fixed point (BatchNorm folding and epilogue
fusion need the plain conv), and only for ``target="cpu"`` (``compiler.passes.optimize``). The
reference provider runs the same algorithm (``runtime/kernels/winograd.py``). Against the direct
convolution in float64 the error is ~1e-7 (2x2 tiles) and ~5e-6 (4x4 tiles) of the output's scale.

In a dynamic graph (run-time batch and spatial sizes, which the Winograd kernels take) the
weights are still transformed once, so the tile is picked for the smallest output in range.
"""

from __future__ import annotations

import numpy as np

from compiler.ir.graph import AOT_DOMAIN
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.passes.base import NO_ACTIVATION
from compiler.passes.base import Pass
from compiler.passes.base import PassResult
from compiler.passes.base import add_constant
from compiler.passes.base import replace_nodes
from compiler.passes.bf16_cost import RULES
from compiler.passes.bf16_cost import keeps_winograd
from compiler.providers.geometry import ConvGeometry
from compiler.providers.geometry import WinogradGeometry
from runtime.contract import FUSED_CONV
from runtime.contract import WINOGRAD_CONV
from runtime.contract import op_name
from runtime.kernels.winograd import MATRICES
from runtime.symbolic import Dim
from runtime.symbolic import bounds

__all__ = ["MIN_CHANNELS", "TILE4_MIN", "UseWinograd", "tile_for", "winograd_weights"]

# Below this many input (or output) channels the transforms cost more than the saved products.
MIN_CHANNELS = 16

# Output tiles of 4x4 (F(4x4, 3x3): 36 products per tile and channel pair instead of 144) where
# they give at least TILE4_MIN tiles, else 2x2 (16 products instead of 36). The tiles are the
# columns of the products: fewer than one panel of the GEMM tile (16 columns on AVX2) wastes
# more than the smaller tiles save (ResNet-50's 7x7 stage: 4 tiles of 4x4 took 2x as long as
# 16 tiles of 2x2; at 14x14, 16 tiles of 4x4 vs 49 of 2x2: 0.9x).
TILE4_MIN = 16


def tile_for(out_h: int, out_w: int) -> int:
    """The output tile size the lowering picks for an ``out_h`` x ``out_w`` output."""
    return 4 if -(-out_h // 4) * -(-out_w // 4) >= TILE4_MIN else 2


def _smallest(d: Dim, ranges: dict[str, tuple[int, int]]) -> int:
    """A run-time dim's least size over the ranges (a static dim as itself): a dynamic graph's
    tile is picked for its smallest output, where 4x4 tiles cost the most (too few tiles, see
    TILE4_MIN); at larger sizes 2x2 tiles where 4x4 would do cost ~10% on that conv."""
    return bounds(d, ranges)[0]


def winograd_weights(w: np.ndarray, tile: int = 2) -> np.ndarray:
    """(M, C, 3, 3) weights -> ((tile + 2)^2, M, C) transformed weights ``G g G^T``, in ``w``'s dtype."""
    g = np.asarray(MATRICES[tile][1], dtype=np.float64)
    a = tile + 2
    u = np.einsum("ik,mckl,jl->ijmc", g, w.astype(np.float64), g)
    return np.ascontiguousarray(u.reshape(a * a, w.shape[0], w.shape[1])).astype(w.dtype)


def _eligible(node: Node) -> bool:
    if node.kind not in ("Conv", FUSED_CONV) or len(node.outputs) != 1:
        return False
    x, w = node.input(0), node.input(1)
    if x is None or w is None or w.const is None or x.shape is None or len(x.shape) != 4:
        return False
    if x.dtype != np.float32 or w.dtype != np.float32 or node.outputs[0].dtype != np.float32:
        return False
    b = node.input(2)
    if b is not None and (b.const is None and b.shape != (w.const.shape[0],)):
        return False
    dynamic = x.is_symbolic or node.outputs[0].is_symbolic
    g = ConvGeometry.from_symbolic_node(node) if dynamic else ConvGeometry.from_node(node, "NCHW")
    return g is not None and WinogradGeometry.fits(g) and min(g.m, g.c) >= MIN_CHANNELS


class UseWinograd(Pass):
    """The lowering; in a ``--precision bf16`` compile (``bf16_engine`` "amx" / "dpbf16") only for
    the convs that keep Winograd against bf16 direct under that engine's rules (``bf16_cost``)."""

    name = "use_winograd"

    def __init__(self, bf16_engine: str | None = None) -> None:
        self.bf16_engine = bf16_engine

    def run(self, graph: Graph) -> PassResult:
        modified = False
        for node in list(graph):
            if node.graph is graph and _eligible(node) and self._keeps(graph, node):
                self._lower(graph, node)
                modified = True
        if modified:
            graph.prune_constants()
        return PassResult(graph, modified)

    def _keeps(self, graph: Graph, conv: Node) -> bool:
        if self.bf16_engine is None:
            return True
        x, w, y = conv.input(0), conv.input(1), conv.outputs[0]
        assert x is not None and w is not None and w.const is not None and y.shape is not None
        static = not (x.is_symbolic or y.is_symbolic)
        tile = tile_for(_smallest(y.shape[2], graph.symbols), _smallest(y.shape[3], graph.symbols))
        m, c = (int(d) for d in w.const.shape[:2])
        pixels = int(np.prod(y.shape)) // m if static else 0
        return keeps_winograd(RULES[self.bf16_engine], c, m, pixels, tile, static)

    @staticmethod
    def _lower(graph: Graph, conv: Node) -> Node:
        w = conv.input(1)
        assert w is not None and w.const is not None
        y = conv.outputs[0]
        assert y.shape is not None
        tile = tile_for(_smallest(y.shape[2], graph.symbols), _smallest(y.shape[3], graph.symbols))
        u = add_constant(graph, f"{w.name}_winograd{tile}", winograd_weights(w.const, tile))
        attrs = dict(conv.attrs) if conv.domain == AOT_DOMAIN else {**conv.attrs, **NO_ACTIVATION}
        lowered = Node(
            op_name(WINOGRAD_CONV),
            [conv.input(0), u, *conv.inputs[2:]],
            list(conv.outputs),
            attrs,
            name=conv.name,
            domain=AOT_DOMAIN,
            origin=conv.origin,
        )
        return replace_nodes(graph, [conv], lowered)
