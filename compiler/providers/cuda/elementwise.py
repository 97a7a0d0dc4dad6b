"""The CUDA kernel for elementwise ops: unary, binary with broadcasting, variadic, FusedElementwise.

One thread per output element; the expressions, broadcasting strides and loop-nest coalescing come
from ``compiler.codegen.elementwise``, shared with the C provider, and scalar constant inputs are
folded into literals as there. A fused chain is one kernel (``templates/cuda/elementwise.cu.j2``).
A dynamic graph's node takes its nest's run-time sizes and strides as parameters (``RunDims``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from compiler.codegen.elementwise import CUDA_DIALECT
from compiler.codegen.elementwise import elementwise_node
from compiler.codegen.elementwise import unflatten
from compiler.providers.base import GenStep
from compiler.providers.base import shape_of
from compiler.providers.c.elementwise import EltwiseKernel
from compiler.providers.cuda.common import THREADS
from compiler.providers.cuda.common import CudaKernel
from compiler.providers.cuda.common import KernelCode
from compiler.providers.cuda.common import RunDims
from compiler.providers.cuda.common import blocks
from compiler.providers.cuda.common import is_dynamic
from compiler.providers.cuda.common import output_ptrs
from compiler.providers.cuda.common import ptr
from compiler.providers.cuda.common import used_indices
from compiler.providers.kit import KernelContext
from compiler.providers.kit import Param

__all__ = ["CudaEltwiseContext", "CudaEltwiseKernel"]


@dataclass(frozen=True)
class CudaEltwiseContext(KernelContext):
    threads: int
    total: Any  # int, or a run-time dim (CDim)
    index: tuple[tuple[str, str], ...]  # (loop variable, expression over `flat`)
    loads: tuple[tuple[str, str, str], ...]  # (variable, pointer param, index expression)
    temps: tuple[tuple[str, str, str], ...]  # (ctype, name, expression)
    result: str
    out_index: str
    dims: tuple[str, ...] = ()  # run-time dim parameters (a dynamic graph's node)


class CudaEltwiseKernel(CudaKernel):
    claims_like = EltwiseKernel
    dynamic = True  # run-time dims: the nest's sizes and strides as kernel parameters

    def build(self, step: GenStep) -> tuple[KernelCode, ...]:
        node = step.node
        inputs = [v for v in node.inputs if v is not None]
        rd = RunDims()
        plan = elementwise_node(node.kind, node.attrs, inputs, shape_of(node.outputs[0], symbolic=True),
                                CUDA_DIALECT, text=rd if is_dynamic(node) else None)
        nest = plan.nest
        args = [ptr(step.inputs[k], step, f"input {k} ({inputs[k].name})") for k in plan.loaded]
        args += output_ptrs(step)
        names = [f"in{k}" for k in plan.loaded]
        params = [*(Param(n, "float", True, False) for n in names), Param("y", "float", False, False)]
        index = unflatten(nest.dims, nest.names, "flat")
        ctx = CudaEltwiseContext(
            params=tuple(params),
            threads=THREADS,
            total=nest.total,
            index=used_indices(index, [nest.out_index, *nest.in_index]),
            loads=plan.loads,
            temps=plan.emitted.temps,
            result=plan.emitted.result,
            out_index=nest.out_index,
            dims=rd.names,
        )
        total = math.prod(shape_of(node.outputs[0], symbolic=True))
        grid = (blocks(total, THREADS), 1, 1)
        return (KernelCode("cuda/elementwise.cu.j2", ctx, grid, (THREADS, 1, 1), 0, (*args, *rd.args)),)


KERNELS = (CudaEltwiseKernel(),)
