"""The CUDA kernel for MaxPool / AveragePool: one thread per output element (``templates/cuda/pool.cu.j2``).

Attribute and shape checks are the C kernel's (``c.pool``).
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.codegen.elementwise import unflatten
from compiler.providers.base import StepPlan
from compiler.providers.c.pool import PoolKernel
from compiler.providers.cuda.common import THREADS
from compiler.providers.cuda.common import CudaKernel
from compiler.providers.cuda.common import KernelCode
from compiler.providers.cuda.common import blocks
from compiler.providers.cuda.common import float_params
from compiler.providers.cuda.common import input_ptrs
from compiler.providers.cuda.common import output_ptrs
from compiler.providers.geometry import PoolGeometry
from compiler.providers.geometry import claimed
from compiler.providers.kit import Param

__all__ = ["CudaPoolContext", "CudaPoolKernel"]


@dataclass(frozen=True)
class CudaPoolContext:
    params: tuple[Param, ...]
    threads: int
    op: str  # "max" | "avg"
    total: int
    index: tuple[tuple[str, str], ...]  # nc, oy, ox from flat
    g: PoolGeometry
    count_include_pad: bool


class CudaPoolKernel(CudaKernel):
    claims_like = PoolKernel

    def build(self, step: StepPlan) -> tuple[KernelCode, ...]:
        node = step.node
        g = claimed(PoolGeometry.from_node(node, "NCHW"), node)
        nc = g.batch * g.c
        total = nc * g.oh * g.ow
        ctx = CudaPoolContext(
            params=float_params(["x", "y"], True), threads=THREADS,
            op="max" if node.op_type == "MaxPool" else "avg", total=total,
            index=unflatten((nc, g.oh, g.ow), ("nc", "oy", "ox"), "flat"), g=g,
            count_include_pad=node.op_type == "AveragePool" and bool(int(node.attrs["count_include_pad"])),
        )  # fmt: skip
        args = (*input_ptrs(step), *output_ptrs(step))
        return (KernelCode("cuda/pool.cu.j2", ctx, (blocks(total, THREADS), 1, 1), (THREADS, 1, 1), 0, args),)


KERNELS = (CudaPoolKernel(),)
