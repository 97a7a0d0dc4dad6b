"""Shared records of the CUDA provider: the CUDA kernel base, kernel code, launch arguments.

Each op kind the CUDA provider runs has a ``CudaKernel`` (listed in ``KERNELS`` of one of the
modules of ``provider.KERNEL_MODULES``): ``supports`` decides the claim from the node's
attributes, dtypes and shapes; ``scratch_nbytes`` sizes the step's device scratch; ``build``
turns a scheduled step into a tuple of ``KernelCode`` -- each one ``__global__`` function
rendered from a template with a frozen context, plus how it is launched: grid, block, dynamic
shared memory and the arguments, in the order of the kernel's parameters.

A kernel's ``extern "C"`` name and its comment are not in its context: ``provider.py`` passes them
beside the context when it renders the kernel, and renders one function for the steps whose
contexts are equal.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from typing import ClassVar

import numpy as np

from compiler.ir.graph import Node
from compiler.providers.base import Location
from compiler.providers.base import StepPlan
from compiler.providers.kit import Kernel
from compiler.providers.kit import Param
from runtime.errors import CompileError
from runtime.plan_schema import LaunchArg

__all__ = [
    "KernelCode",
    "CudaKernel",
    "float32_node",
    "float_params",
    "ptr",
    "input_ptrs",
    "output_ptrs",
    "blocks",
    "used_indices",
    "THREADS",
    "MAX_GRID_YZ",
    "WARPS",
    "MAX_ELEMENTS",
]

THREADS = 256  # threads per block of the one-thread-per-element kernels
MAX_ELEMENTS = (1 << 31) - 1  # kernels index with 32-bit ints
MAX_GRID_YZ = 65535
WARPS = THREADS // 32  # rows (planes) per block of the warp-per-row kernels


@dataclass(frozen=True)
class KernelCode:
    """One ``__global__`` function of a step and its launch."""

    template: str
    ctx: Any  # the frozen context rendered with ``template``
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int  # bytes of dynamic shared memory
    args: tuple[LaunchArg, ...]


class CudaKernel(Kernel):
    """A CUDA kernel: ``build`` renders one step as ``__global__`` functions and their launches.

    A kernel for an op the C provider also runs names that C kernel in ``claims_like``: it takes
    its kinds and its attribute / shape checks, on operands that ``operands_fit`` (float32 with
    32-bit element counts unless a kernel says otherwise).
    """

    claims_like: ClassVar[type[Kernel] | None] = None

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        if cls.claims_like is not None and "kinds" not in cls.__dict__:
            cls.kinds = cls.claims_like.kinds

    def operands_fit(self, node: Node) -> bool:
        return float32_node(node)

    def supports(self, node: Node) -> bool:
        if self.claims_like is None:
            raise NotImplementedError
        return self.operands_fit(node) and _kernel_of(self.claims_like).supports(node)

    def build(self, step: StepPlan) -> tuple[KernelCode, ...]:
        raise NotImplementedError


_CLAIMED_LIKE: dict[type[Kernel], Kernel] = {}


def _kernel_of(cls: type[Kernel]) -> Kernel:
    """One instance per C kernel class a CUDA kernel claims like (kernels hold no state)."""
    if cls not in _CLAIMED_LIKE:
        _CLAIMED_LIKE[cls] = cls()
    return _CLAIMED_LIKE[cls]


def used_indices(pairs: Sequence[tuple[str, str]], exprs: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """The ``(name, expr)`` index definitions some expression in ``exprs`` reads (nvcc warns
    about the others)."""
    text = " ".join(exprs)
    return tuple((n, e) for n, e in pairs if re.search(rf"\b{n}\b", text))


def float_params(names: list[str], restrict: bool) -> tuple[Param, ...]:
    """Float pointer parameters ``names``; all but the output ``y`` const."""
    return tuple(Param(n, "float", n != "y", restrict) for n in names)


def float32_node(node: Node) -> bool:
    """Every present input and output is float32 with a static shape that 32-bit indices cover."""
    values = [v for v in node.inputs if v is not None] + list(node.outputs)
    return bool(node.outputs) and all(
        v.dtype == np.float32 and v.shape is not None and 0 < math.prod(v.shape) <= MAX_ELEMENTS
        for v in values
    )


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
