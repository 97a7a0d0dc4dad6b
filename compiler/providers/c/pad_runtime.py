"""The C Pad over run-time dims (``pad_runtime.c.j2``): sizes and pads known only at a binding.

A dynamic graph's Pad has symbolic input sizes, and its pads may be expressions of the symbols too
(pads computed from the input's shape: padding to a multiple of 32, a SAME pad before a
convolution). No index table can be compiled then; the kernel computes, per outer axis, the input
index each output index reads with the mode's arithmetic -- constant (-1: the padding value),
edge (clamped), reflect (a triangle wave of period 2 (L - 1)), wrap (modulo L) over the axis
cropped by its negative pads, as the reference kernel crops then pads with numpy's ``pad`` -- and
copies each output row (the last axis, merged with the unpadded axes before it) as its left edge,
one memcpy of the interior, and its right edge. Every fixed-size dtype is claimed (elements move as
unsigned integers of their size); modes other than constant only where no axis can become empty.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from compiler.codegen.elementwise import storage_ctype
from compiler.ir.graph import Node
from compiler.providers.base import GenStep
from compiler.providers.base import shape_of
from compiler.providers.c.common import PARALLEL_MIN_WORK
from compiler.providers.c.common import StepCode
from compiler.providers.c.common import params
from compiler.providers.c.common import step_args
from compiler.providers.c.rundims import int_or_none
from compiler.providers.c.rundims import parallel_if
from compiler.providers.c.rundims import run_dims
from compiler.providers.kit import KernelContext
from runtime.symbolic import Dim
from runtime.symbolic import as_dim
from runtime.symbolic import bounds
from runtime.symbolic import max_

__all__ = ["RuntimePadDim", "RuntimePadContext", "runtime_pad", "takes_runtime_pads"]

_MODES = ("constant", "edge", "reflect", "wrap")


@dataclass(frozen=True)
class RuntimePadDim:
    """One axis of the merged layout, as C text: input size, begin / end pads (negative: a crop),
    input stride in elements; ``plain``: unpadded (read at ``i * stride``)."""

    size: str
    begin: str
    end: str
    stride: str
    plain: bool


@dataclass(frozen=True)
class RuntimePadContext(KernelContext):
    ctype: str
    mode: str
    value: str  # the padding value's bits as a C literal of ``ctype``
    outer: tuple[RuntimePadDim, ...]
    last: RuntimePadDim  # the row
    parallel_if: str  # the C condition for the worker pool: the output's elements times a row's cost


def _pads(node: Node) -> list[Dim]:
    values = node.attrs["pads"]
    if not isinstance(values, (list, tuple)):
        raise TypeError(f"Pad pads {values!r}")
    return [as_dim(v) for v in values]


def _layout(xs: tuple[Dim, ...], pads: list[Dim]) -> list[tuple[Dim, Dim, Dim, Dim, bool]]:
    """(size, begin, end, input stride, plain) per axis, runs of unpadded axes merged."""
    rank = len(xs)
    strides = [math.prod(xs[d + 1 :]) for d in range(rank)]
    dims: list[tuple[Dim, Dim, Dim, Dim, bool]] = []
    for d in range(rank):
        b, e = pads[d], pads[d + rank]
        plain = int_or_none(b) == 0 and int_or_none(e) == 0
        if plain and dims and dims[-1][4]:
            size = dims[-1][0]
            dims[-1] = (size * xs[d], 0, 0, strides[d], True)  # type: ignore[operator]
        else:
            dims.append((xs[d], b, e, strides[d], plain))
    return dims or [(1, 0, 0, 1, True)]


def takes_runtime_pads(node: Node) -> bool:
    """Whether this kernel takes the dynamic Pad ``node``: a mode it has, pads one per axis end,
    and (modes reading input elements) no axis that can be empty after its crops."""
    mode = str(node.attrs["mode"])
    xs = shape_of(node.input(0), symbolic=True)
    pads = _pads(node)
    if (
        mode not in _MODES
        or len(pads) != 2 * len(xs)
        or len(shape_of(node.outputs[0], symbolic=True)) != len(xs)
    ):
        return False
    float(node.attrs["value"])
    if mode == "constant":
        return True
    graph = node.graph
    if graph is None:
        return False
    rank = len(xs)
    for d in range(rank):
        kept = xs[d] - max_(0, -pads[d]) - max_(0, -pads[d + rank])  # type: ignore[operator]
        if bounds(kept, graph.symbols)[0] < 1:
            return False
    return True


def runtime_pad(step: GenStep, value: str) -> StepCode:
    """The kernel of a dynamic Pad step (``value``: the padding value's C literal)."""
    node = step.node
    x = node.input(0)
    assert x is not None and x.dtype is not None
    xs = shape_of(x, symbolic=True)
    rd = run_dims(step)

    def text(d: Any) -> str:
        return str(rd.write(d))

    dims = [RuntimePadDim(text(s), text(b), text(e), text(st), plain)
            for s, b, e, st, plain in _layout(xs, _pads(node))]  # fmt: skip
    ys = shape_of(node.outputs[0], symbolic=True)
    ctype = storage_ctype(x.dtype)
    args = step_args(step, ctype)
    work = rd.write(math.prod(ys) * max(1, x.dtype.itemsize // 4))
    ctx = RuntimePadContext(
        params=params(["x", "y"], args, [True, True]) + rd.params,
        ctype=ctype,
        mode=str(node.attrs["mode"]),
        value=value,
        outer=tuple(dims[:-1]),
        last=dims[-1],
        parallel_if=parallel_if(work, 4 * PARALLEL_MIN_WORK) or str(int(work >= 4 * PARALLEL_MIN_WORK)),  # type: ignore[operator]
    )
    return StepCode("c/pad_runtime.c.j2", ctx, (*args, *rd.args))
