"""MaxPool on int8 / uint8 in C (QOperator files keep their MaxPools on the quantized codes, and
fold_qdq leaves them there): bit-exact against onnxruntime on shapes with padding, stride, dilation
and ceil mode, at every CPU level this host runs, and on the C provider rather than the reference."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from compiler import compile_model
from runtime import Session
from tests.cpu_targets import host_runs
from tests.cpu_targets import level_params

_CASES = {
    "3x3s2_ceil": dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),  # SqueezeNet's
    "3x3s1_pad1": dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]),  # Inception's
    "2x2s2": dict(kernel_shape=[2, 2], strides=[2, 2]),
    "3x2_dil_pad": dict(kernel_shape=[3, 2], strides=[1, 2], dilations=[2, 1], pads=[2, 0, 1, 1]),
}


def _model(dtype: np.dtype, shape: tuple[int, ...], attrs: dict[str, object],
           out: tuple[int, ...] | None = None) -> bytes:
    """The one-node graph; ``out``: y's shape (left out for onnxruntime to find)."""
    elem = helper.np_dtype_to_tensor_dtype(dtype)
    node = helper.make_node("MaxPool", ["x"], ["y"], name="pool", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", elem, list(shape))],
                              [helper.make_value_info("y", helper.make_tensor_type_proto(elem, out))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


@pytest.mark.parametrize("level", level_params())
@pytest.mark.parametrize("dtype", [np.int8, np.uint8], ids=["int8", "uint8"])
@pytest.mark.parametrize("case", sorted(_CASES))
def test_eight_bit_maxpool_matches_onnxruntime(case: str, dtype: type, level: str, tmp_path: Path) -> None:
    import onnx
    import onnxruntime as ort

    if not host_runs(level):
        pytest.skip(f"this host does not run {level} code")
    shape = (2, 5, 13, 11)
    raw = _model(np.dtype(dtype), shape, _CASES[case])
    info = np.iinfo(dtype)
    x = np.random.default_rng(len(case)).integers(info.min, info.max + 1, shape).astype(dtype)
    (want,) = ort.InferenceSession(raw, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    model = onnx.load_from_string(_model(np.dtype(dtype), shape, _CASES[case], want.shape))
    art = compile_model(model, tmp_path / "art", cpu=level)
    steps = json.loads((art / "plan.json").read_text())["steps"]
    assert [(s["op_type"], s["provider"]) for s in steps] == [("MaxPool", "c")]
    (got,) = Session(art).run(None, {"x": x})
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8], ids=["int8", "uint8"])
def test_a_window_wholly_in_the_padding_gives_the_lowest_value(dtype: type, tmp_path: Path) -> None:
    """Pads as large as the kernel (onnxruntime refuses them; ONNX does not): the top-left windows
    see only padding and give the type's lowest value, as the reference kernels do."""
    import onnx

    from compiler.frontend.importer import import_model
    from tests.support.graphs import run_graph

    shape, attrs = (1, 2, 5, 5), dict(kernel_shape=[2, 2], strides=[2, 2], pads=[2, 2, 0, 0])
    model = onnx.load_from_string(_model(np.dtype(dtype), shape, attrs, (1, 2, 3, 3)))
    info = np.iinfo(dtype)
    x = np.random.default_rng(3).integers(info.min, info.max + 1, shape).astype(dtype)
    (want,) = run_graph(import_model(model), {"x": x}).values()
    art = compile_model(model, tmp_path / "art")
    steps = json.loads((art / "plan.json").read_text())["steps"]
    assert [(s["op_type"], s["provider"]) for s in steps] == [("MaxPool", "c")]
    (got,) = Session(art).run(None, {"x": x})
    assert want[0, 0, 0, 0] == info.min and want[0, 0, 1, 1] != info.min
    np.testing.assert_array_equal(got, want)
