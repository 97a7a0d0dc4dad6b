"""C kernels that normalize or summarize NCHW planes and rows.

The per-channel kernel (``templates/c/channel.c.j2``) walks the (N, C, spatial) planes:
GlobalAveragePool / GlobalMaxPool (one value per plane), BatchNormalization (inference) and LRN.
Softmax / LogSoftmax normalize along any axis (``templates/c/softmax.c.j2``; along the last axis
on whole vectors with the vector math's exp).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from compiler.codegen.elementwise import literal
from compiler.codegen.toolchain import TargetInfo
from compiler.ir.graph import Node
from compiler.providers.base import StepPlan
from compiler.providers.base import shape_of
from compiler.providers.c.common import PARALLEL_MIN_WORK
from compiler.providers.c.common import CKernel
from compiler.providers.c.common import StepCode
from compiler.providers.c.common import all_float32
from compiler.providers.c.common import float32_unary
from compiler.providers.c.common import params
from compiler.providers.c.common import step_args
from compiler.providers.kit import Param

__all__ = ["ChannelContext", "ChannelKernel", "SoftmaxContext", "SoftmaxKernel"]


@dataclass(frozen=True)
class ChannelContext:
    """A kernel over (N, C, spatial...) planes of ``s`` elements."""

    params: tuple[Param, ...]
    op: str  # "global_avg" | "global_max" | "batchnorm" | "lrn"
    n: int
    c: int
    s: int
    eps: str  # batchnorm
    lrn_lo: int  # lrn: channels below / above c in the window
    lrn_hi: int
    lrn_alpha: str  # alpha / size
    lrn_beta: str
    lrn_bias: str
    parallel: bool


class ChannelKernel(CKernel):
    kinds: tuple[str, ...] = ("GlobalAveragePool", "GlobalMaxPool", "BatchNormalization", "LRN")

    def supports(self, node: Node) -> bool:
        if not all_float32(node) or len(node.outputs) != 1 or node.input(0) is None:
            return False
        xs, ys = shape_of(node.input(0)), shape_of(node.outputs[0])
        if len(xs) < 3 and node.op_type != "BatchNormalization" or len(xs) < 2:
            return False
        if node.op_type.startswith("Global"):
            return len(node.inputs) == 1 and ys == xs[:2] + (1,) * (len(xs) - 2)
        if ys != xs:
            return False
        if node.op_type == "LRN":
            return len(node.inputs) == 1 and all(k in node.attrs for k in ("alpha", "beta", "bias", "size"))
        ins = node.inputs
        return (
            len(ins) == 5
            and all(v is not None and shape_of(v) == (xs[1],) for v in ins[1:])
            and "epsilon" in node.attrs
        )

    def build(self, step: StepPlan, target: TargetInfo) -> StepCode:
        node = step.node
        xs = shape_of(node.input(0))
        a = node.attrs
        op = {
            "GlobalAveragePool": "global_avg",
            "GlobalMaxPool": "global_max",
            "BatchNormalization": "batchnorm",
            "LRN": "lrn",
        }[node.op_type]
        args = step_args(step)
        if op == "batchnorm":
            names, restrict = (
                ["x", "scale", "bias", "mean", "var", "y"],
                [False, True, True, True, True, False],
            )
        else:
            names, restrict = ["x", "y"], [True, True]
        size = int(a["size"]) if op == "lrn" else 1
        s = math.prod(xs[2:])
        ctx = ChannelContext(
            params=params(names, args, restrict),
            op=op,
            n=xs[0],
            c=xs[1],
            s=s,
            eps=literal(float(a["epsilon"])) if op == "batchnorm" else "0.0f",
            lrn_lo=(size - 1) // 2,
            lrn_hi=size - 1 - (size - 1) // 2,
            lrn_alpha=literal(float(a["alpha"]) / size) if op == "lrn" else "0.0f",
            lrn_beta=literal(float(a["beta"])) if op == "lrn" else "0.0f",
            lrn_bias=literal(float(a["bias"])) if op == "lrn" else "0.0f",
            parallel=math.prod(xs) * size >= PARALLEL_MIN_WORK,
        )
        return StepCode("c/channel.c.j2", ctx, tuple(args))


@dataclass(frozen=True)
class SoftmaxContext:
    params: tuple[Param, ...]
    log: bool
    outer: int
    length: int
    inner: int
    parallel: bool
    vector: bool  # contiguous rows (inner 1) run on whole vectors with the vector math
    vw: int  # floats per vector


class SoftmaxKernel(CKernel):
    kinds: tuple[str, ...] = ("Softmax", "LogSoftmax")

    def supports(self, node: Node) -> bool:
        if not float32_unary(node):
            return False
        xs = shape_of(node.input(0))
        axis = node.attrs.get("axis")
        return isinstance(axis, int) and 0 <= axis < max(len(xs), 1) and shape_of(node.outputs[0]) == xs

    def build(self, step: StepPlan, target: TargetInfo) -> StepCode:
        node = step.node
        xs = shape_of(node.input(0))
        axis = int(node.attrs["axis"])
        args = step_args(step)
        inner, vw = math.prod(xs[axis + 1 :]), target.vector_bytes // 4
        ctx = SoftmaxContext(
            params=params(["x", "y"], args, [False, False]),
            log=node.op_type == "LogSoftmax",
            outer=math.prod(xs[:axis]),
            length=xs[axis] if xs else 1,
            inner=inner,
            parallel=math.prod(xs) * 8 >= PARALLEL_MIN_WORK,
            vector=inner == 1 and bool(xs) and xs[axis] >= vw,
            vw=vw,
        )
        return StepCode("c/softmax.c.j2", ctx, tuple(args))


KERNELS = (ChannelKernel(), SoftmaxKernel())
