"""Memory planning: lifetimes and aliasing over the schedule, and offset packing into arenas."""

from compiler.memory.packing import Buffer, MemoryPlan, lower_bound, plan_offsets, verify_plan

__all__ = ["Buffer", "MemoryPlan", "plan_offsets", "lower_bound", "verify_plan"]
