"""``onnx_aot.QLSTM`` with constant W and R: both stored packed, per direction, in the int8 tile's
column panels (``runtime/kernels/qgemm.py: pack_qb``, QGemm's B layout) with their column sums
(W_sum, R_sum), so the C kernel (compiler/providers/c/qlstm.py) reads them in place instead of
packing them at every run (measured on a 50-step bidirectional LSTM, batch 8, 256 / 256: the
packing took ~0.4 ms of a 2.8 ms run). A lowering for the C target, from level 2; the reference
kernel unpacks them.
"""

from __future__ import annotations

import numpy as np

from compiler.ir.graph import AOT_DOMAIN
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.passes.base import Pass
from compiler.passes.base import PassResult
from compiler.passes.base import add_constant
from compiler.passes.base import replace_nodes
from compiler.passes.base import rewrite_each
from runtime.contract import Q_LSTM
from runtime.contract import op_name
from runtime.kernels.qgemm import column_sums
from runtime.kernels.qgemm import pack_qb

__all__ = ["PackQLSTMWeights"]


def _packed(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(dirs, K, N) 8-bit -> its directions packed (dirs, panels, groups, 16, 4) and their sums (dirs, N)."""
    return (np.stack([pack_qb(m) for m in weights]), np.stack([column_sums(m) for m in weights]))


def _lower(graph: Graph, node: Node) -> bool:
    ins = list(node.inputs)
    w, r = ins[1], ins[2]
    if int(node.attrs["packed"]) or w is None or r is None or w.const is None or r.const is None:
        return False
    if w.const.ndim != 3 or r.const.ndim != 3:
        return False
    (wp, ws), (rp, rs) = _packed(w.const), _packed(r.const)
    name = node.name
    ins[1], ins[2] = add_constant(graph, f"{name}_wpack", wp), add_constant(graph, f"{name}_rpack", rp)
    ins += [add_constant(graph, f"{name}_wsum", ws), add_constant(graph, f"{name}_rsum", rs)]
    new = Node(op_name(Q_LSTM), ins, list(node.outputs), {**node.attrs, "packed": 1}, name=name,
               domain=AOT_DOMAIN, origin=list(node.origin))
    replace_nodes(graph, [node], new)
    return True


class PackQLSTMWeights(Pass):
    name = "pack_qlstm_weights"

    def run(self, graph: Graph) -> PassResult:
        modified = rewrite_each(graph, (Q_LSTM,), _lower)
        if modified:
            graph.prune_constants()
        return PassResult(graph, modified)
