"""Math ops beyond the ONNX node suite: opset variants, attribute edge cases, dtypes, fusion.

Each model is one or two ONNX nodes run through ``compiler.backend`` (so canonicalization,
partitioning and the reference kernels all take part) and checked against numpy written from
the ONNX spec; canonical attributes are checked on the imported IR.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from compiler.frontend.importer import import_model
from compiler.passes import FuseElementwise
from runtime.errors import ModelError
from runtime.errors import UnsupportedOpError
from tests.support.models import onnx_model
from tests.support.models import run_backend

_model = partial(onnx_model, opset=18)


def _run(model: onnx.ModelProto, *feeds: np.ndarray) -> Any:
    return run_backend(model, *feeds)[0]


def _unary(op: str, x: np.ndarray, opset: int = 18, **attrs: Any) -> Any:
    elem = helper.np_dtype_to_tensor_dtype(x.dtype)
    return _run(_model(helper.make_node(op, ["x"], ["y"], **attrs), [("x", elem, list(x.shape))],
                       [("y", elem, list(x.shape))], opset=opset), x)


def test_clip_min_above_max_gives_max_in_attribute_and_input_forms() -> None:
    x = np.array([-3.0, 0.0, 3.0], np.float32)
    np.testing.assert_array_equal(_unary("Clip", x, opset=6, min=2.0, max=1.0), [1.0, 1.0, 1.0])
    lo = helper.make_tensor("lo", T.FLOAT, [], [2.0])
    hi = helper.make_tensor("hi", T.FLOAT, [], [1.0])
    model = _model(helper.make_node("Clip", ["x", "lo", "hi"], ["y"]), [("x", T.FLOAT, [3])],
                   [("y", T.FLOAT, [3])], initializers=(lo, hi))
    np.testing.assert_array_equal(_run(model, x), [1.0, 1.0, 1.0])


def test_hardmax_before_opset_13_works_on_the_flattened_input() -> None:
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    y = _unary("Hardmax", x, opset=11, axis=1)
    flat = x.reshape(2, 12)
    want = (np.arange(12) == flat.argmax(axis=1)[:, None]).astype(np.float32).reshape(x.shape)
    np.testing.assert_array_equal(y, want)
    y13 = _unary("Hardmax", x, opset=13, axis=1)
    want13 = np.arange(3)[:, None] == x.argmax(axis=1)[:, None]
    np.testing.assert_array_equal(y13, want13.astype(np.float32))


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.uint8, np.uint64])
def test_bitshift_amounts_outside_the_width_leave_the_sign_fill(dtype: Any) -> None:
    bits = 8 * np.dtype(dtype).itemsize
    signed = np.dtype(dtype).kind == "i"
    x = np.array([5, 96, -7, 1] if signed else [5, 96, 200, 1], dtype)
    s = np.array([1, 3, bits, bits - 1], dtype)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    for direction in ("LEFT", "RIGHT"):
        node = helper.make_node("BitShift", ["x", "s"], ["y"], direction=direction)
        model = _model(node, [("x", elem, [4]), ("s", elem, [4])], [("y", elem, [4])], opset=28)
        y = _run(model, x, s)
        u = x.astype(f"u{x.itemsize}")
        if direction == "LEFT":
            shifted = [(int(u[i]) << int(s[i])) % (1 << bits) if s[i] < bits else 0 for i in range(4)]
            want = np.array(shifted, dtype=u.dtype).astype(dtype)
        else:
            want = np.array([x[i] >> s[i] if s[i] < bits else (-1 if x[i] < 0 else 0) for i in range(4)],
                            dtype)
        np.testing.assert_array_equal(y, want)
        assert y.dtype == np.dtype(dtype)


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [np.int32, np.float16, np.float64])
def test_mod_takes_the_divisor_sign_or_the_dividend_sign(fmod: int, dtype: Any) -> None:
    a = np.array([7, -7, 7, -7, 0], dtype)
    b = np.array([3, 3, -3, -3, 5], dtype)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    node = helper.make_node("Mod", ["a", "b"], ["y"], fmod=fmod)
    y = _run(_model(node, [("a", elem, [5]), ("b", elem, [5])], [("y", elem, [5])]), a, b)
    want = [1, -1, 1, -1, 0] if fmod else [1, 2, -2, -1, 0]
    np.testing.assert_array_equal(y, np.array(want, dtype))


def test_isinf_detect_flags_and_isnan_output_bool() -> None:
    x = np.array([-np.inf, np.inf, np.nan, 1.0], np.float32)
    for neg, pos, want in ((1, 1, [1, 1, 0, 0]), (1, 0, [1, 0, 0, 0]), (0, 1, [0, 1, 0, 0]), (0, 0, [0] * 4)):
        node = helper.make_node("IsInf", ["x"], ["y"], detect_negative=neg, detect_positive=pos)
        y = _run(_model(node, [("x", T.FLOAT, [4])], [("y", T.BOOL, [4])]), x)
        assert y.dtype == np.bool_
        np.testing.assert_array_equal(y, np.array(want, bool))


def test_round_is_half_to_even_and_float16_math_stays_float16() -> None:
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 2.4], np.float32)
    np.testing.assert_array_equal(_unary("Round", x), [0.0, 2.0, 2.0, -0.0, -2.0, 2.0])
    h = np.array([-2.0, -0.5, 0.25, 3.0], np.float16)
    y = _unary("Selu", h, opset=6)
    assert y.dtype == np.float16
    want = 1.0507 * np.where(h > 0, h, 1.67326 * np.expm1(np.minimum(h, 0)))
    np.testing.assert_allclose(y, want, rtol=2e-3)


def test_lp_normalization_p1_uses_absolute_values_and_zero_rows_stay_zero() -> None:
    x = np.array([[1.0, -3.0], [0.0, 0.0]], np.float32)
    np.testing.assert_allclose(_unary("LpNormalization", x, axis=1, p=1), [[0.25, -0.75], [0.0, 0.0]])
    np.testing.assert_allclose(_unary("LpNormalization", x, axis=-1, p=2),
                               [[1 / np.sqrt(10), -3 / np.sqrt(10)], [0.0, 0.0]], rtol=1e-6)


def test_mvn_with_explicit_axes() -> None:
    x = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    y = _unary("MeanVarianceNormalization", x, axes=[-1])
    want = (x - x.mean(-1, keepdims=True)) / (x.std(-1, keepdims=True) + 1e-9)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


def test_trilu_without_k_and_scan_with_reverse_exclusive() -> None:
    x = np.arange(1, 13, dtype=np.int64).reshape(3, 4)
    np.testing.assert_array_equal(_unary("Trilu", x, upper=0), np.tril(x))
    axis = helper.make_tensor("axis", T.INT32, [], [-2])
    node = helper.make_node("CumProd", ["x", "axis"], ["y"], exclusive=1, reverse=1)
    model = _model(node, [("x", T.INT64, [3, 4])], [("y", T.INT64, [3, 4])], opset=26,
                   initializers=(axis,))
    want = np.flip(np.cumprod(np.flip(x, 0), axis=0), 0)
    want = np.concatenate([want[1:], np.ones((1, 4), np.int64)])
    np.testing.assert_array_equal(_run(model, x), want)


def test_einsum_equation_with_spaces_and_implicit_output() -> None:
    rng = np.random.default_rng(2)
    a = rng.standard_normal((2, 3)).astype(np.float32)
    b = rng.standard_normal((3, 4)).astype(np.float32)
    node = helper.make_node("Einsum", ["a", "b"], ["y"], equation="ij, jk")
    y = _run(_model(node, [("a", T.FLOAT, [2, 3]), ("b", T.FLOAT, [3, 4])], [("y", T.FLOAT, [2, 4])]), a, b)
    np.testing.assert_allclose(y, a @ b, rtol=1e-5, atol=1e-6)


def test_prelu_integer_and_castlike_from_a_constant() -> None:
    x = np.array([[-4, 2], [3, -1]], np.int32)
    slope = np.array([2, 3], np.int32)
    node = helper.make_node("PRelu", ["x", "s"], ["y"])
    y = _run(_model(node, [("x", T.INT32, [2, 2]), ("s", T.INT32, [2])], [("y", T.INT32, [2, 2])]), x, slope)
    np.testing.assert_array_equal(y, [[-8, 2], [3, -3]])
    like = helper.make_tensor("like", T.INT64, [1], [0])
    node = helper.make_node("CastLike", ["x", "like"], ["y"])
    model = _model(node, [("x", T.FLOAT, [3])], [("y", T.INT64, [3])], initializers=(like,))
    graph = import_model(model)
    assert [(n.kind, n.attrs) for n in graph.nodes] == [("Cast", {"to": "int64"})]
    y = _run(model, np.array([1.7, -2.5, 3.0], np.float32))
    np.testing.assert_array_equal(y, np.array([1, -2, 3], np.int64))


def test_canonical_attributes_are_filled_in() -> None:
    def canon(op: str, opset: int = 18, **attrs: Any) -> dict[str, Any]:
        model = _model(helper.make_node(op, ["x"], ["y"], **attrs), [("x", T.FLOAT, [2, 3])],
                       [("y", T.FLOAT, [2, 3])], opset=opset)
        (node,) = import_model(model).nodes
        return dict(node.attrs)

    assert canon("Shrink") == {"bias": 0.0, "lambd": 0.5}
    assert canon("Selu", gamma=2.0) == {"alpha": pytest.approx(1.6732632), "gamma": 2.0}
    assert canon("Celu") == canon("ThresholdedRelu") == {"alpha": 1.0}
    assert canon("LpNormalization") == {"axis": 1, "p": 2}
    assert canon("MeanVarianceNormalization", axes=[-1, 0]) == {"axes": [0, 1]}
    with pytest.raises(ModelError, match="p must be 1 or 2"):
        canon("LpNormalization", p=3)


def test_bitcast_needs_equal_widths_and_numpy_types() -> None:
    node = helper.make_node("BitCast", ["x"], ["y"], to=T.INT16)
    model = _model(node, [("x", T.FLOAT, [2])], [("y", T.INT16, [2])], opset=26)
    with pytest.raises(ModelError, match="bit-width"):
        import_model(model)
    node = helper.make_node("BitCast", ["x"], ["y"], to=T.BFLOAT16)
    model = _model(node, [("x", T.INT16, [2])], [("y", T.BFLOAT16, [2])], opset=26)
    with pytest.raises(UnsupportedOpError):
        import_model(model)
    x = np.array([1.0, -2.0], np.float32)
    y = _unary_to("BitCast", x, T.INT32, np.int32)
    np.testing.assert_array_equal(y, x.view(np.int32))


def _unary_to(op: str, x: np.ndarray, to: int, out: Any) -> Any:
    node = helper.make_node(op, ["x"], ["y"], to=to)
    elem = helper.np_dtype_to_tensor_dtype(x.dtype)
    model = _model(node, [("x", elem, list(x.shape))], [("y", to, list(x.shape))], opset=26)
    y = _run(model, x)
    assert y.dtype == np.dtype(out)
    return y


def test_reference_only_elementwise_ops_are_not_fused() -> None:
    # Add -> Tan -> Mul: Add and Mul must stay fusable / C-claimable; Tan has no C expression.
    nodes = [helper.make_node("Add", ["x", "x"], ["a"]), helper.make_node("Tan", ["a"], ["t"]),
             helper.make_node("Mul", ["t", "x"], ["y"])]
    graph = import_model(_model(nodes, [("x", T.FLOAT, [4])], [("y", T.FLOAT, [4])]))
    FuseElementwise().run(graph)
    assert [n.kind for n in graph.nodes] == ["Add", "Tan", "Mul"]
