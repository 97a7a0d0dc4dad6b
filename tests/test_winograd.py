"""Winograd F(2x2, 3x3) convolutions: the lowering pass, the reference kernel and the C kernel.

The pass is shown before/after on IR graphs through the reference kernels (STYLE.md #3); the C
kernel against onnxruntime's direct convolution on shapes the zoo does not have (odd sizes,
asymmetric pads up to 2, batch 2, channel counts that fill no tile, residual and activations,
NaN and Inf), and textually: the lowered conv is one kernel function with the 16 products on
the GEMM tile and the epilogue in the output transform. Models compile at -O2: at -O3 the convs
become WinogradConvNhwc (tests/test_winograd_nhwc.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler import compile_model
from compiler.passes import UseWinograd
from compiler.passes import optimize
from compiler.passes.use_winograd import winograd_weights
from runtime import Session
from runtime.kernels.conv import conv
from runtime.kernels.winograd import winograd_conv
from tests.support.graphs import CONV_ATTRS
from tests.support.graphs import Builder
from tests.support.graphs import check
from tests.support.graphs import kinds

ort = pytest.importorskip("onnxruntime")


# -- the algorithm -------------------------------------------------------------------------------


@pytest.mark.parametrize("tile", [2, 4])
@pytest.mark.parametrize(
    "shape,m,pads",
    [((1, 16, 7, 7), 16, [1, 1, 1, 1]), ((2, 17, 9, 6), 20, [0, 1, 2, 0]), ((1, 3, 2, 2), 5, [2, 2, 2, 2])],
)
def test_reference_winograd_equals_the_direct_convolution(
    shape: tuple[int, ...], m: int, pads: list[int], tile: int
) -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((m, shape[1], 3, 3)).astype(np.float32)
    attrs = {**CONV_ATTRS, "pads": pads}
    expected = conv(np, x.astype(np.float64), w.astype(np.float64), None, attrs)
    got = winograd_conv(np, x, winograd_weights(w, tile), attrs)
    assert got.shape == expected.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * float(np.abs(expected).max()))


# -- the pass --------------------------------------------------------------------------------------


def _conv(b: Builder, x, m: int, name: str, **attrs):  # type: ignore[no-untyped-def]
    c = x.shape[1]
    a = {**CONV_ATTRS, **attrs}
    kh, kw = a["kernel_shape"]
    oh = (x.shape[2] + a["pads"][0] + a["pads"][2] - (kh - 1) * a["dilations"][0] - 1) // a["strides"][0] + 1
    ow = (x.shape[3] + a["pads"][1] + a["pads"][3] - (kw - 1) * a["dilations"][1] - 1) // a["strides"][1] + 1
    w = b.rand(f"{name}_w", m, c // a["group"], kh, kw)
    bias = b.rand(f"{name}_b", m)
    return b.op("Conv", x, w, bias, out_shape=(x.shape[0], m, oh, ow), name=name, **a)


def test_eligible_convs_are_lowered_and_compute_the_same() -> None:
    b = Builder()
    x = b.input("x", (1, 16, 17, 15))
    y = _conv(b, x, 24, "c1")  # 3x3, stride 1: lowered, 5 x 4 tiles of 4x4
    y = b.op("Relu", y)
    y = _conv(b, y, 16, "c2", strides=[2, 2])  # stride 2: kept
    y = _conv(b, y, 16, "c3", pads=[0, 0, 0, 0])  # lowered, a 7x6 output: tiles of 2x2
    z = _conv(b, y, 16, "c4", group=2)  # groups: kept
    z = _conv(b, z, 8, "c5")  # 8 output channels: kept
    graph = b.output(z)
    check(graph, UseWinograd().run, rtol=1e-3)  # 4x4 tiles: ~1e-4 of the terms' scale here
    assert kinds(graph) == ["onnx_aot.WinogradConv", "Relu", "Conv", "onnx_aot.WinogradConv", "Conv", "Conv"]
    lowered = graph.nodes[0]
    assert lowered.input(1) is not None and lowered.input(1).shape == (36, 24, 16)  # 4x4 tiles
    small = graph.nodes[3]
    assert small.input(1) is not None and small.input(1).shape == (16, 16, 16)  # 2x2 tiles
    assert "c1_w" not in graph.constants  # the untransformed weights are gone


def test_fused_conv_keeps_its_epilogue_and_only_the_cpu_target_lowers() -> None:
    def build() -> tuple[Builder, object]:
        b = Builder()
        x = b.input("x", (1, 16, 8, 8))
        z = b.input("z", (1, 16, 8, 8))
        y = b.op("Add", _conv(b, x, 16, "c"), z)
        return b, b.output(b.op("Relu", y))

    _, graph = build()
    check(graph, lambda g: optimize(g, 2, target="cpu"), rtol=1e-4)
    assert kinds(graph) == ["onnx_aot.WinogradConv"]
    node = graph.nodes[0]
    assert node.attrs["activation"] == "Relu" and node.input(3) is not None  # residual kept
    for target in (None, "cuda"):
        _, graph = build()
        optimize(graph, 2, target=target)
        assert kinds(graph) == ["onnx_aot.FusedConv"]
    _, graph = build()
    optimize(graph, 1, target="cpu")
    assert "onnx_aot.WinogradConv" not in kinds(graph)


# -- the C kernel, against onnxruntime ---------------------------------------------------------------


def _model(c: int, m: int, shape: tuple[int, int, int], pads: list[int], act: str, residual: bool,
           rng: np.random.Generator) -> onnx.ModelProto:
    n, h, w = shape
    oh, ow = h + pads[0] + pads[2] - 2, w + pads[1] + pads[3] - 2
    weights = (rng.standard_normal((m, c, 3, 3)) * 0.2).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=pads)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, h, w])]
    last = "c"
    if residual:
        nodes.append(helper.make_node("Add", [last, "z"], ["r"]))
        inputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [n, m, oh, ow]))
        last = "r"
    bias = rng.standard_normal(m).astype(np.float32)
    inits = [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(bias, "b")]
    if act == "Clip":
        inits += [numpy_helper.from_array(np.array(-0.5, np.float32), "lo"),
                  numpy_helper.from_array(np.array(0.75, np.float32), "hi")]
        nodes.append(helper.make_node("Clip", [last, "lo", "hi"], ["y"]))
    else:
        nodes.append(helper.make_node(act or "Identity", [last], ["y"]))
    graph = helper.make_graph(nodes, "winograd", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, m, oh, ow])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    "c,m,shape,pads,act,residual",
    [
        (16, 16, (1, 7, 7), [1, 1, 1, 1], "Relu", False),
        (17, 20, (2, 9, 6), [0, 1, 2, 0], "", True),
        (32, 24, (1, 15, 13), [1, 1, 1, 1], "Clip", True),
        (16, 19, (1, 2, 3), [2, 2, 2, 1], "LeakyRelu", False),
        (24, 40, (1, 34, 30), [1, 1, 1, 1], "Relu", True),
        (16, 18, (2, 3, 5), [0, 0, 0, 0], "Relu", False),  # a 1x3 output: 2x2 tiles
    ],
)
def test_c_kernel_matches_onnxruntime(c: int, m: int, shape: tuple[int, int, int], pads: list[int], act: str,
                                      residual: bool, tmp_path: Path) -> None:
    rng = np.random.default_rng(c * 100 + m)
    model = _model(c, m, shape, pads, act, residual, rng)
    art = compile_model(model, tmp_path / "a", opt_level=2)
    plan = json.loads((art / "plan.json").read_text())
    assert [(s["op_type"], s["provider"]) for s in plan["steps"]] == [("WinogradConv", "c")]
    n, h, w = shape
    feeds = {"x": rng.standard_normal((n, c, h, w)).astype(np.float32)}
    feeds["x"][0, 0, 0, 0] = np.nan
    if residual:
        oh, ow = h + pads[0] + pads[2] - 2, w + pads[1] + pads[3] - 2
        feeds["z"] = rng.standard_normal((n, m, oh, ow)).astype(np.float32)
    (got,) = Session(art).run(None, feeds)
    (expected,) = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    assert np.isnan(expected).any() and np.isfinite(expected).any()
    # every output the NaN reaches directly is NaN; the transforms can spread it further, but only
    # within the tile of outputs computed together (4x4 or 2x2, from the patch holding the NaN)
    nan = np.isnan(got)
    assert nan[np.isnan(expected)].all()
    assert not nan[:, :, 6:, :].any() and not nan[:, :, :, 6:].any()
    both = ~nan & ~np.isnan(expected)
    np.testing.assert_allclose(got[both], expected[both], rtol=1e-4, atol=1e-4)


def test_inf_input_gives_inf_or_nan_and_no_winograd_is_exact(tmp_path: Path) -> None:
    # The transforms combine every input of a patch, so an Inf reaches every output of the tiles
    # whose patches hold it and meets -Inf there: those outputs may come out NaN where the direct
    # sum is finite or +-Inf (as in other Winograd implementations); the rest are unaffected.
    # --no-winograd (compile_model(winograd=False)) keeps the direct convolution.
    rng = np.random.default_rng(5)
    model = _model(16, 16, (1, 8, 8), [1, 1, 1, 1], "", False, rng)
    x = rng.standard_normal((1, 16, 8, 8)).astype(np.float32)
    x[0, 3, 4, 4] = np.inf
    (expected,) = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    (got,) = Session(compile_model(model, tmp_path / "w", opt_level=2)).run(None, {"x": x})
    finite = np.isfinite(expected) & np.isfinite(got)
    np.testing.assert_allclose(got[finite], expected[finite], rtol=1e-4, atol=1e-4)
    inf = ~np.isfinite(expected)
    assert np.all(np.isnan(got[inf]) | (got[inf] == expected[inf]))
    bad = np.argwhere(~np.isfinite(got))[:, 2:]
    assert (bad >= 0).all() and (bad <= 7).all()  # only in the tiles whose patches hold the Inf
    direct = compile_model(model, tmp_path / "d", winograd=False, opt_level=2)
    plan = json.loads((direct / "plan.json").read_text())
    assert [s["op_type"] for s in plan["steps"]] == ["Conv"]
    assert json.loads((direct / "manifest.json").read_text())["options"]["winograd"] is False
    (exact,) = Session(direct).run(None, {"x": x})
    np.testing.assert_array_equal(np.isinf(exact), np.isinf(expected))


def test_lowered_conv_is_one_kernel_with_products_on_the_tile(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    model = _model(24, 16, (1, 8, 8), [1, 1, 1, 1], "Relu", True, rng)
    art = compile_model(model, tmp_path / "a", opt_level=2)
    source = (art / "kernels" / "cpu" / "model.c").read_text()
    (name,) = set(re.findall(r"^void (k_[0-9a-f]{16})\(", source, re.M))
    body = source[source.index(f"void {name}_") :]  # its parts on the worker pool, then the kernel
    body = body[: body.index("\n}\n", body.index(f"void {name}("))]
    assert "for (int k = 0; k < 24; ++k)" in body  # the tile's loop over the C = 24 channels
    assert "const float* Ap = u + (long)k *" in body  # the products read the transformed weights
    epilogue = body[body.index("float out[") :]  # the output transform
    assert "v += bias[m];" in epilogue and "v += zrow[ox];" in epilogue and "0.0f ? 0.0f" in epilogue
