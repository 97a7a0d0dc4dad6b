"""C kernels with run-time dims (issue 17 item 3) for data movement, normalization and
reductions: Concat, Transpose, Reshape / copies, Softmax / LogSoftmax, ... in dynamic graphs,
against onnxruntime at bindings that hit the vector tails, rows shorter than a vector, the range
ends and sizes large enough for threads; every step of those kinds runs on C."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper

from compiler.driver import compile_model
from runtime.errors import InputError
from runtime.errors import ShapeError
from runtime.session import Session
from tests.support.models import ort_run

RTOL, ATOL = 1e-4, 1e-5
CPUS = ["x86-64-v2", "x86-64-v3"]


def _model(nodes: list, inputs: list, outputs: list, inits: list | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "dyn", inputs, outputs, initializer=inits or [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _f(name: str, shape: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _providers(out: Path) -> dict[str, set[str]]:
    plan = json.loads((out / "plan.json").read_text())
    seen: dict[str, set[str]] = {}
    for step in plan["steps"]:
        seen.setdefault(step["op_type"], set()).add(step["provider"])
    return seen


def _check(model: onnx.ModelProto, out: Path, kinds: set[str], bindings: list[dict[str, tuple]],
           seed: int = 0) -> None:
    seen = _providers(out)
    for kind in kinds:
        assert seen.get(kind) == {"c"}, (kind, seen)
    session = Session(out, threads=2)
    for k, feeds_shapes in enumerate(bindings):
        rng = np.random.default_rng(seed + k)
        feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in feeds_shapes.items()}
        got, want = session.run(None, feeds), ort_run(model, feeds)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


def _movement_model() -> onnx.ModelProto:
    """x (n, 3, w): Transpose to (w, n, 3) and back through a Reshape, Concat with itself along
    the run-time axis and along a static one, Softmax along the run-time last axis and along
    the static middle one, LogSoftmax along the first."""
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[2, 0, 1]),
        helper.make_node("Transpose", ["t"], ["t2"], perm=[1, 2, 0]),
        helper.make_node("Shape", ["x"], ["xs"]),
        helper.make_node("Reshape", ["t2", "xs"], ["r"]),
        helper.make_node("Concat", ["r", "x", "r"], ["c2"], axis=2),
        helper.make_node("Concat", ["x", "r"], ["c1"], axis=1),
        helper.make_node("Softmax", ["c2"], ["s2"], axis=2),
        helper.make_node("Softmax", ["c1"], ["s1"], axis=1),
        helper.make_node("LogSoftmax", ["x"], ["l0"], axis=0),
        helper.make_node("Transpose", ["s1"], ["y1"], perm=[1, 0, 2]),
    ]
    return _model(nodes, [_f("x", ["n", 3, "w"])],
                  [_f("s2", ["n", 3, None]), _f("y1", [6, "n", "w"]), _f("l0", ["n", 3, "w"])])


@pytest.mark.parametrize("cpu", CPUS)
def test_movement_and_softmax_with_run_time_dims(tmp_path: Path, cpu: str) -> None:
    model = _movement_model()
    out = compile_model(model, tmp_path / "a", dims={"n": (1, 64), "w": (1, 3000)}, cpu=cpu)
    shapes = [(1, 1), (2, 3), (5, 17), (3, 16), (64, 3000), (7, 900)]
    _check(model, out, {"Transpose", "Concat", "Softmax", "LogSoftmax"},
           [{"x": (n, 3, w)} for n, w in shapes])


def _reduce_model() -> onnx.ModelProto:
    """x (n, c=5, w): ReduceMean over the last axis (LayerNorm as decomposed), over (n, w) ("cols"
    with run-time rows), ReduceMax over the static middle axis, ReduceSum over everything;
    LayerNormalization over (c, w') of a Transpose (static normalized dims, run-time rows)."""
    scale = onnx.numpy_helper.from_array(np.linspace(0.5, 1.5, 5).astype(np.float32), "scale")
    bias = onnx.numpy_helper.from_array(np.linspace(-1, 1, 5).astype(np.float32), "bias")
    axes = {name: onnx.numpy_helper.from_array(np.array(a, np.int64), name)
            for name, a in (("a2", [2]), ("a02", [0, 2]), ("a1", [1]), ("a012", [0, 1, 2]), ("a0", [0]))}
    nodes = [
        helper.make_node("ReduceMean", ["x", "a2"], ["m2"], keepdims=1),
        helper.make_node("ReduceMean", ["x", "a02"], ["m02"], keepdims=0),
        helper.make_node("ReduceMax", ["x", "a1"], ["mx1"], keepdims=0),
        helper.make_node("ReduceSum", ["x", "a012"], ["sall"], keepdims=1),
        helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
        helper.make_node("LayerNormalization", ["xt", "scale", "bias"], ["ln"], axis=2, epsilon=1e-5),
        helper.make_node("ReduceL2", ["x", "a0"], ["l2"], keepdims=0),
    ]
    return _model(nodes, [_f("x", ["n", 5, "w"])],
                  [_f("m2", ["n", 5, 1]), _f("m02", [5]), _f("mx1", ["n", "w"]), _f("sall", [1, 1, 1]),
                   _f("ln", ["n", "w", 5]), _f("l2", [5, "w"])], [scale, bias, *axes.values()])


@pytest.mark.parametrize("cpu", CPUS)
def test_reductions_and_layernorm_with_run_time_dims(tmp_path: Path, cpu: str) -> None:
    model = _reduce_model()
    out = compile_model(model, tmp_path / "a", dims={"n": (1, 16), "w": (1, 3000)}, cpu=cpu)
    shapes = [(1, 1), (2, 3), (5, 17), (16, 3000), (3, 257), (1, 256)]
    _check(model, out, {"ReduceMean", "ReduceMax", "ReduceSum", "ReduceL2", "LayerNormalization"},
           [{"x": (n, 5, w)} for n, w in shapes])


def _split_resize_model() -> onnx.ModelProto:
    """x (n, 6, h, w): Split along the static channels into 2 + 4, a nearest Resize by 2 x 2 and
    by 3 x 1 (asymmetric, floor: as YOLOv8 exports its upsampling), Concat along the channels."""
    empty = onnx.numpy_helper.from_array(np.zeros(0, np.float32), "roi")
    nodes = [
        helper.make_node("Split", ["x", "sizes"], ["a", "b"], axis=1),
        helper.make_node("Resize", ["a", "roi", "s22"], ["ra"], mode="nearest",
                         coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
        helper.make_node("Resize", ["b", "roi", "s31"], ["rb"], mode="nearest",
                         coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
        helper.make_node("Concat", ["b", "a"], ["c"], axis=1),
    ]
    inits = [empty, onnx.numpy_helper.from_array(np.array([2, 4], np.int64), "sizes"),
             onnx.numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "s22"),
             onnx.numpy_helper.from_array(np.array([1, 1, 3, 1], np.float32), "s31")]
    return _model(nodes, [_f("x", ["n", 6, "h", "w"])],
                  [_f("ra", ["n", 2, None, None]), _f("rb", ["n", 4, None, None]),
                   _f("c", ["n", 6, "h", "w"])], inits)


@pytest.mark.parametrize("cpu", CPUS)
def test_split_and_nearest_resize_with_run_time_dims(tmp_path: Path, cpu: str) -> None:
    model = _split_resize_model()
    out = compile_model(model, tmp_path / "a", dims={"n": (1, 8), "h": (1, 160), "w": (1, 160)}, cpu=cpu)
    shapes = [(1, 1, 1), (2, 3, 5), (8, 160, 160), (3, 17, 64)]
    _check(model, out, {"Split", "Resize", "Concat"}, [{"x": (n, 6, h, w)} for n, h, w in shapes])


def _slice_expand_model() -> onnx.ModelProto:
    """x (4, n, w): Slices of the static first axis (as PP-OCR splits q, k, v), a reversed one with
    a step along it, a Slice of the static middle axis of (n, 6, w); v (6, 1) expanded to x2's
    run-time shape (n, 6, w)."""
    def ints(name: str, values: list[int]) -> onnx.TensorProto:
        return onnx.numpy_helper.from_array(np.array(values, np.int64), name)

    nodes = [
        helper.make_node("Slice", ["x", "z", "one", "z"], ["s0"]),
        helper.make_node("Slice", ["x", "one", "three", "z"], ["s1"]),
        helper.make_node("Slice", ["x", "three", "zero_end", "z", "minus2"], ["s2"]),
        helper.make_node("Slice", ["x2", "one", "five", "one", "two"], ["s3"]),
        helper.make_node("Shape", ["x2"], ["shape"]),
        helper.make_node("Expand", ["v", "shape"], ["e"]),
    ]
    inits = [ints("z", [0]), ints("one", [1]), ints("three", [3]), ints("zero_end", [-5]),
             ints("minus2", [-2]), ints("five", [5]), ints("two", [2])]
    return _model(nodes, [_f("x", [4, "n", "w"]), _f("x2", ["n", 6, "w"]), _f("v", [6, 1])],
                  [_f("s0", [1, "n", "w"]), _f("s1", [2, "n", "w"]), _f("s2", [2, "n", "w"]),
                   _f("s3", ["n", 2, "w"]), _f("e", ["n", 6, "w"])], inits)


@pytest.mark.parametrize("cpu", CPUS)
def test_slice_and_expand_with_run_time_dims(tmp_path: Path, cpu: str) -> None:
    model = _slice_expand_model()
    out = compile_model(model, tmp_path / "a", dims={"n": (1, 32), "w": (1, 4096)}, cpu=cpu)
    shapes = [(1, 1), (2, 7), (32, 4096), (5, 333)]
    _check(model, out, {"Slice", "Expand"},
           [{"x": (4, n, w), "x2": (n, 6, w), "v": (6, 1)} for n, w in shapes])


def _channel_model() -> onnx.ModelProto:
    """x (n, 4, h, w): GlobalAveragePool, GlobalMaxPool, BatchNormalization and LRN (channels
    static, batch and spatial dims run-time)."""
    c = 4
    stats = [onnx.numpy_helper.from_array(np.linspace(lo, hi, c).astype(np.float32), name)
             for name, lo, hi in (("g", 0.5, 2.0), ("b", -1.0, 1.0), ("mu", -0.2, 0.3), ("var", 0.5, 1.5))]
    nodes = [
        helper.make_node("GlobalAveragePool", ["x"], ["gap"]),
        helper.make_node("GlobalMaxPool", ["x"], ["gmp"]),
        helper.make_node("BatchNormalization", ["x", "g", "b", "mu", "var"], ["bn"], epsilon=1e-5),
        helper.make_node("LRN", ["x"], ["lrn"], size=3, alpha=1e-3, beta=0.75, bias=1.0),
    ]
    return _model(nodes, [_f("x", ["n", c, "h", "w"])],
                  [_f("gap", ["n", c, 1, 1]), _f("gmp", ["n", c, 1, 1]), _f("bn", ["n", c, "h", "w"]),
                   _f("lrn", ["n", c, "h", "w"])], stats)


@pytest.mark.parametrize("cpu", CPUS)
def test_channel_kernels_with_run_time_dims(tmp_path: Path, cpu: str) -> None:
    model = _channel_model()
    out = compile_model(model, tmp_path / "a", dims={"n": (1, 8), "h": (1, 128), "w": (1, 300)}, cpu=cpu)
    shapes = [(1, 1, 1), (2, 3, 5), (8, 128, 300), (3, 17, 257)]
    _check(model, out, {"GlobalAveragePool", "GlobalMaxPool", "BatchNormalization", "LRN"},
           [{"x": (n, 4, h, w)} for n, h, w in shapes])


def _assumed_concat_range_model() -> onnx.ModelProto:
    """Concat of a (n, 2, h) and b (n, 3, k) along axis 1: h and k must agree (the import records
    the assumption, the runtime checks it); Range(0, float(k), 1.5) of a run-time length."""
    def const(name: str, value: np.ndarray) -> onnx.TensorProto:
        return onnx.numpy_helper.from_array(value, name)

    nodes = [
        helper.make_node("Concat", ["a", "b"], ["c"], axis=1),
        helper.make_node("Shape", ["b"], ["bs"], start=2),
        helper.make_node("Cast", ["bs"], ["kf"], to=TensorProto.FLOAT),
        helper.make_node("Squeeze", ["kf", "zero"], ["k"]),
        helper.make_node("Range", ["start", "k", "delta"], ["r"]),
    ]
    inits = [const("zero", np.array([0], np.int64)), const("start", np.array(0.5, np.float32)),
             const("delta", np.array(1.5, np.float32))]
    return _model(nodes, [_f("a", ["n", 2, "h"]), _f("b", ["n", 3, "k"])],
                  [_f("c", ["n", 5, None]), _f("r", [None])], inits)


def test_concat_of_dims_equal_by_assumption_and_range(tmp_path: Path) -> None:
    model = _assumed_concat_range_model()
    out = compile_model(model, tmp_path / "a", dims={"n": (1, 4), "h": (1, 700), "k": (1, 700)})
    shapes = [(1, 1), (2, 5), (4, 700), (3, 64)]
    _check(model, out, {"Concat", "Range"}, [{"a": (n, 2, w), "b": (n, 3, w)} for n, w in shapes])
    feeds = {"a": np.zeros((1, 2, 5), np.float32), "b": np.zeros((1, 3, 6), np.float32)}
    with pytest.raises((InputError, ShapeError)):
        Session(out).run(None, feeds)


def _gather_model() -> onnx.ModelProto:
    """An embedding lookup: table (50, 8) gathered by ids (b, s) (the test feeds ids in range,
    negative ones too; out-of-range ones are tests/test_index_bounds.py's); x (b, 6, w) gathered
    along its static middle axis and along its run-time last axis."""
    table = onnx.numpy_helper.from_array(np.arange(400, dtype=np.float32).reshape(50, 8) / 7, "table")
    pick = onnx.numpy_helper.from_array(np.array([[5, 0], [-1, 2]], np.int64), "pick")
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"], axis=0),
        helper.make_node("Gather", ["x", "pick"], ["g1"], axis=1),
        helper.make_node("Gather", ["x", "ids"], ["g2"], axis=2),
    ]
    return _model(nodes, [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"]),
                          _f("x", ["b", 6, "w"])],
                  [_f("emb", ["b", "s", 8]), _f("g1", ["b", 2, 2, "w"]), _f("g2", ["b", 6, "b", "s"])],
                  [table, pick])


def test_gather_with_run_time_dims(tmp_path: Path) -> None:
    model = _gather_model()
    out = compile_model(model, tmp_path / "a", dims={"b": (1, 4), "s": (1, 512), "w": (50, 600)})
    session = Session(out, threads=2)
    assert _providers(out)["Gather"] == {"c"}
    for b, s, w in ((1, 1, 50), (2, 7, 77), (4, 512, 600)):
        rng = np.random.default_rng(b * s)
        feeds = {"ids": rng.integers(-50, 50, (b, s)).astype(np.int64),
                 "x": rng.standard_normal((b, 6, w)).astype(np.float32)}
        for g, want in zip(session.run(None, feeds), ort_run(model, feeds), strict=True):
            np.testing.assert_array_equal(g, want)


def test_constant_of_shape_with_run_time_dims(tmp_path: Path) -> None:
    """ConstantOfShape of x's run-time shape, float32 and int64 (YOLOv8n's anchor strides)."""
    nodes = [
        helper.make_node("Shape", ["x"], ["xs"]),
        helper.make_node("ConstantOfShape", ["xs"], ["f"],
                         value=onnx.numpy_helper.from_array(np.array([2.5], np.float32))),
        helper.make_node("ConstantOfShape", ["xs"], ["i"],
                         value=onnx.numpy_helper.from_array(np.array([-3], np.int64))),
    ]
    model = _model(nodes, [_f("x", ["n", 3, "w"])],
                   [_f("f", ["n", 3, "w"]),
                    helper.make_tensor_value_info("i", TensorProto.INT64, ["n", 3, "w"])])
    out = compile_model(model, tmp_path / "a", dims={"n": (1, 8), "w": (1, 5000)})
    _check(model, out, {"ConstantOfShape"},
           [{"x": (n, 3, w)} for n, w in ((1, 1), (8, 5000), (3, 33))])


def test_argmax_argmin_with_run_time_dims(tmp_path: Path) -> None:
    """ArgMax over the static classes of x (n, t, 37) (a CTC decode's), ArgMin with
    select_last_index over the static middle axis of x2 (n, 6, w); ties are likely with inputs
    rounded. A run-time axis is left to the reference kernel."""
    nodes = [
        helper.make_node("Round", ["x"], ["r"]),
        helper.make_node("ArgMax", ["r"], ["am"], axis=2, keepdims=0),
        helper.make_node("Round", ["x2"], ["r2"]),
        helper.make_node("ArgMin", ["r2"], ["an"], axis=1, keepdims=1, select_last_index=1),
    ]
    model = _model(nodes, [_f("x", ["n", "t", 37]), _f("x2", ["n", 6, "w"])],
                   [helper.make_tensor_value_info("am", TensorProto.INT64, ["n", "t"]),
                    helper.make_tensor_value_info("an", TensorProto.INT64, ["n", 1, "w"])])
    out = compile_model(model, tmp_path / "a", dims={"n": (1, 4), "t": (1, 2000), "w": (1, 3000)})
    _check(model, out, {"ArgMax", "ArgMin"},
           [{"x": (n, t, 37), "x2": (n, 6, w)} for n, t, w in ((1, 1, 1), (4, 2000, 3000), (2, 77, 5))])


def test_cast_where_compare_with_run_time_dims(tmp_path: Path) -> None:
    """The typed maps (elementwise_typed.py): an int64 mask (b, s) cast to float32 (the encoder's
    attention mask), Where over a comparison broadcast against a static row, And / Not of bools."""
    row = onnx.numpy_helper.from_array(np.linspace(-1, 1, 7).astype(np.float32), "row")
    nodes = [
        helper.make_node("Cast", ["mask"], ["mf"], to=TensorProto.FLOAT),
        helper.make_node("Greater", ["x", "row"], ["gt"]),
        helper.make_node("Where", ["gt", "x", "row"], ["w"]),
        helper.make_node("Less", ["x", "row"], ["lt"]),
        helper.make_node("Not", ["lt"], ["nl"]),
        helper.make_node("And", ["gt", "nl"], ["both"]),
        helper.make_node("Cast", ["both"], ["bi"], to=TensorProto.INT32),
    ]
    model = _model(nodes, [helper.make_tensor_value_info("mask", TensorProto.INT64, ["b", "s"]),
                           _f("x", ["b", "s", 7])],
                   [_f("mf", ["b", "s"]), _f("w", ["b", "s", 7]),
                    helper.make_tensor_value_info("bi", TensorProto.INT32, ["b", "s", 7])], [row])
    out = compile_model(model, tmp_path / "a", dims={"b": (1, 8), "s": (1, 5000)})
    assert {k: v for k, v in _providers(out).items() if k in ("Cast", "Where", "Greater", "And")} == {
        "Cast": {"c"}, "Where": {"c"}, "Greater": {"c"}, "And": {"c"}}
    session = Session(out, threads=2)
    for b, s in ((1, 1), (8, 5000), (3, 17)):
        rng = np.random.default_rng(b + s)
        feeds = {"mask": rng.integers(0, 2, (b, s)).astype(np.int64),
                 "x": rng.standard_normal((b, s, 7)).astype(np.float32)}
        for g, want in zip(session.run(None, feeds), ort_run(model, feeds), strict=True):
            np.testing.assert_array_equal(g, want)


def test_tile_with_run_time_dims(tmp_path: Path) -> None:
    """Tile by static repeats (2, 1, 3) of x (n, 4, w)."""
    reps = onnx.numpy_helper.from_array(np.array([2, 1, 3], np.int64), "reps")
    model = _model([helper.make_node("Tile", ["x", "reps"], ["y"])], [_f("x", ["n", 4, "w"])],
                   [_f("y", [None, 4, None])], [reps])
    out = compile_model(model, tmp_path / "a", dims={"n": (1, 8), "w": (1, 3000)})
    _check(model, out, {"Tile"}, [{"x": (n, 4, w)} for n, w in ((1, 1), (8, 3000), (3, 17))])


def test_topk_with_run_time_rows(tmp_path: Path) -> None:
    """TopK (k 5, largest and smallest) along the static last axis of x (n, t, 40), run-time rows;
    values distinct so the indices are unambiguous."""
    k = onnx.numpy_helper.from_array(np.array([5], np.int64), "k")
    nodes = [helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=2),
             helper.make_node("TopK", ["x", "k"], ["v2", "i2"], axis=2, largest=0)]
    outs = [_f("v", ["n", "t", 5]), helper.make_tensor_value_info("i", TensorProto.INT64, ["n", "t", 5]),
            _f("v2", ["n", "t", 5]), helper.make_tensor_value_info("i2", TensorProto.INT64, ["n", "t", 5])]
    model = _model(nodes, [_f("x", ["n", "t", 40])], outs, [k])
    out = compile_model(model, tmp_path / "a", dims={"n": (1, 4), "t": (1, 3000)})
    assert _providers(out)["TopK"] == {"c"}
    session = Session(out, threads=2)
    for n, t in ((1, 1), (4, 3000), (2, 33)):
        x = np.random.default_rng(n * t).permutation(n * t * 40).reshape(n, t, 40).astype(np.float32)
        for g, want in zip(session.run(None, {"x": x}), ort_run(model, {"x": x}), strict=True):
            np.testing.assert_array_equal(g, want)
