"""Lower 3x3 stride-1 convolutions to Winograd F(2x2, 3x3): 2.25x fewer multiplications.

A Conv / FusedConv with a 3x3 kernel, stride 1, dilation 1, one group, float32, constant weights,
pads of at most 2 and at least ``MIN_CHANNELS`` input and output channels becomes
``onnx_aot.WinogradConv(X, U, B?, Z?)`` with the conv's attributes (and the fused epilogue's).
``U`` holds the weights already transformed, ``U[xi * 4 + nu, m, c] = (G g[m, c] G^T)[xi, nu]``,
computed here in float64, once, ahead of time. Each 2x2 block of output pixels is then
``A^T [sum_c U[:, :, m, c] * (B^T d_c B)] A`` over the 4x4 input patches ``d_c``: the products
over channels are 16 matrix products (M x C by C x tiles), which the C provider runs on its GEMM
tile, and the transforms around them are a few additions per value (Lavin & Gray, "Fast
Algorithms for Convolutional Neural Networks", 2015).

This is a lowering for the C target, not an optimization every provider understands: it runs
once, after the fusions of level 2 have reached their fixed point (BatchNorm folding and epilogue
fusion need the plain conv), and only for ``target="cpu"`` (``compiler.passes.optimize``). The
reference provider runs the same algorithm (``runtime/kernels/fused.py``), so results agree with
the direct convolution to float32 rounding (relative errors ~1e-6).
"""

from __future__ import annotations

import numpy as np

from compiler.ir.graph import AOT_DOMAIN, Graph, Node
from compiler.passes.base import NO_ACTIVATION, Pass, PassResult, add_constant, replace_nodes

__all__ = ["MIN_CHANNELS", "UseWinograd", "winograd_weights"]

# Below this many input (or output) channels the transforms cost more than the saved products.
MIN_CHANNELS = 16

_G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])


def winograd_weights(w: np.ndarray) -> np.ndarray:
    """(M, C, 3, 3) weights -> (16, M, C) transformed weights ``G g G^T``, in ``w``'s dtype."""
    u = np.einsum("ik,mckl,jl->ijmc", _G, w.astype(np.float64), _G)
    return np.ascontiguousarray(u.reshape(16, w.shape[0], w.shape[1])).astype(w.dtype)


def _eligible(node: Node) -> bool:
    if node.kind not in ("Conv", "onnx_aot.FusedConv") or len(node.outputs) != 1:
        return False
    x, w = node.input(0), node.input(1)
    if x is None or w is None or w.const is None or x.shape is None or len(x.shape) != 4:
        return False
    if x.dtype != np.float32 or w.dtype != np.float32 or node.outputs[0].dtype != np.float32:
        return False
    b = node.input(2)
    if b is not None and (b.const is None and b.shape != (w.const.shape[0],)):
        return False
    a = node.attrs
    try:
        kernel, strides, dilations = list(a["kernel_shape"]), list(a["strides"]), list(a["dilations"])
        pads, group = [int(p) for p in a["pads"]], int(a["group"])
    except (KeyError, TypeError, ValueError):
        return False
    if kernel != [3, 3] or strides != [1, 1] or dilations != [1, 1] or group != 1:
        return False
    if len(pads) != 4 or min(pads) < 0 or max(pads) > 2:
        return False
    m, c = int(w.const.shape[0]), int(w.const.shape[1])
    return w.const.shape == (m, c, 3, 3) and x.shape[1] == c and m >= MIN_CHANNELS and c >= MIN_CHANNELS


class UseWinograd(Pass):
    name = "use_winograd"

    def run(self, graph: Graph) -> PassResult:
        modified = False
        for node in list(graph):
            if node.graph is graph and _eligible(node):
                self._lower(graph, node)
                modified = True
        if modified:
            graph.prune_constants()
        return PassResult(graph, modified)

    @staticmethod
    def _lower(graph: Graph, conv: Node) -> Node:
        w = conv.input(1)
        assert w is not None and w.const is not None
        u = add_constant(graph, f"{w.name}_winograd", winograd_weights(w.const))
        attrs = dict(conv.attrs) if conv.domain == AOT_DOMAIN else {**conv.attrs, **NO_ACTIVATION}
        lowered = Node(
            "WinogradConv",
            [conv.input(0), u, *conv.inputs[2:]],
            list(conv.outputs),
            attrs,
            name=conv.name,
            domain=AOT_DOMAIN,
            origin=conv.origin,
        )
        return replace_nodes(graph, [conv], lowered)
