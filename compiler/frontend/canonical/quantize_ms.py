"""Canonical forms of onnxruntime's ``com.microsoft`` integer GEMMs: DynamicQuantizeMatMul,
MatMulIntegerToFloat and QGemm, as the chain of standard ops they stand for (the first two: what
``quantize_dynamic`` writes before onnxruntime fuses it)::

    DynamicQuantizeMatMul(A, B, b_scale, b_zero?, bias?):
        DynamicQuantizeLinear(A) -> (q, s, z); MatMulInteger(q, B, z, b_zero) -> Cast(float)
        -> Mul(., Mul(s, b_scale)) [-> Add(., bias)]
    MatMulIntegerToFloat(A, B, a_scale, b_scale, a_zero?, b_zero?, bias?):
        MatMulInteger(A, B, a_zero, b_zero) -> Cast(float) -> Mul(., Mul(a_scale, b_scale)) [-> Add]
    QGemm(A, a_scale, a_zero, B, b_scale, b_zero, C?, y_scale?, y_zero?; transA, transB, alpha):
        MatMulInteger(A', B', a_zero, b_zero) [-> Add(., C)] -> Cast(float) -> Mul(., factor)
        [-> QuantizeLinear(., 1, y_zero)]

QGemm's ``factor`` is onnxruntime's output scale, ``alpha * a_scale * b_scale[n] [/ y_scale]``, formed
here in float32 as its kernel forms it (the scales must be constants); C is its int32 bias, added to
the accumulators; with ``y_zero`` the output is requantized (``rint(float(acc) * factor) + y_zero``,
saturated: QuantizeLinear by a scale of 1 rounds exactly that product), without it the output is the
float product (with or without ``y_scale``, as onnxruntime has it). A' and B' are A and B transposed
where transA / transB say (B is a constant weight, so its Transpose folds).

so each is exact where ONNX's ops are, and the C target's passes turn the first into one
``onnx_aot.QGemm`` (compiler/passes/fuse_dynamic_qgemm.py) and the second's MatMulInteger into
one (compiler/passes/use_qgemm.py). Output types: compiler/frontend/qgemm_shapes.py.
"""

from __future__ import annotations

import numpy as np

from compiler.frontend.canonical.context import CanonContext
from compiler.frontend.canonical.context import shape_of
from compiler.frontend.canonical.registry import register
from compiler.ir.graph import Node
from compiler.ir.graph import Value

__all__: list[str] = []


def _value(ctx: CanonContext, what: str, dtype: type | np.dtype, shape: tuple[int, ...] | None) -> Value:
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



def _transposed(ctx: CanonContext, x: Value | None, what: str, flag: str, nodes: list[Node]) -> Value:
    """``x`` (2-D), transposed (a node appended to ``nodes``) when attribute ``flag`` is set."""
    if x is None or x.dtype is None or x.shape is None or len(x.shape) != 2:
        raise ctx.error(f"{what} must be 2-D")
    if not int(ctx.attr(flag, 0)):
        return x
    out = _value(ctx, f"{what}_transposed", x.dtype, (x.shape[1], x.shape[0]))
    nodes.append(ctx.node("Transpose", [x], {"perm": [1, 0]}, outputs=[out], name=out.name))
    return out


def _output_scale(ctx: CanonContext, y_scale: Value | None) -> np.ndarray:
    """onnxruntime's QGemm output scale ``alpha * a_scale * b_scale[n] [/ y_scale]``, in float32."""
    a_scale, b_scale = ctx.const_input(1, "a_scale"), ctx.const_input(4, "b_scale")
    if a_scale is None or b_scale is None or a_scale.size != 1 or b_scale.ndim > 1:
        raise ctx.error("a_scale must be one element and b_scale one element or one per column")
    factor = np.float32(ctx.attr("alpha", 1.0)) * a_scale.astype(np.float32).reshape(())
    factor = factor * b_scale.astype(np.float32)
    if y_scale is not None:
        y = ctx.const_input(7, "y_scale")
        assert y is not None
        if y.size != 1:
            raise ctx.error("y_scale must be one element")
        factor = factor / y.astype(np.float32).reshape(())
    return np.asarray(factor, np.float32)


@register("com.microsoft.QGemm")
def _qgemm(ctx: CanonContext) -> list[Node]:
    a, _, a_zero, b, _, b_zero, bias, y_scale, y_zero = (list(ctx.inputs) + [None] * 9)[:9]
    nodes: list[Node] = []
    a, b = _transposed(ctx, a, "A", "transA", nodes), _transposed(ctx, b, "B", "transB", nodes)
    out = ctx.outputs[0]
    shape = (shape_of(a)[0], shape_of(b)[1])
    acc = _value(ctx, "acc", np.int32, shape)
    nodes.append(ctx.node("MatMulInteger", [a, b, a_zero, b_zero], {}, outputs=[acc], name=acc.name))
    if bias is not None:
        if bias.dtype != np.int32:
            raise ctx.error("C (the bias) must be int32")
        biased = _value(ctx, "biased", np.int32, shape)
        nodes.append(ctx.node("Add", [acc, bias], {}, outputs=[biased], name=biased.name))
        acc = biased
    wide = _value(ctx, "acc_float", np.float32, shape)
    factor = ctx.graph.add_constant(f"{ctx.name}/output_scale", _output_scale(ctx, y_scale))
    scaled = out if y_zero is None else _value(ctx, "scaled", np.float32, shape)
    nodes += [ctx.node("Cast", [acc], {"to": "float32"}, outputs=[wide], name=wide.name),
              ctx.node("Mul", [wide, factor], {}, outputs=[scaled], name=scaled.name)]
    if y_zero is not None:
        if y_scale is None:
            raise ctx.error("y_zero_point without y_scale")
        one = ctx.graph.add_constant(f"{ctx.name}/unit_scale", np.ones((), np.float32))
        if y_zero.dtype not in (np.int8, np.uint8) or y_zero.shape is None or np.prod(y_zero.shape) != 1:
            raise ctx.error("y_zero_point must be one int8 or uint8 element")
        attrs = {"axis": 0, "block_size": 0, "to": y_zero.dtype.name, "precision": "float32"}
        nodes.append(ctx.node("QuantizeLinear", [scaled, one, y_zero], attrs, outputs=[out]))
    return nodes
