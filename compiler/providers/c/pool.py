"""C kernels for MaxPool / AveragePool (1-D and 2-D, NCHW).

Global pools, BatchNormalization, LRN and Softmax are in ``norm``; the channels-last pools of the
layout pass in ``pool_nhwc``. A dynamic graph's pool (floor mode) runs the same template with its
batch and spatial sizes, and the border columns' bounds, computed at run time from the binding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.codegen.cdims import CDim
from compiler.codegen.toolchain import TargetInfo
from compiler.ir.graph import Node
from compiler.providers.base import GenStep
from compiler.providers.c.common import PARALLEL_MIN_WORK
from compiler.providers.c.common import Arg
from compiler.providers.c.common import CKernel
from compiler.providers.c.common import StepCode
from compiler.providers.c.common import dyn_arg
from compiler.providers.c.common import float32_unary
from compiler.providers.c.common import params
from compiler.providers.c.common import step_args
from compiler.providers.c.conv import Decls
from compiler.providers.c.conv import dynamic_geometry
from compiler.providers.c.conv import is_dynamic
from compiler.providers.c.elementwise_typed import value_ctype
from compiler.providers.geometry import PoolGeometry
from compiler.providers.geometry import claimed
from compiler.providers.kit import KernelContext
from compiler.providers.kit import Param

__all__ = ["PoolContext", "PoolKernel"]

_EIGHT_BIT = frozenset({np.dtype(np.int8), np.dtype(np.uint8)})


@dataclass(frozen=True)
class PoolContext(KernelContext):
    op: str  # "max" | "avg"
    nc: int
    g: PoolGeometry
    count_include_pad: bool
    parallel: bool
    ow_lo: int | CDim  # output columns [ow_lo, ow_hi) have every window tap inside the input row
    ow_hi: int | CDim
    decls: Decls = ()  # a dynamic node's run-time sizes
    ctype: str = "float"  # x's and y's C type: int8_t / uint8_t for an 8-bit MaxPool
    lowest: int = 0  # an 8-bit MaxPool's result for a window wholly in the padding
    when: str = ""  # a dynamic node's C condition for running on the pool


class PoolKernel(CKernel):
    kinds: tuple[str, ...] = ("MaxPool", "AveragePool")
    dynamic = True  # run-time batch and spatial sizes (floor mode)

    def supports(self, node: Node) -> bool:
        if not (float32_unary(node) or _eight_bit_max(node)):
            return False
        if node.op_type == "AveragePool" and "count_include_pad" not in node.attrs:
            return False
        g = PoolGeometry.from_node(node, "NCHW", symbolic=is_dynamic(node))
        return g is not None and (node.op_type == "MaxPool" or (g.dh == 1 and g.dw == 1))

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        if is_dynamic(node):
            return _build_dynamic(step)
        g = claimed(PoolGeometry.from_node(node, "NCHW"), node)
        ctype, lowest = _element(node)
        args = step_args(step, ctype)
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
            ctype=ctype,
            lowest=lowest,
        )
        return StepCode("c/pool.c.j2", ctx, tuple(args))


def _eight_bit_max(node: Node) -> bool:
    """A MaxPool from int8 / uint8 to the same type, shapes known (QOperator files keep their
    MaxPools on the quantized values: a max commutes with the monotone quantization)."""
    x, y = node.input(0), node.outputs[0]
    return (node.op_type == "MaxPool" and len(node.inputs) == 1 and len(node.outputs) == 1
            and x is not None and y is not None and x.dtype in _EIGHT_BIT and y.dtype == x.dtype
            and x.shape is not None and y.shape is not None and not is_dynamic(node))


def _element(node: Node) -> tuple[str, int]:
    """The pool's C element type and, for an 8-bit one, its type's lowest value."""
    x = node.input(0)
    assert x is not None and x.dtype is not None
    if x.dtype == np.float32:
        return "float", 0
    return value_ctype(x.dtype), int(np.iinfo(x.dtype).min)


def _build_dynamic(step: GenStep) -> StepCode:
    node = step.node
    g0 = claimed(PoolGeometry.from_node(node, "NCHW", symbolic=True), node)
    g, decls = dynamic_geometry(g0, step.symbols)
    args: list[Arg] = [*step_args(step), dyn_arg(step)]
    if isinstance(g.w, CDim):  # the columns with every tap inside the row, at run time (window.inside)
        lo = -(-g.pl // g.sw)
        last = f"(W - 1 + {g.pl - (g.kw - 1) * g.dw})"
        decls += (("OWLO", f"({lo} < OW ? {lo} : OW)"),
                  ("OWHI_", f"({last} >= 0 ? ({last} / {g.sw} + 1 < OW ? {last} / {g.sw} + 1 : OW) : 0)"),
                  ("OWHI", "(OWHI_ > OWLO ? OWHI_ : OWLO)"))
        ow_lo, ow_hi = CDim("OWLO"), CDim("OWHI")
    else:
        ow_lo, ow_hi = g0.cols.inside()
    ctx = PoolContext(
        params=(*params(["x", "y"], args[:-1], [True, True]), Param("dyn", "int64_t", True, True)),
        op="max" if node.op_type == "MaxPool" else "avg",
        nc=g.batch * g.c,
        g=g,
        count_include_pad=node.op_type == "AveragePool" and bool(int(node.attrs["count_include_pad"])),
        parallel=True,
        ow_lo=ow_lo,
        ow_hi=ow_hi,
        decls=decls,
        when=f"{g.batch * g.c * g.oh * g.ow * g.kh * g.kw} >= {PARALLEL_MIN_WORK}",
    )
    return StepCode("c/pool.c.j2", ctx, tuple(args))


KERNELS = (PoolKernel(),)
