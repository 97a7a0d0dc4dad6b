"""The golden cases of a ``--precision bf16`` graph: the fp32 model's outputs, with the measured error.

The GEMM and convolution weights of such a graph are rounded to bfloat16
(``compiler/passes/pack_gemm_weights.py``, ``pack_conv_bf16.py``; ``Graph.narrowing.rounded`` keeps
each one's fp32 original). A golden case runs the reference kernels twice on its inputs: with the
rounded weights (what the artifact computes: for weights in the AMX layout the reference rounds the
step's input too, as the AMX-BF16 path does, so the measured error covers it; a CPU without AMX
computes closer to fp32) and with the fp32 originals (what the model computes). A float output's
reference is the fp32 one and its tolerance its dtype's plus the measured difference,
``bf16_error`` (max |bf16 - fp32| / max |fp32|, recorded in golden.json): ``verify`` checks the
artifact stays within the error it had when compiled, against the model as given. Integer and bool
outputs (an argmax) keep the rounded run as their reference, exact as ever. A graph without
rounded weights runs once, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from compiler.ir.graph import Graph

__all__ = ["fp32_weights", "with_fp32_reference"]


@contextmanager
def fp32_weights(graph: Graph) -> Iterator[None]:
    """``graph``'s rounded constants hold their fp32 originals inside the block."""
    swapped = []
    for value in graph.constants.values():
        entry = graph.narrowing.rounded.get(id(value.const))
        if entry is not None and entry[0] is value.const:
            swapped.append((value, value.const))
            value.const = entry[1]
    try:
        yield
    finally:
        for value, const in swapped:
            value.const = const


def _relative(got: np.ndarray, ref: np.ndarray) -> float:
    scale = float(np.abs(ref).max(initial=0.0))
    return float(np.abs(got.astype(np.float64) - ref).max(initial=0.0)) / scale if scale else 0.0


def with_fp32_reference(graph: Graph, run: Callable[[], tuple[object, list[np.ndarray]]],
                        outputs: list[np.ndarray]) -> tuple[list[np.ndarray], list[float | None]]:
    """``outputs`` (a case's reference run; ``run()[1]`` reruns it) with every float output replaced by
    its fp32-weights run where ``graph`` has rounded weights, and the measured error of each
    (None: kept as it was)."""
    if not graph.narrowing.rounded:
        return outputs, [None] * len(outputs)
    with fp32_weights(graph):
        wide = run()[1]
    refs, errors = [], []
    for got, ref in zip(outputs, wide, strict=True):
        floating = got.dtype.kind == "f" and np.isfinite(ref).all()
        refs.append(ref if floating else got)
        errors.append(_relative(got, ref) if floating else None)
    return refs, errors
