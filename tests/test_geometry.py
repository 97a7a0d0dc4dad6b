"""Window sizes (runtime/kernels/window.py) and op geometry (compiler/providers/geometry.py).

The sizes are checked against onnxruntime (one session holding a node per case), onnx's shape
inference of opset 22 (the first to drop a ceil-mode window that starts in the end padding) and,
for the ceil-mode case, the ONNX reference evaluator: pools with ceil mode, dilations and
asymmetric pads; convolutions with auto_pad SAME_UPPER / SAME_LOWER / VALID and groups;
ConvTranspose with output_padding. The geometry records must read the same sizes from a node in
NCHW and in NHWC. End to end, a ceil-mode pool whose last window starts in the end padding runs
in C at -O2 (NCHW kernels) and -O3 (NHWC kernels) with onnxruntime's output shape and values, at
an opset whose onnx shape inference keeps that window (it used to give an extra row and column
of -inf / NaN in NCHW and a run-time error in NHWC).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler import compile_model
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.providers.geometry import Axis
from compiler.providers.geometry import ConvGeometry
from compiler.providers.geometry import ConvTransposeGeometry
from compiler.providers.geometry import MatmulProduct
from compiler.providers.geometry import PoolGeometry
from compiler.providers.geometry import WinogradGeometry
from runtime import Session
from runtime.kernels.nhwc import PANEL
from runtime.kernels.window import conv_out_size
from runtime.kernels.window import conv_transpose_out_size
from runtime.kernels.window import floor_mode_end
from runtime.kernels.window import pool_out_size
from runtime.kernels.window import same_pads

ort = pytest.importorskip("onnxruntime")
F32 = np.float32

# (op, input shape, attributes) -> one node per case in one model
Case = tuple[str, tuple[int, ...], dict[str, Any]]


def _model(cases: list[Case], opset: int) -> onnx.ModelProto:
    nodes, inputs, outputs, inits = [], [], [], []
    for i, (op, shape, attrs) in enumerate(cases):
        ins = [f"x{i}"]
        if op in ("Conv", "ConvTranspose"):
            w = np.ones(attrs.pop("w_shape"), F32)
            inits.append(numpy_helper.from_array(w, f"w{i}"))
            ins.append(f"w{i}")
        inputs.append(helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, list(shape)))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None))
        nodes.append(helper.make_node(op, ins, [f"y{i}"], **attrs))
    graph = helper.make_graph(nodes, "sizes", inputs, outputs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _ort_shapes(cases: list[Case], opset: int = 19) -> list[tuple[int, ...]]:
    model = _model([(op, shape, dict(attrs)) for op, shape, attrs in cases], opset)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feeds = {f"x{i}": np.zeros(shape, F32) for i, (_, shape, _) in enumerate(cases)}
    return [tuple(y.shape) for y in session.run(None, feeds)]


def _inferred_shapes(cases: list[Case], opset: int = 22) -> list[tuple[int, ...]]:
    model = _model([(op, shape, dict(attrs)) for op, shape, attrs in cases], opset)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    return [tuple(d.dim_value for d in out.type.tensor_type.shape.dim) for out in inferred.graph.output]


def _pool_cases() -> tuple[list[Case], list[int]]:
    """1-D MaxPools over sizes, kernels, strides, dilations, pads (below the kernel: onnxruntime's
    limit) and both ceil modes, with pool_out_size's answer for each."""
    cases, want = [], []
    for size, k, s, d, b, e, ceil in itertools.product(range(1, 9), (1, 2, 3), (1, 2, 3), (1, 2), range(3),
                                                       range(3), (0, 1)):  # fmt: skip
        out = pool_out_size(size, k, s, d, b, e, ceil)
        if b < k and e < k and out >= 1:
            attrs = {"kernel_shape": [k], "strides": [s], "dilations": [d], "pads": [b, e], "ceil_mode": ceil}
            cases.append(("MaxPool", (1, 1, size), attrs))
            want.append(out)
    return cases, want


def test_pool_sizes_match_onnxruntime_and_opset22_shape_inference() -> None:
    cases, want = _pool_cases()
    assert len(cases) > 1000
    assert [s[2] for s in _ort_shapes(cases)] == want
    assert [s[2] for s in _inferred_shapes(cases)] == want
    # onnx's inference of opset 19 keeps a window in the end padding in some of these
    assert [s[2] for s in _inferred_shapes(cases, opset=19)] != want


def test_floor_mode_end_gives_ceil_modes_size_for_every_input_size() -> None:
    for size, k, s, d, b, e in itertools.product(range(1, 12), range(1, 5), range(1, 5), (1, 2, 3), range(6),
                                                 range(6)):  # fmt: skip
        out = pool_out_size(size, k, s, d, b, e, 1)
        if out >= 1:
            assert pool_out_size(size, k, s, d, b, floor_mode_end(k, s, d, e), 0) == out, (
                size,
                k,
                s,
                d,
                b,
                e,
            )


# A last window starting in the end padding: ONNX drops it.
DROPPED: Case = ("MaxPool", (1, 1, 4, 4), {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [0, 0, 1, 1],
                                           "ceil_mode": 1})  # fmt: skip


def test_a_ceil_window_starting_in_the_end_padding_is_dropped() -> None:
    from onnx.reference import ReferenceEvaluator

    _, shape, attrs = DROPPED
    assert pool_out_size(4, 2, 2, 1, 0, 1, 1) == 2  # the third window would start at 4: padding
    assert _ort_shapes([DROPPED]) == [(1, 1, 2, 2)]
    assert _inferred_shapes([DROPPED], opset=22) == [(1, 1, 2, 2)]
    assert _inferred_shapes([DROPPED], opset=19) == [(1, 1, 3, 3)]  # onnx's inference before 22
    x = np.arange(16, dtype=F32).reshape(shape)
    assert ReferenceEvaluator(_model([DROPPED], 19)).run(None, {"x0": x})[0].shape == (1, 1, 2, 2)


def _conv_cases() -> tuple[list[Case], list[tuple[int, int]]]:
    """1-D convs with explicit pads and every auto_pad; with (size, out) for conv_out_size."""
    cases, want = [], []
    for size, k, s, d in itertools.product(range(1, 9), (1, 2, 3), (1, 2, 3), (1, 2)):
        for pad in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
            if pad.startswith("SAME") and d > 1:
                continue  # onnxruntime has no dilated SAME convs (values with dilations: below)
            for b, e in [(0, 0), (1, 0), (0, 2), (2, 1)] if pad == "NOTSET" else [(0, 0)]:
                if pad.startswith("SAME"):
                    b, e = same_pads(size, k, s, d, pad == "SAME_UPPER")
                out = conv_out_size(size, k, s, d, b, e)
                if out < 1:
                    continue
                attrs: dict[str, Any] = {
                    "kernel_shape": [k],
                    "strides": [s],
                    "dilations": [d],
                    "w_shape": (2, 1, k),
                }
                attrs |= {"pads": [b, e]} if pad == "NOTSET" else {"auto_pad": pad}
                cases.append(("Conv", (1, 1, size), attrs))
                want.append(out)
    return cases, want


def test_conv_sizes_and_auto_pad_match_onnxruntime() -> None:
    cases, want = _conv_cases()
    assert [s[2] for s in _ort_shapes(cases)] == want


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
@pytest.mark.parametrize("dilations", [[1, 1], [1, 2]])
def test_same_pads_split_the_padding_as_onnx_does(auto_pad: str, dilations: list[int]) -> None:
    """Values, not only sizes: a 2-D conv with auto_pad equals the reference conv with same_pads
    (oracle: onnxruntime, or ONNX's reference evaluator for dilations, which onnxruntime lacks)."""
    from onnx.reference import ReferenceEvaluator

    from runtime.kernels.conv import conv

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 2, 7, 6)).astype(F32)
    w = rng.standard_normal((3, 2, 2, 4)).astype(F32)
    attrs = {"kernel_shape": [2, 4], "strides": [2, 1], "dilations": dilations, "w_shape": w.shape}
    model = _model([("Conv", x.shape, {**attrs, "auto_pad": auto_pad})], 19)
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(w, "w0"))
    if dilations == [1, 1]:
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"x0": x})[0]  # fmt: skip
    else:
        want = ReferenceEvaluator(model).run(None, {"x0": x})[0]
    (pt, pb), (pl, pr) = (
        same_pads(n, k, s, d, auto_pad == "SAME_UPPER")
        for n, k, s, d in zip((7, 6), (2, 4), (2, 1), dilations, strict=True)
    )
    ours = {**attrs, "pads": [pt, pl, pb, pr], "group": 1}
    np.testing.assert_allclose(conv(np, x, w, None, ours), want, rtol=1e-5, atol=1e-5)


def test_conv_transpose_sizes_match_onnxruntime() -> None:
    cases, want = [], []
    for size, k, s, d, b, e, op in itertools.product(
        range(1, 6), (1, 3), (1, 2, 3), (1, 2), (0, 1), (0, 2), (0, 1)
    ):
        out = conv_transpose_out_size(size, k, s, d, b, e, op)
        if op < s and out >= 1:
            attrs = {"kernel_shape": [k], "strides": [s], "dilations": [d], "pads": [b, e],
                     "output_padding": [op], "w_shape": (1, 2, k)}  # fmt: skip
            cases.append(("ConvTranspose", (1, 1, size), attrs))
            want.append(out)
    assert [s[2] for s in _ort_shapes(cases)] == want


# -- geometry records --------------------------------------------------------------------------


def _node(kind: str, x: tuple[int, ...], y: tuple[int, ...], attrs: dict[str, Any],
          w: tuple[int, ...] | None = None) -> Node:  # fmt: skip
    domain, _, op = kind.rpartition(".")
    ins = [Value("x", np.dtype(F32), x)] + ([Value("w", np.dtype(F32), w)] if w is not None else [])
    return Node(op, ins, [Value("y", np.dtype(F32), y)], attrs, domain=domain or "")


def _nhwc(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (shape[0], *shape[2:], shape[1])


# (N, C, H, W), kernel, strides, pads, dilations, ceil_mode
POOLS_2D = [
    ((1, 3, 4, 4), [2, 2], [2, 2], [0, 0, 1, 1], [1, 1], 1),  # DROPPED
    ((2, 5, 9, 11), [3, 3], [2, 2], [1, 0, 1, 2], [1, 1], 1),
    ((1, 4, 10, 10), [3, 3], [2, 2], [0, 0, 0, 0], [1, 1], 1),
    ((1, 2, 9, 8), [3, 2], [1, 2], [2, 1, 2, 1], [2, 1], 0),
    ((1, 7, 8, 9), [5, 3], [2, 1], [2, 0, 1, 1], [1, 1], 1),
    ((1, 1, 7, 7), [3, 3], [3, 3], [1, 1, 2, 2], [1, 1], 1),
]


@pytest.mark.parametrize("x, k, s, p, d, ceil", POOLS_2D)
def test_pool_geometry_is_the_same_in_nchw_and_nhwc(
    x: tuple[int, ...], k: list[int], s: list[int], p: list[int], d: list[int], ceil: int
) -> None:
    attrs = {"kernel_shape": k, "strides": s, "pads": p, "dilations": d, "ceil_mode": ceil}
    (y,) = _ort_shapes([("MaxPool", x, attrs)])
    nchw = PoolGeometry.from_node(_node("MaxPool", x, y, attrs), "NCHW")
    nhwc = PoolGeometry.from_node(_node("onnx_aot.MaxPoolNhwc", _nhwc(x), _nhwc(y), attrs), "NHWC")
    assert nchw is not None and nhwc is not None
    assert (nchw.rows, nchw.cols, nchw.batch, nchw.c) == (nhwc.rows, nhwc.cols, nhwc.batch, nhwc.c)
    assert (nchw.oh, nchw.ow, nchw.kh, nchw.sw, nchw.pb, nchw.dh) == (y[2], y[3], k[0], s[1], p[2], d[0])
    wrong = (*y[:2], y[2] + 1, y[3])  # e.g. what onnx's inference before opset 22 says for DROPPED
    assert PoolGeometry.from_node(_node("MaxPool", x, wrong, attrs), "NCHW") is None
    assert (
        PoolGeometry.from_node(_node("onnx_aot.MaxPoolNhwc", _nhwc(x), _nhwc(wrong), attrs), "NHWC") is None
    )


def test_a_1d_pool_has_a_unit_row_axis() -> None:
    attrs = {"kernel_shape": [3], "strides": [2], "pads": [1, 1], "ceil_mode": 0}
    g = PoolGeometry.from_node(_node("AveragePool", (2, 3, 9), (2, 3, 5), attrs), "NCHW")
    assert (
        g is not None
        and g.rank == 1
        and g.rows == Axis.unit()
        and (g.w, g.ow, g.kw, g.pl, g.pr) == (9, 5, 3, 1, 1)
    )
    assert g.kernel_shape == (3,)


# (N, C, H, W), M, kernel, strides, pads, dilations, group
CONVS = [
    ((1, 6, 9, 8), 4, [3, 3], [2, 1], [1, 0, 2, 1], [1, 2], 2),
    ((2, 8, 7, 7), 8, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 8),  # depthwise
    ((1, 3, 15, 13), 20, [7, 7], [2, 2], [3, 3, 3, 3], [1, 1], 1),
    ((1, 4, 5, 6), 36, [1, 1], [1, 1], [0, 0, 0, 0], [1, 1], 4),
]


@pytest.mark.parametrize("x, m, k, s, p, d, group", CONVS)
def test_conv_geometry_is_the_same_in_nchw_and_nhwc(
    x: tuple[int, ...], m: int, k: list[int], s: list[int], p: list[int], d: list[int], group: int
) -> None:
    attrs = {"kernel_shape": k, "strides": s, "pads": p, "dilations": d, "group": group}
    w = (m, x[1] // group, *k)
    (y,) = _ort_shapes([("Conv", x, {**attrs, "w_shape": w})])
    nchw = ConvGeometry.from_node(_node("Conv", x, y, attrs, w), "NCHW")
    assert nchw is not None and nchw.weight_shape == w
    panels = (group, -(-(m // group) // PANEL), *k, x[1] // group, PANEL)
    packed = (k[0], k[1], m) if m == x[1] == group else panels
    nhwc = ConvGeometry.from_node(_node("onnx_aot.ConvNhwc", _nhwc(x), _nhwc(y), attrs, packed), "NHWC")
    assert nhwc is not None and nhwc.weight_shape == packed
    assert (nchw.rows, nchw.cols, nchw.m, nchw.mg, nchw.cg, nchw.k) == (nhwc.rows, nhwc.cols, nhwc.m, nhwc.mg,
                                                                     nhwc.cg, nhwc.k)  # fmt: skip
    assert nchw.one_channel_groups == nhwc.one_channel_groups == (x[1] == group > 1)
    assert nchw.depthwise == nhwc.depthwise == (m == x[1] == group)
    assert ConvGeometry.from_node(_node("Conv", x, y, attrs, (m + 1, *w[1:])), "NCHW") is None
    assert ConvGeometry.from_node(_node("Conv", x, (*y[:3], y[3] + 1), attrs, w), "NCHW") is None


@pytest.mark.parametrize("tile", [2, 4])
def test_winograd_geometry_is_the_same_in_nchw_and_nhwc(tile: int) -> None:
    attrs = {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 0, 2, 1], "dilations": [1, 1], "group": 1}
    x, y, a2 = (2, 5, 9, 7), (2, 20, 10, 6), (tile + 2) ** 2
    nchw = WinogradGeometry.from_node(_node("onnx_aot.WinogradConv", x, y, attrs, (a2, 20, 5)), "NCHW")
    nhwc = WinogradGeometry.from_node(
        _node("onnx_aot.WinogradConvNhwc", _nhwc(x), _nhwc(y), attrs, (a2, 2, 5, PANEL)), "NHWC"
    )
    assert nchw is not None and nhwc is not None
    assert (nchw.rows, nchw.cols, nchw.tile, nchw.th, nchw.tw) == (nhwc.rows, nhwc.cols, tile, -(-10 // tile),
                                                                 -(-6 // tile))  # fmt: skip
    assert (
        WinogradGeometry.from_node(_node("onnx_aot.WinogradConv", x, y, attrs, (a2 + 1, 20, 5)), "NCHW")
        is None
    )
    strided = {**attrs, "strides": [2, 2]}
    assert WinogradGeometry.from_node(_node("onnx_aot.WinogradConv", x, (2, 20, 5, 3), strided, (a2, 20, 5)),
                                      "NCHW") is None  # fmt: skip


def test_conv_transpose_geometry() -> None:
    attrs = {"kernel_shape": [3, 2], "strides": [2, 3], "pads": [1, 0, 0, 1], "dilations": [1, 2], "group": 2,
             "output_padding": [1, 2]}  # fmt: skip
    x, w = (1, 4, 5, 3), (4, 3, 3, 2)
    (y,) = _ort_shapes([("ConvTranspose", x, {**attrs, "w_shape": w})])
    g = ConvTransposeGeometry.from_node(_node("ConvTranspose", x, y, attrs, w), "NCHW")
    assert g is not None and (g.m, g.mg, g.cg, g.oh, g.ow, g.h, g.w) == (6, 3, 2, y[2], y[3], 5, 3)
    assert (
        ConvTransposeGeometry.from_node(_node("ConvTranspose", x, (*y[:3], y[3] - 1), attrs, w), "NCHW")
        is None
    )


def test_matmul_product() -> None:
    gemm = _node("Gemm", (7, 5), (4, 5), {"transA": 1, "transB": 0, "alpha": 1.0, "beta": 1.0}, (7, 3))
    gemm.outputs[0].shape = (5, 3)
    assert MatmulProduct.from_node(gemm) == MatmulProduct(5, 3, 7, 1, 5, 3, 1, (), (), ())
    mm = _node("MatMul", (2, 1, 4, 6), (2, 3, 4, 5), {}, (3, 6, 5))
    assert MatmulProduct.from_node(mm) == MatmulProduct(4, 5, 6, 6, 1, 5, 1, (2, 3), (1, 0), (0, 1))
    vec = _node("MatMul", (6,), (2, 5), {}, (2, 6, 5))
    assert MatmulProduct.from_node(vec) == MatmulProduct(1, 5, 6, 6, 1, 5, 1, (2,), (0,), (1,))
    assert MatmulProduct.from_node(_node("MatMul", (2, 4, 6), (2, 4, 5), {}, (3, 6, 5))) is None


# -- end to end ----------------------------------------------------------------------------------


def _ceil_pool_model(declared: bool) -> onnx.ModelProto:
    """Conv 1x1 -> MaxPool / AveragePool (count_include_pad) in ceil mode, DROPPED's windows, opset 19."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 16, 1, 1)).astype(F32), "w")
    attrs = DROPPED[2]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1]),
             helper.make_node("MaxPool", ["c"], ["y_max"], **attrs),
             helper.make_node("AveragePool", ["c"], ["y_avg"], count_include_pad=1, **attrs),
             helper.make_node("Relu", ["y_avg"], ["y_relu"])]  # fmt: skip
    shape = [1, 16, 2, 2] if declared else None
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("y_max", "y_relu")]
    if not declared:  # what a tool that ran onnx's inference of opset 19 left in the model
        outs = [
            helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 16, 3, 3]) for n in ("y_max", "y_relu")
        ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 4, 4])
    graph = helper.make_graph(nodes, "ceil_pools", [x], outs, initializer=[w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


@pytest.mark.parametrize("declared", [True, False], ids=["declared", "recorded_by_old_inference"])
def test_ceil_mode_pools_agree_with_onnxruntime_in_nchw_and_nhwc(tmp_path: Path, declared: bool) -> None:
    model = _ceil_pool_model(declared)
    x = np.random.default_rng(1).standard_normal((1, 16, 4, 4)).astype(F32)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    want = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(
        None, {"x": x})  # fmt: skip
    assert [y.shape for y in want] == [(1, 16, 2, 2)] * 2
    for level, kinds in ((2, {"MaxPool", "AveragePool"}), (3, {"MaxPoolNhwc", "AveragePoolNhwc"})):
        path = compile_model(model, tmp_path / f"O{level}", opt_level=level)
        steps = json.loads((path / "plan.json").read_text())["steps"]
        assert {s["op_type"] for s in steps if "Pool" in s["op_type"]} == kinds
        assert all(s["provider"] == "c" for s in steps if "Pool" in s["op_type"])
        got = Session(path).run(None, {"x": x})
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
