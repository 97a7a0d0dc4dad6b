"""The NHWC layout pass (compiler/passes/layout_nhwc.py): regions, edges, the ops' NHWC forms.

Each graph is run through the reference kernels before and after the pass (tests/test_passes.py
``check``); the structure after it is asserted: Transposes only where a tensor enters or leaves
a region, Reshapes where only size-1 axes move, weights packed once. End to end, models compiled
at -O3 match onnxruntime.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler import compile_model
from compiler.ir.graph import AOT_DOMAIN
from compiler.ir.graph import Value
from compiler.passes import LayoutNhwc
from compiler.passes import optimize
from compiler.passes.layout_nhwc import regions
from runtime import Session
from runtime.kernels.nhwc import PANEL
from runtime.kernels.nhwc import pack_conv_weights
from tests.support.graphs import CONV_ATTRS
from tests.support.graphs import Builder
from tests.support.graphs import check
from tests.support.graphs import kinds

ACT = {"activation": "", "act_min": 0.0, "act_max": 0.0, "act_alpha": 0.0}


def _conv(b: Builder, x: Value, m: int, name: str, kind: str = "Conv", z: Value | None = None, **attrs):  # type: ignore[no-untyped-def]
    assert x.shape is not None
    a = {**CONV_ATTRS, **attrs}
    kh, kw = a["kernel_shape"]
    n, c, h, w_ = x.shape
    oh = (h + a["pads"][0] + a["pads"][2] - (kh - 1) * a["dilations"][0] - 1) // a["strides"][0] + 1
    ow = (w_ + a["pads"][1] + a["pads"][3] - (kw - 1) * a["dilations"][1] - 1) // a["strides"][1] + 1
    w = b.rand(f"{name}_w", m, c // a["group"], kh, kw)
    bias = b.rand(f"{name}_b", m)
    if kind == "FusedConv":
        return b.op(
            "FusedConv",
            x,
            w,
            bias,
            z,
            out_shape=(n, m, oh, ow),
            name=name,
            domain=AOT_DOMAIN,
            **a,
            **{**ACT, "activation": "Relu"},
        )
    return b.op("Conv", x, w, bias, out_shape=(n, m, oh, ow), name=name, **a)


def _count(graph, kind: str) -> int:  # type: ignore[no-untyped-def]
    return sum(1 for node in graph if node.kind == kind)


def test_a_conv_chain_becomes_one_region_with_transposes_only_at_its_edges() -> None:
    b = Builder()
    x = b.input("x", (2, 5, 13, 11))
    y = _conv(b, x, 20, "c1", strides=[2, 2])
    y = b.op("Relu", y)
    y = b.op(
        "MaxPool",
        y,
        out_shape=(2, 20, 5, 4),
        kernel_shape=[3, 3],
        strides=[1, 1],
        pads=[0, 0, 0, 0],
        dilations=[1, 1],
        ceil_mode=0,
        storage_order=0,
    )
    r = _conv(b, y, 20, "c2", kernel_shape=[1, 1], pads=[0, 0, 0, 0])
    y = _conv(b, r, 20, "c3", kind="FusedConv", z=y)  # residual from inside the region
    y = b.op("GlobalAveragePool", y, out_shape=(2, 20, 1, 1))
    graph = b.output(y)
    check(graph, LayoutNhwc().run)
    assert kinds(graph) == [
        "Transpose",
        "onnx_aot.ConvNhwc",
        "Relu",
        "onnx_aot.MaxPoolNhwc",
        "onnx_aot.ConvNhwc",
        "onnx_aot.ConvNhwc",
        "onnx_aot.GlobalAveragePoolNhwc",
        "Reshape",
    ]
    first = graph.nodes[0]
    assert first.attrs["perm"] == [0, 2, 3, 1] and first.outputs[0].shape == (2, 13, 11, 5)
    # the (2, 1, 1, 20) pooled tensor leaves as a Reshape (no copy), under the output's own name
    assert graph.outputs[0] is y and y.producer is graph.nodes[-1] and y.shape == (2, 20, 1, 1)
    conv = graph.nodes[1]
    assert conv.input(1) is not None and conv.input(1).shape == (1, 2, 3, 3, 5, PANEL)
    assert conv.attrs["activation"] == ""  # a plain Conv gets the fused epilogue's attributes
    fused = graph.nodes[5]
    assert fused.input(3) is graph.nodes[3].outputs[0] and fused.attrs["activation"] == "Relu"


def test_tensors_used_outside_leave_through_one_transpose_and_non_candidates_split_regions() -> None:
    b = Builder()
    x = b.input("x", (1, 8, 9, 9))
    y = _conv(b, x, 16, "c1")
    s = b.op("Softmax", y, axis=1)  # no NHWC form: the region ends here
    z = _conv(b, s, 16, "c2")
    graph = b.output(z, y)  # y is also a graph output
    assert [len(r) for r in regions(graph)] == [1, 1]
    check(graph, LayoutNhwc().run)
    assert kinds(graph) == [
        "Transpose",
        "onnx_aot.ConvNhwc",
        "Transpose",
        "Softmax",
        "Transpose",
        "onnx_aot.ConvNhwc",
        "Transpose",
    ]
    assert [v.name for v in graph.outputs] == [z.name, y.name]
    back = graph.nodes[2]
    assert back.attrs["perm"] == [0, 3, 1, 2] and back.outputs[0] is y
    assert len(y.uses) == 1  # the Softmax; the graph output slot is y itself


def test_regions_without_a_convolution_are_left_alone() -> None:
    b = Builder()
    x = b.input("x", (1, 4, 6, 6))
    y = b.op(
        "MaxPool",
        x,
        out_shape=(1, 4, 5, 5),
        kernel_shape=[2, 2],
        strides=[1, 1],
        pads=[0, 0, 0, 0],
        dilations=[1, 1],
        ceil_mode=0,
        storage_order=0,
    )
    graph = b.output(b.op("Relu", y))
    assert regions(graph) == []
    assert not LayoutNhwc().run(graph).modified
    assert kinds(graph) == ["MaxPool", "Relu"]


def test_constants_of_elementwise_ops_and_batchnorm_follow_the_layout() -> None:
    b = Builder()
    x = b.input("x", (1, 6, 7, 5))
    y = _conv(b, x, 12, "c1", kernel_shape=[1, 1], pads=[0, 0, 0, 0])
    y = b.op("Mul", y, b.rand("scale", 12, 1, 1))  # per channel
    y = b.op("Add", y, b.rand("full", 1, 12, 7, 5))  # a whole 4-D constant
    y = b.op("Sub", y, b.const("one", np.array([1.0], np.float32)))  # a scalar stays
    params = [b.rand("g", 12), b.rand("beta", 12), b.rand("mean", 12), b.rand("var", 12, low=0.5, high=2.0)]
    bn = b.op("BatchNormalization", y, *params, out_shape=(1, 12, 7, 5), epsilon=1e-5)
    t = b.op(
        "FusedElementwise",
        bn,
        b.rand("s2", 12, 1, 1),
        domain=AOT_DOMAIN,
        program=[
            {"op": "Mul", "args": ["i0", "i1"], "attrs": {}},
            {"op": "Relu", "args": ["t0"], "attrs": {}},
        ],
    )
    u = b.op("Concat", y, t, out_shape=(1, 24, 7, 5), axis=1)
    z = _conv(b, u, 8, "c2")
    graph = b.output(z)
    check(graph, LayoutNhwc().run, rtol=1e-4)
    assert kinds(graph) == [
        "Transpose",
        "onnx_aot.ConvNhwc",
        "Mul",
        "Add",
        "Sub",
        "onnx_aot.FusedElementwise",
        "Concat",
        "onnx_aot.ConvNhwc",
        "Transpose",
    ]
    mul, add, sub, fused, concat = graph.nodes[2:7]
    assert mul.input(1) is not None and mul.input(1).shape == (1, 1, 1, 12)
    assert add.input(1) is not None and add.input(1).shape == (1, 7, 5, 12)
    assert sub.input(1) is not None and sub.input(1).shape == (1,)
    # the BatchNormalization went into the FusedElementwise's program: x * s + t first
    assert [ins["op"] for ins in fused.attrs["program"]] == ["Mul", "Add", "Mul", "Relu"]
    assert fused.input(0) is sub.outputs[0] and len(fused.inputs) == 4
    assert concat.attrs["axis"] == 3


def test_winograd_convs_take_packed_transformed_weights() -> None:
    b = Builder()
    x = b.input("x", (1, 16, 17, 18))
    y = _conv(b, x, 20, "c1")
    graph = b.output(_conv(b, y, 16, "c2"))
    check(graph, lambda g: optimize(g, 3, target="cpu"), rtol=1e-3)
    assert kinds(graph) == [
        "Transpose",
        "onnx_aot.WinogradConvNhwc",
        "onnx_aot.WinogradConvNhwc",
        "Transpose",
    ]
    u = graph.nodes[1].input(1)
    assert u is not None and u.shape == (36, 2, 16, PANEL)  # 20 channels in two panels of 16


def test_only_level_3_on_the_cpu_target_changes_the_layout() -> None:
    def build():  # type: ignore[no-untyped-def]
        b = Builder()
        x = b.input("x", (1, 4, 6, 6))
        return b.output(_conv(b, x, 8, "c1"))

    assert kinds(optimize(build(), 2, target="cpu")) == ["Conv"]
    assert kinds(optimize(build(), 3, target="cuda")) == ["Conv"]
    assert kinds(optimize(build(), 3, target="cpu")) == ["Transpose", "onnx_aot.ConvNhwc", "Transpose"]


def test_a_channel_shuffle_stays_inside_the_region() -> None:
    b = Builder()
    x = b.input("x", (1, 12, 5, 6))
    y = _conv(b, x, 12, "c1", kernel_shape=[1, 1], pads=[0, 0, 0, 0], group=4)
    y = b.op("Reshape", y, out_shape=(1, 4, 3, 5, 6), shape=[1, 4, 3, 5, 6])
    y = b.op("Transpose", y, out_shape=(1, 3, 4, 5, 6), perm=[0, 2, 1, 3, 4])
    y = b.op("Reshape", y, out_shape=(1, 12, 5, 6), shape=[1, 12, 5, 6])
    graph = b.output(_conv(b, y, 12, "c2", group=12))  # depthwise
    check(graph, LayoutNhwc().run)
    assert kinds(graph) == ["Transpose", "onnx_aot.ConvNhwc", "Reshape", "Transpose", "Reshape",
                            "onnx_aot.ConvNhwc", "Transpose"]
    split, swap, merge = graph.nodes[2:5]
    assert split.attrs["shape"] == [1, 5, 6, 4, 3] and swap.attrs["perm"] == [0, 1, 2, 4, 3]
    assert merge.outputs[0].shape == (1, 5, 6, 12)


def test_depthwise_weights_are_a_vector_of_channels_per_tap() -> None:
    w = np.arange(6 * 9, dtype=np.float32).reshape(6, 1, 3, 3)
    packed = pack_conv_weights(w, 6)
    assert packed.shape == (3, 3, 6) and packed[1, 2, 4] == w[4, 0, 1, 2]


# -- end to end --------------------------------------------------------------------------------


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(7)

    def init(name: str, *shape: int, scale: float = 0.3) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    nodes = [
        helper.make_node(
            "Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]
        ),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["p1", "w2"], ["c2"], kernel_shape=[1, 1]),
        helper.make_node("BatchNormalization", ["c2", "g", "beta", "mean", "var"], ["n2"]),
        helper.make_node("Add", ["n2", "p1"], ["a2"]),
        helper.make_node("Relu", ["a2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3"], ["c3"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Concat", ["c3", "r2"], ["cat"], axis=1),
        helper.make_node("Conv", ["cat", "w4"], ["c4"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=4),
        helper.make_node("GlobalAveragePool", ["c4"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["y"]),
    ]
    inits = [
        init("w1", 24, 3, 3, 3),
        init("b1", 24),
        init("w2", 24, 24, 1, 1, scale=0.2),
        init("g", 24),
        init("beta", 24),
        init("mean", 24),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, 24).astype(np.float32), "var"),
        init("w3", 20, 24, 3, 3, scale=0.1),
        init("w4", 44, 11, 3, 3, scale=0.1),
    ]
    graph = helper.make_graph(
        nodes,
        "nhwc_e2e",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 23, 21])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 44])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_a_model_compiled_at_level_3_matches_onnxruntime(tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    model = _model()
    art = compile_model(model, tmp_path / "o3", opt_level=3)
    x = np.random.default_rng(1).standard_normal((1, 3, 23, 21)).astype(np.float32)
    (got,) = Session(art).run(None, {"x": x})
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (want,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4 * float(np.abs(want).max()))
    (other,) = Session(art).run(None, {"x": x + 1.0})
    assert np.isfinite(got).all() and not np.allclose(got, other)
