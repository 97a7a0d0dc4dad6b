"""What the reduction-like C kernels (``reduce``, ``einsum``) share: their C type table,
index math over merged dimensions, and the aliasing rule for empty operands."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from compiler.codegen.elementwise import index_expr
from compiler.codegen.elementwise import unflatten
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.providers.base import shape_of

__all__ = ["CType", "CTYPES", "ctype_of", "prod", "offset_expr", "all_nonempty"]


@dataclass(frozen=True)
class CType:
    """A dtype as the kernels compute in it."""

    name: str  # the C type of an element
    kind: str  # numpy kind: "f" float, "i" signed, "u" unsigned, "b" bool
    acc: str  # the C type sums and products accumulate in
    lowest: str  # the C literal of the smallest value (-inf for floats)
    highest: str
    math: str  # suffix of the <math.h> functions ("f" for float)


def _int(bits: int, signed: bool) -> CType:
    if signed:
        return CType(f"int{bits}_t", "i", "int64_t", f"INT{bits}_MIN", f"INT{bits}_MAX", "")
    return CType(f"uint{bits}_t", "u", "uint64_t", "0", f"UINT{bits}_MAX", "")


CTYPES: dict[str, CType] = {
    "float32": CType("float", "f", "float", "(-INFINITY)", "INFINITY", "f"),
    "float64": CType("double", "f", "double", "(-INFINITY)", "INFINITY", ""),
    "bool": CType("uint8_t", "b", "uint8_t", "0", "1", ""),
    **{f"int{b}": _int(b, True) for b in (8, 16, 32, 64)},
    **{f"uint{b}": _int(b, False) for b in (8, 16, 32, 64)},
}


def ctype_of(v: Value | None) -> CType | None:
    """The C type of a static-shaped value, or None when the kernels do not compute in its dtype."""
    if v is None or v.shape is None or v.dtype is None:
        return None
    return CTYPES.get(np.dtype(v.dtype).name)


def prod(dims: Sequence[int]) -> int:
    return int(np.prod(dims, dtype=np.int64))


def offset_expr(flat: str, dims: Sequence[int], strides: Sequence[int]) -> str:
    """C expression: the element offset of row-major position ``flat`` over ``dims`` at ``strides``."""
    names = [f"({expr})" for _, expr in unflatten(dims, [f"d{d}" for d in range(len(dims))], flat)]
    return index_expr([s if n != 1 else 0 for n, s in zip(dims, strides, strict=True)], names)


def all_nonempty(node: Node) -> bool:
    """Every operand has elements (an empty one may share its address with another operand, so
    no pointer of the step can be ``restrict``)."""
    return all(prod(shape_of(v)) > 0 for v in [*node.inputs, *node.outputs] if v is not None)
