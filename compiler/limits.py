"""Compile-time resource limits: ``--max-arena-bytes``, and the largest tensor the compiler accepts.

A deployment that must fit a memory budget says so at compile time; a plan whose arenas need
more fails there, with the bytes each memory space needs, instead of on the device. Independent
of any budget, a tensor over ``MAX_TENSOR_BYTES`` (1 TiB) is a ``ShapeError`` where the frontend
first gives it a static shape: such a model cannot run anywhere, and sizes that large would
overflow the int64 arithmetic of shapes and offsets further down.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from collections.abc import Sequence

import numpy as np

from compiler.memory import MemoryPlan
from runtime.errors import CompileError
from runtime.errors import ShapeError

__all__ = ["MAX_TENSOR_BYTES", "ArenaLimitError", "check_arena_limit", "check_tensor_size"]

MAX_TENSOR_BYTES = 1 << 40


def check_tensor_size(what: str, dtype: np.dtype, dims: Sequence[int]) -> None:
    """``ShapeError`` naming ``what`` when a tensor of ``dims`` x ``dtype`` exceeds 1 TiB."""
    nbytes = math.prod(int(d) for d in dims) * np.dtype(dtype).itemsize
    if nbytes > MAX_TENSOR_BYTES:
        raise ShapeError(f"{what} has shape {list(dims)} ({nbytes:,} bytes), over the "
                         f"{MAX_TENSOR_BYTES:,}-byte limit for one tensor")


class ArenaLimitError(CompileError):
    """The memory plan needs more arena bytes than ``max_arena_bytes`` allows."""

    def __init__(self, message: str, needed: dict[str, int], limit: int) -> None:
        super().__init__(message)
        self.needed = needed
        self.limit = limit


def check_arena_limit(model: str, plans: Mapping[str, MemoryPlan], limit: int | None) -> None:
    """Raise ``ArenaLimitError`` when any memory space's arena exceeds ``limit`` bytes."""
    if limit is None:
        return
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise CompileError(f"max_arena_bytes must be a whole number of bytes >= 0, got {limit!r}")
    needed = {space: int(plan.arena_nbytes) for space, plan in sorted(plans.items())}
    over = {space: n for space, n in needed.items() if n > limit}
    if over:
        detail = ", ".join(
            f"{space} arena {n:,} bytes (lower bound {int(plans[space].lower_bound_nbytes):,})"
            for space, n in over.items())
        raise ArenaLimitError(
            f"{model}: the memory plan needs {detail}, over --max-arena-bytes {limit:,}; raise the "
            f"limit to at least {max(over.values()):,} or use a smaller input shape", needed, limit)
