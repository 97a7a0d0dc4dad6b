"""Activation ranges of the fp32 model on the calibration feeds, observed with the reference kernels.

The fp32 model is imported (``compiler/frontend``) and run feed by feed through the IR interpreter
(``compiler/ir/evaluate.py``, numpy kernels of ``runtime/kernels``), so calibration needs neither
onnxruntime nor a build: the importer keeps the ONNX tensor names, and every tensor the QDQ rewrite
quantizes is watched as it is written. The methods (``--calibration-method``):

- ``minmax`` (default): the smallest and largest value seen over all feeds.
- ``entropy``: KL-divergence calibration as TensorRT describes it (Migacz, "8-bit inference with
  TensorRT", 2017) and onnxruntime's ``EntropyCalibrater`` computes it: a histogram of |x| in
  ``HIST_BINS`` (2048) bins over [0, max |x|]; for each candidate threshold of ``i`` bins
  (``ENTROPY_QUANT_BINS`` = 128 .. 2048) the clipped distribution P (outliers into the last bin) is
  compared with Q, P merged into 128 levels (256 for a tensor that is never negative, a ReLU's: its
  asymmetric int8 spends every code on [0, t], as pytorch-quantization's unsigned case) and expanded
  back; the threshold of least KL(P || Q).
  The zero bin counts as its neighbour (NVIDIA's pytorch-quantization does the same): a ReLU output's
  zeros would otherwise pull the threshold down to a few bins.
- ``percentile``: the ``PERCENTILE`` (99.999th) percentile of |x| from the same histogram.

A histogram method clips the range to [-t, t] and then to the observed [min, max] (a ReLU output
keeps 0 as its low end). Histograms need each tensor's max |x| first, so those methods run the
feeds twice (min / max, then the histograms); minmax runs them once.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from typing import Any

import numpy as np

from compiler.ir.evaluate import Interpreter
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value

__all__ = ["METHODS", "HIST_BINS", "ENTROPY_QUANT_BINS", "PERCENTILE", "Observed", "observe"]

METHODS = ("minmax", "entropy", "percentile")
HIST_BINS = 2048
ENTROPY_QUANT_BINS = 128
PERCENTILE = 99.999

Sink = Callable[[str, np.ndarray], None]


@dataclass
class Observed:
    """Per watched tensor the range to quantize, and the fp32 outputs of each feed (in order)."""

    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    outputs: list[list[np.ndarray]] = field(default_factory=list)


class _Watching(Interpreter):
    """The interpreter, handing every watched value's array to ``sink`` as it is computed."""

    def __init__(self, graph: Graph, watched: set[str], sink: Sink) -> None:
        super().__init__(graph)
        self.watched, self.sink = watched, sink

    def run(self, feeds: Mapping[str, Any]) -> list[Any]:
        for name in sorted(self.watched & set(feeds)):
            self.sink(name, np.asarray(feeds[name]))
        return super().run(feeds)

    def write(self, node: Node, value: Value, result: Any) -> None:
        super().write(node, value, result)
        if value.name in self.watched:
            self.sink(value.name, self.env[id(value)])


def observe(graph: Graph, feeds: Sequence[Mapping[str, np.ndarray]], watched: set[str], method: str,
            say: Callable[[str], None]) -> Observed:
    """Run ``feeds`` through ``graph`` and return the ``method`` range of every ``watched`` tensor."""
    low: dict[str, float] = {}
    high: dict[str, float] = {}

    def extremes(name: str, array: np.ndarray) -> None:
        low[name] = min(low.get(name, 0.0), float(array.min(initial=0.0)))
        high[name] = max(high.get(name, 0.0), float(array.max(initial=0.0)))

    found = Observed()
    passes = 1 if method == "minmax" else 2
    for k, feed in enumerate(feeds):
        say(f"calibrating ({method}): feed {k + 1}/{len(feeds)}" + (", pass 1/2" if passes == 2 else ""))
        found.outputs.append([np.asarray(o) for o in _Watching(graph, watched, extremes).run(feed)])
    if method == "minmax":
        found.ranges = {name: (low[name], high[name]) for name in sorted(low)}
        return found
    hists = {name: np.zeros(HIST_BINS, np.int64) for name in low}
    top = {name: max(-low[name], high[name]) for name in low}

    def histogram(name: str, array: np.ndarray) -> None:
        if top[name] > 0:
            hists[name] += np.histogram(np.abs(array), HIST_BINS, range=(0.0, top[name]))[0]

    for k, feed in enumerate(feeds):
        say(f"calibrating ({method}): feed {k + 1}/{len(feeds)}, pass 2/2")
        _Watching(graph, watched, histogram).run(feed)
    for name in sorted(low):
        if method == "entropy":  # a tensor >= 0 (a ReLU's) spends all 256 codes on [0, t]
            bins = _entropy_threshold(hists[name], ENTROPY_QUANT_BINS * (2 if low[name] >= 0 else 1))
        else:
            bins = _percentile_threshold(hists[name])
        t = bins * top[name] / HIST_BINS if top[name] > 0 else 0.0
        found.ranges[name] = (max(-t, low[name]), min(t, high[name]))
    return found


def _percentile_threshold(hist: np.ndarray) -> float:
    """The upper edge, in bins, of the bin holding the PERCENTILE-th percentile of ``hist``."""
    cdf = np.cumsum(hist) / max(int(hist.sum()), 1)
    return float(min(int(np.searchsorted(cdf, PERCENTILE / 100.0)) + 1, hist.size))


def _entropy_threshold(hist: np.ndarray, levels: int) -> float:
    """The threshold, in bins, of least KL divergence between ``hist`` clipped there and its
    ``levels``-level quantization (TensorRT's calibration)."""
    best, best_div = hist.size, np.inf
    hist = hist.astype(np.float64)
    hist[0] = hist[1]  # the zeros (half of a ReLU's output) would outweigh the rest (pytorch-quantization)
    tail = np.cumsum(hist[::-1])[::-1]  # tail[i]: the counts of bins i..end
    for i in range(levels, hist.size + 1):
        p = hist[:i].copy()
        if i < hist.size:
            p[-1] += tail[i]
        div = _kl(p, _expanded_levels(hist[:i], levels))
        if div < best_div:
            best, best_div = i, div
    return float(best)


def _expanded_levels(sliced: np.ndarray, levels: int) -> np.ndarray:
    """``sliced`` merged into ``levels`` bins, each level's count spread back over its non-empty
    bins (the candidate Q of the entropy method)."""
    edges = (np.arange(levels) * sliced.size) // levels
    sums = np.add.reduceat(sliced, edges)
    nonzero = np.add.reduceat((sliced > 0).astype(np.float64), edges)
    per_bin = np.divide(sums, nonzero, out=np.zeros_like(sums), where=nonzero > 0)
    widths = np.diff(np.append(edges, sliced.size))
    return np.where(sliced > 0, np.repeat(per_bin, widths), 0.0)


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    """KL(P || Q) of two unnormalized histograms, empty bins of either smoothed by a small epsilon."""
    if p.sum() <= 0 or q.sum() <= 0:
        return np.inf
    p, q = _smooth(p / p.sum()), _smooth(q / q.sum())
    mask = p > 0
    return float(np.sum(p[mask] * np.log(p[mask] / q[mask])))


def _smooth(p: np.ndarray, eps: float = 1e-4) -> np.ndarray:
    """``p`` with each empty bin given ``eps`` and that mass taken evenly from the others."""
    zeros = p == 0
    n_zero, n_nonzero = int(zeros.sum()), int((~zeros).sum())
    if n_zero == 0 or n_nonzero == 0:
        return p
    return np.where(zeros, eps, p - eps * n_zero / n_nonzero).clip(min=eps * 1e-3)
