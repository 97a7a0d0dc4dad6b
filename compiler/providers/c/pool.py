"""C kernels for MaxPool / AveragePool (1-D and 2-D, NCHW).

Global pools, BatchNormalization, LRN and Softmax are in ``norm``; the channels-last pools of the
layout pass in ``pool_nhwc``.
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.codegen.toolchain import TargetInfo
from compiler.ir.graph import Node
from compiler.providers.base import StepPlan
from compiler.providers.c.common import PARALLEL_MIN_WORK
from compiler.providers.c.common import CKernel
from compiler.providers.c.common import StepCode
from compiler.providers.c.common import float32_unary
from compiler.providers.c.common import params
from compiler.providers.c.common import step_args
from compiler.providers.geometry import PoolGeometry
from compiler.providers.geometry import claimed
from compiler.providers.kit import Param

__all__ = ["PoolContext", "PoolKernel"]


@dataclass(frozen=True)
class PoolContext:
    params: tuple[Param, ...]
    op: str  # "max" | "avg"
    nc: int
    g: PoolGeometry
    count_include_pad: bool
    parallel: bool
    ow_lo: int  # output columns [ow_lo, ow_hi) have every window tap inside the input row
    ow_hi: int


class PoolKernel(CKernel):
    kinds: tuple[str, ...] = ("MaxPool", "AveragePool")

    def supports(self, node: Node) -> bool:
        if not float32_unary(node):
            return False
        if node.op_type == "AveragePool" and "count_include_pad" not in node.attrs:
            return False
        g = PoolGeometry.from_node(node, "NCHW")
        return g is not None and (node.op_type == "MaxPool" or (g.dh == 1 and g.dw == 1))

    def build(self, step: StepPlan, target: TargetInfo) -> StepCode:
        node = step.node
        g = claimed(PoolGeometry.from_node(node, "NCHW"), node)
        args = step_args(step)
        ow_lo, ow_hi = g.cols.inside()
        ctx = PoolContext(
            params=params(["x", "y"], args, [True, True]),
            op="max" if node.op_type == "MaxPool" else "avg",
            nc=g.batch * g.c,
            g=g,
            count_include_pad=node.op_type == "AveragePool" and bool(int(node.attrs["count_include_pad"])),
            parallel=g.batch * g.c * g.oh * g.ow * g.kh * g.kw >= PARALLEL_MIN_WORK,
            ow_lo=ow_lo,
            ow_hi=ow_hi,
        )
        return StepCode("c/pool.c.j2", ctx, tuple(args))


KERNELS = (PoolKernel(),)
