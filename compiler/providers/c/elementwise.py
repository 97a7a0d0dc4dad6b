"""C kernels for elementwise ops: unary, binary with broadcasting, variadic, FusedElementwise.

The expressions come from ``compiler.codegen.elementwise`` (shared with the CUDA renderer); this
module only decides the loop nest (dimensions merged where every operand stays linear) and which
inputs are scalar constants folded into literals. The kernel never declares its pointers
``restrict``: the memory planner may run it in place (output == an input of the output's shape),
which is safe because each output element is written after its own inputs are read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from compiler.codegen.cdims import kernel_dims
from compiler.codegen.elementwise import ELEMENTWISE_OPS
from compiler.codegen.elementwise import LoopNest
from compiler.codegen.elementwise import broadcast_strides
from compiler.codegen.elementwise import coalesce
from compiler.codegen.elementwise import contiguous_strides
from compiler.codegen.elementwise import elementwise_node
from compiler.codegen.elementwise import literal
from compiler.codegen.elementwise import node_program
from compiler.codegen.elementwise import program_supported
from compiler.codegen.elementwise import scalar_constant
from compiler.codegen.toolchain import TargetInfo
from compiler.ir.graph import Node
from compiler.providers.base import GenStep
from compiler.providers.base import shape_of
from compiler.providers.c.common import PARALLEL_MIN_WORK
from compiler.providers.c.common import CKernel
from compiler.providers.c.common import StepCode
from compiler.providers.c.common import all_float32
from compiler.providers.c.common import arg
from compiler.providers.c.common import dyn_arg
from compiler.providers.c.common import output_args
from compiler.providers.c.elementwise_vector import vector_program
from compiler.providers.c.rundims import assumed_equal
from compiler.providers.kit import KernelContext
from compiler.providers.kit import Param
from runtime.contract import FUSED_ELEMENTWISE

__all__ = ["EltwiseContext", "EltwiseKernel"]

_CHUNK = 4096  # elements per parallel chunk when the nest is a single loop


@dataclass(frozen=True)
class EltwiseContext(KernelContext):
    nest: LoopNest
    loads: tuple[tuple[str, str, str], ...]  # (variable, pointer param, index expression)
    temps: tuple[tuple[str, str, str], ...]  # (ctype, name, expression)
    result: str
    parallel: bool
    parallel_if: str  # C condition for the OpenMP if clause where the size is a run-time one, else ""
    chunk: int
    vw: int  # floats per vector
    # the vector path of the innermost loop (elementwise_vector.py): its loads (variable, vf
    # expression) and statements (name, vf expression), the last one the result; None: scalar only
    vloads: tuple[tuple[str, str], ...] | None
    vector: tuple[tuple[str, str], ...] | None


class EltwiseKernel(CKernel):
    kinds = tuple(sorted(ELEMENTWISE_OPS - {"Equal", "Less", "Greater", "And", "Or", "Not", "Where"})) + (
        FUSED_ELEMENTWISE,
    )
    dynamic = True  # run-time dims: the nest's sizes and strides from the binding (cdims.py)

    def supports(self, node: Node) -> bool:
        if not all_float32(node) or len(node.outputs) != 1 or not node.inputs:
            return False
        if any(v is None or v.is_symbolic and v.is_const for v in node.inputs):
            return False
        out = shape_of(node.outputs[0], symbolic=True)
        same = assumed_equal(node)
        try:
            for v in node.inputs:
                assert v is not None
                broadcast_strides(shape_of(v, symbolic=True), out, same)
            program = node_program(node.kind, node.attrs, len(node.inputs))
        except (ValueError, KeyError, TypeError):
            return False
        return program_supported(program, len(node.inputs))

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        inputs = [v for v in node.inputs if v is not None]
        dynamic = any(v.is_symbolic for v in (*inputs, *node.outputs))
        text = kernel_dims(step.symbols) if dynamic else None
        same = assumed_equal(node) if dynamic else None
        plan = elementwise_node(node.kind, node.attrs, inputs, shape_of(node.outputs[0], symbolic=True),
                                text=text, same=same)
        args = [arg(step.inputs[k], "float", True, step, f"input {k} ({inputs[k].name})")
                for k in plan.loaded]
        args += output_args(step)
        names = [f"in{k}" for k in plan.loaded] + ["y"]
        if dynamic:  # the binding: the kernel's sizes are C over it
            args.append(dyn_arg(step))
            names.append("dyn")
        work = max(1, plan.program_length)
        static = isinstance(plan.nest.total, int)
        ctx = EltwiseContext(
            params=tuple(Param(n, a.ctype, a.const, n == "dyn") for n, a in zip(names, args, strict=True)),
            nest=plan.nest,
            loads=plan.loads,
            temps=plan.emitted.temps,
            result=plan.emitted.result,
            # run-time sizes: threads only when the run's work is large enough (OpenMP's if clause)
            parallel=not static or plan.nest.total * work >= PARALLEL_MIN_WORK,
            parallel_if="" if static else f"{plan.nest.total} * {work} >= {PARALLEL_MIN_WORK}",
            chunk=_CHUNK,
            vw=target.vector_bytes // 4,
            **_vector_path(node, inputs, plan.loads, same),
        )
        return StepCode("c/elementwise.c.j2", ctx, tuple(args))


def _vector_path(node: Node, inputs: list, loads: tuple[tuple[str, str, str], ...],
                 same: Callable[[Any, Any], bool] | None = None) -> dict:
    """The vector loads and statements of the innermost loop, or None for both where an operand
    is neither contiguous nor constant along it or an instruction has no vector form."""
    none = {"vloads": None, "vector": None}
    out = shape_of(node.outputs[0], symbolic=True)
    loaded = [v for v in inputs if scalar_constant(v) is None]
    strides = [broadcast_strides(shape_of(v, symbolic=True), out, same) for v in loaded]
    _, cols = coalesce(out, [contiguous_strides(out), *strides])
    if cols[0][-1] != 1 or any(c[-1] not in (0, 1) for c in cols[1:]):
        return none
    vloads = tuple((var, f"vload({ptr} + {idx})" if c[-1] else f"vbcast({ptr}[{idx}])")
                   for (var, ptr, idx), c in zip(loads, cols[1:], strict=True))
    exprs, it = [], iter(v for v, _ in vloads)
    for v in inputs:
        c = scalar_constant(v)
        exprs.append(f"vbcast({literal(c)})" if c is not None else next(it))
    vector = vector_program(node_program(node.kind, node.attrs, len(inputs)), exprs)
    return none if vector is None else {"vloads": vloads, "vector": vector}


KERNELS = (EltwiseKernel(),)
