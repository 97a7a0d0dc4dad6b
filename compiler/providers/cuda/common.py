"""Shared records of the CUDA provider: the CUDA kernel base, kernel code, launch arguments.

Each op kind the CUDA provider runs has a ``CudaKernel`` (listed in ``KERNELS`` of one of the
modules of ``provider.KERNEL_MODULES``): ``supports`` decides the claim from the node's
attributes, dtypes and shapes; ``scratch_nbytes`` sizes the step's device scratch; ``build``
turns a scheduled step into a tuple of ``KernelCode`` -- each one ``__global__`` function
rendered from a template with a frozen context, plus how it is launched: grid, block, dynamic
shared memory and the arguments, in the order of the kernel's parameters.

A kernel of a dynamic graph's node (its class sets ``dynamic``) takes its run-time dims as ``int``
parameters after its pointers (``RunDims``: each distinct expression of the symbols one parameter
``rd<k>``, its launch argument that expression, evaluated by the runtime at each binding); its
grid and arena pointers are expressions too (``runtime/binding.py``). Static dims stay literals, so
a static node renders exactly as before.

A kernel's ``extern "C"`` name and its comment are not in its context: ``provider.py`` passes them
beside the context when it renders the kernel, and renders one function for the steps whose
contexts are equal.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from typing import ClassVar
from typing import TypeVar

import numpy as np

from compiler.codegen.cdims import CDim
from compiler.ir.graph import Node
from compiler.providers.base import GenLocation
from compiler.providers.base import GenStep
from compiler.providers.geometry import Spatial
from compiler.providers.kit import Kernel
from compiler.providers.kit import KernelContext
from compiler.providers.kit import Param
from runtime.errors import CompileError
from runtime.plan_schema import LaunchArg
from runtime.symbolic import Expr
from runtime.symbolic import bounds
from runtime.symbolic import ceildiv

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
    "RunDims",
    "is_dynamic",
    "ranges",
    "fits_int32",
    "max_of",
]

G = TypeVar("G", bound=Spatial)
THREADS = 256  # threads per block of the one-thread-per-element kernels
MAX_ELEMENTS = (1 << 31) - 1  # kernels index with 32-bit ints
MAX_GRID_YZ = 65535
WARPS = THREADS // 32  # rows (planes) per block of the warp-per-row kernels


@dataclass(frozen=True)
class KernelCode:
    """One ``__global__`` function of a step and its launch."""

    template: str
    ctx: KernelContext  # the frozen context rendered with ``template``
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int  # bytes of dynamic shared memory
    args: tuple[LaunchArg, ...]


class CudaKernel(Kernel):
    """A CUDA kernel: ``build`` renders one step as ``__global__`` functions and their launches.

    A kernel for an op the C provider also runs names that C kernel in ``claims_like``: it takes
    its kinds and its attribute / shape checks, on operands that ``operands_fit`` (float32 with
    32-bit element counts unless a kernel says otherwise). A kernel that sets ``dynamic`` also
    takes a dynamic graph's nodes (its dims written with ``RunDims``).
    """

    claims_like: ClassVar[type[Kernel] | None] = None

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        if cls.claims_like is not None and "kinds" not in cls.__dict__:
            cls.kinds = cls.claims_like.kinds

    def operands_fit(self, node: Node) -> bool:
        """float32 operands with 32-bit element counts (a dynamic graph's node: at every binding)."""
        if is_dynamic(node):
            return fits_int32(node) and all(v.dtype == np.float32 for v in (*node.inputs, *node.outputs)
                                            if v is not None)
        return float32_node(node)

    def supports(self, node: Node) -> bool:
        if self.claims_like is None:
            raise NotImplementedError
        return self.operands_fit(node) and _kernel_of(self.claims_like).supports(node)

    def build(self, step: GenStep) -> tuple[KernelCode, ...]:
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


def ptr(loc: GenLocation | None, step: GenStep, what: str, written: bool = False) -> LaunchArg:
    """The launch argument for ``loc``: device arena or device weights, never the caller's arrays
    (a dynamic plan's arena offset is an expression over the buffers' placeholders)."""
    if loc is None:
        raise CompileError(f"{step.node.describe()}: no location for {what}")
    if loc.kind not in ("arena", "weights") or (not isinstance(loc.offset, Expr) and loc.offset < 0):
        raise CompileError(
            f"{step.node.describe()}: {what} at {loc} is not in device memory (a missing transfer?)"
        )
    if loc.space != "cuda":
        raise CompileError(f"{step.node.describe()}: {what} lives in memory space {loc.space!r}")
    if written and loc.kind == "weights":
        raise CompileError(f"{step.node.describe()}: {what} is written but lives in weights")
    return LaunchArg("ptr", loc.offset if isinstance(loc.offset, Expr) else int(loc.offset), loc.kind)


def input_ptrs(step: GenStep) -> list[LaunchArg]:
    """Pointers to the step's present inputs, in input order."""
    out: list[LaunchArg] = []
    for i, value in enumerate(step.node.inputs):
        if value is None:
            continue
        loc = step.inputs[i] if i < len(step.inputs) else None
        out.append(ptr(loc, step, f"input {i} ({value.name})"))
    return out


def output_ptrs(step: GenStep) -> list[LaunchArg]:
    return [
        ptr(loc, step, f"output {i} ({step.node.outputs[i].name})", written=True)
        for i, loc in enumerate(step.outputs)
    ]


def blocks(total: Any, per_block: int) -> Any:
    """Blocks of ``per_block`` covering ``total`` (at least one); a run-time ``total`` (an ``Expr``
    of the symbols, >= 1 at every binding) gives an ``Expr``."""
    if isinstance(total, Expr):
        return ceildiv(total, int(per_block))
    return max(1, -(-int(total) // int(per_block)))


# -- run-time dims (a dynamic graph's nodes) ---------------------------------------------------------
def is_dynamic(node: Node) -> bool:
    """Some input or output of ``node`` has a run-time dim."""
    return any(v is not None and v.is_symbolic for v in (*node.inputs, *node.outputs))


def ranges(node: Node) -> dict[str, tuple[int, int]]:
    """The ranges of the symbols of the node's graph."""
    return dict(node.graph.symbols) if node.graph is not None else {}


def max_of(x: Any, node: Node) -> int:
    """The largest value ``x`` (an int or an ``Expr``) takes over the symbols' ranges."""
    return bounds(x, ranges(node))[1] if isinstance(x, Expr) else int(x)


def fits_int32(node: Node) -> bool:
    """Every operand of a dynamic node has at least one element at every binding and at most
    ``MAX_ELEMENTS`` at the largest (the kernels index with 32-bit ints); none is a symbolic
    constant."""
    values = [v for v in node.inputs if v is not None] + list(node.outputs)
    span = ranges(node)
    if not node.outputs or not span:
        return False
    for v in values:
        if v.shape is None or v.is_const and v.is_symbolic:
            return False
        lo, hi = bounds(math.prod(v.shape), span) if v.is_symbolic else (math.prod(v.shape),) * 2
        if lo < 1 or hi > MAX_ELEMENTS:
            return False
    return True


class RunDims:
    """The run-time dims of one kernel: ``self(x)`` is ``x`` for an int and, for an ``Expr`` of the
    symbols, a ``CDim`` naming the kernel's ``int`` parameter ``rd<k>`` (one per distinct
    expression; templates do arithmetic on it as C text); ``names`` are those parameters in order,
    ``args`` their launch arguments (each the expression, evaluated per binding)."""

    def __init__(self) -> None:
        self._exprs: dict[Expr, str] = {}

    def __call__(self, x: Any) -> Any:
        if isinstance(x, CDim):
            return x
        if not isinstance(x, Expr):
            return int(x)
        name = self._exprs.get(x)
        if name is None:
            name = self._exprs[x] = f"rd{len(self._exprs)}"
        return CDim(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._exprs.values())

    @property
    def args(self) -> tuple[LaunchArg, ...]:
        return tuple(LaunchArg("i32", e) for e in self._exprs)

    def geometry(self, g: G) -> G:
        """A windowed op's geometry (``compiler/providers/geometry.py``: a ``Spatial``) with its
        run-time batch and spatial sizes written as parameters (channels and windows static)."""
        rows = dataclasses.replace(g.rows, size=self(g.h), out=self(g.oh))
        cols = dataclasses.replace(g.cols, size=self(g.w), out=self(g.ow))
        return dataclasses.replace(g, batch=self(g.batch), rows=rows, cols=cols)
