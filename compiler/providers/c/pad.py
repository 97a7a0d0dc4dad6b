"""The C kernel for Pad (modes constant, reflect, edge, wrap; negative pads crop).

The output is walked in rows (its last dimension, merged with the unpadded dimensions before it):
an outer index reads the input through a per-axis table of offsets (-1: a padding row in mode
"constant") or at a plain stride where the axis is not padded, and each row is one memcpy of its
contiguous interior plus its edges from two small tables. The tables come from numpy's own
``pad`` of index vectors, so reflect / edge / wrap (pads longer than the axis included) mean
exactly what the reference kernel's ``pad`` of the data does. Elements move as unsigned integers
of their size, so every fixed-size dtype is claimed. Run-time sizes and pads (a dynamic graph):
``pad_runtime.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from compiler.codegen.elementwise import contiguous_strides
from compiler.codegen.elementwise import storage_ctype
from compiler.codegen.toolchain import TargetInfo
from compiler.ir.graph import Node
from compiler.providers.base import GenStep
from compiler.providers.base import shape_of
from compiler.providers.c.common import PARALLEL_MIN_WORK
from compiler.providers.c.common import CKernel
from compiler.providers.c.common import StepCode
from compiler.providers.c.common import params
from compiler.providers.c.common import same_dtype_movable
from compiler.providers.c.common import step_args
from compiler.providers.c.pad_runtime import runtime_pad
from compiler.providers.c.pad_runtime import takes_runtime_pads
from compiler.providers.c.rundims import is_dynamic
from compiler.providers.kit import KernelContext

__all__ = ["PadDim", "PadContext", "PadKernel", "pad_tables"]


def _ints(values: object) -> list[int]:
    if not isinstance(values, (list, tuple)):
        raise TypeError(f"expected a list of ints, got {values!r}")
    return [int(v) for v in values]


# The ONNX modes that reuse input elements, by numpy's name for them (the same names).
_NUMPY_PAD_MODES: dict[str, Literal["reflect", "edge", "wrap"]] = {
    "reflect": "reflect",
    "edge": "edge",
    "wrap": "wrap",
}


@dataclass(frozen=True)
class PadDim:
    """One outer dimension of a Pad: input offsets from ``table`` (-1: padding) or ``i * stride``."""

    size: int
    out_stride: int  # in rows
    stride: int  # input elements
    table: tuple[int, ...] | None


@dataclass(frozen=True)
class PadContext(KernelContext):
    ctype: str
    constant: bool  # mode "constant": padding reads ``value``, tables hold -1 there
    value: str  # the padding value's bits as a C literal of ``ctype``
    outer: tuple[PadDim, ...]
    padded: tuple[int, ...]  # the outer dimensions with tables
    width: int  # elements of one output row (the last, possibly merged, dimension)
    lo: int  # [lo, hi) of a row is a contiguous run of the input row ...
    hi: int
    src: int  # ... starting at this input element offset
    left: tuple[int, ...]  # input offsets of row elements [0, lo) (mode != "constant")
    right: tuple[int, ...]  # input offsets of row elements [hi, width)
    parallel: bool


MAX_TABLE = 1 << 16  # longest per-axis index table the C kernel carries (a C array literal)


def pad_tables(xs: Sequence[int], pads: Sequence[int], mode: str) -> list[np.ndarray]:
    """Per axis, the input index each output index reads (-1: the constant), as the reference pads.

    Negative pads crop first, then numpy's ``pad`` of the index vector gives reflect / edge /
    wrap exactly as the reference kernel's ``pad`` of the data. Raises ValueError where numpy
    cannot pad (reflect of an empty axis).
    """
    rank = len(xs)
    if (mode != "constant" and mode not in _NUMPY_PAD_MODES) or len(pads) != 2 * rank:
        raise ValueError(f"Pad mode {mode!r} with {len(pads)} pads for rank {rank}")
    tables = []
    for d in range(rank):
        b, e = int(pads[d]), int(pads[d + rank])
        if int(xs[d]) + b + e > MAX_TABLE:  # the tables are C arrays: the reference pads these
            raise ValueError(f"Pad output axis {d} of {int(xs[d]) + b + e} elements")
        index = np.arange(max(0, -b), max(max(0, -b), int(xs[d]) - max(0, -e)), dtype=np.int64)
        widths = (max(0, b), max(0, e))
        if mode == "constant":
            tables.append(np.pad(index, widths, mode="constant", constant_values=-1))
        else:
            tables.append(np.pad(index, widths, mode=_NUMPY_PAD_MODES[mode]))
    return tables


def _pad_value(value: float, dtype: np.dtype) -> str:
    """The padding value cast to ``dtype`` as the reference does, as an unsigned C literal."""
    with np.errstate(all="ignore"):
        cast = np.array(value).astype(dtype)
    bits = int(cast.reshape(1).view(np.dtype(f"u{dtype.itemsize}"))[0])
    return f"({storage_ctype(dtype)}){bits}u" if dtype.itemsize <= 4 else f"({storage_ctype(dtype)}){bits}ull"


def _pad_layout(
    xs: tuple[int, ...], tables: list[np.ndarray]
) -> tuple[list[tuple[int, int, np.ndarray | None]], np.ndarray]:
    """Runs of unpadded axes merged: ([(size, input stride, table or None)] outer, last table)."""
    own = contiguous_strides(xs)
    dims: list[tuple[int, int, np.ndarray | None]] = []
    for d, table in enumerate(tables):
        plain = len(table) == xs[d] and bool(np.array_equal(table, np.arange(xs[d])))
        if plain and dims and dims[-1][2] is None:
            size, _, _ = dims[-1]
            dims[-1] = (size * xs[d], own[d], None)
        else:
            dims.append((len(table), own[d], None if plain else np.where(table < 0, -1, table * own[d])))
    if not dims:
        dims = [(1, 1, None)]
    size, stride, last = dims.pop()
    last_table = np.arange(size, dtype=np.int64) * stride if last is None else last
    return dims, last_table


def _interior(row: np.ndarray) -> tuple[int, int]:
    """The longest [lo, hi) of ``row`` reading consecutive input elements (copied with memcpy)."""
    best, start = (0, 0), 0
    for i in range(len(row) + 1):
        if i == len(row) or row[i] < 0 or (i > start and row[i] != row[i - 1] + 1):
            if i - start > best[1] - best[0]:
                best = (start, i)
            start = i + 1 if i < len(row) and row[i] < 0 else i
    return best


class PadKernel(CKernel):
    kinds: tuple[str, ...] = ("Pad",)
    dynamic = True  # run-time sizes and pads: pad_runtime.py

    def supports(self, node: Node) -> bool:
        if not same_dtype_movable(node) or len(node.inputs) != 1 or len(node.outputs) != 1:
            return False
        if is_dynamic(node):
            return takes_runtime_pads(node)
        xs = shape_of(node.input(0))
        try:
            tables = pad_tables(xs, _ints(node.attrs["pads"]), str(node.attrs["mode"]))
        except ValueError:
            return False
        float(node.attrs["value"])
        return shape_of(node.outputs[0]) == tuple(len(t) for t in tables)

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        x, y = node.input(0), node.outputs[0]
        assert x is not None and x.dtype is not None
        if is_dynamic(node):
            return runtime_pad(step, _pad_value(float(node.attrs["value"]), x.dtype))
        xs, mode = shape_of(x), str(node.attrs["mode"])
        outer, last = _pad_layout(xs, pad_tables(xs, _ints(node.attrs["pads"]), mode))
        lo, hi = _interior(last)
        rows = [size for size, _, _ in outer]
        out_strides = contiguous_strides(rows) if rows else ()
        ctype = storage_ctype(x.dtype)
        args = step_args(step, ctype)
        ctx = PadContext(
            params=params(["x", "y"], args, [True] * 2),
            ctype=ctype,
            constant=mode == "constant",
            value=_pad_value(float(node.attrs["value"]), x.dtype),
            outer=tuple(
                PadDim(size, ostride, stride, None if table is None else tuple(int(t) for t in table))
                for (size, stride, table), ostride in zip(outer, out_strides, strict=True)
            ),
            padded=tuple(k for k, (_, _, table) in enumerate(outer) if table is not None),
            width=len(last),
            lo=lo,
            hi=hi,
            src=int(last[lo]) if hi > lo else 0,
            left=tuple(int(t) for t in last[:lo]),
            right=tuple(int(t) for t in last[hi:]),
            parallel=y.size >= 4 * PARALLEL_MIN_WORK and int(np.prod(rows, dtype=np.int64)) > 1,
        )
        if y.size == 0:
            return StepCode(None, ctx, ())
        return StepCode("c/pad.c.j2", ctx, tuple(args))


KERNELS = (PadKernel(),)
