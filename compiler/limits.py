"""Compile-time resource limits: ``--max-arena-bytes``.

A deployment that must fit a memory budget says so at compile time; a plan whose arenas need
more fails there, with the bytes each memory space needs, instead of on the device.
"""

from __future__ import annotations

from collections.abc import Mapping

from compiler.memory import MemoryPlan
from runtime.errors import CompileError

__all__ = ["ArenaLimitError", "check_arena_limit"]


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
