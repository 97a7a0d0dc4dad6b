"""C kernel for a MaxPoolNhwc between ``--precision bf16`` steps: its input and output stored as
bfloat16 codes (``compiler/providers/c/conv_amx.py: bf16_link``; ``templates/c/pool_nhwc_bf16.c.j2``).

The maximum of bf16 values is one of them, so the codes it stores are the ones its bf16 readers
rounded the fp32 MaxPool's result to: the artifact computes the same bits with half the bytes.
``PoolNhwcKernel`` hands such a node here (static shapes).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from compiler.codegen.toolchain import TargetInfo
from compiler.ir.graph import Node
from compiler.providers.base import GenStep
from compiler.providers.c.common import PARALLEL_MIN_WORK
from compiler.providers.c.common import StepCode
from compiler.providers.c.common import params
from compiler.providers.c.common import step_args
from compiler.providers.c.conv_amx import bf16_link
from compiler.providers.geometry import PoolGeometry
from compiler.providers.geometry import claimed
from compiler.providers.kit import KernelContext
from runtime.contract import MAX_POOL_NHWC

__all__ = ["PoolBf16Context", "bf16_pool", "build_bf16_pool"]


@dataclass(frozen=True)
class PoolBf16Context(KernelContext):
    g: PoolGeometry
    parallel: bool


def bf16_pool(node: Node) -> bool:
    """``node`` is a MaxPoolNhwc whose input (and so its output) is stored as bfloat16."""
    x = node.input(0)
    return node.kind == MAX_POOL_NHWC and x is not None and bf16_link(x)


def build_bf16_pool(step: GenStep, target: TargetInfo) -> StepCode:
    node = step.node
    g = claimed(PoolGeometry.from_node(node, "NHWC"), node)
    args = [dataclasses.replace(a, ctype="uint16_t") for a in step_args(step)]
    work = g.batch * g.oh * g.ow * g.c * g.kh * g.kw
    ctx = PoolBf16Context(params=params(["x", "y"], args, [True, True]), g=g,
                          parallel=work >= PARALLEL_MIN_WORK and g.batch * g.oh > 1)
    return StepCode("c/pool_nhwc_bf16.c.j2", ctx, tuple(args))
