"""onnxruntime's com.microsoft quantized ops (QOperator files): each op against onnxruntime on small
graphs in the form its quantizer writes (uint8 and int8, broadcasting, NCHW pools with pads), the C
kernels against the reference kernels at 1 and 2 threads, the canonical forms, the user errors;
and light-zoo models quantized by onnxruntime's own quantizer (tests/test_qoperator_zoo.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from onnx import helper
from onnx import numpy_helper

from compiler.frontend.importer import import_model
from runtime.errors import ModelError
from runtime.errors import UnsupportedOpError
from tests.cpu_targets import host_runs
from tests.cpu_targets import level_params
from tests.support.qoperator_models import QBuilder
from tests.support.qoperator_models import ort_outputs
from tests.support.qoperator_models import ours_outputs
from tests.support.qoperator_models import reference_outputs
from tests.support.qoperator_models import steps_off

# Where onnxruntime rounds in float32 and we do not (docs/ops.md, "Integer ops"): QLinearAdd computes
# the exact value where onnxruntime's AVX2 kernel rounds two fused multiply-adds, QLinearSigmoid's
# table the float64 logistic where onnxruntime uses MLAS's approximation. Both may differ by one step
# of the output's scale, rarely (none in these cases on the machine this was written on).
_ONE_STEP = {"add_full", "add_chan", "add_scalar", "add_rows", "sigmoid"}


def _every_op(dtype: type, seed: int) -> QBuilder:
    b = QBuilder(dtype, seed)
    a, d = b.data("a", (2, 16, 9, 11)), b.data("d", (2, 16, 9, 11))
    c, s = b.data("c", (16, 1, 1)), b.data("s", (1,))
    pa, pc, pd, po, po2 = b.params("pa"), b.params("pc"), b.params("pd"), b.params("po"), b.params("po2")
    b.node("QLinearAdd", [a, *pa, d, *pd, *po], "add_full")
    b.node("QLinearAdd", [a, *pa, c, *pc, *po2], "add_chan")
    b.node("QLinearAdd", [s, *pc, a, *pa, *po2], "add_scalar")
    b.node("QLinearMul", [a, *pa, d, *pd, *po], "mul_full")
    b.node("QLinearMul", [c, *pc, a, *pa, *po2], "mul_chan")
    wide, chan = b.data("rows", (1, 4, 32, 40)), b.data("chan", (4, 1, 1))  # rows long enough for tables
    b.node("QLinearAdd", [wide, *pa, chan, *pc, *po2], "add_rows")
    b.node("QLinearMul", [chan, *pc, wide, *pa, *po], "mul_rows")
    b.node("QLinearLeakyRelu", [a, *pa, *po], "leaky", alpha=0.1)
    b.node("QLinearSigmoid", [a, *pa, *po], "sigmoid")
    b.node("QLinearConcat", [*po, a, *pa, d, *po, a, *pd], "concat", axis=1)
    cond = b.data("cond", (16, 1, 11), np.bool_)
    b.node("QLinearWhere", [cond, a, *pa, d, *pd, *po], "where")
    pool = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    b.node("QLinearAveragePool", [a, *pa, *po], "avg", **pool)
    b.node("QLinearAveragePool", [a, *pa, *po], "avg_counted", **pool, count_include_pad=1, ceil_mode=1)
    b.node("QLinearAveragePool", [a, *pa, *po], "avg_2x2", kernel_shape=[2, 2], strides=[2, 2])
    b.node("QLinearAveragePool", [a, *pa, *po], "avg_nhwc", kernel_shape=[3, 2], pads=[1, 0, 1, 1],
           channels_last=1)
    b.node("QLinearAveragePool", [a, *pa, *po], "avg_whole", kernel_shape=[9, 11])
    line = b.data("line", (2, 3, 13))
    b.node("QLinearAveragePool", [line, *pa, *po], "avg_1d", kernel_shape=[4], strides=[3], pads=[2, 1])
    b.node("QLinearGlobalAveragePool", [a, *pa, *po], "gap", channels_last=0)
    b.node("QLinearGlobalAveragePool", [a, *pa, *po], "gap_nhwc", channels_last=1)
    soft = b.params("soft", 1 / 256, 0 if np.dtype(dtype) == np.uint8 else -128)
    b.node("QLinearSoftmax", [a, *pa, *soft], "softmax", opset=13, axis=-1)
    b.node("QLinearSoftmax", [a, *pa, *soft], "softmax_axis1", opset=13, axis=1)
    b.node("QLinearSoftmax", [a, *pa, *soft], "softmax_opset12", opset=12, axis=2)
    wide = b.data("wide", (3, 1000))  # (a classifier's scores: the exp table's shift depends on the length)
    b.node("QLinearSoftmax", [wide, *b.params("pw", 0.05), *soft], "softmax_wide", opset=13)
    return b


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_every_op_matches_onnxruntime_and_the_reference(dtype: type, tmp_path: Path) -> None:
    b = _every_op(dtype, seed=3)
    expected = ort_outputs(b.model(), b.feeds)
    model = b.model(expected)
    reference = reference_outputs(model, b.feeds)
    one, two = ours_outputs(model, b.feeds, tmp_path / "art", threads=(1, 2))
    for node, want, ref, got1, got2 in zip(b.nodes, expected, reference, one, two, strict=True):
        assert got1.dtype == want.dtype and got1.shape == want.shape, node.name
        np.testing.assert_array_equal(got1, ref, err_msg=f"{node.name}: C kernel vs reference")
        np.testing.assert_array_equal(got2, got1, err_msg=f"{node.name}: 2 threads vs 1")
        steps, count = steps_off(ref, want)
        if node.name in _ONE_STEP:
            assert steps <= 1 and count <= want.size // 1000, (node.name, steps, count)
        else:
            assert steps == 0, f"{node.name}: {count} elements differ from onnxruntime by up to {steps} steps"
    plan = json.loads((tmp_path / "art" / "plan.json").read_text())
    ours = {(s["op_type"], s["provider"]) for s in plan["steps"] if s["domain"] == "onnx_aot"}
    kinds = ("QBinary", "QLookup", "QAveragePool", "QGlobalAveragePool", "QSoftmax")
    assert ours == {(kind, "c") for kind in kinds}  # (every step of them on the C kernels)


@pytest.mark.parametrize("level", level_params())
def test_every_cpu_level_computes_the_reference(level: str, tmp_path: Path) -> None:
    # The build contracts multiply-adds where the level has FMA (v3, v4) and cannot on v2: the
    # kernels leave no float32 product to fuse, so every level gives the reference's bits.
    if not host_runs(level):
        pytest.skip(f"this host does not run {level} code")
    b = _every_op(np.int8, seed=5)
    model = b.model(ort_outputs(b.model(), b.feeds))
    (ours,) = ours_outputs(model, b.feeds, tmp_path / "art", cpu=level)
    for node, ref, got in zip(b.nodes, reference_outputs(model, b.feeds), ours, strict=True):
        np.testing.assert_array_equal(got, ref, err_msg=f"{node.name} at {level}")


def _kinds(b: QBuilder) -> list[str]:
    return [n.kind for n in import_model(b.model(ort_outputs(b.model(), b.feeds))).nodes]


def test_canonical_forms() -> None:
    b = QBuilder(np.uint8)
    a = b.data("a", (1, 4, 6, 6))
    pa, po = b.params("pa"), b.params("po")
    b.node("QLinearConcat", [*pa, a, *pa, a, *po], "concat", axis=-3)  # the first input needs no table
    b.node("QLinearAveragePool", [a, *pa, *po], "whole", kernel_shape=[6, 6])
    b.node("QLinearAveragePool", [a, *pa, *po], "nhwc", kernel_shape=[2, 2], channels_last=1)
    b.node("QLinearSoftmax", [a, *pa, *po], "axis1", opset=13, axis=1)
    b.node("QLinearSoftmax", [a, *pa, *po], "rows", opset=11)
    assert _kinds(b) == ["onnx_aot.QLookup", "Concat", "onnx_aot.QGlobalAveragePool",
                         "Transpose", "onnx_aot.QAveragePool", "Transpose",
                         "Transpose", "onnx_aot.QSoftmax", "Transpose",
                         "Reshape", "onnx_aot.QSoftmax", "Reshape"]


def _one(op: str, inputs: list[str], b: QBuilder, **attrs: object) -> None:
    """Import ``op`` alone, its output shaped as its input (onnxruntime refuses these nodes)."""
    b.node(op, inputs, "y", **attrs)
    import_model(b.model([np.empty(b.feeds[inputs[0]].shape)]))


def test_user_errors_name_the_node() -> None:
    b = QBuilder(np.uint8)
    b.inits.append(numpy_helper.from_array(np.full(4, 0.1, np.float32), "per_channel"))
    a = b.data("a", (1, 4, 3, 3))
    with pytest.raises(ModelError, match=r"'y'.*per-tensor"):
        _one("QLinearLeakyRelu", [a, "per_channel", *b.params("x")[1:], *b.params("o")], b)
    b = QBuilder(np.uint8)
    a = b.data("a", (1, 4, 3, 3))
    with pytest.raises(ModelError, match=r"'y'.*opset"):
        _one("QLinearSoftmax", [a, *b.params("x"), *b.params("o")], b)
    b = QBuilder(np.uint8)
    a, scale = b.data("a", (1, 4, 3, 3)), b.data("scale", (), np.float32)
    with pytest.raises(ModelError, match=r"'y'.*must be a constant"):
        _one("QLinearSigmoid", [a, scale, b.params("x")[1], *b.params("o")], b)


def test_unsupported_types_are_refused() -> None:
    b = QBuilder(np.uint8)
    b.inputs.append(helper.make_tensor_value_info("w", helper.np_dtype_to_tensor_dtype(np.dtype(np.uint16)),
                                                  [1, 4]))
    b.nodes.append(helper.make_node("QLinearAdd", ["w", "p_scale", "", "w", "p_scale", "", "p_scale", ""],
                                    ["y"], name="y", domain="com.microsoft"))
    b.params("p")
    b.outputs.append(helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(np.dtype(np.uint16)),
                                                   [1, 4]))
    with pytest.raises(UnsupportedOpError, match=r"'y'.*uint16"):
        import_model(b.model())
