"""Indexing, scatter/gather and reduction ops beyond the ONNX node suite.

Opset variants, duplicate and negative indices, empty reductions, the rewrites into existing kinds
(SpaceToDepth, DepthToSpace, CenterCropPad) and the errors: each model is one ONNX node run through
``compiler.backend`` and checked against numpy written from the ONNX spec.
"""

from __future__ import annotations

import itertools
from functools import partial
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

import compiler.backend as backend
from compiler.frontend.importer import import_model
from runtime.errors import InputError
from runtime.errors import ModelError
from runtime.errors import RuntimeKernelError
from runtime.errors import UnsupportedOpError
from tests.support.models import onnx_model

_model = partial(onnx_model, opset=18)


def _run(op: str, inputs: list[np.ndarray], opset: int = 18, n_out: int = 1,
         out: tuple[Any, tuple[int, ...]] | None = None, **attrs: Any) -> list[Any]:
    """Run one ``op`` node; ``out`` (dtype, shape) types an output inference cannot (no values)."""
    names = [f"i{k}" for k in range(len(inputs))]
    node = helper.make_node(op, names, [f"o{k}" for k in range(n_out)], **attrs)
    info = [out] if out is not None else None
    return list(backend.run_node(node, inputs, opset_version=opset, outputs_info=info))


def _kinds(node: onnx.NodeProto, inputs: list[tuple[str, int, list[int]]],
           outputs: list[tuple[str, int, list[int]]], opset: int = 18) -> list[str]:
    return [n.kind for n in import_model(_model(node, inputs, outputs, opset=opset)).nodes]


# -- TopK, ArgMax / ArgMin ----------------------------------------------------------------------
def test_top_k_k_attribute_before_opset_10_and_input_after() -> None:
    x = np.array([[3.0, 1.0, 4.0, 1.0], [5.0, 9.0, 2.0, 6.0]], np.float32)
    values, indices = _run("TopK", [x], opset=1, n_out=2, k=2)
    np.testing.assert_array_equal(values, [[4.0, 3.0], [9.0, 6.0]])
    np.testing.assert_array_equal(indices, [[2, 0], [1, 3]])
    values, indices = _run("TopK", [x, np.array([3], np.int64)], opset=11, n_out=2, axis=0 - 1, largest=0)
    np.testing.assert_array_equal(values, [[1.0, 1.0, 3.0], [2.0, 5.0, 6.0]])
    np.testing.assert_array_equal(indices, [[1, 3, 0], [2, 0, 3]])  # ties: the lower index first
    assert indices.dtype == np.int64


def test_top_k_k_out_of_range_is_a_model_error() -> None:
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ModelError):
        _run("TopK", [x, np.array([4], np.int64)], opset=11, n_out=2)


def test_top_k_largest_ties_take_the_lower_index_on_integers() -> None:
    x = np.array([2, 7, 7, 2, 9], np.int32)
    values, indices = _run("TopK", [x, np.array([4], np.int64)], opset=11, n_out=2)
    np.testing.assert_array_equal(values, [9, 7, 7, 2])
    np.testing.assert_array_equal(indices, [4, 1, 2, 0])


def test_argmax_argmin_on_integers_with_ties_and_a_0d_result() -> None:
    x = np.array([1, 5, 5, -2, -2], np.int32)
    assert _run("ArgMax", [x], opset=13, keepdims=0)[0].shape == ()
    assert int(_run("ArgMax", [x], opset=13, keepdims=0)[0]) == 1
    assert int(_run("ArgMax", [x], opset=13, keepdims=0, select_last_index=1)[0]) == 2
    np.testing.assert_array_equal(_run("ArgMin", [x], opset=13, select_last_index=1)[0], [4])


# -- gathers and scatters -----------------------------------------------------------------------
def test_gather_nd_batch_dims_and_negative_indices() -> None:
    data = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    indices = np.array([[[-1, 0], [0, 3]], [[1, -4], [2, 2]]], np.int64)
    (y,) = _run("GatherND", [data, indices], opset=13, batch_dims=1)
    want = np.array([[data[0, 2, 0], data[0, 0, 3]], [data[1, 1, 0], data[1, 2, 2]]])
    np.testing.assert_array_equal(y, want)


def test_gather_elements_out_of_range_index_is_an_input_error() -> None:
    data = np.zeros((2, 2), np.float32)
    with pytest.raises(InputError, match="index 2 is out of range for axis 1 of size 2"):
        _run("GatherElements", [data, np.array([[0, 2]], np.int64)], opset=13, axis=1)


def test_scatter_nd_duplicate_indices_accumulate_in_order() -> None:
    data = np.ones((4, 2), np.float32)
    indices = np.array([[1], [-3], [3], [1]], np.int64)
    updates = np.array([[2, 3], [4, 5], [6, 7], [8, 9]], np.float32)
    (added,) = _run("ScatterND", [data, indices, updates], reduction="add")
    np.testing.assert_array_equal(added, [[1, 1], [15, 18], [1, 1], [7, 8]])
    (multiplied,) = _run("ScatterND", [data, indices, updates], reduction="mul")
    np.testing.assert_array_equal(multiplied, [[1, 1], [64, 135], [1, 1], [6, 7]])
    (replaced,) = _run("ScatterND", [data, indices, updates])
    np.testing.assert_array_equal(replaced, [[1, 1], [8, 9], [1, 1], [6, 7]])  # the last write wins


def test_scatter_elements_duplicates_and_the_deprecated_scatter() -> None:
    data = np.zeros((2, 3), np.int64)
    indices = np.array([[2, 2, -1]], np.int64)
    updates = np.array([[5, -1, 4]], np.int64)
    (y,) = _run("ScatterElements", [data, indices, updates], axis=1, reduction="min")
    np.testing.assert_array_equal(y, [[0, 0, -1], [0, 0, 0]])
    (y,) = _run("ScatterElements", [data, indices, updates], axis=1, reduction="max")
    np.testing.assert_array_equal(y, [[0, 0, 5], [0, 0, 0]])
    (y,) = _run("Scatter", [data, np.array([[1, 0, 1]], np.int64), updates], opset=9)
    np.testing.assert_array_equal(y, [[0, -1, 0], [5, 0, 4]])


def test_tensor_scatter_without_write_indices_and_linear_overflow() -> None:
    past = np.zeros((2, 4, 3), np.float32)
    update = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
    (y,) = _run("TensorScatter", [past, update], opset=24, axis=1)
    want = past.copy()
    want[:, :2] = update
    np.testing.assert_array_equal(y, want)
    with pytest.raises(RuntimeKernelError, match="overflows"):
        _run("TensorScatter", [past, update, np.array([3, 0], np.int64)], opset=24, axis=1)
    (y,) = _run("TensorScatter", [past, update, np.array([3, 0], np.int64)], opset=24, axis=1,
                mode="circular")
    np.testing.assert_array_equal(y[0, [3, 0]], update[0])


# -- value-producing ops ------------------------------------------------------------------------
def test_one_hot_int_depth_float_indices_and_middle_axis() -> None:
    indices = np.array([[0.0, -1.0], [2.5, 3.0]], np.float32)  # 2.5 matches nothing, 3.0 is out of range
    values = np.array([-1, 7], np.int32)
    (y,) = _run("OneHot", [indices, np.array(3, np.int64), values], opset=11, axis=1)
    assert y.shape == (2, 3, 2) and y.dtype == np.int32
    want = np.full((2, 3, 2), -1, np.int32)
    want[0, 0, 0] = want[0, 2, 1] = 7
    np.testing.assert_array_equal(y, want)


def test_eye_like_negative_k_keeps_the_input_dtype() -> None:
    (y,) = _run("EyeLike", [np.zeros((3, 4), np.float64)], opset=9, k=-1)
    assert y.dtype == np.float64
    np.testing.assert_array_equal(y, np.eye(3, 4, k=-1))


def test_reverse_sequence_rank_3_batch_major() -> None:
    x = np.arange(2 * 4 * 2, dtype=np.float32).reshape(2, 4, 2)
    (y,) = _run("ReverseSequence", [x, np.array([3, 0], np.int64)], opset=10, batch_axis=0, time_axis=1)
    want = x.copy()
    want[0, :3] = x[0, 2::-1]
    np.testing.assert_array_equal(y, want)


def _col2im_naive(x: np.ndarray, image: list[int], block: list[int], strides: list[int],
                  dilations: list[int], pads: list[int]) -> np.ndarray:
    n = len(image)
    counts = [(image[i] + pads[i] + pads[i + n] - dilations[i] * (block[i] - 1) - 1) // strides[i] + 1
              for i in range(n)]
    channels = x.shape[1] // int(np.prod(block))
    cols = x.reshape(x.shape[0], channels, *block, *counts)
    out = np.zeros((x.shape[0], channels, *image), x.dtype)
    for offset in itertools.product(*(range(k) for k in block)):
        for pos in itertools.product(*(range(c) for c in counts)):
            at = [pos[i] * strides[i] + offset[i] * dilations[i] - pads[i] for i in range(n)]
            if all(0 <= a < image[i] for i, a in enumerate(at)):
                target: tuple[Any, ...] = (slice(None), slice(None), *at)
                source: tuple[Any, ...] = (slice(None), slice(None), *offset, *pos)
                out[target] += cols[source]
    return out


def test_col2im_1d_with_strides_dilations_and_uneven_pads() -> None:
    image, block, strides, dilations, pads = [9], [3], [2], [2], [1, 2]
    x = np.random.default_rng(0).standard_normal((2, 2 * 3, 4)).astype(np.float32)
    (y,) = _run("Col2Im", [x, np.array(image, np.int64), np.array(block, np.int64)],
                strides=strides, dilations=dilations, pads=pads)
    np.testing.assert_allclose(y, _col2im_naive(x, image, block, strides, dilations, pads), rtol=1e-6)


# -- rewrites into existing kinds ---------------------------------------------------------------
def test_space_to_depth_and_depth_to_space_round_trip_through_transposes() -> None:
    x = np.arange(2 * 3 * 4 * 6, dtype=np.float32).reshape(2, 3, 4, 6)
    for mode in ("DCR", "CRD"):
        (deep,) = _run("SpaceToDepth", [x], opset=28, blocksize=2, mode=mode)
        (back,) = _run("DepthToSpace", [deep], opset=28, blocksize=2, mode=mode)
        np.testing.assert_array_equal(back, x)
    (old,) = _run("DepthToSpace", [np.arange(8, dtype=np.float32).reshape(1, 4, 1, 2)], opset=1, blocksize=2)
    np.testing.assert_array_equal(old[0, 0], [[0, 2, 1, 3], [4, 6, 5, 7]])
    kinds = _kinds(helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=2),
                   [("x", T.FLOAT, [2, 3, 4, 6])], [("y", T.FLOAT, [2, 12, 2, 3])])
    assert kinds == ["Reshape", "Transpose", "Reshape"]


def test_center_crop_pad_becomes_slice_and_pad() -> None:
    x = np.arange(5 * 4, dtype=np.float32).reshape(5, 4)
    (y,) = _run("CenterCropPad", [x, np.array([2, 7], np.int64)], out=(np.float32, (2, 7)))
    want = np.zeros((2, 7), np.float32)
    want[:, 1:5] = x[1:3]
    np.testing.assert_array_equal(y, want)
    (same,) = _run("CenterCropPad", [x, np.array([4], np.int64)], out=(np.float32, (5, 4)), axes=[-1])
    np.testing.assert_array_equal(same, x)
    shape = helper.make_tensor("s", T.INT64, [2], [2, 7])
    model = _model(helper.make_node("CenterCropPad", ["x", "s"], ["y"]), [("x", T.FLOAT, [5, 4])],
                   [("y", T.FLOAT, [2, 7])])
    model.graph.initializer.append(shape)
    assert [n.kind for n in import_model(model).nodes] == ["Slice", "Pad"]


# -- reductions ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("op", "want"), [
    ("ReduceMax", np.iinfo(np.int32).min), ("ReduceMin", np.iinfo(np.int32).max), ("ReduceSum", 0),
    ("ReduceProd", 1), ("ReduceL1", 0), ("ReduceSumSquare", 0)])
def test_integer_reductions_over_an_empty_axis_give_the_identity(op: str, want: int) -> None:
    x = np.zeros((3, 0), np.int32)
    (y,) = _run(op, [x, np.array([1], np.int64)], opset=18, out=(np.int32, (3,)), keepdims=0)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, np.full(3, want, np.int32))


def test_reduce_log_sum_exp_does_not_overflow_and_log_sum_of_empty_is_minus_inf() -> None:
    x = np.array([[1000.0, 1000.0], [-np.inf, 0.0]], np.float32)
    (y,) = _run("ReduceLogSumExp", [x, np.array([1], np.int64)], out=(np.float32, (2,)), keepdims=0)
    np.testing.assert_allclose(y, [1000.0 + np.log(2.0), 0.0], rtol=1e-6)
    (y,) = _run("ReduceLogSum", [np.zeros((2, 0), np.float32)], opset=13, axes=[1])
    np.testing.assert_array_equal(y, np.full((2, 1), -np.inf, np.float32))


# -- data-dependent shapes ----------------------------------------------------------------------
def test_data_dependent_output_shapes_are_unsupported() -> None:
    model = _model(helper.make_node("NonZero", ["x"], ["y"]), [("x", T.FLOAT, [2, 3])],
                   [("y", T.INT64, [2, 3])], opset=13)
    with pytest.raises(UnsupportedOpError, match="output shapes that depend on input values"):
        backend.prepare(model).run([np.ones((2, 3), np.float32)])
