"""The C DynamicQuantizeLinear (templates/c/qdynamic.c.j2): ONNX's definition bit for bit.

The arithmetic is the fused integer GEMM's (templates/c/qquant.c.j2 serves both): the scale
(max(x, 0) - min(x, 0)) / 255 in float32, the zero point saturate(round(-min / scale)), and
y = saturate(round(x / scale) + zero point), dividing, rounding half to even.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from compiler.codegen.toolchain import TargetInfo
from compiler.ir.graph import Node
from compiler.providers.base import GenStep
from compiler.providers.c.common import PARALLEL_MIN_WORK
from compiler.providers.c.common import CKernel
from compiler.providers.c.common import StepCode
from compiler.providers.c.common import arg
from compiler.providers.c.common import params
from compiler.providers.kit import KernelContext

__all__ = ["DynamicQuantizeContext"]

BLOCK = 4096  # elements per pool item


@dataclass(frozen=True)
class DynamicQuantizeContext(KernelContext):
    count: int
    block: int
    blocks: int
    when: str


class DynamicQuantizeKernel(CKernel):
    kinds: tuple[str, ...] = ("DynamicQuantizeLinear",)

    def supports(self, node: Node) -> bool:
        x = node.input(0)
        if x is None or x.dtype != np.float32 or x.shape is None or len(node.outputs) != 3:
            return False
        y, scale, zero = node.outputs
        return (
            y.dtype == np.uint8
            and scale.dtype == np.float32
            and zero.dtype == np.uint8
            and y.shape == x.shape
            and math.prod(x.shape) >= 1
        )

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        x = step.node.inputs[0]
        assert x is not None and x.shape is not None
        count = math.prod(x.shape)
        args = [
            arg(step.inputs[0], "float", True, step, "input 0"),
            *(
                arg(loc, ctype, False, step, f"output {i}")
                for i, (loc, ctype) in enumerate(
                    zip(step.outputs, ("uint8_t", "float", "uint8_t"), strict=True)
                )
            ),
        ]
        ctx = DynamicQuantizeContext(
            params(["x", "y", "scale", "zero"], args, [True] * 4),
            count,
            BLOCK,
            -(-count // BLOCK),
            "1" if count >= PARALLEL_MIN_WORK else "0",
        )
        return StepCode("c/qdynamic.c.j2", ctx, tuple(args))


KERNELS = (DynamicQuantizeKernel(),)
