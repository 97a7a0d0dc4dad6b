"""Denormal weights of the multiply-heavy ops stored as zero.

A float32 weight below ``FLT_MIN`` in magnitude (a denormal, 1.2e-38) changes a product by less
than 1.2e-38 times the activation it meets, yet on x86 every multiply-add with a denormal operand
takes a microcode assist of about a hundred cycles. Trained models keep such values where a
weight decayed to nearly nothing: PaddleOCR v4's recognizer has 31,350 of them in ten tensors,
and the 1x1 convolution of one squeeze-and-excitation block took 21x the time of the same
convolution with ordinary weights (147 against 7 us), in every engine that computes with them.

The weights of Conv, ConvTranspose, Gemm, MatMul and the recurrent ops (and of the fused forms
the later passes make of them, so values folded in from a BatchNorm are caught on the next round)
are flushed, wherever every consumer of the constant is one of those ops; a constant that is
also read elsewhere (a graph output, an elementwise operand) keeps its bits. Activations that
become denormal at run time are computed as IEEE says: the CPU's flush-to-zero mode is never set.
"""

from __future__ import annotations

import numpy as np

from compiler.ir.graph import Graph
from compiler.ir.graph import Value
from compiler.passes.base import Pass
from compiler.passes.base import PassResult
from runtime.contract import FUSED_CONV
from runtime.contract import FUSED_GEMM

__all__ = ["FlushDenormalWeights", "flush_denormals"]

# Ops whose constant inputs are weights multiplied into every output row (by position: any).
WEIGHT_CONSUMERS = frozenset({
    "Conv", "ConvTranspose", "Gemm", "MatMul", "LSTM", "GRU", "RNN", FUSED_CONV, FUSED_GEMM,
})


def flush_denormals(array: np.ndarray) -> np.ndarray | None:
    """``array`` with its denormals set to +-0 (sign kept), or None when it has none."""
    if array.dtype not in (np.float32, np.float64):
        return None
    tiny = np.finfo(array.dtype).tiny
    denormal = (array != 0) & (np.abs(array) < tiny)
    if not denormal.any():
        return None
    return np.where(denormal, np.copysign(np.zeros((), array.dtype), array), array)


class FlushDenormalWeights(Pass):
    name = "flush_denormal_weights"

    def __init__(self) -> None:
        # arrays already found clean, by id (held, so an id is not reused): the manager runs every
        # pass each round, and a scan of VGG-19's 550 MB of weights need not be repeated
        self._clean: dict[int, np.ndarray] = {}

    def run(self, graph: Graph) -> PassResult:
        modified = False
        for value in {id(v): v for node in graph if node.kind in WEIGHT_CONSUMERS
                      for v in node.inputs if v is not None and v.is_const}.values():
            const = value.const
            if const is None or id(const) in self._clean or not self._only_weights(graph, value):
                continue
            flushed = flush_denormals(const)
            if flushed is None:
                self._clean[id(const)] = const
            else:
                value.const = flushed
                self._clean[id(flushed)] = flushed
                modified = True
        return PassResult(graph, modified)

    @staticmethod
    def _only_weights(graph: Graph, value: Value) -> bool:
        return not graph.is_graph_output(value) and all(
            use.node.kind in WEIGHT_CONSUMERS for use in value.uses)
