"""The CUDA kernel for MaxPool / AveragePool: one thread per output element (``templates/cuda/pool.cu.j2``).

Attribute and shape checks are the C kernel's (``c.pool``); a dynamic graph's node (floor mode)
takes its run-time batch and spatial sizes as parameters (``RunDims``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from compiler.codegen.elementwise import unflatten
from compiler.providers.base import GenStep
from compiler.providers.c.pool import PoolKernel
from compiler.providers.cuda.common import THREADS
from compiler.providers.cuda.common import CudaKernel
from compiler.providers.cuda.common import KernelCode
from compiler.providers.cuda.common import RunDims
from compiler.providers.cuda.common import blocks
from compiler.providers.cuda.common import float_params
from compiler.providers.cuda.common import input_ptrs
from compiler.providers.cuda.common import is_dynamic
from compiler.providers.cuda.common import output_ptrs
from compiler.providers.geometry import PoolGeometry
from compiler.providers.geometry import claimed
from compiler.providers.kit import KernelContext

__all__ = ["CudaPoolContext", "CudaPoolKernel"]


@dataclass(frozen=True)
class CudaPoolContext(KernelContext):
    threads: int
    op: str  # "max" | "avg"
    total: Any  # int, or a run-time dim (CDim)
    index: tuple[tuple[str, str], ...]  # nc, oy, ox from flat
    g: PoolGeometry  # a dynamic node's: run-time sizes as CDim
    count_include_pad: bool
    dims: tuple[str, ...] = ()  # run-time dim parameters (a dynamic graph's node)


class CudaPoolKernel(CudaKernel):
    claims_like = PoolKernel
    dynamic = True  # run-time batch and spatial sizes (floor mode: the C kernel's check)

    def build(self, step: GenStep) -> tuple[KernelCode, ...]:
        node = step.node
        rd = RunDims()
        g = claimed(PoolGeometry.from_node(node, "NCHW", symbolic=is_dynamic(node)), node)
        total = g.batch * g.c * g.oh * g.ow
        g = rd.geometry(g)
        nc = g.batch * g.c
        ctx = CudaPoolContext(
            params=float_params(["x", "y"], True), threads=THREADS,
            op="max" if node.op_type == "MaxPool" else "avg", total=rd(total),
            index=unflatten((nc, g.oh, g.ow), ("nc", "oy", "ox"), "flat"), g=g,
            count_include_pad=node.op_type == "AveragePool" and bool(int(node.attrs["count_include_pad"])),
            dims=rd.names,
        )  # fmt: skip
        args = (*input_ptrs(step), *output_ptrs(step), *rd.args)
        return (KernelCode("cuda/pool.cu.j2", ctx, (blocks(total, THREADS), 1, 1), (THREADS, 1, 1), 0, args),)


KERNELS = (CudaPoolKernel(),)
