"""C kernels that normalize or summarize NCHW planes and rows.

The per-channel kernel (``templates/c/channel.c.j2``) walks the (N, C, spatial) planes:
GlobalAveragePool / GlobalMaxPool (one value per plane), BatchNormalization (inference) and LRN;
with run-time N and spatial dims (C over the binding, ``rundims.py``) where C is static.
Softmax / LogSoftmax normalize along any axis (``templates/c/softmax.c.j2``; along the last axis
on whole vectors with the vector math's exp), also with run-time dims (C over the binding,
``rundims.py``): a run-time length takes the vector path when the run's rows hold a vector.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from compiler.codegen.elementwise import literal
from compiler.codegen.toolchain import TargetInfo
from compiler.ir.graph import Node
from compiler.providers.base import GenStep
from compiler.providers.base import shape_of
from compiler.providers.c.common import PARALLEL_MIN_WORK
from compiler.providers.c.common import CKernel
from compiler.providers.c.common import StepCode
from compiler.providers.c.common import all_float32
from compiler.providers.c.common import float32_unary
from compiler.providers.c.common import params
from compiler.providers.c.common import step_args
from compiler.providers.c.pool_nhwc import LRN_POWERS
from compiler.providers.c.rundims import is_dynamic
from compiler.providers.c.rundims import parallel_if
from compiler.providers.c.rundims import run_dims
from compiler.providers.c.rundims import symbolic_const
from compiler.providers.kit import KernelContext
from runtime.symbolic import Expr

__all__ = ["ChannelContext", "ChannelKernel", "SoftmaxContext", "SoftmaxKernel"]


@dataclass(frozen=True)
class ChannelContext(KernelContext):
    """A kernel over (N, C, spatial...) planes of ``s`` elements."""

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
    parallel_if: str = ""  # run-time dims (n, s: CDim; c static): the C condition for the worker pool
    simd: bool = False  # the global average's sum split into vector lanes (omp simd; dynamic nodes)
    lrn_power: str = "pow"  # as ChannelNhwcContext's: "sqrt3/4" | "sqrt" | "one" | "pow"


class ChannelKernel(CKernel):
    kinds: tuple[str, ...] = ("GlobalAveragePool", "GlobalMaxPool", "BatchNormalization", "LRN")
    dynamic = True  # run-time batch and spatial dims (the channels static)

    def supports(self, node: Node) -> bool:
        if not all_float32(node) or len(node.outputs) != 1 or node.input(0) is None:
            return False
        if any(symbolic_const(v) for v in node.inputs):
            return False
        xs, ys = shape_of(node.input(0), symbolic=True), shape_of(node.outputs[0], symbolic=True)
        if len(xs) < 3 and node.op_type != "BatchNormalization" or len(xs) < 2 or isinstance(xs[1], Expr):
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
            and all(v is not None and shape_of(v, symbolic=True) == (xs[1],) for v in ins[1:])
            and "epsilon" in node.attrs
        )

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        xs = shape_of(node.input(0), symbolic=True)
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
        rd = run_dims(step)  # n and s from the binding in a dynamic graph
        s = rd.write(math.prod(xs[2:]))
        work = rd.write(math.prod(xs) * size)
        ctx = ChannelContext(
            params=params(names, args, restrict) + rd.params,
            op=op,
            n=rd.write(xs[0]),
            c=int(xs[1]),
            s=s,
            eps=literal(float(a["epsilon"])) if op == "batchnorm" else "0.0f",
            lrn_lo=(size - 1) // 2,
            lrn_hi=size - 1 - (size - 1) // 2,
            lrn_alpha=literal(float(a["alpha"]) / size) if op == "lrn" else "0.0f",
            lrn_beta=literal(float(a["beta"])) if op == "lrn" else "0.0f",
            lrn_bias=literal(float(a["bias"])) if op == "lrn" else "0.0f",
            lrn_power=LRN_POWERS.get(float(a["beta"]), "pow") if op == "lrn" else "pow",
            parallel=rd.dynamic or work >= PARALLEL_MIN_WORK,
            parallel_if=f"{work} >= {PARALLEL_MIN_WORK}" if rd.dynamic else "",
            simd=rd.dynamic,
        )
        return StepCode("c/channel.c.j2", ctx, (*args, *rd.args))


@dataclass(frozen=True)
class SoftmaxContext(KernelContext):
    log: bool
    outer: int
    length: int
    inner: int
    parallel: bool
    vector: bool  # contiguous rows (inner 1) run on whole vectors with the vector math
    vw: int  # floats per vector
    # run-time dims (outer, length, inner: CDim): the C condition for the worker pool and, for
    # contiguous rows of a run-time length, the C condition of the vector path ("": none)
    parallel_if: str = ""
    vector_if: str = ""
    # run-time dims with elements apart (inner not 1): rows walked as columns, `columns` of them
    # side by side per work item on whole vectors (0: the row-at-a-time loops)
    columns: int = 0


class SoftmaxKernel(CKernel):
    kinds: tuple[str, ...] = ("Softmax", "LogSoftmax")
    dynamic = True  # run-time dims: rows, length and stride from the binding

    def supports(self, node: Node) -> bool:
        if not float32_unary(node) or symbolic_const(node.input(0)):
            return False
        xs = shape_of(node.input(0), symbolic=True)
        axis = node.attrs.get("axis")
        return (isinstance(axis, int) and 0 <= axis < max(len(xs), 1)
                and shape_of(node.outputs[0], symbolic=True) == xs)

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        if is_dynamic(node):
            return _dynamic_softmax(step, target)
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
            # rows with elements apart: adjacent columns on whole vectors (a row at a time reads
            # one element per cache line: YOLOv8's DFL Softmax took 10x as long)
            columns=SOFTMAX_COLUMNS if inner > 1 else 0,
        )
        return StepCode("c/softmax.c.j2", ctx, tuple(args))


# columns per work item of a Softmax whose rows lie apart (their maxima and sums on the stack)
SOFTMAX_COLUMNS = 256


def _dynamic_softmax(step: GenStep, target: TargetInfo) -> StepCode:
    """Softmax with run-time dims: contiguous rows (inner 1) on whole vectors where the run's
    length holds a vector (a C test when the length is a run-time one); rows with elements apart
    (inner > 1: YOLOv8's DFL, axis 1 of (b, 16, 4, n)) as SOFTMAX_COLUMNS adjacent columns at a
    time, on whole vectors along the inner axis; threads where the run's work is large enough."""
    node = step.node
    xs = shape_of(node.input(0), symbolic=True)
    axis = int(node.attrs["axis"])
    args = step_args(step)
    rd = run_dims(step)
    vw = target.vector_bytes // 4
    inner, length = math.prod(xs[axis + 1 :]), xs[axis]
    contiguous = isinstance(inner, int) and inner == 1
    total = rd.write(math.prod(xs) * 8)
    ctx = SoftmaxContext(
        params=params(["x", "y"], args, [False, False]) + rd.params,
        log=node.op_type == "LogSoftmax",
        outer=rd.write(math.prod(xs[:axis])),
        length=rd.write(length),
        inner=rd.write(inner),
        parallel=not isinstance(total, int) or total >= PARALLEL_MIN_WORK,
        vector=contiguous and isinstance(length, int) and length >= vw,
        vw=vw,
        parallel_if=parallel_if(total, PARALLEL_MIN_WORK),
        vector_if=f"{rd.write(length)} >= {vw}" if contiguous and not isinstance(length, int) else "",
        columns=0 if contiguous else SOFTMAX_COLUMNS,
    )
    return StepCode("c/softmax.c.j2", ctx, (*args, *rd.args))


KERNELS = (ChannelKernel(), SoftmaxKernel())
