"""fold_qdq: QDQ patterns (written the way onnxruntime's quantizer writes them) become integer ops.

Each test imports a model twice, folds one copy (``FoldQdq`` without a provider gate, so every
exact pattern folds, on the reference kernels) and compares the graphs before and after: data
movement and Q/DQ cancellation give the same bits; QLinearConv / QLinearMatMul compute in exact
integers what the float graph computes in float32, so they may differ by one output step where
the float sum lands on a rounding tie (allowed on at most 1% of the outputs, or one). onnxruntime runs the
same file as the oracle. A pattern that does not match exactly is left as it was.
"""

from __future__ import annotations

import collections
import json
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from compiler.driver import import_model
from compiler.ir.evaluate import evaluate
from compiler.ir.graph import Graph
from compiler.passes import PassManager
from compiler.passes import optimize
from compiler.passes import passes_for_level
from compiler.passes.eliminate_dead_code import EliminateDeadCode
from compiler.passes.fold_qdq import FoldQdq
from tests.support.qdq_models import QdqBuilder
from tests.support.qdq_models import quantize_file
from tests.support.qdq_models import stray
from tests.support.zoo import dummy_input
from tests.support.zoo import zoo_model

X_SCALE, Y_SCALE = 0.0473, 0.0817  # arbitrary, as calibration gives: few exact ties


def _kinds(graph: Graph) -> collections.Counter[str]:
    return collections.Counter(node.kind for node in graph)


def _fold(model: onnx.ModelProto, claims: object = None) -> tuple[Graph, Graph]:
    """The model imported at -O1, before and after fold_qdq (+ dead code elimination)."""
    before = optimize(import_model(model), 1)
    after = optimize(import_model(model), 1)
    after = PassManager([FoldQdq(claims), EliminateDeadCode()]).run(after).graph  # type: ignore[arg-type]
    return before, after


def _feeds(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {v.name: (rng.standard_normal(v.shape) * 2).astype(np.float32) for v in graph.inputs}


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)  # type: ignore[no-any-return]


def _within_a_step(a: np.ndarray, b: np.ndarray, step: float) -> None:
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    assert diff.max() <= step * 1.0001, diff.max()
    assert np.count_nonzero(diff) <= max(1, diff.size // 100)


def _conv_model(relu: bool = False, zero: int = -128, per_channel: bool = True,
                weight_dq: bool = True) -> onnx.ModelProto:
    b = QdqBuilder(seed=1)
    x = b.qdq("x", X_SCALE, 3)
    if weight_dq:
        w, w_scale = b.weight((8, 4, 3, 3), 0, per_channel)
        bias = b.bias(X_SCALE, np.broadcast_to(w_scale, (8,)))
    else:
        w = b.const(b.rng.standard_normal((8, 4, 3, 3)).astype(np.float32) * 0.1, "w")
        bias = b.const(np.zeros(8, np.float32), "b")
    y = b.node("Conv", [x, w, bias], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    if relu:
        y = b.node("Relu", [y])
    return b.model({"x": (1, 4, 9, 9)}, [b.qdq(y, Y_SCALE, zero)])


@pytest.mark.parametrize(("relu", "zero", "per_channel"),
                         [(False, -128, True), (False, 5, False), (True, -128, True), (True, 0, True)])
def test_conv_becomes_qlinearconv(relu: bool, zero: int, per_channel: bool) -> None:
    model = _conv_model(relu, zero, per_channel)
    before, after = _fold(model)
    kinds = _kinds(after)
    assert kinds["QLinearConv"] == 1 and "Conv" not in kinds and "Relu" not in kinds
    # A Relu clamps nothing when the zero point is the codes' minimum; else a table clamps the codes.
    assert kinds["onnx_aot.QLookup"] == (1 if relu and zero != -128 else 0)
    assert kinds["DequantizeLinear"] == 1 and kinds["QuantizeLinear"] == 1  # the graph's input and output
    feeds = _feeds(before)
    (ours,), (ref,), (theirs,) = evaluate(after, feeds), evaluate(before, feeds), _ort(model, feeds)
    _within_a_step(ours, ref, Y_SCALE)
    _within_a_step(ours, theirs, Y_SCALE)


def test_float_weights_stay_a_float_conv() -> None:
    """A Conv whose weights are plain floats (not codes behind a DequantizeLinear) is left alone."""
    before, after = _fold(_conv_model(weight_dq=False))
    assert _kinds(after) == _kinds(before) and _kinds(after)["Conv"] == 1


def test_an_inexact_bias_stays_float() -> None:
    """A float bias that is no integer at x_scale * w_scale keeps the float Conv."""
    b = QdqBuilder(seed=2)
    x = b.qdq("x", X_SCALE, 0)
    w, _ = b.weight((4, 4, 1, 1), 0)
    y = b.node("Conv", [x, w, b.const(np.full(4, 0.1234567, np.float32), "b")], kernel_shape=[1, 1])
    _, after = _fold(b.model({"x": (1, 4, 5, 5)}, [b.qdq(y, Y_SCALE, 0)]))
    assert _kinds(after)["Conv"] == 1 and "QLinearConv" not in _kinds(after)


def test_the_gate_keeps_what_the_provider_does_not_claim() -> None:
    model = _conv_model()
    before, after = _fold(model, claims=lambda node: node.kind != "QLinearConv")
    assert _kinds(after) == _kinds(before)


def test_fold_runs_on_the_c_target_only() -> None:
    names = {p.name for p in passes_for_level(2, "cpu")}
    assert "fold_qdq" in names
    assert "fold_qdq" not in {p.name for p in passes_for_level(2, "cuda")}
    assert "fold_qdq" not in {p.name for p in passes_for_level(1, "cpu")}


@pytest.mark.parametrize("b_form", ["per_column", "per_tensor", "activation"])
def test_matmul_becomes_qlinearmatmul(b_form: str) -> None:
    b = QdqBuilder(seed=3)
    a = b.qdq("a", X_SCALE, -4)
    if b_form == "activation":
        w = b.qdq("b", 0.0291, 2)
        inputs = {"a": (2, 6, 16), "b": (2, 16, 5)}
    else:
        w, _ = b.weight((16, 5), 1, per_channel=b_form == "per_column")
        inputs = {"a": (2, 6, 16)}
    model = b.model(inputs, [b.qdq(b.node("MatMul", [a, w]), Y_SCALE, 1)])
    before, after = _fold(model)
    assert _kinds(after)["QLinearMatMul"] == 1 and "MatMul" not in _kinds(after)
    feeds = _feeds(before)
    (ours,), (ref,), (theirs,) = evaluate(after, feeds), evaluate(before, feeds), _ort(model, feeds)
    _within_a_step(ours, ref, Y_SCALE)
    _within_a_step(ours, theirs, Y_SCALE)


@pytest.mark.parametrize("with_bias", [False, True])
def test_gemm(with_bias: bool) -> None:
    """transB by transposed codes, alpha into the weight scale; a bias keeps a float epilogue."""
    b = QdqBuilder(seed=4)
    a = b.qdq("a", X_SCALE, 0)
    w, w_scale = b.weight((5, 16), 0)  # [N, K] with transB: per output column is axis 0
    inputs = [a, w] + ([b.bias(X_SCALE * 0.5, w_scale)] if with_bias else [])
    y = b.node("Gemm", inputs, transB=1, alpha=0.5)
    model = b.model({"a": (3, 16)}, [b.qdq(y, Y_SCALE, 0)])
    before, after = _fold(model)
    kinds = _kinds(after)
    assert "Gemm" not in kinds
    assert kinds["MatMulInteger" if with_bias else "QLinearMatMul"] == 1
    feeds = _feeds(before)
    (ours,), (ref,) = evaluate(after, feeds), evaluate(before, feeds)
    _within_a_step(ours, ref, Y_SCALE)


def _movement_model(op: str, same: bool = True, **attrs: object) -> onnx.ModelProto:
    b = QdqBuilder(seed=5)
    x = b.qdq("x", X_SCALE, 7)
    extra = {"Reshape": [b.const(np.array([1, 4, 6, 6], np.int64), "shape")],
             "Slice": [b.const(np.array([1, 2], np.int64)), b.const(np.array([4, 5], np.int64)),
                       b.const(np.array([2, 3], np.int64))],
             "Resize": ["", b.const(np.array([1, 1, 2, 1.5], np.float32), "scales")]}.get(op, [])
    if op == "Concat":
        extra = [b.qdq("x2", X_SCALE, 7)]
    y = b.node(op, [x, *extra], **attrs)
    return b.model({"x": (1, 4, 6, 6), "x2": (1, 4, 6, 6)} if op == "Concat" else {"x": (1, 4, 6, 6)},
                   [b.qdq(y, X_SCALE if same else Y_SCALE, 7)])


@pytest.mark.parametrize(("op", "attrs", "kind"), [
    ("Reshape", {}, "Reshape"), ("Transpose", {"perm": [0, 2, 3, 1]}, "Transpose"),
    ("Concat", {"axis": 1}, "Concat"), ("Flatten", {"axis": 1}, "Reshape"),
    ("MaxPool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}, "MaxPool"),
    ("Slice", {}, "Slice"), ("Resize", {"mode": "nearest"}, "Resize"),
])
def test_movement_moves_the_codes(op: str, attrs: dict[str, object], kind: str) -> None:
    model = _movement_model(op, **attrs)
    before, after = _fold(model)
    kinds = _kinds(after)
    assert kinds[kind] == 1
    assert kinds["QuantizeLinear"] == len(before.inputs) and kinds["DequantizeLinear"] == 1
    feeds = _feeds(before)
    (ours,), (ref,), (theirs,) = evaluate(after, feeds), evaluate(before, feeds), _ort(model, feeds)
    assert ours.tobytes() == ref.tobytes()
    np.testing.assert_array_equal(ours, theirs)


def test_movement_to_another_scale_moves_the_quantize_first() -> None:
    """The Transpose keeps its place between the two quantizations' codes only after the
    QuantizeLinear moved before it (fold_qdq._sink): the requantization DQ -> Q is then a QLookup,
    the Transpose moves its codes, the same bits."""
    before, after = _fold(_movement_model("Transpose", same=False, perm=[0, 2, 3, 1]))
    assert _kinds(after) == collections.Counter({"QuantizeLinear": 1, "onnx_aot.QLookup": 1, "Transpose": 1,
                                                 "DequantizeLinear": 1})
    transpose = next(node for node in after if node.kind == "Transpose")
    assert transpose.inputs[0].dtype == np.int8 and transpose.inputs[0].producer.kind == "onnx_aot.QLookup"
    feeds = _feeds(before)
    assert evaluate(after, feeds)[0].tobytes() == evaluate(before, feeds)[0].tobytes()


@pytest.fixture(scope="module")
def squeezenet_qdq(tmp_path_factory: pytest.TempPathFactory) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """The light zoo's SqueezeNet at opset 13 and onnxruntime's S8S8 per-channel QDQ file of it."""
    from compiler.bench import for_onnxruntime

    root = tmp_path_factory.mktemp("fold-qdq")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = onnx.version_converter.convert_version(for_onnxruntime(zoo_model("squeezenet")), 13)
    onnx.save(model, str(root / "fp32.onnx"))
    quantize_file(root / "fp32.onnx", root / "qdq.onnx", "qdq", lambda seed: dummy_input(model, seed))
    return model, onnx.load(str(root / "qdq.onnx"))


def test_squeezenet_qdq_folds_and_strays_no_more_than_onnxruntime(
        squeezenet_qdq: tuple[onnx.ModelProto, onnx.ModelProto]) -> None:
    fp32, qdq = squeezenet_qdq
    before, after = _fold(qdq)
    kinds = _kinds(after)
    assert kinds["QLinearConv"] == 26 and "Conv" not in kinds and kinds["MaxPool"] == 3
    for seed in range(3):
        feeds = dummy_input(fp32, seed)
        reference = _ort(fp32, feeds)
        ours, theirs = evaluate(after, feeds), _ort(qdq, feeds)
        assert stray(ours, reference) <= 1.25 * stray(theirs, reference) + 0.005
        assert stray(ours, evaluate(before, feeds)) <= 0.02  # one step of the last scale, at most a few


def test_a_compiled_qdq_model_runs(tmp_path: Path) -> None:
    """On the C target the gate decides; either way the artifact matches onnxruntime's int8 run."""
    from compiler.driver import compile_model
    from runtime.session import Session

    model = _conv_model(relu=True, zero=0)
    artifact = compile_model(model, tmp_path / "conv")
    feeds = _feeds(optimize(import_model(model), 0))
    (ours,), (theirs,) = Session(artifact).run(None, feeds), _ort(model, feeds)
    _within_a_step(ours, theirs, Y_SCALE)


@pytest.mark.parametrize(("op", "attrs"), [("Relu", {}), ("Clip", {})])
def test_a_clamp_between_equal_quantizations_is_a_table(op: str, attrs: dict[str, object]) -> None:
    b = QdqBuilder(seed=6)
    x = b.qdq("x", X_SCALE, 7)
    inputs = [x] + ([b.const(np.float32(-0.3), "lo"), b.const(np.float32(2.5), "hi")] if op == "Clip" else [])
    y = b.node(op, inputs, **attrs)
    s, z = b.qparams(X_SCALE, 7)  # the same parameters, as their own initializers
    out = b.node("DequantizeLinear", [b.node("QuantizeLinear", [y, s, z]), s, z])
    model = b.model({"x": (2, 3, 4, 5)}, [out])
    before, after = _fold(model)
    kinds = _kinds(after)
    assert kinds["onnx_aot.QLookup"] == 1 and "Relu" not in kinds and kinds["QuantizeLinear"] == 1
    feeds = _feeds(before)
    (ours,), (ref,), (theirs,) = evaluate(after, feeds), evaluate(before, feeds), _ort(model, feeds)
    assert ours.tobytes() == ref.tobytes()
    np.testing.assert_array_equal(ours, theirs)


def test_folded_integer_steps_compile_and_run(tmp_path: Path) -> None:
    """The C provider's gate takes the folded conv (pack_qconv_weights lowers it to the integer
    conv kernel) and its clamp (a lookup table, which fuse_qconv_lookup puts into the conv's store):
    the integer steps go through the whole compile and the artifact matches onnxruntime's int8 run
    of the file."""
    from compiler.driver import compile_model
    from runtime.session import Session

    model = _conv_model(relu=True, zero=0)
    artifact = compile_model(model, tmp_path / "conv")
    steps = json.loads((artifact / "plan.json").read_text())["steps"]
    kinds = [s["op_type"] for s in steps if s["op_type"] in ("PackedQConv", "QLinearConv", "QLookup", "Conv")]
    assert kinds == ["PackedQConv"]
    assert len(next(s for s in steps if s["op_type"] == "PackedQConv")["inputs"]) == 6  # its Lut
    feeds = _feeds(optimize(import_model(model), 0))
    (ours,), (theirs,) = Session(artifact).run(None, feeds), _ort(model, feeds)
    _within_a_step(ours, theirs, Y_SCALE)
