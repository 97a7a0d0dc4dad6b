"""C kernels without a GEMM core: pooling, normalization and softmax.

MaxPool / AveragePool (1-D and 2-D), GlobalAveragePool / GlobalMaxPool, BatchNormalization
(inference), LRN, Softmax / LogSoftmax (any axis). Data movement is in ``movement``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.codegen.elementwise import literal
from compiler.codegen.toolchain import TargetInfo
from compiler.ir.graph import Node
from compiler.providers.base import StepPlan
from compiler.providers.c.common import (
    PARALLEL_MIN_WORK,
    Param,
    StepCode,
    all_float32,
    comment,
    fn_name,
    input_args,
    output_args,
    params,
    register,
    shape_of,
)

__all__ = ["PoolContext", "ChannelContext", "SoftmaxContext", "PoolKernel", "ChannelKernel", "SoftmaxKernel"]


def _prod(dims: tuple[int, ...] | list[int]) -> int:
    return int(np.prod(dims, dtype=np.int64))


# -- pooling ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolContext:
    fn: str
    comment: str
    params: tuple[Param, ...]
    op: str  # "max" | "avg"
    nc: int
    h: int
    w: int
    oh: int
    ow: int
    kh: int
    kw: int
    sh: int
    sw: int
    pt: int
    pl: int
    pb: int
    pr: int
    dh: int
    dw: int
    count_include_pad: bool
    parallel: bool
    ow_lo: int  # output columns [ow_lo, ow_hi) have every window tap inside the input row
    ow_hi: int


def _interior(g: dict[str, int]) -> tuple[int, int]:
    """The output columns whose windows lie wholly inside the input row."""
    lo = min(-(-g["pl"] // g["sw"]), g["ow"])
    last = g["w"] - 1 + g["pl"] - (g["kw"] - 1) * g["dw"]  # ow * sw <= last
    hi = min(last // g["sw"] + 1, g["ow"]) if last >= 0 else 0
    return lo, max(lo, hi)


def _pool_geometry(node: Node) -> dict[str, int] | None:
    xs, ys = shape_of(node.input(0)), shape_of(node.outputs[0])
    a = node.attrs
    try:
        ks, st, pads = list(a["kernel_shape"]), list(a["strides"]), list(a["pads"])
        dil = list(a["dilations"]) if "dilations" in a else [1] * len(ks)
        ceil = int(a["ceil_mode"])
    except (KeyError, TypeError, ValueError):
        return None
    rank = len(xs) - 2
    if rank not in (1, 2) or len(ys) != len(xs) or ys[:2] != xs[:2]:
        return None
    if len(ks) != rank or len(st) != rank or len(dil) != rank or len(pads) != 2 * rank:
        return None
    if min(ks) < 1 or min(st) < 1 or min(dil) < 1 or min(pads) < 0:
        return None
    for d in range(rank):
        span = (ks[d] - 1) * dil[d] + 1
        num = xs[2 + d] + pads[d] + pads[rank + d] - span
        allowed = {num // st[d] + 1} | ({-(-num // st[d]) + 1, -(-num // st[d])} if ceil else set())
        if ys[2 + d] not in allowed or ys[2 + d] < 1:
            return None
    if rank == 1:
        return dict(h=1, w=xs[2], oh=1, ow=ys[2], kh=1, kw=ks[0], sh=1, sw=st[0], pt=0, pl=pads[0], pb=0,
                    pr=pads[1], dh=1, dw=dil[0])  # fmt: skip
    return dict(h=xs[2], w=xs[3], oh=ys[2], ow=ys[3], kh=ks[0], kw=ks[1], sh=st[0], sw=st[1], pt=pads[0],
                pl=pads[1], pb=pads[2], pr=pads[3], dh=dil[0], dw=dil[1])  # fmt: skip


class PoolKernel:
    kinds: tuple[str, ...] = ("MaxPool", "AveragePool")

    def supports(self, node: Node) -> bool:
        if not all_float32(node) or len(node.outputs) != 1 or len(node.inputs) != 1:
            return False
        if node.op_type == "AveragePool" and "count_include_pad" not in node.attrs:
            return False
        g = _pool_geometry(node)
        return g is not None and (node.op_type == "MaxPool" or (g["dh"] == 1 and g["dw"] == 1))

    def scratch_nbytes(self, node: Node) -> int:
        return 0

    def build(self, step: StepPlan, target: TargetInfo) -> StepCode:
        node = step.node
        g = _pool_geometry(node)
        assert g is not None, node.describe()
        xs = shape_of(node.input(0))
        args = [*input_args(step), *output_args(step)]
        ctx = PoolContext(
            fn=fn_name(step),
            comment=comment(node),
            params=params(["x", "y"], args, [True, True]),
            op="max" if node.op_type == "MaxPool" else "avg",
            nc=xs[0] * xs[1],
            count_include_pad=node.op_type == "AveragePool" and bool(int(node.attrs["count_include_pad"])),
            parallel=xs[0] * xs[1] * g["oh"] * g["ow"] * g["kh"] * g["kw"] >= PARALLEL_MIN_WORK,
            ow_lo=_interior(g)[0],
            ow_hi=_interior(g)[1],
            **g,
        )
        return StepCode("c/pool.c.j2", ctx, ctx.fn, tuple(args))


# -- per-channel kernels: GlobalAveragePool, GlobalMaxPool, BatchNormalization, LRN ------------


@dataclass(frozen=True)
class ChannelContext:
    """A kernel over (N, C, spatial...) planes of ``s`` elements."""

    fn: str
    comment: str
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


class ChannelKernel:
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

    def scratch_nbytes(self, node: Node) -> int:
        return 0

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
        args = [*input_args(step), *output_args(step)]
        if op == "batchnorm":
            names, restrict = (
                ["x", "scale", "bias", "mean", "var", "y"],
                [False, True, True, True, True, False],
            )
        else:
            names, restrict = ["x", "y"], [True, True]
        size = int(a["size"]) if op == "lrn" else 1
        s = _prod(xs[2:])
        ctx = ChannelContext(
            fn=fn_name(step),
            comment=comment(node),
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
            parallel=_prod(xs) * size >= PARALLEL_MIN_WORK,
        )
        return StepCode("c/channel.c.j2", ctx, ctx.fn, tuple(args))


# -- softmax --------------------------------------------------------------------------------


@dataclass(frozen=True)
class SoftmaxContext:
    fn: str
    comment: str
    params: tuple[Param, ...]
    log: bool
    outer: int
    length: int
    inner: int
    parallel: bool


class SoftmaxKernel:
    kinds: tuple[str, ...] = ("Softmax", "LogSoftmax")

    def supports(self, node: Node) -> bool:
        if not all_float32(node) or len(node.outputs) != 1 or len(node.inputs) != 1:
            return False
        xs = shape_of(node.input(0))
        axis = node.attrs.get("axis")
        return isinstance(axis, int) and 0 <= axis < max(len(xs), 1) and shape_of(node.outputs[0]) == xs

    def scratch_nbytes(self, node: Node) -> int:
        return 0

    def build(self, step: StepPlan, target: TargetInfo) -> StepCode:
        node = step.node
        xs = shape_of(node.input(0))
        axis = int(node.attrs["axis"])
        args = [*input_args(step), *output_args(step)]
        ctx = SoftmaxContext(
            fn=fn_name(step),
            comment=comment(node),
            params=params(["x", "y"], args, [False, False]),
            log=node.op_type == "LogSoftmax",
            outer=_prod(xs[:axis]),
            length=xs[axis] if xs else 1,
            inner=_prod(xs[axis + 1 :]),
            parallel=_prod(xs) * 8 >= PARALLEL_MIN_WORK,
        )
        return StepCode("c/softmax.c.j2", ctx, ctx.fn, tuple(args))


for _kernel in (PoolKernel(), ChannelKernel(), SoftmaxKernel()):
    register(_kernel)
