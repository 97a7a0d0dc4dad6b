"""Spatial ops end to end: Resize / Upsample, ConvTranspose, GridSample, AffineGrid.

Each case is a one-node ONNX model with shapes and attributes the node suite does not use. It
is compiled with the default providers and run through ``runtime.Session``:

- C kernels (Resize, ConvTranspose): plan.json must show the step on the C provider, and the
  output must match the reference kernel run on the step's canonical attributes;
- every op: the output (whichever provider ran it) must match ``onnx.reference`` or, where that is
  wrong or incomplete, onnxruntime (grouped ConvTranspose, Upsample and opset-10 Resize, opset-16
  GridSample mode names, opset-11 tf_half_pixel_for_nn).

Cases the C kernels decline (3-D ConvTranspose, a resized channel axis, float64) check the claim.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from typing import cast

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from compiler.driver import compile_model
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.providers.c.provider import CProvider
from runtime.kernels import get_kernel
from runtime.session import Session

RTOL, ATOL = 1e-4, 1e-5
RNG = np.random.default_rng(20261123)


def rand(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def one_node_model(op: str, feeds: dict[str, np.ndarray], consts: dict[str, np.ndarray],
                   inputs: list[str], attrs: dict[str, Any], opset: int, out_rank: int | None = None
                   ) -> onnx.ModelProto:
    """``op`` over graph inputs ``feeds`` and initializers ``consts`` ("" skips an input); the output
    has the first feed's dtype and rank (unless ``out_rank``), its dims left to shape inference."""
    first = next(iter(feeds.values()))
    dtype = helper.np_dtype_to_tensor_dtype(first.dtype)
    rank = first.ndim if out_rank is None else out_rank
    graph = helper.make_graph(
        [helper.make_node(op, inputs, ["y"], **attrs)], "case",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in feeds.items()],
        [helper.make_tensor_value_info("y", dtype, [None] * rank)],
        [numpy_helper.from_array(a, n) for n, a in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10  # what onnxruntime reads
    return model


def compile_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray],
                tmp_path: Path) -> tuple[np.ndarray, dict[str, Any]]:
    session = Session(compile_model(model, tmp_path / "artifact"))
    return session.run(None, feeds)[0], session.plan.to_json()


def op_step(plan: dict[str, Any], op: str) -> dict[str, Any]:
    (step,) = [s for s in plan["steps"] if s["op_type"] == op]
    return step


def reference_kernel(step: dict[str, Any], inputs: list[np.ndarray | None], out: np.ndarray) -> np.ndarray:
    kernel = get_kernel(step["op_type"])
    return kernel(np, inputs, step["attrs"], [(out.shape, out.dtype)])[0]


def onnx_reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    outputs = cast(list[Any], ReferenceEvaluator(model).run(None, feeds))
    return np.asarray(outputs[0])


def onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, feeds)[0])


ORACLES = {"onnx": onnx_reference, "ort": onnxruntime}


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], kernel_inputs: list[np.ndarray | None],
          op: str, tmp_path: Path, *, provider: str, oracle: str | None = "onnx") -> np.ndarray:
    """Compile and run; the step's provider must be ``provider``; compare with the reference kernel
    (C steps) and with ``oracle``: onnx.reference, or onnxruntime where onnx.reference is wrong
    (grouped ConvTranspose) or lacks the case (opset-16 GridSample mode names)."""
    out, plan = compile_run(model, feeds, tmp_path)
    step = op_step(plan, op)
    assert step["provider"] == provider, f"{op} ran on {step['provider']}, expected {provider}"
    if provider == "c":
        np.testing.assert_allclose(out, reference_kernel(step, kernel_inputs, out), rtol=RTOL, atol=ATOL)
    if oracle is not None:
        np.testing.assert_allclose(out, ORACLES[oracle](model, feeds), rtol=RTOL, atol=ATOL)
    return out


# -- Resize -------------------------------------------------------------------------------------

# (name, X shape, {scales | sizes | roi: values}, attributes)
RESIZE_CASES: list[tuple[str, tuple[int, ...], dict[str, list[float]], dict[str, Any]]] = [
    ("nearest_half_pixel", (2, 3, 5, 4), {"scales": [1, 1, 2, 3]}, {"mode": "nearest"}),
    ("nearest_floor_down", (1, 2, 7, 9), {"sizes": [1, 2, 3, 4]},
     {"mode": "nearest", "nearest_mode": "floor", "coordinate_transformation_mode": "asymmetric"}),
    ("nearest_ceil_align", (1, 1, 6, 5), {"sizes": [1, 1, 13, 8]},
     {"mode": "nearest", "nearest_mode": "round_prefer_ceil",
      "coordinate_transformation_mode": "align_corners"}),
    ("linear_fractional", (2, 3, 9, 10), {"scales": [1, 1, 1.7, 0.6]}, {"mode": "linear"}),
    ("linear_pytorch_one_row", (1, 4, 6, 7), {"sizes": [1, 4, 1, 15]},
     {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}),
    ("linear_align_parallel", (1, 8, 48, 40), {"scales": [1, 1, 2, 2]},
     {"mode": "linear", "coordinate_transformation_mode": "align_corners"}),
    ("linear_antialias", (1, 2, 17, 23), {"sizes": [1, 2, 5, 7]}, {"mode": "linear", "antialias": 1}),
    ("cubic_exclude_outside", (1, 2, 7, 6), {"scales": [1, 1, 1.5, 2.25]},
     {"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1}),
    ("cubic_antialias", (2, 1, 20, 13), {"scales": [1, 1, 0.3, 0.45]}, {"mode": "cubic", "antialias": 1}),
    ("cubic_asymmetric", (1, 3, 5, 8), {"sizes": [1, 3, 9, 5]},
     {"mode": "cubic", "coordinate_transformation_mode": "asymmetric"}),
    ("crop_linear", (1, 2, 8, 9), {"roi": [0, 0, 0.1, -0.2, 1, 1, 0.8, 1.3], "sizes": [1, 2, 5, 11]},
     {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": 3.5}),
    ("crop_nearest", (2, 1, 6, 7), {"roi": [0, 0, -0.25, 0.15, 1, 1, 0.85, 1.1], "sizes": [2, 1, 4, 6]},
     {"mode": "nearest", "coordinate_transformation_mode": "tf_crop_and_resize",
      "extrapolation_value": -1.0}),
    ("not_smaller_axes", (1, 2, 5, 8), {"sizes": [9, 11]},
     {"mode": "linear", "axes": [2, 3], "keep_aspect_ratio_policy": "not_smaller"}),
    ("one_axis_symmetric", (2, 2, 3, 7), {"scales": [1.6]},
     {"mode": "linear", "axes": [3], "coordinate_transformation_mode": "half_pixel_symmetric"}),
    ("rank3_last_axis", (2, 5, 9), {"sizes": [2, 5, 4]}, {"mode": "cubic"}),
    ("rank1", (9,), {"sizes": [14]}, {"mode": "linear"}),
]


def resize_model(shape: tuple[int, ...], inputs: dict[str, list[float]], attrs: dict[str, Any],
                 dtype: Any = np.float32) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    x = rand(*shape, dtype=dtype)
    consts = {"roi": np.asarray(inputs.get("roi", []), np.float32),
              "scales": np.asarray(inputs.get("scales", []), np.float32)}
    names = ["x", "roi" if "roi" in inputs else "", "scales" if "scales" in inputs else ""]
    if "sizes" in inputs:
        consts["sizes"] = np.asarray(inputs["sizes"], np.int64)
        names.append("sizes")
    consts = {n: a for n, a in consts.items() if n in names}
    return one_node_model("Resize", {"x": x}, consts, names, attrs, 19), {"x": x}


@pytest.mark.parametrize("case", RESIZE_CASES, ids=[c[0] for c in RESIZE_CASES])
def test_resize_c_kernel(case: tuple, tmp_path: Path) -> None:
    _, shape, inputs, attrs = case
    model, feeds = resize_model(shape, inputs, attrs)
    check(model, feeds, [feeds["x"]], "Resize", tmp_path, provider="c")


def test_resize_tf_half_pixel_for_nn_opset11(tmp_path: Path) -> None:
    x = rand(1, 3, 4, 6)
    consts = {"roi": np.zeros(0, np.float32), "scales": np.asarray([1, 1, 1.5, 0.5], np.float32)}
    attrs = {"mode": "nearest", "nearest_mode": "ceil",
             "coordinate_transformation_mode": "tf_half_pixel_for_nn"}
    model = one_node_model("Resize", {"x": x}, consts, ["x", "roi", "scales"], attrs, 11)
    check(model, {"x": x}, [x], "Resize", tmp_path, provider="c", oracle="ort")


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample_is_an_asymmetric_resize(mode: str, tmp_path: Path) -> None:
    x = rand(2, 3, 4, 5)
    model = one_node_model("Upsample", {"x": x}, {"scales": np.asarray([1, 1, 2, 3], np.float32)},
                           ["x", "scales"], {"mode": mode}, 9)
    out = check(model, {"x": x}, [x], "Resize", tmp_path, provider="c", oracle="ort")
    # asymmetric coordinates: even output rows / every third column are the input itself
    np.testing.assert_allclose(out[:, :, ::2, ::3], x, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [[1, 1, 2, 3], [1, 1, 0.5, 0.75], [1, 1, 1.5, 0.6]])
def test_resize_opset10_matches_onnxruntime(mode: str, scales: list[float], tmp_path: Path) -> None:
    x = rand(1, 2, 4, 5)
    model = one_node_model("Resize", {"x": x}, {"scales": np.asarray(scales, np.float32)}, ["x", "scales"],
                           {"mode": mode}, 10)
    check(model, {"x": x}, [x], "Resize", tmp_path, provider="c", oracle="ort")


@pytest.mark.parametrize(("name", "scales", "dtype"), [
    ("channel_axis", [1, 2, 1, 1], np.float32),
    ("float64", [1, 1, 2, 1.5], np.float64),
])
def test_resize_declined_by_c_runs_on_reference(name: str, scales: list[float], dtype: Any,
                                                tmp_path: Path) -> None:
    model, feeds = resize_model((1, 2, 3, 4), {"scales": scales}, {"mode": "linear"}, dtype)
    check(model, feeds, [feeds["x"]], "Resize", tmp_path, provider="reference")


def test_resize_integer_input_saturates(tmp_path: Path) -> None:
    x = np.asarray(RNG.integers(0, 256, (1, 1, 4, 5)), np.uint8)
    model = one_node_model("Resize", {"x": x}, {"scales": np.asarray([1, 1, 1.5, 1.7], np.float32)},
                           ["x", "", "scales"], {"mode": "cubic"}, 19)
    out, _ = compile_run(model, {"x": x}, tmp_path)
    np.testing.assert_array_equal(out, onnx_reference(model, {"x": x}))


def test_resize_nearest_kernel_is_a_pure_gather(tmp_path: Path) -> None:
    model, feeds = resize_model((1, 2, 3, 4), {"scales": [1, 1, 2, 2]}, {"mode": "nearest"})
    compile_run(model, feeds, tmp_path)
    source = (tmp_path / "artifact" / "kernels" / "cpu" / "model.c").read_text()
    assert "h_index" in source and "h_weight" not in source


# -- ConvTranspose ------------------------------------------------------------------------------

# (name, X shape, W shape, with bias, attributes)
CONV_T_CASES: list[tuple[str, tuple[int, ...], tuple[int, ...], bool, dict[str, Any]]] = [
    ("plain", (1, 3, 5, 6), (3, 4, 3, 3), False, {}),
    ("groups_strides_pads_bias", (2, 6, 4, 5), (6, 2, 3, 2), True,
     {"group": 3, "strides": [2, 3], "pads": [1, 0, 0, 2]}),
    ("dilations_output_padding", (1, 2, 4, 3), (2, 3, 2, 3), True,
     {"strides": [2, 2], "dilations": [2, 1], "output_padding": [1, 0]}),
    ("same_lower", (1, 2, 5, 4), (2, 2, 3, 4), False, {"strides": [3, 2], "auto_pad": "SAME_LOWER"}),
    ("output_shape", (1, 1, 3, 4), (1, 2, 3, 3), True, {"strides": [3, 2], "output_shape": [10, 9]}),
    ("depthwise", (1, 4, 6, 6), (4, 1, 3, 3), True, {"group": 4, "pads": [1, 1, 1, 1]}),
    ("one_d", (2, 4, 9), (4, 3, 4), True, {"strides": [3], "pads": [2, 1], "output_padding": [1]}),
    ("upsampler_parallel", (1, 16, 20, 20), (16, 8, 4, 4), True, {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
]


ConvTransposeCase = tuple[onnx.ModelProto, dict[str, np.ndarray], list[np.ndarray | None]]


def conv_t_model(x_shape: tuple[int, ...], w_shape: tuple[int, ...], bias: bool,
                 attrs: dict[str, Any]) -> ConvTransposeCase:
    x, w = rand(*x_shape), rand(*w_shape)
    consts = {"w": w}
    names = ["x", "w"]
    b = None
    if bias:
        b = consts["b"] = rand(w_shape[1] * int(attrs.get("group", 1)))
        names.append("b")
    model = one_node_model("ConvTranspose", {"x": x}, consts, names, attrs, 19)
    return model, {"x": x}, [x, w, b]


@pytest.mark.parametrize("case", CONV_T_CASES, ids=[c[0] for c in CONV_T_CASES])
def test_conv_transpose_c_kernel(case: tuple, tmp_path: Path) -> None:
    _, x_shape, w_shape, bias, attrs = case
    model, feeds, kernel_inputs = conv_t_model(x_shape, w_shape, bias, attrs)
    check(model, feeds, kernel_inputs, "ConvTranspose", tmp_path, provider="c", oracle="ort")


def test_conv_transpose_kernel_is_gemm_tile_then_col2im(tmp_path: Path) -> None:
    model, feeds, _ = conv_t_model((1, 3, 5, 6), (3, 4, 3, 3), True, {"strides": [2, 2]})
    compile_run(model, feeds, tmp_path)
    source = (tmp_path / "artifact" / "kernels" / "cpu" / "model.c").read_text()
    # the kernel's two parts on the worker pool, defined ahead of it: the GEMM tile, then col2im
    parts = [f for f in source.split(" __attribute__((noinline)) void ")[1:] if "scratch" in f.split(")")[0]]
    assert [f.split("(")[0].rsplit("_", 1)[1] for f in parts] == ["tiles", "rows"]
    assert "vbcast(" in parts[0] and "yr[iw * 2 - off] += cr[iw]" in parts[1] and "vbcast(" not in parts[1]


def test_conv_transpose_3d_runs_on_reference(tmp_path: Path) -> None:
    model, feeds, kernel_inputs = conv_t_model((1, 2, 3, 4, 3), (2, 2, 2, 3, 2), True,
                                               {"strides": [2, 1, 2], "pads": [0, 1, 0, 1, 0, 1]})
    check(model, feeds, kernel_inputs, "ConvTranspose", tmp_path, provider="reference", oracle="ort")


def test_c_provider_claims() -> None:
    provider = CProvider()

    def node(op: str, x: tuple[int, ...], y: tuple[int, ...], attrs: dict[str, Any],
             extra: list[Value] | None = None) -> Node:
        inputs = [Value("x", np.dtype(np.float32), x), *(extra or [])]
        return Node(op, inputs, [Value("y", np.dtype(np.float32), y)], attrs, name="n")

    resize = {"mode": "linear", "coordinate_transformation_mode": "half_pixel", "nearest_mode": "floor",
              "cubic_coeff_a": -0.75, "exclude_outside": 0, "extrapolation_value": 0.0, "antialias": 0,
              "scales": [1.0, 1.0, 2.0, 2.0], "roi": [0.0] * 4 + [1.0] * 4}
    assert provider.supports(node("Resize", (1, 2, 3, 4), (1, 2, 6, 8), resize))
    channels = resize | {"scales": [2.0, 1.0, 2.0, 2.0]}
    assert not provider.supports(node("Resize", (1, 2, 3, 4), (2, 2, 6, 8), channels))
    assert not provider.supports(node("Resize", (1, 2, 3, 4), (1, 2, 6, 8), {"mode": "linear"}))
    w = Value("w", np.dtype(np.float32), (2, 3, 2, 2))
    conv_t = {"kernel_shape": [2, 2], "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1],
              "group": 1, "output_padding": [0, 0]}
    assert provider.supports(node("ConvTranspose", (1, 2, 4, 4), (1, 3, 5, 5), conv_t, [w]))
    assert not provider.supports(node("ConvTranspose", (1, 2, 4, 4), (1, 6, 5, 5), conv_t, [w]))


# -- GridSample / AffineGrid (reference provider) ------------------------------------------------


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [0, 1])
def test_grid_sample_2d(mode: str, padding_mode: str, align_corners: int, tmp_path: Path) -> None:
    x = rand(2, 3, 4, 5)
    grid = (RNG.random((2, 3, 6, 2)) * 3 - 1.5).astype(np.float32)  # reaches outside [-1, 1]
    model = one_node_model("GridSample", {"x": x, "grid": grid}, {}, ["x", "grid"],
                           {"mode": mode, "padding_mode": padding_mode, "align_corners": align_corners}, 20)
    check(model, {"x": x, "grid": grid}, [], "GridSample", tmp_path, provider="reference")


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_grid_sample_3d_and_opset16_names(mode: str, tmp_path: Path) -> None:
    x = rand(1, 2, 3, 4, 2)
    grid = (RNG.random((1, 2, 3, 2, 3)) * 2.4 - 1.2).astype(np.float32)
    model = one_node_model("GridSample", {"x": x, "grid": grid}, {}, ["x", "grid"],
                           {"mode": mode, "padding_mode": "reflection"}, 20)
    check(model, {"x": x, "grid": grid}, [], "GridSample", tmp_path / "3d", provider="reference")
    x2, grid2 = rand(1, 2, 3, 4), (RNG.random((1, 5, 3, 2)) * 2 - 1).astype(np.float32)
    old = one_node_model("GridSample", {"x": x2, "grid": grid2}, {}, ["x", "grid"],
                         {"mode": "bilinear" if mode == "linear" else mode}, 16)
    check(old, {"x": x2, "grid": grid2}, [], "GridSample", tmp_path / "16", provider="reference",
          oracle="ort")


@pytest.mark.parametrize("size", [[2, 3, 4, 5], [1, 2, 3, 4, 2], [1, 1, 1, 3]])
@pytest.mark.parametrize("align_corners", [0, 1])
def test_affine_grid(size: list[int], align_corners: int, tmp_path: Path) -> None:
    nd = len(size) - 2
    theta = rand(size[0], nd, nd + 1)
    model = one_node_model("AffineGrid", {"theta": theta}, {"size": np.asarray(size, np.int64)},
                           ["theta", "size"], {"align_corners": align_corners}, 20, nd + 2)
    # One sample along an axis with align_corners has no spec'd position: onnx.reference divides by
    # zero, onnxruntime puts it at 1; we follow PyTorch's 0 (checked below).
    check(model, {"theta": theta}, [], "AffineGrid", tmp_path, provider="reference",
          oracle=None if align_corners and 1 in size[2:] else "onnx")


def test_affine_grid_single_sample_sits_at_zero(tmp_path: Path) -> None:
    theta = np.asarray([[[1, 0, 0], [0, 1, 0]]], np.float32)  # the identity
    model = one_node_model("AffineGrid", {"theta": theta}, {"size": np.asarray([1, 1, 1, 3], np.int64)},
                           ["theta", "size"], {"align_corners": 1}, 20, 4)
    out, _ = compile_run(model, {"theta": theta}, tmp_path)
    np.testing.assert_array_equal(out[0, 0], [[-1, 0], [0, 0], [1, 0]])
