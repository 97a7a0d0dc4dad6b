"""Store the constant B of a transB Gemm transposed, once, ahead of time.

A Gemm / FusedGemm with ``transB=1`` reads B as (N, K): the C provider's register tile loads B
along the output columns, so for such a product it copies B^T into panels in scratch **at every
run** (for a CRNN's final 1024 -> 8210 classifier: 33.6 MB transposed per run, 7 of its 24 ms).
When B is a constant, this lowering stores B^T instead and sets ``transB=0``: the product is the
same, the panels are then a row copy (or B is read in place), and nothing is transposed at run
time.

Products with few rows keep ``transB=1``: the C kernel runs them as dot products along K, which
wants B's rows (N, K) contiguous (``compiler/providers/c/gemm.py``, ``DOT_MAX_ROWS``). A constant
read by anything but such Gemms is left alone (transposing it would store the weights twice).
A lowering for the C target (``compiler.passes.lowerings_for``), from level 2.
"""

from __future__ import annotations

import numpy as np

from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.passes.base import Pass
from compiler.passes.base import PassResult
from compiler.passes.base import add_constant
from compiler.providers.c.gemm import DOT_MAX_ROWS

__all__ = ["TransposeGemmWeights"]

_GEMMS = ("Gemm", "onnx_aot.FusedGemm")


def _eligible(node: Node) -> bool:
    """A transB Gemm whose rows are too many for the dot-product path, with a 2-D constant B."""
    if node.kind not in _GEMMS or node.attrs.get("transB") != 1 or node.attrs.get("transA") not in (0, None):
        return False
    a, b = node.input(0), node.input(1)
    if a is None or b is None or b.const is None or b.const.ndim != 2 or a.shape is None:
        return False
    return len(a.shape) == 2 and int(a.shape[0]) > DOT_MAX_ROWS


class TransposeGemmWeights(Pass):
    name = "transpose_gemm_weights"

    def run(self, graph: Graph) -> PassResult:
        done: dict[int, Value] = {}  # id(B) -> B^T, shared by the Gemms that read one B
        modified = False
        for node in list(graph):
            b = node.input(1) if node.kind in _GEMMS else None
            if b is None or not _eligible(node) or not all(_eligible(c) for c in b.consumers()):
                continue
            assert b.const is not None
            if id(b) not in done:
                done[id(b)] = add_constant(graph, f"{b.name}_t", np.ascontiguousarray(b.const.T))
            graph.set_input(node, 1, done[id(b)])
            node.attrs["transB"] = 0
            modified = True
        if modified:
            graph.prune_constants()
        return PassResult(graph, modified)
