"""Ops whose canonical form once refused symbolic dims at import (docs/dynamic-shapes.md, "Not
built yet"), now compiled over ranges: Resize by ``sizes`` as PyTorch exports
``F.interpolate(x, size=y.shape[-2:])`` and ``F.interpolate(x, size=(H, W))``. Each model is built
with onnx.helper in the exporter's form, compiled with ``dims=`` ranges and run at several
bindings (range ends, odd sizes) against onnxruntime (rtol 1e-3 / atol 1e-4)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler.driver import compile_model
from compiler.frontend.importer import import_model
from runtime.errors import RuntimeKernelError
from runtime.session import Session

F = TensorProto.FLOAT
N = helper.make_node
_SLICES = {"s0": np.array([0], np.int64), "s2": np.array([2], np.int64), "s4": np.array([4], np.int64)}
DIMS = {"n": (1, 2), "h": (8, 40), "w": (9, 40)}
SIZES = ((1, 8, 9), (2, 40, 40), (1, 13, 27), (2, 17, 10))


def _model(nodes: list[onnx.NodeProto], inputs: list[tuple[str, list[Any]]],
           inits: dict[str, np.ndarray], opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
                              [helper.make_tensor_value_info("out", F, ["a", "b", "c", "d"])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _sizes_of(source: str, x: str) -> list[onnx.NodeProto]:
    """PyTorch's ``size=source.shape[-2:]``: Shape(x)[:2] ++ Shape(source)[2:4]."""
    return [N("Shape", [source], ["ss"]), N("Slice", ["ss", "s2", "s4"], ["hw"]),
            N("Shape", [x], ["xs"]), N("Slice", ["xs", "s0", "s2"], ["nc"]),
            N("Concat", ["nc", "hw"], ["sizes"], axis=0)]


def _resize(out: str, mode: str, coordinate_mode: str, **attrs: Any) -> onnx.NodeProto:
    return N("Resize", ["x", "", "", "sizes"], [out], mode=mode,
             coordinate_transformation_mode=coordinate_mode, **attrs)


def interpolate_to_pooled(mode: str, coordinate_mode: str) -> onnx.ModelProto:
    """``y + F.interpolate(maxpool2(y), size=y.shape[-2:])``: at odd sizes no whole scale."""
    nodes = [N("MaxPool", ["y"], ["x"], kernel_shape=[2, 2], strides=[2, 2]), *_sizes_of("y", "x"),
             _resize("r", mode, coordinate_mode, nearest_mode="floor"),
             N("Add", ["r", "y"], ["out"])]
    return _model(nodes, [("y", ["n", 3, "h", "w"])], dict(_SLICES))


def interpolate_to_twice() -> onnx.ModelProto:
    """``big + F.interpolate(x, size=big.shape[-2:])`` where big is twice x: whole scales."""
    nodes = [N("Tile", ["x", "reps"], ["big"]), *_sizes_of("big", "x"),
             _resize("r", "nearest", "asymmetric", nearest_mode="floor"),
             N("Add", ["r", "big"], ["out"])]
    return _model(nodes, [("x", ["n", 3, "h", "w"])], {**_SLICES, "reps": np.array([1, 1, 2, 2], np.int64)})


def interpolate_to_constant(mode: str, coordinate_mode: str) -> onnx.ModelProto:
    """``F.interpolate(x, size=(24, 40))`` of a dynamic input."""
    nodes = [N("Shape", ["x"], ["xs"]), N("Slice", ["xs", "s0", "s2"], ["nc"]),
             N("Concat", ["nc", "hw"], ["sizes"], axis=0),
             _resize("out", mode, coordinate_mode)]
    return _model(nodes, [("x", ["n", 3, "h", "w"])], {**_SLICES, "hw": np.array([24, 40], np.int64)})


def _check(model: onnx.ModelProto, out: Path, sizes: tuple[tuple[int, int, int], ...] = SIZES) -> Session:
    ort = pytest.importorskip("onnxruntime")
    session, reference = Session(out), ort.InferenceSession(model.SerializeToString())
    name = model.graph.input[0].name
    for n, h, w in sizes:
        x = np.random.default_rng(h * w + n).standard_normal((n, 3, h, w)).astype(np.float32)
        got, want = session.run(None, {name: x})[0], reference.run(None, {name: x})[0]
        assert got.shape == want.shape, (n, h, w)
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4, err_msg=f"{(n, h, w)}")
    return session


def _steps(out: Path) -> list[dict[str, Any]]:
    return json.loads((out / "plan.json").read_text())["steps"]


RUNTIME_SCALES = {
    "to-pooled-nearest": lambda: interpolate_to_pooled("nearest", "asymmetric"),
    "to-pooled-linear": lambda: interpolate_to_pooled("linear", "pytorch_half_pixel"),
    "to-pooled-linear-align": lambda: interpolate_to_pooled("linear", "align_corners"),
    "constant-linear": lambda: interpolate_to_constant("linear", "half_pixel"),
    "constant-nearest": lambda: interpolate_to_constant("nearest", "asymmetric"),
    "constant-cubic": lambda: interpolate_to_constant("cubic", "half_pixel"),
    "constant-nearest-tf": lambda: interpolate_to_constant("nearest", "tf_half_pixel_for_nn"),
}


@pytest.mark.parametrize("case", sorted(RUNTIME_SCALES))
def test_resize_by_symbolic_sizes_takes_its_scales_from_the_run(case: str, tmp_path: Path) -> None:
    model = RUNTIME_SCALES[case]()
    graph = import_model(model, dims=DIMS)
    (resize,) = [n for n in graph.nodes if n.kind == "Resize"]
    assert resize.attrs["scales"][2:] == [0.0, 0.0] and len(resize.attrs["sizes"]) == 4
    out = compile_model(model, tmp_path / "a", dims=DIMS, cpu="x86-64-v3")
    want = "reference" if "cubic" in case else "c"  # (C: nearest and linear)
    assert [s["provider"] for s in _steps(out) if s["op_type"] == "Resize"] == [want]
    _check(model, out)


def test_resize_to_a_twice_as_large_map_folds_to_whole_scales_on_c(tmp_path: Path) -> None:
    model = interpolate_to_twice()
    (resize,) = [n for n in import_model(model, dims=DIMS).nodes if n.kind == "Resize"]
    assert resize.attrs["scales"] == [1.0, 1.0, 2.0, 2.0] and "sizes" not in resize.attrs
    out = compile_model(model, tmp_path / "a", dims=DIMS, cpu="x86-64-v3")
    assert [s["provider"] for s in _steps(out) if s["op_type"] == "Resize"] == ["c"]
    _check(model, out)


def test_static_imports_keep_their_scales(tmp_path: Path) -> None:
    """A static import computes every scale at compile time (no ``sizes`` attribute): the same
    canonical Resize as before, and the dynamic artifact computes the same values."""
    model = interpolate_to_pooled("linear", "pytorch_half_pixel")
    static = import_model(model, {"y": (1, 3, 13, 27)})
    (resize,) = [n for n in static.nodes if n.kind == "Resize"]
    assert resize.attrs["scales"] == [1.0, 1.0, 13 / 6, 27 / 13] and "sizes" not in resize.attrs
    assert "keep_aspect_ratio_policy" not in resize.attrs


def test_keep_aspect_ratio_policy_over_a_run_time_scale() -> None:
    """The reference kernel applies keep_aspect_ratio_policy to the run's sizes / input."""
    from runtime.kernels.spatial import resize_plan

    attrs = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor",
             "antialias": 0, "exclude_outside": 0, "cubic_coeff_a": -0.75, "extrapolation_value": 0.0,
             "scales": [1.0, 0.0, 0.0], "roi": [0.0] * 3 + [1.0] * 3, "sizes": [1, 8, 8],
             "keep_aspect_ratio_policy": "not_larger"}
    taps = resize_plan((1, 4, 2), (1, 8, 4), attrs)  # min(8/4, 8/2) = 2 on both axes
    assert [t.index.shape[0] for t in taps] == [1, 8, 4]
    assert [int(i) for i in taps[2].index[:, 0]] == [0, 0, 1, 1]  # scale 2, not 8/2
    with pytest.raises(RuntimeKernelError, match="requested sizes"):
        resize_plan((1, 4, 2), (1, 8, 8), attrs)


# -- auto_pad SAME at a stride over 1 (TF exports) ------------------------------------------------
_W = np.random.default_rng(5).standard_normal((4, 3, 3, 3)).astype(np.float32)
SAME = {
    "conv-upper-3x3-s2": (N("Conv", ["x", "k"], ["out"], auto_pad="SAME_UPPER", strides=[2, 2]), {"k": _W}),
    "conv-lower-3x3-s2": (N("Conv", ["x", "k"], ["out"], auto_pad="SAME_LOWER", strides=[2, 2]), {"k": _W}),
    "conv-upper-2x2-s2": (N("Conv", ["x", "k"], ["out"], auto_pad="SAME_UPPER", strides=[2, 2]),
                          {"k": _W[:, :, :2, :2].copy()}),
    "conv-upper-5x5-s3x2": (N("Conv", ["x", "k"], ["out"], auto_pad="SAME_UPPER", strides=[3, 2]),
                            {"k": np.ones((4, 3, 5, 5), np.float32) / 25}),  # (onnxruntime: no dilations)
    "maxpool-upper-3x3-s2": (N("MaxPool", ["x"], ["out"], kernel_shape=[3, 3], auto_pad="SAME_UPPER",
                               strides=[2, 2]), {}),
    "avgpool-upper-count-pad": (N("AveragePool", ["x"], ["out"], kernel_shape=[3, 3], auto_pad="SAME_UPPER",
                                  strides=[2, 2], count_include_pad=1), {}),
    "maxpool-upper-3x3-s2-ceil": (N("MaxPool", ["x"], ["out"], kernel_shape=[3, 3], auto_pad="SAME_UPPER",
                                    strides=[2, 2], ceil_mode=1), {}),
    "avgpool-lower-no-count": (N("AveragePool", ["x"], ["out"], kernel_shape=[3, 3], auto_pad="SAME_LOWER",
                                 strides=[2, 2]), {}),
}
STATIC_PADS = {"conv-lower-3x3-s2", "conv-upper-2x2-s2", "avgpool-lower-no-count"}


@pytest.mark.parametrize("case", sorted(SAME))
def test_same_pads_at_a_stride_take_symbols(case: str, tmp_path: Path) -> None:
    """SAME pads over a run-time size: static where every size has the same begin pad (the end pad
    its largest, the op on C), else a Pad node of expressions before a VALID op."""
    node, inits = SAME[case]
    model = _model([node], [("x", ["n", 3, "h", "w"])], inits)
    out = compile_model(model, tmp_path / "a", dims=DIMS, cpu="x86-64-v3")
    steps = _steps(out)
    op = [s for s in steps if s["op_type"] not in ("Pad", "Transpose")]
    assert len(op) == 1 and (node.op_type != "Conv" or op[0]["provider"] == "c"), steps
    assert all(p == 0 for p in op[0]["attrs"]["pads"]) == (case not in STATIC_PADS)
    assert any(s["op_type"] == "Pad" for s in steps) == (case not in STATIC_PADS)
    _check(model, out, SIZES + ((1, 9, 10), (1, 10, 11), (1, 11, 12)))


def test_same_pads_stay_static_in_a_static_import() -> None:
    node, inits = SAME["conv-upper-3x3-s2"]
    model = _model([node], [("x", ["n", 3, "h", "w"])], inits)
    (conv,) = import_model(model, {"x": (1, 3, 13, 10)}).nodes
    assert conv.kind == "Conv" and conv.attrs["pads"] == [1, 0, 1, 1]


# -- AveragePool in ceil mode counting its pads (PyTorch's AvgPool2d(ceil_mode=True)) ---------------
def _avg(**attrs: Any) -> onnx.NodeProto:
    return N("AveragePool", ["x"], ["out"], ceil_mode=1, count_include_pad=1, **attrs)


CEIL_COUNTED = {
    "3x3-s2-pad1": _avg(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    "3x3-s2-asymmetric": _avg(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 1, 1, 0]),
    "3x3-s2-no-pads": _avg(kernel_shape=[3, 3], strides=[2, 2]),
    "5x5-s3-pad2": _avg(kernel_shape=[5, 5], strides=[3, 3], pads=[2, 2, 2, 2]),
}


@pytest.mark.parametrize("case", sorted(CEIL_COUNTED))
def test_ceil_mode_average_pool_counting_pads_takes_symbols(case: str, tmp_path: Path) -> None:
    """The declared pads become a Pad node of zeros and the pool counts its padded input (never
    ceil mode's extra cells): the divisor onnxruntime uses, at sizes where the last window is cut."""
    model = _model([CEIL_COUNTED[case]], [("x", ["n", 3, "h", "w"])], {})
    graph = import_model(model, dims=DIMS)
    pool = graph.nodes[-1]
    assert pool.kind == "AveragePool"
    assert pool.attrs["count_include_pad"] == 0 and pool.attrs["ceil_mode"] == 0
    assert [n.kind for n in graph.nodes[:-1]] == (["Pad"] if "no-pads" not in case else [])
    out = compile_model(model, tmp_path / "a", dims=DIMS, cpu="x86-64-v3")
    _check(model, out, SIZES + ((1, 9, 10), (1, 10, 11), (1, 11, 12)))
    static = import_model(model, {"x": (1, 3, 13, 10)})
    assert [n.kind for n in static.nodes] == ["AveragePool"]  # a static import keeps its ceil mode
    assert static.nodes[0].attrs["ceil_mode"] == 1 and static.nodes[0].attrs["count_include_pad"] == 1


_COORDINATES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric")
_NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


@pytest.mark.parametrize("mode", ["linear", *(f"nearest-{m}" for m in _NEAREST)])
def test_the_c_kernel_takes_run_time_scales_as_onnx_defines_them(mode: str, tmp_path: Path) -> None:
    """Every coordinate mode, up and down (24x40 from 8..40 x 9..40), against ONNX's reference
    evaluator (float64, the definition; it has no tf_half_pixel_for_nn, checked against
    onnxruntime above): nearest picks the same pixels, linear within float32."""
    from onnx.reference import ReferenceEvaluator

    kind, _, nearest = mode.partition("-")
    nodes = [_resize(f"out{k}", kind, c, **({"nearest_mode": nearest} if nearest else {}))
             for k, c in enumerate(_COORDINATES)]
    nodes[0:0] = [N("Shape", ["x"], ["xs"]), N("Slice", ["xs", "s0", "s2"], ["nc"]),
                  N("Concat", ["nc", "hw"], ["sizes"], axis=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, ["n", 3, "h", "w"])],
                              [helper.make_tensor_value_info(f"out{k}", F, ["a", 3, 24, 40])
                               for k in range(len(_COORDINATES))],
                              [numpy_helper.from_array(v, k) for k, v in
                               {**_SLICES, "hw": np.array([24, 40], np.int64)}.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    out = compile_model(model, tmp_path / "a", dims=DIMS, cpu="x86-64-v3")
    assert {s["provider"] for s in _steps(out) if s["op_type"] == "Resize"} == {"c"}
    session, reference = Session(out), ReferenceEvaluator(model)
    for n, h, w in (*SIZES, (1, 12, 20), (1, 24, 40), (1, 16, 9), (1, 36, 30)):
        x = np.random.default_rng(h * w).standard_normal((n, 3, h, w)).astype(np.float32)
        for k, (got, want) in enumerate(zip(session.run(None, {"x": x}), reference.run(None, {"x": x}),
                                            strict=True)):
            if kind == "nearest":
                np.testing.assert_array_equal(got, want, err_msg=f"{_COORDINATES[k]} at {(n, h, w)}")
            else:
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=_COORDINATES[k])
