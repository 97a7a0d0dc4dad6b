"""Canonical forms of onnxruntime's ``com.microsoft`` integer GEMMs: DynamicQuantizeMatMul and
MatMulIntegerToFloat, as the chain of standard ops they stand for (what ``quantize_dynamic`` writes
before onnxruntime fuses it)::

    DynamicQuantizeMatMul(A, B, b_scale, b_zero?, bias?):
        DynamicQuantizeLinear(A) -> (q, s, z); MatMulInteger(q, B, z, b_zero) -> Cast(float)
        -> Mul(., Mul(s, b_scale)) [-> Add(., bias)]
    MatMulIntegerToFloat(A, B, a_scale, b_scale, a_zero?, b_zero?, bias?):
        MatMulInteger(A, B, a_zero, b_zero) -> Cast(float) -> Mul(., Mul(a_scale, b_scale)) [-> Add]

so each is exact where ONNX's ops are, and the C target's passes turn the first into one
``onnx_aot.QGemm`` (compiler/passes/fuse_dynamic_qgemm.py) and the second's MatMulInteger into
one (compiler/passes/use_qgemm.py). Output types: compiler/frontend/qgemm_shapes.py.
"""

from __future__ import annotations

import numpy as np

from compiler.frontend.canonical.context import CanonContext
from compiler.frontend.canonical.registry import register
from compiler.ir.graph import Node
from compiler.ir.graph import Value

__all__: list[str] = []


def _value(ctx: CanonContext, what: str, dtype: type, shape: tuple[int, ...] | None) -> Value:
    return Value(ctx.graph.unique_name(f"{ctx.name}/{what}"), np.dtype(dtype), shape)


def _scaled(ctx: CanonContext, q: Value, b: Value | None, zeros: tuple[Value | None, Value | None],
            scales: tuple[Value | None, Value | None], bias: Value | None) -> list[Node]:
    """MatMulInteger(q, b, zeros) -> Cast -> Mul(., Mul(scales)) [-> Add(., bias)] into the outputs."""
    out = ctx.outputs[0]
    shape = out.shape
    acc, wide = _value(ctx, "acc", np.int32, shape), _value(ctx, "acc_float", np.float32, shape)
    a_scale, b_scale = scales
    if a_scale is None or b_scale is None or b is None:
        raise ctx.error("needs A's and B's scales and B")
    factor = _value(ctx, "scale", np.float32, None if b_scale.shape is None else
                    tuple(np.broadcast_shapes(a_scale.shape or (), b_scale.shape)))
    scaled = out if bias is None else _value(ctx, "scaled", np.float32, shape)
    nodes = [ctx.node("MatMulInteger", [q, b, *zeros], {}, outputs=[acc], name=acc.name),
             ctx.node("Cast", [acc], {"to": "float32"}, outputs=[wide], name=wide.name),
             ctx.node("Mul", [a_scale, b_scale], {}, outputs=[factor], name=factor.name),
             ctx.node("Mul", [wide, factor], {}, outputs=[scaled], name=scaled.name)]
    if bias is not None:
        nodes.append(ctx.node("Add", [scaled, bias], {}, outputs=[out]))
    return nodes


@register("com.microsoft.DynamicQuantizeMatMul")
def _dynamic_quantize_matmul(ctx: CanonContext) -> list[Node]:
    a, b, b_scale, b_zero, bias = (list(ctx.inputs) + [None] * 5)[:5]
    if a is None or a.dtype != np.float32:
        raise ctx.error("A must be float32")
    q = _value(ctx, "a_quantized", np.uint8, a.shape)
    s, z = _value(ctx, "a_scale", np.float32, ()), _value(ctx, "a_zero", np.uint8, ())
    quantize = ctx.node("DynamicQuantizeLinear", [a], {}, outputs=[q, s, z], name=q.name)
    return [quantize, *_scaled(ctx, q, b, (z, b_zero), (s, b_scale), bias)]


@register("com.microsoft.MatMulIntegerToFloat")
def _matmul_integer_to_float(ctx: CanonContext) -> list[Node]:
    a, b, a_scale, b_scale, a_zero, b_zero, bias = (list(ctx.inputs) + [None] * 7)[:7]
    if a is None:
        raise ctx.error("A is missing")
    return _scaled(ctx, a, b, (a_zero, b_zero), (a_scale, b_scale), bias)
