"""C kernels for elementwise ops: unary, binary with broadcasting, variadic, FusedElementwise.

The expressions come from ``compiler.codegen.elementwise`` (shared with the CUDA renderer); this
module only decides the loop nest (dimensions merged where every operand stays linear) and which
inputs are scalar constants folded into literals. The kernel never declares its pointers
``restrict``: the memory planner may run it in place (output == an input of the output's shape),
which is safe because each output element is written after its own inputs are read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.codegen.elementwise import (
    ELEMENTWISE_OPS,
    LoopNest,
    broadcast_strides,
    emit_program,
    literal,
    loop_nest,
    node_program,
    program_supported,
)
from compiler.codegen.toolchain import TargetInfo
from compiler.ir.graph import Node, Value
from compiler.providers.base import StepPlan
from compiler.providers.c.common import (
    PARALLEL_MIN_WORK,
    Arg,
    CKernel,
    StepCode,
    all_float32,
    arg,
    output_args,
    shape_of,
)
from compiler.providers.kit import Param

__all__ = ["EltwiseContext", "EltwiseKernel"]

_CHUNK = 4096  # elements per parallel chunk when the nest is a single loop


@dataclass(frozen=True)
class EltwiseContext:
    params: tuple[Param, ...]
    nest: LoopNest
    loads: tuple[tuple[str, str, str], ...]  # (variable, pointer param, index expression)
    temps: tuple[tuple[str, str, str], ...]  # (ctype, name, expression)
    result: str
    parallel: bool
    chunk: int


def _scalar_const(value: Value) -> float | None:
    if value.const is None or value.const.size != 1:
        return None
    return float(np.asarray(value.const, dtype=np.float32).reshape(-1)[0])


class EltwiseKernel(CKernel):
    kinds = tuple(sorted(ELEMENTWISE_OPS - {"Equal", "Less", "Greater", "And", "Or", "Not", "Where"})) + (
        "onnx_aot.FusedElementwise",
    )

    def supports(self, node: Node) -> bool:
        if not all_float32(node) or len(node.outputs) != 1 or not node.inputs:
            return False
        if any(v is None for v in node.inputs):
            return False
        out = shape_of(node.outputs[0])
        try:
            for v in node.inputs:
                assert v is not None
                broadcast_strides(shape_of(v), out)
            program = node_program(node.kind, node.attrs, len(node.inputs))
        except (ValueError, KeyError, TypeError):
            return False
        return program_supported(program, len(node.inputs))

    def build(self, step: StepPlan, target: TargetInfo) -> StepCode:
        node = step.node
        out_shape = shape_of(node.outputs[0])
        inputs = [v for v in node.inputs if v is not None]
        consts: dict[int, float] = {}
        exprs: list[str] = []
        names: list[str] = []
        args: list[Arg] = []
        strides: list[tuple[int, ...]] = []
        for k, value in enumerate(inputs):
            c = _scalar_const(value)
            if c is not None:
                consts[k] = c
                exprs.append(literal(c))
                continue
            exprs.append(f"x{k}")
            names.append(f"in{k}")
            args.append(arg(step.inputs[k], "float", True, step, f"input {k} ({value.name})"))
            strides.append(broadcast_strides(shape_of(value), out_shape))
        nest = loop_nest(out_shape, strides)
        loaded = [k for k in range(len(inputs)) if k not in consts]
        loads = tuple((f"x{k}", f"in{k}", idx) for k, idx in zip(loaded, nest.in_index, strict=True))
        program = node_program(node.kind, node.attrs, len(inputs))
        emitted = emit_program(program, exprs, consts)
        args += output_args(step)
        names.append("y")
        ctx = EltwiseContext(
            params=tuple(Param(n, a.ctype, a.const, False) for n, a in zip(names, args, strict=True)),
            nest=nest,
            loads=loads,
            temps=emitted.temps,
            result=emitted.result,
            parallel=nest.total * max(1, len(program)) >= PARALLEL_MIN_WORK,
            chunk=_CHUNK,
        )
        return StepCode("c/elementwise.c.j2", ctx, tuple(args))


KERNELS = (EltwiseKernel(),)
