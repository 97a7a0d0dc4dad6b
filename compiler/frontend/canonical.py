"""Canonical op forms: each ONNX node rewritten once into the form docs/ops.md describes.

Opset differences (attribute vs input, defaults, negative axes, auto_pad) are resolved here and
nowhere else. A canonicalizer is registered per op type and returns the IR nodes that stand for
the ONNX node (usually one). Ops without a canonicalizer keep their ONNX attributes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from compiler.ir.graph import Graph, Node, Value
from runtime.errors import ModelError, UnsupportedOpError

__all__ = ["COMPILE_TIME_INPUTS", "CanonContext", "canonicalize", "onnx_attrs", "np_dtype_of"]

Canonicalizer = Callable[["CanonContext"], list[Node]]
_REGISTRY: dict[str, Canonicalizer] = {}

UNARY_PLAIN = (
    "Relu Sigmoid Tanh Exp Log Neg Abs Sqrt Reciprocal Erf Floor Ceil Softplus Sign Sin Cos Not "
    "Softsign Round IsNaN Tan Asin Acos Atan Sinh Cosh Asinh Acosh Atanh Mish HardSwish BitwiseNot"
).split()
BINARY_PLAIN = ("Add Sub Mul Div Pow Equal Less Greater LessOrEqual GreaterOrEqual And Or Xor Where PRelu "
                "BitwiseAnd BitwiseOr BitwiseXor").split()
VARIADIC = "Sum Max Min Mean".split()

# Node inputs whose *values* are needed at compile time (shapes, axes, pads, sizes, k, ...), by
# input index, for every opset that has them. A canonicalizer reads them with const_input; the
# backend and ``compile --bind`` use this table to find graph inputs to specialize on.
_REDUCE_OPS = ("ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceL1 ReduceL2 ReduceLogSum "
               "ReduceLogSumExp ReduceSumSquare").split()
COMPILE_TIME_INPUTS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "ConstantOfShape": (0,), "Range": (0, 1, 2),
    "Slice": (1, 2, 3, 4), "Squeeze": (1,), "Unsqueeze": (1,), "Split": (1,), "Pad": (1, 2, 3),
    "Resize": (1, 2, 3), "Upsample": (1,), "TopK": (1,), "OneHot": (1,), "Clip": (1, 2),
    "CenterCropPad": (1,), "Trilu": (1,), "CumSum": (1,), "CumProd": (1,), "Col2Im": (1, 2), "DFT": (1, 2),
    "STFT": (1, 3), "HannWindow": (0,), "HammingWindow": (0,), "BlackmanWindow": (0,),
    "MelWeightMatrix": (0, 1, 2, 3, 4), "AffineGrid": (1,), "EyeLike": (),
    "MaxUnpool": (2,),
    **{op: (1,) for op in _REDUCE_OPS},
}


# Element types onnx-aot computes in: numpy's own bool, integer and IEEE float types.
_NUMPY_DTYPES = frozenset(np.dtype(t) for t in (
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64))


def np_dtype_of(elem_type: int, what: str) -> np.dtype:
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except Exception:
        raise UnsupportedOpError(f"{what}: unsupported element type {elem_type}") from None
    if dtype not in _NUMPY_DTYPES:  # also rejects bfloat16 / float8 / int4 (ml_dtypes' types)
        raise UnsupportedOpError(f"{what}: unsupported element type "
                                 f"{onnx.TensorProto.DataType.Name(elem_type).lower()}")
    return dtype


def onnx_attrs(node: onnx.NodeProto) -> dict[str, Any]:
    """The node's attributes as Python values (tensors become numpy arrays)."""
    out: dict[str, Any] = {}
    for attr in node.attribute:
        if attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
            out[attr.name] = attr  # control flow: left for the partitioner to reject
            continue
        value = helper.get_attribute_value(attr)
        if isinstance(value, onnx.TensorProto):
            value = numpy_helper.to_array(value)
        elif isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            value = [v.decode("utf-8", "replace") for v in value]
        out[attr.name] = value
    return out


@dataclass
class CanonContext:
    """What a canonicalizer sees of one ONNX node."""

    proto: onnx.NodeProto
    name: str
    attrs: dict[str, Any]
    inputs: list[Value | None]
    outputs: list[Value]
    opset: int
    graph: Graph
    used: frozenset[str]  # ONNX value names something consumes (or the graph outputs)

    @property
    def op_type(self) -> str:
        return self.proto.op_type

    def describe(self) -> str:
        return f"node {self.name!r} ({self.op_type})"

    def error(self, message: str) -> ModelError:
        return ModelError(f"{self.describe()}: {message}")

    def attr(self, key: str, default: Any) -> Any:
        return self.attrs[key] if key in self.attrs else default

    def rank(self, i: int = 0) -> int:
        value = self.inputs[i]
        assert value is not None and value.shape is not None
        return len(value.shape)

    def const_input(self, i: int, what: str) -> np.ndarray | None:
        """The constant value of input ``i`` (None when omitted); an error when not constant."""
        value = self.inputs[i] if i < len(self.inputs) else None
        if value is None:
            return None
        if value.const is None:
            raise self.error(
                f"input {i} ({what}, {value.name!r}) must be a constant for ahead-of-time compilation"
            )
        return value.const

    def axis(self, axis: int, rank: int) -> int:
        if not -rank <= axis < max(rank, 1):
            raise self.error(f"axis {axis} out of range for rank {rank}")
        return axis + rank if axis < 0 else axis

    def node(self, op_type: str, inputs: list[Value | None], attrs: dict[str, Any],
             outputs: list[Value] | None = None, *, domain: str = "", name: str | None = None) -> Node:
        while inputs and inputs[-1] is None:
            inputs = inputs[:-1]
        return Node(op_type, inputs, outputs if outputs is not None else self.outputs, attrs,
                    name=name if name is not None else self.name, domain=domain, origin=[self.name])


def register(*op_types: str) -> Callable[[Canonicalizer], Canonicalizer]:
    def deco(fn: Canonicalizer) -> Canonicalizer:
        for op in op_types:
            _REGISTRY[op] = fn
        return fn

    return deco


def canonical_op_types() -> frozenset[str]:
    """ONNX op types with a canonicalizer (they may become other kinds, see docs/ops.md)."""
    return frozenset(_REGISTRY)


def canonicalize(ctx: CanonContext) -> list[Node]:
    if ctx.proto.domain not in ("", "ai.onnx"):
        return [ctx.node(ctx.op_type, ctx.inputs, ctx.attrs, domain=ctx.proto.domain)]
    fn = _REGISTRY.get(ctx.op_type)
    if fn is None:
        return [ctx.node(ctx.op_type, ctx.inputs, ctx.attrs)]
    return fn(ctx)


def _ints(values: Any) -> list[int]:
    return [int(v) for v in values]


def _float(value: Any) -> float:
    return float(np.asarray(value).reshape(-1)[0]) if np.asarray(value).size else 0.0


# -- simple ops ------------------------------------------------------------------------------
@register(*UNARY_PLAIN, *BINARY_PLAIN, *VARIADIC, "MatMul", "GlobalAveragePool", "GlobalMaxPool")
def _plain(ctx: CanonContext) -> list[Node]:
    return [ctx.node(ctx.op_type, ctx.inputs, {})]


@register("Identity")
def _identity(ctx: CanonContext) -> list[Node]:
    return [ctx.node("Identity", ctx.inputs[:1], {})]


@register("Dropout")
def _dropout(ctx: CanonContext) -> list[Node]:
    # Inference: output = input; the optional mask is all true.
    nodes = [ctx.node("Identity", ctx.inputs[:1], {}, outputs=ctx.outputs[:1])]
    if len(ctx.outputs) > 1 and ctx.outputs[1].name in ctx.used:
        mask = ctx.outputs[1]
        assert mask.shape is not None
        assert mask.dtype is not None  # bool since opset 10, the input's type before
        nodes.append(ctx.node("ConstantOfShape", [], {"shape": list(mask.shape), "value": 1,
                                                      "dtype": mask.dtype.name},
                              outputs=[mask], name=ctx.graph.unique_name(ctx.name + "/mask")))
    return nodes


@register("LeakyRelu")
def _leaky(ctx: CanonContext) -> list[Node]:
    return [ctx.node("LeakyRelu", ctx.inputs, {"alpha": float(ctx.attr("alpha", 0.01))})]


@register("Elu")
def _elu(ctx: CanonContext) -> list[Node]:
    return [ctx.node("Elu", ctx.inputs, {"alpha": float(ctx.attr("alpha", 1.0))})]


@register("HardSigmoid")
def _hsig(ctx: CanonContext) -> list[Node]:
    return [ctx.node("HardSigmoid", ctx.inputs, {"alpha": float(ctx.attr("alpha", 0.2)),
                                                 "beta": float(ctx.attr("beta", 0.5))})]


@register("Gelu")
def _gelu(ctx: CanonContext) -> list[Node]:
    return [ctx.node("Gelu", ctx.inputs, {"approximate": str(ctx.attr("approximate", "none"))})]


@register("Clip")
def _clip(ctx: CanonContext) -> list[Node]:
    if ctx.opset < 11:
        lo = float(ctx.attr("min", -np.inf))
        hi = float(ctx.attr("max", np.inf))
    else:
        lo_c = ctx.const_input(1, "min")
        hi_c = ctx.const_input(2, "max")
        lo = _float(lo_c) if lo_c is not None else -np.inf
        hi = _float(hi_c) if hi_c is not None else np.inf
    # ONNX: when min > max every value becomes max; with min := max both bounds say so.
    return [ctx.node("Clip", ctx.inputs[:1], {"min": min(lo, hi), "max": hi})]


# -- convolution and pooling -----------------------------------------------------------------
def _resolve_pads(ctx: CanonContext, spatial: tuple[int, ...], kernel: list[int],
                  strides: list[int], dilations: list[int]) -> list[int]:
    n = len(spatial)
    auto_pad = str(ctx.attr("auto_pad", "NOTSET"))
    if auto_pad in ("NOTSET", ""):
        pads = _ints(ctx.attr("pads", [0] * (2 * n)))
        if len(pads) != 2 * n:
            raise ctx.error(f"pads has {len(pads)} values, expected {2 * n}")
        if any(p < 0 for p in pads):
            raise ctx.error(f"negative pads {pads}")
        return pads
    if auto_pad == "VALID":
        return [0] * (2 * n)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begins, ends = [], []
        for size, k, s, d in zip(spatial, kernel, strides, dilations, strict=True):
            out = -(-size // s)
            total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
            small, big = total // 2, total - total // 2
            begins.append(small if auto_pad == "SAME_UPPER" else big)
            ends.append(big if auto_pad == "SAME_UPPER" else small)
        return begins + ends
    raise ctx.error(f"unknown auto_pad {auto_pad!r}")


def _spatial(ctx: CanonContext) -> tuple[int, ...]:
    x = ctx.inputs[0]
    assert x is not None and x.shape is not None
    if len(x.shape) < 3:
        raise ctx.error(f"input needs rank >= 3 (N, C, spatial...), got shape {x.shape}")
    return x.shape[2:]


@register("Conv")
def _conv(ctx: CanonContext) -> list[Node]:
    w = ctx.inputs[1]
    assert w is not None and w.shape is not None
    spatial = _spatial(ctx)
    n = len(spatial)
    kernel = _ints(ctx.attr("kernel_shape", w.shape[2:]))
    strides = _ints(ctx.attr("strides", [1] * n))
    dilations = _ints(ctx.attr("dilations", [1] * n))
    if len(kernel) != n or len(strides) != n or len(dilations) != n:
        raise ctx.error("kernel_shape/strides/dilations do not match the input's spatial rank")
    pads = _resolve_pads(ctx, spatial, kernel, strides, dilations)
    attrs = {"kernel_shape": kernel, "strides": strides, "pads": pads, "dilations": dilations,
             "group": int(ctx.attr("group", 1))}
    return [ctx.node("Conv", ctx.inputs[:3], attrs)]


@register("MaxPool", "AveragePool", "LpPool")
def _pool(ctx: CanonContext) -> list[Node]:
    spatial = _spatial(ctx)
    n = len(spatial)
    if "kernel_shape" not in ctx.attrs:
        raise ctx.error("kernel_shape is required")
    kernel = _ints(ctx.attrs["kernel_shape"])
    strides = _ints(ctx.attr("strides", [1] * n))
    dilations = _ints(ctx.attr("dilations", [1] * n))
    pads = _resolve_pads(ctx, spatial, kernel, strides, dilations)
    attrs: dict[str, Any] = {"kernel_shape": kernel, "strides": strides, "pads": pads,
                             "ceil_mode": int(ctx.attr("ceil_mode", 0))}
    if ctx.op_type == "MaxPool":
        attrs["dilations"] = dilations
        attrs["storage_order"] = int(ctx.attr("storage_order", 0))
    elif ctx.op_type == "AveragePool":
        attrs["count_include_pad"] = int(ctx.attr("count_include_pad", 0))
        attrs["dilations"] = dilations
    else:
        attrs["p"] = int(ctx.attr("p", 2))
        attrs["dilations"] = dilations
    # MaxPool's optional Indices output is kept only when the model uses it.
    keep = 2 if ctx.op_type == "MaxPool" and any(v.name in ctx.used for v in ctx.outputs[1:2]) else 1
    return [ctx.node(ctx.op_type, ctx.inputs[:1], attrs, outputs=ctx.outputs[:keep])]


@register("LRN")
def _lrn(ctx: CanonContext) -> list[Node]:
    if "size" not in ctx.attrs:
        raise ctx.error("size is required")
    return [ctx.node("LRN", ctx.inputs, {"alpha": float(ctx.attr("alpha", 1e-4)),
                                         "beta": float(ctx.attr("beta", 0.75)),
                                         "bias": float(ctx.attr("bias", 1.0)),
                                         "size": int(ctx.attrs["size"])})]


@register("Gemm")
def _gemm(ctx: CanonContext) -> list[Node]:
    return [ctx.node("Gemm", ctx.inputs[:3], {"alpha": float(ctx.attr("alpha", 1.0)),
                                              "beta": float(ctx.attr("beta", 1.0)),
                                              "transA": int(ctx.attr("transA", 0)),
                                              "transB": int(ctx.attr("transB", 0))})]


@register("Softmax", "LogSoftmax", "Hardmax")
def _softmax(ctx: CanonContext) -> list[Node]:
    rank = ctx.rank()
    default = -1 if ctx.opset >= 13 else 1
    axis = ctx.axis(int(ctx.attr("axis", default)), rank)
    if ctx.opset >= 13 or axis == rank - 1:
        return [ctx.node(ctx.op_type, ctx.inputs[:1], {"axis": axis})]
    # Before opset 13 the op works on the input flattened to 2-D at `axis`.
    x = ctx.inputs[0]
    out = ctx.outputs[0]
    assert x is not None and x.shape is not None
    flat = (int(np.prod(x.shape[:axis], dtype=np.int64)), int(np.prod(x.shape[axis:], dtype=np.int64)))
    g = ctx.graph
    v_in = g.make_value(ctx.name + "/flat", x.dtype, flat)
    v_out = g.make_value(ctx.name + "/flat_out", x.dtype, flat)
    return [
        ctx.node("Reshape", [x], {"shape": list(flat)}, outputs=[v_in],
                 name=g.unique_name(ctx.name + "/flatten")),
        ctx.node(ctx.op_type, [v_in], {"axis": 1}, outputs=[v_out]),
        ctx.node("Reshape", [v_out], {"shape": list(x.shape)}, outputs=[out],
                 name=g.unique_name(ctx.name + "/unflatten")),
    ]


# -- shape and data movement ------------------------------------------------------------------
@register("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def _reshape(ctx: CanonContext) -> list[Node]:
    out = ctx.outputs[0]
    assert out.shape is not None
    return [ctx.node("Reshape", ctx.inputs[:1], {"shape": list(out.shape)})]


@register("Expand")
def _expand(ctx: CanonContext) -> list[Node]:
    out = ctx.outputs[0]
    assert out.shape is not None
    return [ctx.node("Expand", ctx.inputs[:1], {"shape": list(out.shape)})]


@register("Concat")
def _concat(ctx: CanonContext) -> list[Node]:
    if "axis" not in ctx.attrs:
        raise ctx.error("axis is required")
    return [ctx.node("Concat", ctx.inputs, {"axis": ctx.axis(int(ctx.attrs["axis"]), ctx.rank())})]


@register("Transpose")
def _transpose(ctx: CanonContext) -> list[Node]:
    rank = ctx.rank()
    perm = _ints(ctx.attr("perm", list(range(rank))[::-1]))
    if sorted(perm) != list(range(rank)):
        raise ctx.error(f"perm {perm} is not a permutation of {rank} axes")
    return [ctx.node("Transpose", ctx.inputs[:1], {"perm": perm})]


@register("Gather")
def _gather(ctx: CanonContext) -> list[Node]:
    return [ctx.node("Gather", ctx.inputs[:2], {"axis": ctx.axis(int(ctx.attr("axis", 0)), ctx.rank())})]


@register("Cast")
def _cast(ctx: CanonContext) -> list[Node]:
    dtype = np_dtype_of(int(ctx.attrs["to"]), ctx.describe())
    return [ctx.node("Cast", ctx.inputs[:1], {"to": dtype.name})]


@register("ConstantOfShape")
def _constant_of_shape(ctx: CanonContext) -> list[Node]:
    out = ctx.outputs[0]
    assert out.shape is not None and out.dtype is not None
    value = ctx.attr("value", np.zeros(1, np.float32))
    scalar = np.asarray(value).reshape(-1)
    item = scalar[0].item() if scalar.size else 0
    return [ctx.node("ConstantOfShape", [], {"shape": list(out.shape), "value": item,
                                             "dtype": out.dtype.name})]


@register("Shape")
def _shape(ctx: CanonContext) -> list[Node]:
    rank = ctx.rank()
    start = int(ctx.attr("start", 0))
    end = int(ctx.attr("end", rank))
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return [ctx.node("Shape", ctx.inputs[:1], {"start": start, "end": max(end, start)})]


@register("Slice")
def _slice(ctx: CanonContext) -> list[Node]:
    rank = ctx.rank()
    x = ctx.inputs[0]
    assert x is not None and x.shape is not None
    if ctx.opset < 10:
        starts = _ints(ctx.attrs["starts"])
        ends = _ints(ctx.attrs["ends"])
        axes = _ints(ctx.attr("axes", range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts = _ints(ctx.const_input(1, "starts"))  # type: ignore[arg-type]
        ends = _ints(ctx.const_input(2, "ends"))  # type: ignore[arg-type]
        axes_c = ctx.const_input(3, "axes")
        steps_c = ctx.const_input(4, "steps")
        axes = _ints(axes_c) if axes_c is not None else list(range(len(starts)))
        steps = _ints(steps_c) if steps_c is not None else [1] * len(starts)
    axes = [ctx.axis(a, rank) for a in axes]
    n_starts, n_ends = [], []
    for a, s, e, st in zip(axes, starts, ends, steps, strict=True):
        if st == 0:
            raise ctx.error("slice step 0")
        dim = x.shape[a]
        s = s + dim if s < 0 else s
        e = e + dim if e < 0 else e
        if st > 0:
            s, e = min(max(s, 0), dim), min(max(e, 0), dim)
        else:  # the start clamps to a real index; end -1 means "through index 0"
            s, e = min(max(s, 0), dim - 1), min(max(e, -1), dim - 1)
        n_starts.append(s)
        n_ends.append(e)
    return [ctx.node("Slice", ctx.inputs[:1], {"starts": n_starts, "ends": n_ends, "axes": axes,
                                               "steps": steps})]


@register("Split")
def _split(ctx: CanonContext) -> list[Node]:
    axis = ctx.axis(int(ctx.attr("axis", 0)), ctx.rank())
    sizes = []
    for out in ctx.outputs:
        assert out.shape is not None
        sizes.append(int(out.shape[axis]))
    return [ctx.node("Split", ctx.inputs[:1], {"axis": axis, "split": sizes})]


@register("Pad")
def _pad(ctx: CanonContext) -> list[Node]:
    rank = ctx.rank()
    mode = str(ctx.attr("mode", "constant"))
    if ctx.opset < 11:
        pads = _ints(ctx.attr("pads", ctx.attr("paddings", [0] * 2 * rank)))
        value = float(ctx.attr("value", 0.0))
    else:
        pads = _ints(ctx.const_input(1, "pads"))  # type: ignore[arg-type]
        value_c = ctx.const_input(2, "constant_value")
        value = _float(value_c) if value_c is not None else 0.0
        axes_c = ctx.const_input(3, "axes") if len(ctx.inputs) > 3 else None
        if axes_c is not None:
            axes = [ctx.axis(int(a), rank) for a in axes_c]
            full = [0] * (2 * rank)
            for k, a in enumerate(axes):
                full[a] = pads[k]
                full[a + rank] = pads[k + len(axes)]
            pads = full
    if len(pads) != 2 * rank:
        raise ctx.error(f"pads has {len(pads)} values, expected {2 * rank}")
    return [ctx.node("Pad", ctx.inputs[:1], {"pads": pads, "mode": mode, "value": value})]


@register("Tile")
def _tile(ctx: CanonContext) -> list[Node]:
    return [ctx.node("Tile", ctx.inputs[:1], {"repeats": _ints(ctx.const_input(1, "repeats"))})]  # type: ignore[arg-type]


REDUCE_AXES_AS_INPUT = {"ReduceSum": 13}  # the others moved axes to an input in opset 18


@register("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ReduceL1",
          "ReduceSumSquare", "ReduceLogSumExp", "ReduceLogSum")
def _reduce(ctx: CanonContext) -> list[Node]:
    rank = ctx.rank()
    since = REDUCE_AXES_AS_INPUT.get(ctx.op_type, 18)
    if ctx.opset >= since:
        axes_c = ctx.const_input(1, "axes") if len(ctx.inputs) > 1 else None
        axes = _ints(axes_c) if axes_c is not None else []
    else:
        axes = _ints(ctx.attr("axes", []))
    if not axes:
        if int(ctx.attr("noop_with_empty_axes", 0)):
            return [ctx.node("Identity", ctx.inputs[:1], {})]
        axes = list(range(rank))
    axes = sorted({ctx.axis(a, rank) for a in axes})
    return [ctx.node(ctx.op_type, ctx.inputs[:1], {"axes": axes,
                                                   "keepdims": int(ctx.attr("keepdims", 1))})]


@register("ArgMax", "ArgMin")
def _argmax(ctx: CanonContext) -> list[Node]:
    return [ctx.node(ctx.op_type, ctx.inputs[:1], {
        "axis": ctx.axis(int(ctx.attr("axis", 0)), ctx.rank()),
        "keepdims": int(ctx.attr("keepdims", 1)),
        "select_last_index": int(ctx.attr("select_last_index", 0))})]


# Further ops live in their own modules; importing them registers their canonicalizers.
from compiler.frontend import (  # noqa: E402,F401
    canonical_index,
    canonical_loss,
    canonical_math,
    canonical_nn,
    canonical_seq,
    canonical_spatial,
)
