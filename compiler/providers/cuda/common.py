"""Shared records of the CUDA provider: kernel registry, kernel code, launch arguments.

Each op kind the CUDA provider runs is registered here by a ``CudaKernel`` (in the modules of
``provider.KERNEL_MODULES``): ``supports`` decides the claim from the node's
attributes, dtypes and shapes; ``scratch_nbytes`` sizes the step's device scratch; ``build``
turns a scheduled step into a tuple of ``KernelCode`` -- each one ``__global__`` function
rendered from a template with a frozen context, plus how it is launched: grid, block, dynamic
shared memory and the arguments, in the order of the kernel's parameters.

Every kernel context has a ``name`` field (the ``extern "C"`` symbol); ``provider.py`` fills it and
shares one function between steps whose contexts are equal but for the name and comment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from compiler.ir.graph import Node
from compiler.providers.base import Location, StepPlan, shape_of
from runtime.errors import CompileError
from runtime.plan_schema import LaunchArg

__all__ = [
    "Param",
    "KernelCode",
    "CudaKernel",
    "REGISTRY",
    "register",
    "shape_of",
    "float32_node",
    "ptr",
    "input_ptrs",
    "output_ptrs",
    "blocks",
    "comment",
    "THREADS",
    "MAX_GRID_YZ",
    "MAX_ELEMENTS",
]

THREADS = 256  # threads per block of the one-thread-per-element kernels
MAX_ELEMENTS = (1 << 31) - 1  # kernels index with 32-bit ints
MAX_GRID_YZ = 65535


@dataclass(frozen=True)
class Param:
    """One pointer parameter of a kernel (``__restrict__`` only where nothing may alias)."""

    name: str
    ctype: str
    const: bool
    restrict: bool


@dataclass(frozen=True)
class KernelCode:
    """One ``__global__`` function of a step and its launch."""

    template: str
    ctx: Any  # a frozen dataclass with ``name`` and ``comment`` fields
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int  # bytes of dynamic shared memory
    args: tuple[LaunchArg, ...]


class CudaKernel(Protocol):
    kinds: tuple[str, ...]

    def supports(self, node: Node) -> bool: ...

    def scratch_nbytes(self, node: Node) -> int: ...

    def build(self, step: StepPlan) -> tuple[KernelCode, ...]: ...


REGISTRY: dict[str, CudaKernel] = {}


def register(kernel: CudaKernel) -> CudaKernel:
    """Register ``kernel`` for each of its kinds (one kernel per kind)."""
    for kind in kernel.kinds:
        if kind in REGISTRY:
            raise ValueError(f"CUDA kernel for {kind} registered twice")
        REGISTRY[kind] = kernel
    return kernel


def float32_node(node: Node) -> bool:
    """Every present input and output is float32 with a static shape that 32-bit indices cover."""
    values = [v for v in node.inputs if v is not None] + list(node.outputs)
    return bool(node.outputs) and all(
        v.dtype == np.float32 and v.shape is not None and 0 < math.prod(v.shape) <= MAX_ELEMENTS
        for v in values
    )


def comment(node: Node) -> str:
    """The node's kind and name, safe inside a C comment."""
    text = f"{node.kind} {node.name}"
    return "".join(ch if ch.isalnum() or ch in " ._:/-" else "_" for ch in text)


def ptr(loc: Location | None, step: StepPlan, what: str, written: bool = False) -> LaunchArg:
    """The launch argument for ``loc``: device arena or device weights, never the caller's arrays."""
    if loc is None:
        raise CompileError(f"{step.node.describe()}: no location for {what}")
    if loc.space not in ("arena", "weights") or loc.offset < 0:
        raise CompileError(
            f"{step.node.describe()}: {what} at {loc} is not in device memory (a missing transfer?)"
        )
    if loc.memory_space != "cuda":
        raise CompileError(f"{step.node.describe()}: {what} lives in memory space {loc.memory_space!r}")
    if written and loc.space == "weights":
        raise CompileError(f"{step.node.describe()}: {what} is written but lives in weights")
    return LaunchArg("ptr", int(loc.offset), loc.space)


def input_ptrs(step: StepPlan) -> list[LaunchArg]:
    """Pointers to the step's present inputs, in input order."""
    out: list[LaunchArg] = []
    for i, value in enumerate(step.node.inputs):
        if value is None:
            continue
        loc = step.inputs[i] if i < len(step.inputs) else None
        out.append(ptr(loc, step, f"input {i} ({value.name})"))
    return out


def output_ptrs(step: StepPlan) -> list[LaunchArg]:
    return [
        ptr(loc, step, f"output {i} ({step.node.outputs[i].name})", written=True)
        for i, loc in enumerate(step.outputs)
    ]


def blocks(total: int, per_block: int) -> int:
    """Blocks of ``per_block`` covering ``total`` (at least one)."""
    return max(1, -(-int(total) // int(per_block)))
