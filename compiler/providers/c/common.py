"""Shared records of the C provider: the C kernel base, step code, entry arguments.

Each op kind the C provider runs has a ``CKernel`` (listed in ``KERNELS`` of one of the modules of
``provider.KERNEL_MODULES``): ``supports`` decides the claim from the node's attributes, dtypes
and shapes; ``scratch_nbytes`` sizes the step's arena scratch; ``build`` turns a scheduled step
into ``StepCode`` -- a template, its frozen context and the pointer arguments the partition entry
passes, in the order of the step function's parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from compiler.codegen.cdims import c_dim
from compiler.codegen.toolchain import TargetInfo
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.providers.base import GenLocation
from compiler.providers.base import GenStep
from compiler.providers.kit import Kernel
from compiler.providers.kit import KernelContext
from compiler.providers.kit import Param
from runtime.errors import CompileError
from runtime.symbolic import Expr

__all__ = [
    "Arg",
    "StepCode",
    "CKernel",
    "all_float32",
    "float32_unary",
    "same_dtype_movable",
    "PARALLEL_MIN_WORK",
    "step_args",
    "dyn_arg",
]

# Below this many scalar operations a kernel runs on the calling thread (an OpenMP fork/join
# costs a few microseconds).
PARALLEL_MIN_WORK = 1 << 15


@dataclass(frozen=True)
class Arg:
    """A pointer the entry passes: a GenLocation cast to the parameter's type."""

    kind: str  # "arena" | "weights" | "ext" (a location kind: runtime/contract.py)
    offset: int | str  # a byte offset or slot; C text over the binding in a dynamic graph
    ctype: str
    const: bool


@dataclass(frozen=True)
class StepCode:
    """What one step contributes: a rendered function (or none) and its call."""

    template: str | None  # None: the step needs no code (a view onto the same address)
    ctx: KernelContext  # the frozen context rendered with ``template``
    args: tuple[Arg, ...]
    checked: bool = False  # the function returns int and takes ``fault`` last (common.c.j2)


class CKernel(Kernel):
    """A C kernel: ``build`` renders one step as a step function and its call."""

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        raise NotImplementedError


def _values(node: Node) -> list[Value]:
    return [v for v in node.inputs if v is not None] + list(node.outputs)


def all_float32(node: Node) -> bool:
    """Every input and output of ``node`` is a float32 tensor with a static shape."""
    return all(v.dtype == np.float32 and v.shape is not None for v in _values(node))


def float32_unary(node: Node) -> bool:
    """One input and one output, both float32 tensors with static shapes (pools, softmax)."""
    return len(node.inputs) == 1 and len(node.outputs) == 1 and all_float32(node)


def same_dtype_movable(node: Node) -> bool:
    """Inputs and outputs share one fixed-size numeric dtype (kernels that only move bytes)."""
    values = _values(node)
    if not values or any(v.dtype is None or v.shape is None for v in values):
        return False
    dtype = values[0].dtype
    assert dtype is not None
    return dtype.kind in "biufc" and dtype.itemsize in (1, 2, 4, 8) and all(v.dtype == dtype for v in values)


def arg(loc: GenLocation | None, ctype: str, const: bool, step: GenStep, what: str) -> Arg:
    """The entry argument for ``loc``; a missing or bad location names the node."""
    if loc is None:
        raise CompileError(f"{step.node.describe()}: no location for {what}")
    if isinstance(loc.offset, Expr):  # an arena offset of a dynamic graph: C text over its binding
        if loc.kind != "arena" or not step.dyn:
            raise CompileError(f"{step.node.describe()}: bad location {loc} for {what}")
        return Arg(loc.kind, c_dim(loc.offset, step.symbols, step.dyn), ctype, const)
    if loc.kind not in ("arena", "weights", "ext") or loc.offset < 0:
        raise CompileError(f"{step.node.describe()}: bad location {loc} for {what}")
    if loc.kind == "weights" and not const:
        raise CompileError(f"{step.node.describe()}: {what} is written but lives in weights")
    return Arg(loc.kind, int(loc.offset), ctype, const)


def dyn_arg(step: GenStep) -> Arg:
    """The binding's array (``const int64_t* dyn`` of a kernel with run-time dims)."""
    if not step.dyn:
        raise CompileError(f"{step.node.describe()}: a kernel with run-time dims outside a dynamic graph")
    return Arg("ext", 0, "int64_t", True)  # slot 0 of a dynamic C partition (plan.py)


def input_args(step: GenStep, ctype: str = "float") -> list[Arg]:
    """Args for the step's present inputs, in input order."""
    out: list[Arg] = []
    for i, value in enumerate(step.node.inputs):
        if value is None:
            continue
        loc = step.inputs[i] if i < len(step.inputs) else None
        out.append(arg(loc, ctype, True, step, f"input {i} ({value.name})"))
    return out


def output_args(step: GenStep, ctype: str = "float") -> list[Arg]:
    return [
        arg(loc, ctype, False, step, f"output {i} ({step.node.outputs[i].name})")
        for i, loc in enumerate(step.outputs)
    ]


def step_args(step: GenStep, ctype: str = "float", out_ctype: str | None = None) -> list[Arg]:
    """Args for the step's present inputs then its outputs (of ``out_ctype``, default ``ctype``)."""
    return [*input_args(step, ctype), *output_args(step, out_ctype or ctype)]


def scratch_arg(step: GenStep, needed: int) -> list[Arg]:
    """The scratch pointer (checked to be big enough), or nothing when ``needed`` is 0."""
    if needed == 0:
        return []
    if step.scratch is None or step.scratch_nbytes < needed:
        raise CompileError(
            f"{step.node.describe()}: needs {needed} bytes of scratch, plan gives {step.scratch_nbytes}"
        )
    return [arg(step.scratch, "float", False, step, "scratch")]


def params(names: Sequence[str], args: Sequence[Arg], restrict: Sequence[bool]) -> tuple[Param, ...]:
    """The step function's parameters; ``restrict`` is dropped where two args share an address
    (an empty tensor's buffer may sit anywhere, even on another operand)."""
    places = [(a.kind, a.offset) for a in args]
    shared = {p for p in places if places.count(p) > 1}
    return tuple(Param(n, a.ctype, a.const, r and (a.kind, a.offset) not in shared)
                 for n, a, r in zip(names, args, restrict, strict=True))
