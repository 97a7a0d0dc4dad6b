"""Memory planning: lifetimes and aliasing over the schedule, and offset packing into arenas."""

from compiler.memory.packing import Buffer
from compiler.memory.packing import MemoryPlan
from compiler.memory.packing import lower_bound
from compiler.memory.packing import plan_offsets
from compiler.memory.packing import verify_plan

__all__ = ["Buffer", "MemoryPlan", "plan_offsets", "lower_bound", "verify_plan"]
