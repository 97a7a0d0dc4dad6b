"""``--precision bf16``: a per-channel affine + Relu ahead of a 1x1 conv, done in the conv's input pass.

DenseNet's layers are BatchNorm (+ Scale) + Relu of the concatenated features, then a 1x1 conv;
after ``fuse_elementwise`` the first part is one FusedElementwise (x * s1 + t1) * s2 + t2, Relu,
whose output only the conv reads. The bf16 conv (``templates/c/conv_amx.c.j2``) reads its input
once anyway, to round it to bfloat16 into scratch; this pass gives it the affine folded to one
scale S and shift T per input channel (and ``pre_relu``) so that pass computes them on the way and
the FusedElementwise (a write and a read of the whole tensor) goes. Only for ConvNhwc on an AMX
pack (after ``pack_conv_bf16``) with a 1x1 kernel, stride 1 and no padding (a padded pixel would
be T, not 0), when the FusedElementwise's program is Mul / Add by per-channel (or scalar) constants of x
and at most one Relu at its end.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.passes.base import Pass
from compiler.passes.base import PassResult
from compiler.passes.base import add_constant
from compiler.passes.base import sole_consumer
from runtime.contract import CONV_NHWC
from runtime.contract import FUSED_ELEMENTWISE

__all__ = ["FuseConvPrescale", "affine_of"]


def _channel_const(node: Node, arg: str, c: int) -> np.ndarray | None:
    """Program argument ``arg`` ("i<k>") as c float64 values, when it is a constant broadcast
    along the last axis only (size 1 or c there, 1 elsewhere)."""
    if not arg.startswith("i") or arg == "i0":
        return None
    v = node.input(int(arg[1:]))
    if v is None or v.const is None or v.const.dtype != np.float32 or v.const.ndim > 4:
        return None
    a = v.const
    if a.size == 1:
        return np.full(c, float(a.reshape(())), np.float64)
    if a.shape[-1] != c or a.size != c:
        return None
    return a.reshape(c).astype(np.float64)


def affine_of(node: Node, c: int) -> tuple[np.ndarray, np.ndarray, int] | None:
    """(S, T, relu) when ``node``'s program is x -> Mul/Add by per-channel constants, then at most
    one Relu last: the same result as S * x + T (float64 folding of the constants), Relu'd."""
    program: list[dict[str, Any]] = node.attrs.get("program", [])
    s, t, last, relu = np.ones(c), np.zeros(c), "i0", 0
    for k, op in enumerate(program):
        args = list(op.get("args", []))
        if relu or last not in args:
            return None
        if op["op"] == "Relu" and args == [last] and k == len(program) - 1:
            relu = 1
        elif op["op"] in ("Mul", "Add") and len(args) == 2 and args[0] != args[1]:
            const = _channel_const(node, args[1] if args[0] == last else args[0], c)
            if const is None:
                return None
            s, t = (s * const, t * const) if op["op"] == "Mul" else (s, t + const)
        else:
            return None
        last = f"t{k}"
    return s, t, relu


def _fusable(graph: Graph, conv: Node) -> tuple[Node, tuple[np.ndarray, np.ndarray, int]] | None:
    w, x = conv.input(1), conv.input(0)
    if conv.kind != CONV_NHWC or w is None or w.dtype != np.uint16 or x is None or len(conv.inputs) > 4:
        return None
    if list(conv.attrs.get("kernel_shape", [])) != [1, 1] or list(conv.attrs.get("strides", [])) != [1, 1]:
        return None  # (a strided 1x1 of C % 32 == 0 reads its taps in place: that path has no pre-op)
    if any(int(p) for p in conv.attrs.get("pads", [1])):
        return None
    fe = x.producer
    if fe is None or fe.kind != FUSED_ELEMENTWISE or len(fe.outputs) != 1:
        return None
    if sole_consumer(graph, x) is not conv:
        return None
    src = fe.input(0)
    if src is None or src.dtype != np.float32 or src.shape != x.shape or x.shape is None:
        return None
    found = affine_of(fe, int(x.shape[-1]))
    return None if found is None else (fe, found)


class FuseConvPrescale(Pass):
    name = "fuse_conv_prescale"

    def run(self, graph: Graph) -> PassResult:
        modified = False
        for conv in list(graph):
            found = _fusable(graph, conv)
            if found is None:
                continue
            fe, (s, t, relu) = found
            src = fe.input(0)
            scale = add_constant(graph, f"{conv.name}_prescale", s.astype(np.float32))
            shift = add_constant(graph, f"{conv.name}_preshift", t.astype(np.float32))
            graph.set_inputs(conv, [src, *conv.inputs[1:], *[None] * (4 - len(conv.inputs)), scale, shift])
            conv.attrs["pre_relu"] = relu
            graph.remove_node(fe)
            modified = True
        if modified:
            graph.prune_constants()
        return PassResult(graph, modified)
