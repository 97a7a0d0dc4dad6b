"""Small models that put every CUDA kernel template and variant at awkward sizes.

Each ``SHAPE_MODELS`` entry builds a one- or few-node float32 model with seeded random weights:
partial tiles (sizes that are not multiples of the 64 / 32 / 16 tile edges), K not a multiple of
the 16-deep slice, odd spatial sizes, strides, dilations, asymmetric pads, groups, batches, rows
longer and shorter than a warp, a warp count per block that does not divide the rows, and the
epilogue variants (bias, residual, activation, alpha / beta). ``transformer`` and the two models of
``tests/test_cuda_codegen.py`` are added by ``scripts/cuda_host_check.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

__all__ = ["SHAPE_MODELS", "shape_model", "random_feeds"]

OPSET = 17


def _model(name: str, nodes: list[onnx.NodeProto], inputs: dict[str, tuple[int, ...]],
           outputs: list[str], weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v)) for k, v in inputs.items()],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in weights.items()],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    return onnx.shape_inference.infer_shapes(model)


def _w(rng: np.random.Generator, *shape: int, scale: float | None = None) -> np.ndarray:
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    s = scale if scale is not None else 1.0 / np.sqrt(max(fan_in, 1))
    return (rng.standard_normal(shape) * s).astype(np.float32)


def _conv(name: str, x: tuple[int, ...], m: int, k: tuple[int, int], *, residual: bool = False,
          relu: bool = False, bias: bool = True, **attrs: Any) -> onnx.ModelProto:
    rng = np.random.default_rng(len(name))
    group = int(attrs.get("group", 1))
    weights = {"w": _w(rng, m, x[1] // group, *k)}
    ins = ["x", "w"]
    if bias:
        weights["b"] = _w(rng, m, scale=0.1)
        ins.append("b")
    nodes = [helper.make_node("Conv", ins, ["c"], name="conv", kernel_shape=list(k), **attrs)]
    last = "c"
    inputs = {"x": x}
    if residual:
        # the residual's shape is the conv's output: a second input, fused into the epilogue
        nodes.append(helper.make_node("Add", ["c", "z"], ["s"], name="res"))
        last = "s"
    if relu:
        nodes.append(helper.make_node("Relu", [last], ["y"], name="relu"))
        last = "y"
    model = _model(name, nodes, inputs, [last], weights)
    if residual:
        shape = [d.dim_value for d in model.graph.value_info[0].type.tensor_type.shape.dim]
        model.graph.input.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, shape))
        model = onnx.shape_inference.infer_shapes(model)
    return model


def _gemm(name: str, a: tuple[int, int], b: tuple[int, int], c: tuple[int, ...] | None,
          **attrs: Any) -> onnx.ModelProto:
    rng = np.random.default_rng(len(name))
    weights = {"b": _w(rng, *b)}
    ins = ["a", "b"]
    if c is not None:
        weights["c"] = _w(rng, *c, scale=0.5)
        ins.append("c")
    node = helper.make_node("Gemm", ins, ["y"], name="gemm", **attrs)
    return _model(name, [node], {"a": a}, ["y"], weights)


def _one(name: str, op: str, x: tuple[int, ...], weights: dict[str, np.ndarray] | None = None,
         extra: list[str] | None = None, **attrs: Any) -> onnx.ModelProto:
    node = helper.make_node(op, ["x", *(extra or [])], ["y"], name=op.lower(), **attrs)
    return _model(name, [node], {"x": x}, ["y"], weights or {})


def _matmul_batched() -> onnx.ModelProto:
    rng = np.random.default_rng(7)
    node = helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")
    return _model("matmul_batched", [node], {"a": (3, 1, 37, 19)}, ["y"], {"b": _w(rng, 5, 19, 23)})


def _matmul_two_inputs() -> onnx.ModelProto:
    nodes = [helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")]
    return _model("matmul_activations", nodes, {"a": (2, 65, 70), "b": (2, 70, 66)}, ["y"], {})


def _gemv_batched() -> onnx.ModelProto:
    """MatMul with one row per batch and broadcast batches: the matrix-vector kernel over grid z."""
    rng = np.random.default_rng(9)
    node = helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")
    return _model("gemv_batched", [node], {"a": (2, 3, 1, 40)}, ["y"], {"b": _w(rng, 3, 40, 20)})


def _batchnorm() -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    c = 5
    weights = {"s": _w(rng, c, scale=0.5) + 1, "bb": _w(rng, c, scale=0.1), "mu": _w(rng, c, scale=0.1),
               "var": np.abs(_w(rng, c, scale=1.0)) + 0.5}
    return _one("batchnorm", "BatchNormalization", (2, c, 7, 9), weights, ["s", "bb", "mu", "var"],
                epsilon=1e-3)


def _layernorm(name: str, x: tuple[int, ...], axis: int, bias: bool) -> onnx.ModelProto:
    rng = np.random.default_rng(len(name))
    norm = x[axis:]
    weights = {"g": _w(rng, *norm, scale=0.5) + 1}
    extra = ["g"]
    if bias:
        weights["bb"] = _w(rng, *norm, scale=0.1)
        extra.append("bb")
    return _one(name, "LayerNormalization", x, weights, extra, axis=axis, epsilon=1e-5)


def _reduce(name: str, op: str, x: tuple[int, ...], axes: list[int] | None, keepdims: int) -> onnx.ModelProto:
    if op == "ReduceMean":  # axes an attribute up to opset 17
        return _one(name, op, x, keepdims=keepdims, **({"axes": axes} if axes is not None else {}))
    weights = {"axes": np.array(axes, np.int64)} if axes is not None else {}
    return _one(name, op, x, weights, ["axes"] if axes is not None else [], keepdims=keepdims)


def _concat() -> onnx.ModelProto:
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"], name="sig"),
             helper.make_node("Concat", ["s", "x", "t"], ["y"], name="cat", axis=1)]
    return _model("concat_rows", nodes, {"x": (3, 5, 7), "t": (3, 2, 7)}, ["y"], {})


def _concat_in_place() -> onnx.ModelProto:
    """Batch 1: each input is produced straight into its slice of the output; the Concat launches
    nothing (squeezenet's fire modules, densenet's dense blocks)."""
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="left", kernel_shape=[1, 1]),
             helper.make_node("Conv", ["x", "w3"], ["b"], name="right", kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["a", "b"], ["y"], name="cat", axis=1)]
    return _model("concat_in_place", nodes, {"x": (1, 4, 6, 5)}, ["y"],
                  {"w1": _w(rng, 10, 4, 1, 1), "w3": _w(rng, 12, 4, 3, 3)})


def _copy() -> onnx.ModelProto:
    """Two graph outputs of the same value: the second one gets its own copy (onnx_aot.Copy)."""
    nodes = [helper.make_node("Sigmoid", ["x"], ["a"], name="sig"),
             helper.make_node("Identity", ["a"], ["y"], name="same")]
    return _model("copy", nodes, {"x": (3, 7, 13)}, ["a", "y"], {})


def _broadcast() -> onnx.ModelProto:
    rng = np.random.default_rng(11)
    nodes = [helper.make_node("Mul", ["x", "c"], ["m"], name="mul"),
             helper.make_node("Add", ["m", "t"], ["a"], name="add"),
             helper.make_node("Sigmoid", ["a"], ["y"], name="sig"),
             helper.make_node("Max", ["x", "t", "c"], ["z"], name="max")]
    return _model("eltwise_broadcast", nodes, {"x": (3, 1, 5, 1), "t": (1, 4, 1, 6)}, ["y", "z"],
                  {"c": _w(rng, 4, 5, 1, scale=1.0)})


def _eltwise_nan() -> onnx.ModelProto:
    nodes = [helper.make_node(op, ins, [out], name=out)
             for op, ins, out in (("Max", ["x", "t"], "mx"), ("Min", ["x", "t"], "mn"), ("Relu", ["x"], "r"),
                                  ("Sigmoid", ["t"], "sg"), ("Tanh", ["x"], "th"), ("Abs", ["t"], "ab"))]
    return _model("eltwise_nan", nodes, {"x": (7, 9), "t": (7, 9)}, ["mx", "mn", "r", "sg", "th", "ab"], {})


SHAPE_MODELS: dict[str, Callable[[], onnx.ModelProto]] = {
    # tiled implicit-GEMM conv: partial 32x32 tiles, K = 45, bias + ReLU epilogue
    "conv_odd": lambda: _conv("conv_odd", (1, 5, 11, 13), 12, (3, 3), relu=True, pads=[1, 1, 1, 1]),
    # groups (grid z), batch 2, stride 2, dilation 2, asymmetric pads, no bias
    "conv_grouped": lambda: _conv("conv_grouped", (2, 8, 9, 10), 18, (3, 3), bias=False, group=2,
                                  strides=[2, 2], dilations=[2, 2], pads=[1, 2, 0, 1]),
    # the 64x64 tile (enough blocks), K = 144, residual + ReLU epilogue
    "conv_big_tile": lambda: _conv("conv_big_tile", (1, 16, 90, 90), 130, (3, 3), residual=True, relu=True,
                                   pads=[1, 1, 1, 1]),
    "conv_1x1": lambda: _conv("conv_1x1", (3, 33, 5, 3), 40, (1, 1)),
    "conv_rect": lambda: _conv("conv_rect", (1, 3, 17, 12), 10, (5, 2), strides=[3, 1], pads=[2, 0, 1, 1]),
    # direct conv: depthwise stride 2, and a channel multiplier of 2
    "conv_depthwise": lambda: _conv("conv_depthwise", (2, 7, 13, 11), 7, (3, 3), group=7, strides=[2, 2],
                                    pads=[1, 1, 1, 1], relu=True),
    "conv_multiplier": lambda: _conv("conv_multiplier", (1, 3, 9, 8), 6, (3, 3), group=3, dilations=[2, 1],
                                     residual=True),
    "conv_depthwise_dilated": lambda: _conv("conv_depthwise_dilated", (1, 4, 12, 9), 4, (3, 2), group=4,
                                            dilations=[2, 3], pads=[2, 0, 1, 3], strides=[1, 2]),
    "conv_few_out": lambda: _conv("conv_few_out", (1, 9, 10, 7), 5, (3, 3), pads=[0, 1, 2, 1]),
    # GEMM tile: M, N, K odd, transA / transB strides, alpha / beta, row and full bias
    "gemm_odd": lambda: _gemm("gemm_odd", (70, 33), (33, 45), (45,)),
    "gemm_trans": lambda: _gemm("gemm_trans", (37, 9), (50, 37), (9, 1), transA=1, transB=1, alpha=0.5,
                                beta=2.0),
    "gemm_full_bias": lambda: _gemm("gemm_full_bias", (130, 70), (70, 129), (130, 129)),
    "matmul_batched": _matmul_batched,
    "matmul_activations": _matmul_two_inputs,
    # matrix-vector: one warp per column (B along k), and the 32x8 split (B along n)
    "gemv_warp": lambda: _gemm("gemv_warp", (3, 100), (50, 100), (50,), transB=1),
    "gemv_split": lambda: _gemm("gemv_split", (2, 77), (77, 45), (2, 45), beta=0.5),
    "gemv_one_row": lambda: _gemm("gemv_one_row", (1, 40), (40, 33), None),
    "gemv_trans_a": lambda: _gemm("gemv_trans_a", (65, 4), (33, 65), (4, 1), transA=1, transB=1, alpha=1.5),
    "gemv_batched": _gemv_batched,
    # pools: clipped windows, ceil mode, padding counted or not, dilation, 1-D
    "maxpool_ceil": lambda: _one("maxpool_ceil", "MaxPool", (2, 3, 11, 10), kernel_shape=[3, 3],
                                 strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1),
    "maxpool_nan": lambda: _one("maxpool_nan", "MaxPool", (1, 3, 9, 8), kernel_shape=[2, 2], strides=[2, 2],
                                ceil_mode=1),
    "maxpool_dilated": lambda: _one("maxpool_dilated", "MaxPool", (1, 4, 9, 9), kernel_shape=[2, 3],
                                    dilations=[2, 2], strides=[1, 2]),
    "avgpool_pad": lambda: _one("avgpool_pad", "AveragePool", (1, 5, 9, 7), kernel_shape=[3, 3],
                                strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1),
    "avgpool_ceil": lambda: _one("avgpool_ceil", "AveragePool", (2, 3, 10, 11), kernel_shape=[3, 2],
                                 strides=[2, 2], pads=[0, 1, 1, 0], ceil_mode=1),
    "avgpool_ceil_pad": lambda: _one("avgpool_ceil_pad", "AveragePool", (1, 2, 10, 9), kernel_shape=[3, 3],
                                     strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1, count_include_pad=1),
    "avgpool_1d": lambda: _one("avgpool_1d", "AveragePool", (2, 3, 17), kernel_shape=[4], strides=[3]),
    # per channel: warp-per-plane pools (plane longer / shorter than a warp), BatchNorm, LRN
    "global_avg": lambda: _one("global_avg", "GlobalAveragePool", (3, 5, 7, 7)),
    "global_one": lambda: _one("global_one", "GlobalAveragePool", (2, 3, 1, 1)),
    "global_long": lambda: _one("global_long", "GlobalMaxPool", (1, 17, 13, 11)),
    "global_max_nan": lambda: _one("global_max_nan", "GlobalMaxPool", (2, 9, 7, 7)),
    "global_max": lambda: _one("global_max", "GlobalMaxPool", (2, 9, 3, 5)),
    "batchnorm": _batchnorm,
    "lrn": lambda: _one("lrn", "LRN", (2, 7, 5, 3), size=5, alpha=1e-3, beta=0.75, bias=1.5),
    "lrn_few_channels": lambda: _one("lrn_few_channels", "LRN", (1, 2, 3, 3), size=5, alpha=0.1, beta=0.75),
    "lrn_even": lambda: _one("lrn_even", "LRN", (1, 6, 4, 4), size=4, alpha=1e-2, beta=0.5, bias=2.0),
    # rows: one warp a row, rows shorter and longer than a warp, inner strides
    "softmax_inner": lambda: _one("softmax_inner", "Softmax", (3, 7, 5), axis=1),
    "softmax_axis0": lambda: _one("softmax_axis0", "Softmax", (6, 4, 3), axis=0),
    "softmax_nan": lambda: _one("softmax_nan", "Softmax", (40, 12), axis=-1),
    "softmax_long": lambda: _one("softmax_long", "Softmax", (5, 77), axis=-1),
    "logsoftmax": lambda: _one("logsoftmax", "LogSoftmax", (2, 3, 40), axis=2),
    "logsoftmax_inner": lambda: _one("logsoftmax_inner", "LogSoftmax", (2, 33, 3), axis=1),
    "layernorm": lambda: _layernorm("layernorm", (3, 5, 100), 2, True),
    "layernorm_axes": lambda: _layernorm("layernorm_axes", (2, 3, 4, 5), 1, False),
    "reduce_mean": lambda: _reduce("reduce_mean", "ReduceMean", (3, 4, 5, 6), [1, 3], 1),
    "reduce_sum_all": lambda: _reduce("reduce_sum_all", "ReduceSum", (7, 9, 11), None, 0),
    "reduce_sum_strided": lambda: _reduce("reduce_sum_strided", "ReduceSum", (4, 3, 5, 2), [0, 2], 1),
    "reduce_sum_inner": lambda: _reduce("reduce_sum_inner", "ReduceSum", (5, 70, 3), [0], 0),
    # movement: transpose with odd dims, concat of rows
    "transpose": lambda: _one("transpose", "Transpose", (3, 5, 2, 7), perm=[2, 0, 3, 1]),
    "transpose_2d": lambda: _one("transpose_2d", "Transpose", (37, 70), perm=[1, 0]),
    "transpose_5d": lambda: _one("transpose_5d", "Transpose", (2, 3, 1, 4, 5), perm=[4, 2, 0, 3, 1]),
    "concat_rows": _concat,
    "concat_in_place": _concat_in_place,
    "copy": _copy,
    # elementwise: broadcasting, variadic Max, a fused chain
    "eltwise_broadcast": _broadcast,
    "eltwise_nan": _eltwise_nan,
}


def shape_model(name: str) -> onnx.ModelProto:
    return SHAPE_MODELS[name]()


# models whose feeds also hold NaN, +inf and -inf (NaN propagation of max / softmax / elementwise)
SPECIAL_FEEDS = frozenset({"maxpool_nan", "global_max_nan", "softmax_nan", "eltwise_nan"})


def random_feeds(specs: Any, seed: int = 0, special: bool = False) -> dict[str, np.ndarray]:
    """Seeded standard-normal float32 feeds for ``specs`` (TensorSpecs of a plan's inputs); with
    ``special`` about one element in 7 is NaN, +inf or -inf."""
    rng = np.random.default_rng(seed)
    feeds = {s.name: rng.standard_normal(s.shape).astype(s.dtype) for s in specs}
    if special:
        for array in feeds.values():
            flat = array.reshape(-1)
            picks = rng.integers(0, 7 * 3, size=flat.size)
            for k, value in enumerate((np.nan, np.inf, -np.inf)):
                flat[picks == k] = value
    return feeds
