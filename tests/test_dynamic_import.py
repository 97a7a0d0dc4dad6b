"""Dynamic shapes, first step (issue 17): ranges on the command line and in Python, and an import
that keeps symbols -- every value's shape, evaluated at a binding of the symbols, is the shape the
static import at those sizes gives, node for node (docs/dynamic-shapes.md).

Models: PP-OCRv4 rec as shipped (``x=1x3x48x32..2048``), a BERT-style encoder in the form PyTorch
exports it (``--dim batch=1..8 --dim seq=1..512``) and a YOLOv8n-style detector fragment
(``images=1..8x3x320..640x320..640``), the last two built here with onnx.helper.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler.cli import parse_dim
from compiler.cli import parse_shape
from compiler.driver import compile_model
from compiler.frontend.importer import import_model
from compiler.frontend.probing import Probes
from compiler.frontend.probing import fit
from compiler.ir.graph import Graph
from runtime.errors import InputError
from runtime.errors import ModelError
from runtime.errors import ShapeError
from runtime.session import Session
from runtime.symbolic import Expr
from runtime.symbolic import evaluate
from runtime.symbolic import sym
from tests.support.dynamic_models import bert_model
from tests.support.dynamic_models import yolo_model
from tests.support.fetched import fetched_model

F = TensorProto.FLOAT
I64 = TensorProto.INT64


def _at(dims: Any, binding: Mapping[str, int]) -> Any:
    return tuple(evaluate(d, binding) for d in dims)


def assert_same_as_static(dynamic: Graph, static: Graph, binding: Mapping[str, int]) -> int:
    """Same nodes in the same order; every input, output and attribute of each, with the symbols at
    ``binding``, equal to the static import's; symbolic constants evaluate to its constants.
    Returns the number of symbolic dims met (so a test can see the import kept symbols)."""
    assert [n.kind for n in dynamic.nodes] == [n.kind for n in static.nodes]
    met = 0
    for a, b in zip(dynamic.nodes, static.nodes, strict=True):
        for va, vb in zip([*a.inputs, *a.outputs], [*b.inputs, *b.outputs], strict=True):
            assert (va is None) == (vb is None), a
            if va is None or vb is None:
                continue
            assert va.dtype == vb.dtype, (a, va)
            assert _at(va.shape, binding) == vb.shape, (a, va.name, va.shape, vb.shape, binding)
            met += sum(isinstance(d, Expr) for d in va.shape or ())
            assert (va.const is None) == (vb.const is None), (a, va.name)
            if va.const is not None and va.const.dtype == object:
                assert vb.const is not None
                got = np.array([evaluate(d, binding) for d in va.const.reshape(-1)])
                assert np.array_equal(got, vb.const.reshape(-1)), (a, va.name)
            elif va.const is not None:
                assert np.array_equal(va.const, vb.const), (a, va.name)
        assert set(a.attrs) == set(b.attrs), a
        for key, want in b.attrs.items():
            got = a.attrs[key]
            if isinstance(got, (list, tuple)) and any(isinstance(d, Expr) for d in got):
                got = list(_at(got, binding))
            assert np.array_equal(np.asarray(got, dtype=object), np.asarray(want, dtype=object)), (a, key)
    for va, vb in zip(dynamic.outputs, static.outputs, strict=True):
        assert _at(va.shape, binding) == vb.shape
    return met


# -- the models ------------------------------------------------------------------------------------
def _init(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(array, name)


# -- the imports keep symbols ----------------------------------------------------------------------
def test_ppocr_rec_imported_once_has_every_width_s_shapes() -> None:
    path = fetched_model("ppocrv4-rec")
    dynamic = import_model(path, {"x": (1, 3, 48, (32, 2048))})
    (name,) = dynamic.symbols
    assert dynamic.symbols[name] == (32, 2048) and name == "p2o_DynamicDimension_1"  # its dim_param
    assert dynamic.inputs[0].shape == (1, 3, 48, sym(name))
    for width in (160, 320, 640, 1280, 33, 2047):
        static = import_model(path, {"x": (1, 3, 48, width)})
        assert assert_same_as_static(dynamic, static, {name: width}) > 400
    assert str(dynamic.outputs[0].shape[1]) == f"({name}+3)//8"  # the sequence length the CTC reads


def test_ppocr_det_imported_once_has_the_static_shapes() -> None:
    path = fetched_model("ppocrv4-det")
    dynamic = import_model(path, {"x": (1, 3, (32, 1024), (32, 1024))})
    h, w = sorted(dynamic.symbols)
    for height, width in ((640, 640), (320, 960), (32, 1024)):
        static = import_model(path, {"x": (1, 3, height, width)})
        assert assert_same_as_static(dynamic, static, {h: height, w: width}) > 1000
    # the FPN adds an upsampled coarser map to a finer one and concatenates: equal at multiples of 32
    kinds = {n.name: n.op_type for n in dynamic.nodes}
    assert dynamic.assumptions and {kinds[name] for name, *_ in dynamic.assumptions} == {"Add", "Concat"}


@pytest.mark.parametrize("binding", [{"batch": 1, "seq": 1}, {"batch": 3, "seq": 77},
                                     {"batch": 8, "seq": 512}, {"batch": 2, "seq": 128}])
def test_bert_encoder_with_named_dims(binding: dict[str, int]) -> None:
    model = bert_model()
    dynamic = import_model(model, dims={"batch": (1, 8), "seq": (1, 512)})
    assert dynamic.symbols == {"batch": (1, 8), "seq": (1, 512)}
    assert [v.shape for v in dynamic.inputs] == [(sym("batch"), sym("seq"), 32), (sym("batch"), sym("seq"))]
    b, s = binding["batch"], binding["seq"]
    static = import_model(model, {"x": (b, s, 32), "mask": (b, s)})
    assert assert_same_as_static(dynamic, static, binding) > 50
    reshapes = [n for n in dynamic.nodes if n.op_type == "Reshape"]
    assert [sym("batch"), sym("seq"), 4, 8] in [n.attrs["shape"] for n in reshapes]  # the heads


@pytest.mark.parametrize("binding", [{"images_0": 1, "h": 320, "w": 640}, {"images_0": 8, "h": 640, "w": 320},
                                     {"images_0": 3, "h": 480, "w": 416}])
def test_yolo_fragment_with_ranged_image_dims(binding: dict[str, int]) -> None:
    model = yolo_model()
    dynamic = import_model(model, {"images": ((1, 8), 3, (320, 640), (320, 640))})
    symbols = dict(dynamic.symbols)
    assert symbols == {"b": (1, 8), "h": (320, 640), "w": (320, 640)}
    bound = {"b": binding["images_0"], "h": binding["h"], "w": binding["w"]}
    static = import_model(model, {"images": (bound["b"], 3, bound["h"], bound["w"])})
    assert assert_same_as_static(dynamic, static, bound) > 40
    out = dynamic.outputs[0].shape
    assert out[:2] == (sym("b"), 32)
    # the Concat after the upsample takes its first input's dims: 2*((h+15)//16), which is the
    # stride-8 map's (h+7)//8 at every size the model takes (multiples of 16)
    assert str(out[2]) == "4*((h+15)//16)*((w+15)//16)"
    assert evaluate(out[2], bound) == (bound["h"] // 8) * (bound["w"] // 8)
    # ... an equality the model needs, recorded for the runtime to check at each binding
    h, w = sym("h"), sym("w")
    assert dynamic.assumptions == [("Concat_18", 2 * ((h + 15) // 16), (h + 7) // 8),
                                   ("Concat_18", 2 * ((w + 15) // 16), (w + 7) // 8)]


# -- the interface ---------------------------------------------------------------------------------
def test_cli_parses_ranges() -> None:
    assert parse_shape("x=1x3x48x32..2048") == ("x", (1, 3, 48, (32, 2048)))
    assert parse_shape("images=1..8x3x320..640x320..640") == ("images", ((1, 8), 3, (320, 640), (320, 640)))
    assert parse_dim("seq=1..512") == ("seq", (1, 512))
    assert parse_dim("batch=4") == ("batch", 4)
    for bad in ("seq", "seq=1..", "seq=..5", "seq=a..b", "=1..2", "seq=-1..5"):
        with pytest.raises(Exception, match="expected PARAM=LO..HI"):
            parse_dim(bad)


def test_a_range_of_one_size_is_static_and_names_follow_dim_params() -> None:
    model = bert_model()
    graph = import_model(model, dims={"batch": (2, 2), "seq": 7})
    assert graph.symbols == {} and graph.inputs[0].shape == (2, 7, 32)
    graph = import_model(model, {"x": ((1, 4), (5, 9), 32), "mask": ((1, 4), (5, 9))}, dims={"batch": (1, 4)})
    assert graph.symbols == {"batch": (1, 4), "seq": (5, 9)}  # x and mask share both by dim_param
    assert graph.inputs[1].shape == (sym("batch"), sym("seq"))


@pytest.mark.parametrize(("shapes", "dims", "match"), [
    ({}, {"batch": (9, 2), "seq": 1}, r"--dim batch is 9\.\.2: LO is above HI"),
    ({}, {"batch": (-1, 2), "seq": 1}, r"--dim batch LO is -1, a negative size"),
    ({}, {"batch": (0, 2), "seq": 1}, r"--dim batch is 0\.\.2: a range starts at 1 or more"),
    ({}, {"batch": 1, "seq": 1, "tokens": (1, 9)}, r"--dim tokens: no graph input has a dim named 'tokens'"),
    ({"x": (1, 4, (2, 64))}, {"seq": 4}, r"input 'x' dim 2 is fixed at 32 by the model, --shape gives a "
                                         r"range 2\.\.64; e\.g\. --shape x=1x4x32"),
    ({"x": (1, (3, 9), 32)}, {"seq": (1, 512)}, r"input 'x' dim 1: --shape gives 3\.\.9, --dim seq gives "
                                                r"1\.\.512; give one of them"),
    ({"x": ((1, 2), 5, 32), "mask": ((1, 3), 5)}, {}, r"input 'mask' dim 0: range 1\.\.3, but dim_param "
                                                      r"'batch' is given 1\.\.2 on another input"),
    ({"x": (1, (9,), 32)}, {}, r"--shape for 'x': dim 1 is \(9,\): a range is \(LO, HI\), two sizes"),
])
def test_bad_ranges_are_shape_errors_naming_input_or_param(shapes: dict[str, Any], dims: dict[str, Any],
                                                          match: str) -> None:
    with pytest.raises(ShapeError, match=match):
        import_model(bert_model(), shapes, dims=dims)


def test_an_unbound_dim_is_still_an_error_with_a_hint() -> None:
    with pytest.raises(ShapeError, match=r"input 'mask' has an unknown dim: dim 1 \('seq'\);.*"
                                         r"--shape mask=1\.\.8x224"):
        import_model(bert_model(), {"x": ((1, 8), (1, 16), 32)}, dims={"batch": (1, 8)})


def test_static_compiles_record_ranges_of_one_size_as_given(tmp_path: Path) -> None:
    out = compile_model(bert_model(), tmp_path / "a", dims={"batch": 2, "seq": (5, 5)}, golden_cases=0)
    options = json.loads((out / "manifest.json").read_text())["options"]
    assert options["dims"] == {"batch": 2, "seq": [5, 5]} and options["shapes"] == {}
    out = compile_model(bert_model(), tmp_path / "b", shapes={"x": (2, 5, 32), "mask": (2, 5)},
                        golden_cases=0)
    assert "dims" not in json.loads((out / "manifest.json").read_text())["options"]


# -- one op at a time ------------------------------------------------------------------------------
def _i64(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def single_op_model(nodes: list[onnx.NodeProto], inits: dict[str, np.ndarray],
                    in_shape: tuple[Any, ...] = ("n", 4, 8, "w"), out_rank: int = 4) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "one", [helper.make_tensor_value_info("x", F, list(in_shape))],
                              [helper.make_tensor_value_info("y", F, [None] * out_rank)],
                              initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


N = helper.make_node
SLICE = ["x", "s", "e", "a"]
SQUARE = {"in_shape": ("n", 4, "w", "w")}
ONE = np.ones((1,), np.float32)
TAKES_SYMBOLS = {
    "Pad": ([N("Pad", ["x", "p"], ["y"])], {"p": _i64(0, 0, 1, 1, 0, 0, 1, 1)}, {}),
    "Slice to the end": ([N("Slice", SLICE, ["y"])], {"s": _i64(1), "e": _i64(2**62), "a": _i64(3)}, {}),
    "Slice clamped": ([N("Slice", SLICE, ["y"])], {"s": _i64(0), "e": _i64(16), "a": _i64(3)}, {}),
    "MaxPool": ([N("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])], {}, {}),
    "ConvTranspose": ([N("ConvTranspose", ["x", "k"], ["y"], strides=[2, 2])],
                      {"k": np.ones((4, 4, 3, 3), np.float32)}, {}),
    "Flatten": ([N("Flatten", ["x"], ["y"], axis=1)], {}, {"out_rank": 2}),
    "Flatten of a square": ([N("Flatten", ["x"], ["y"], axis=1)], {}, {"out_rank": 2, **SQUARE}),
    "ReduceSum": ([N("ReduceSum", ["x", "ax"], ["y"], keepdims=0)], {"ax": _i64(3)}, {"out_rank": 3}),
    "Tile": ([N("Tile", ["x", "r"], ["y"])], {"r": _i64(1, 1, 1, 2)}, {}),
    "Expand to a Shape": ([N("Shape", ["x"], ["s"]), N("Expand", ["c", "s"], ["y"])], {"c": ONE}, {}),
    "ConstantOfShape": ([N("Shape", ["x"], ["s"]), N("ConstantOfShape", ["s"], ["z"]),
                         N("Add", ["x", "z"], ["y"])], {}, {}),
    "torch expand_as (Equal / Where)": ([
        N("Shape", ["x"], ["s"]), N("Shape", ["s"], ["r"]),
        N("ConstantOfShape", ["r"], ["ones"], value=helper.make_tensor("v", I64, [1], [1])),
        N("Mul", ["ones", "m1"], ["neg"]), N("Equal", ["s", "neg"], ["eq"]),
        N("Where", ["eq", "ones", "s"], ["t"]), N("Expand", ["c", "t"], ["y"])],
        {"m1": _i64(-1), "c": ONE}, {}),
    "Gather along a symbolic axis": ([N("Gather", ["x", "i"], ["y"], axis=3)], {"i": _i64(0, 2)}, {}),
    "Resize by scales": ([N("Resize", ["x", "", "sc"], ["y"], mode="linear")],
                         {"sc": np.array([1, 1, 2, 2], np.float32)}, {}),
    "DepthToSpace": ([N("DepthToSpace", ["x"], ["y"], blocksize=2)], {}, {}),
    "Range over a float dim": ([N("Shape", ["x"], ["s"]), N("Gather", ["s", "i3"], ["w"]),
                                N("Cast", ["w"], ["wf"], to=F), N("Range", ["z", "wf", "o"], ["r"]),
                                N("Add", ["x", "r"], ["y"])],
                               {"i3": np.array(3, np.int64), "z": np.array(0, np.float32),
                                "o": np.array(1, np.float32)}, {}),
    "Einsum": ([N("Einsum", ["x", "x"], ["y"], equation="ncij,ncjk->ncik")], {}, SQUARE),
    "InstanceNormalization": ([N("InstanceNormalization", ["x", "sc", "b"], ["y"])],
                              {"sc": np.ones(4, np.float32), "b": np.zeros(4, np.float32)}, {}),
    "LSTM over a symbolic sequence": ([N("Squeeze", ["x", "ax"], ["xs"]),
                                       N("Transpose", ["xs"], ["xt"], perm=[2, 0, 1]),
                                       N("LSTM", ["xt", "W", "R"], ["y"], hidden_size=2)],
                                      {"ax": _i64(2), "W": np.ones((1, 8, 4), np.float32),
                                       "R": np.ones((1, 8, 2), np.float32)}, {"in_shape": ("n", 4, 1, "w")}),
}


# a result whose shape follows the symbols stays a node (a constant has one shape); at a static shape
# the import folds it when it is small (FOLD_MAX_BYTES), so only the shapes are compared
FOLDED_WHEN_STATIC = {"Expand to a Shape", "ConstantOfShape", "torch expand_as (Equal / Where)",
                      "Range over a float dim"}


@pytest.mark.parametrize("case", list(TAKES_SYMBOLS))
def test_ops_that_take_symbols_import_like_the_static_import(case: str) -> None:
    nodes, inits, extra = TAKES_SYMBOLS[case]
    model = single_op_model(nodes, inits, **extra)
    dynamic = import_model(model, dims={"n": (1, 4), "w": (8, 64)})
    assert any(isinstance(d, Expr) for d in dynamic.outputs[0].shape)
    for n, w in ((1, 8), (3, 13), (4, 64)):
        dims = extra.get("in_shape", ("n", 4, 8, "w"))
        static_shape = tuple(n if d == "n" else w if d == "w" else d for d in dims)
        static = import_model(model, {"x": static_shape})
        if case in FOLDED_WHEN_STATIC:  # a small result of a static shape is a constant there
            shapes = {v.name: v.shape for v in static.values()}
            met = [v for v in dynamic.values() if v.name in shapes]  # (the outputs, at least)
            assert "y" in {v.name for v in met}
            for value in met:
                assert _at(value.shape, {"n": n, "w": w}) == shapes[value.name], (case, value.name)
            continue
        assert_same_as_static(dynamic, static, {"n": n, "w": w})


def test_what_the_ranges_decide_is_folded() -> None:
    model = single_op_model(*TAKES_SYMBOLS["Slice to the end"][:2])
    dynamic = import_model(model, dims={"n": (1, 4), "w": (8, 64)})
    (node,) = dynamic.nodes
    assert node.attrs["starts"] == [1] and node.attrs["ends"] == [sym("w")]  # not min(1, w)


@pytest.mark.parametrize(("nodes", "inits"), [
    ([N("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1, count_include_pad=1,
        pads=[1, 1, 1, 1])], {}),
    ([N("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")], {}),
])
def test_ops_that_cannot_take_symbols_yet_name_the_node_and_dims(nodes: list[onnx.NodeProto],
                                                                 inits: dict[str, np.ndarray]) -> None:
    model = single_op_model(nodes, inits)
    op = nodes[0].op_type
    with pytest.raises(ShapeError, match=rf"node '{op}_0' \({op}\): its canonical form cannot take "
                                         r"symbolic dims yet .* it met 'x' shape \[n, 4, 8, w\]"):
        import_model(model, dims={"n": (1, 4), "w": (8, 64)})


_K = np.random.default_rng(3).standard_normal((4, 4, 3, 3)).astype(np.float32)


@pytest.mark.parametrize(("node", "inits"), [
    (N("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1), {}),
    (N("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1, pads=[1, 0, 1, 1]), {}),
    (N("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1, pads=[1, 1, 1, 1]), {}),
    (N("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], auto_pad="SAME_UPPER"), {}),
    (N("AveragePool", ["x"], ["y"], kernel_shape=[4, 4], auto_pad="SAME_LOWER"), {}),
    (N("Conv", ["x", "k"], ["y"], auto_pad="SAME_UPPER"), {"k": _K}),
], ids=["max-ceil", "max-ceil-pads", "avg-ceil-no-pad-count", "max-same", "avg-same-lower", "conv-same"])
def test_ceil_mode_and_stride_one_same_pads_take_symbols(node: onnx.NodeProto, inits: dict[str, np.ndarray],
                                                         tmp_path: Path) -> None:
    """Ceil mode where the padding never counts is floor mode with longer end pads at every size,
    and SAME pads at stride 1 do not depend on the size: both compile over run-time dims and match
    onnxruntime at sizes that end on a whole window and at sizes that do not."""
    ort = pytest.importorskip("onnxruntime")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F, [1, 4, "h", "w"])],
                              [helper.make_tensor_value_info("y", F, ["n", "c", "oh", "ow"])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    out = compile_model(model, tmp_path / "a", dims={"h": (5, 40), "w": (5, 40)}, cpu="x86-64-v3")
    session, reference = Session(out), ort.InferenceSession(model.SerializeToString())
    assert {s["provider"] for s in json.loads((out / "plan.json").read_text())["steps"]} == {"c"}
    for h, w in ((5, 5), (6, 9), (17, 40), (40, 24)):
        x = np.random.default_rng(h * w).standard_normal((1, 4, h, w)).astype(np.float32)
        got, want = session.run(None, {"x": x})[0], reference.run(None, {"x": x})[0]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_top_k_along_a_symbolic_axis_checks_k_at_the_binding(tmp_path: Path) -> None:
    """k above the range's low end is a size the model cannot take: an InputError naming the node
    at the binding, not a refused compile; k above its high end is refused at compile time."""
    ort = pytest.importorskip("onnxruntime")

    def model(k: int) -> onnx.ModelProto:
        graph = helper.make_graph([N("TopK", ["x", "k"], ["v", "i"], axis=1)], "g",
                                  [helper.make_tensor_value_info("x", F, [2, "n"])],
                                  [helper.make_tensor_value_info("v", F, [2, k]),
                                   helper.make_tensor_value_info("i", TensorProto.INT64, [2, k])],
                                  [numpy_helper.from_array(_i64(k), "k")])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    session = Session(compile_model(model(5), tmp_path / "a", dims={"n": (3, 40)}))
    reference = ort.InferenceSession(model(5).SerializeToString())
    for n in (5, 6, 40):
        x = np.random.default_rng(n).standard_normal((2, n)).astype(np.float32)
        for got, want in zip(session.run(None, {"x": x}), reference.run(None, {"x": x}), strict=True):
            np.testing.assert_array_equal(got, want)
    with pytest.raises(InputError, match=r"node 'TopK_0' needs min\(5,n\) == 5, but at n=4"):
        session.run(None, {"x": np.zeros((2, 4), np.float32)})
    with pytest.raises(ModelError, match=r"k = 41 is out of range for axis 1 of size n \(at most 40\)"):
        compile_model(model(41), tmp_path / "b", dims={"n": (3, 40)})


def test_fit_family() -> None:
    w, h = sym("W"), sym("H")
    probes = Probes({"W": (8, 64), "H": (1, 9)})
    bindings = probes.varied
    cases = [(lambda b: (b["W"] + 1) // 2, "(W+1)//2"), (lambda b: min(b["W"], 16), "min(16,W)"),
             (lambda b: 4 * b["W"] * b["H"], "4*H*W"), (lambda b: b["W"] * b["W"], "W*W"),
             (lambda b: b["W"] + 2 * b["H"] + 3, "2*H+W+3"), (lambda b: (b["W"] - 3) // 4 + 1, "(W+1)//4"),
             (lambda b: 7, 7)]
    for f, want in cases:
        got = fit([f(b) for b in bindings], [w, h], bindings)
        assert (str(got) if isinstance(got, Expr) else got) == want
    assert fit([b["W"] ** 3 + b["H"] for b in bindings], [w, h], bindings) is None
    again = Probes({"W": (8, 64), "H": (1, 9)})
    assert (again.varied, again.aligned) == (probes.varied, probes.aligned)  # seeded: every import alike


def test_a_node_the_ranges_hardly_fit_is_a_shape_error() -> None:
    reshape = single_op_model([N("Reshape", ["x", "s"], ["y"])], {"s": _i64(7, -1)}, ("n", "w"), 2)
    with pytest.raises(ShapeError, match=r"node 'Reshape_0' \(Reshape\): output 'y' dim 0 is no expression "
                                         r"of the symbols .* the node takes 2 of 32 probe sizes"):
        import_model(reshape, dims={"n": (1, 4), "w": (8, 64)})
    # (control flow over symbolic dims imports: tests/test_dynamic_control.py)


def test_a_node_no_probe_size_fits_is_a_shape_error_saying_so() -> None:
    reshape = single_op_model([N("Reshape", ["x", "s"], ["y"])], {"s": _i64(7, -1)}, ("n", "w"), 2)
    with pytest.raises(ShapeError, match=r"node 'Reshape_0' \(Reshape\): cannot infer a static shape for "
                                         r"output 'y' at any probe size of the symbols \(at n=1, w=8\): its "
                                         r"input shapes \(nxw, 2\) do not fit the op"):
        import_model(reshape, dims={"n": (1, 4), "w": (8, 13)})


def gpt_positions_model() -> onnx.ModelProto:
    """A decoder's prologue as exports write it: position ids and the causal mask are constants of the
    longest length, sliced to ``seq`` (``self.position_ids[:, :seq]``, ``bias[:, :, :seq, :seq]``)."""
    rng = np.random.default_rng(7)
    inits = [_init("pos_ids", np.arange(512, dtype=np.int64).reshape(1, 512)),
             _init("pos_table", rng.standard_normal((512, 16)).astype(np.float32)),
             _init("causal", np.tril(np.ones((512, 512), np.float32)).reshape(1, 1, 512, 512)),
             _init("ax1", _i64(1)), _init("zero", _i64(0)), _init("i1", np.array(1, np.int64)),
             _init("ax0", _i64(0)), _init("ax23", _i64(2, 3)), _init("zz", _i64(0, 0))]
    nodes = [N("Shape", ["x"], ["s"]), N("Gather", ["s", "i1"], ["seq"], axis=0),
             N("Unsqueeze", ["seq", "ax0"], ["seq1"]),
             N("Slice", ["pos_ids", "zero", "seq1", "ax1"], ["pid"]),
             N("Gather", ["pos_table", "pid"], ["pe"]), N("Add", ["x", "pe"], ["h"]),
             N("Concat", ["seq1", "seq1"], ["ss"], axis=0),
             N("Slice", ["causal", "zz", "ss", "ax23"], ["cm"]),
             N("Transpose", ["h"], ["ht"], perm=[0, 2, 1]), N("MatMul", ["h", "ht"], ["sc"]),
             N("Unsqueeze", ["sc", "ax1"], ["sc4"]), N("Mul", ["sc4", "cm"], ["y"])]
    graph = helper.make_graph(nodes, "gpt", [helper.make_tensor_value_info("x", F, ["b", "seq", 16])],
                              [helper.make_tensor_value_info("y", F, [None] * 4)], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_constants_sliced_to_a_symbolic_length() -> None:
    model = gpt_positions_model()
    dynamic = import_model(model, dims={"b": (1, 4), "seq": (1, 512)})
    slices = [n for n in dynamic.nodes if n.op_type == "Slice"]
    assert [n.attrs["ends"] for n in slices] == [[sym("seq")], [sym("seq"), sym("seq")]]  # min(512, seq)
    assert dynamic.outputs[0].shape == (sym("b"), 1, sym("seq"), sym("seq"))
    for b, seq in ((1, 1), (2, 77), (4, 512)):
        # (the static import folds the slices of constants: compare the values both have)
        static = {v.name: v.shape for v in import_model(model, {"x": (b, seq, 16)}).values()}
        met = [v for v in dynamic.values() if v.name in static]
        assert len(met) >= 5
        for value in met:
            assert _at(value.shape, {"b": b, "seq": seq}) == static[value.name], value.name


def test_shape_arithmetic_folds_into_a_symbolic_reshape_target() -> None:
    """Shape -> Gather -> Cast -> Div -> Cast, Sub, Mul, Squeeze, Unsqueeze, Concat: a Reshape of
    (n, 4, 8, w) into (n, 4, 8*2 - 0, w // 2) as an exporter computes it (an integer Div; a float
    one is fractional at odd widths, so it is not folded: docs/dynamic-shapes.md)."""
    nodes = [N("Shape", ["x"], ["s"]), N("Gather", ["s", "i0"], ["n"], axis=0),
             N("Gather", ["s", "i3"], ["w"], axis=0), N("Cast", ["w"], ["wf"], to=TensorProto.INT32),
             N("Div", ["wf", "twof"], ["hf"]), N("Cast", ["hf"], ["half"], to=I64),
             N("Gather", ["s", "i2"], ["h"], axis=0), N("Mul", ["h", "two"], ["h2"]),
             N("Sub", ["h2", "zero"], ["h3"]),
             N("Unsqueeze", ["n", "ax0"], ["n1"]), N("Unsqueeze", ["h3", "ax0"], ["h31"]),
             N("Unsqueeze", ["half", "ax0"], ["w1"]), N("Squeeze", ["four", "ax0"], ["four0"]),
             N("Unsqueeze", ["four0", "ax0"], ["four1"]),
             N("Concat", ["n1", "four1", "h31", "w1"], ["target"], axis=0),
             N("Reshape", ["x", "target"], ["y"])]
    inits = {"i0": np.array(0, np.int64), "i2": np.array(2, np.int64), "i3": np.array(3, np.int64),
             "twof": np.array(2, np.int32), "two": np.array(2, np.int64), "zero": np.array(0, np.int64),
             "ax0": _i64(0), "four": _i64(4)}
    model = single_op_model(nodes, inits)
    dynamic = import_model(model, dims={"n": (1, 4), "w": (8, 64)})
    (reshape,) = dynamic.nodes
    assert reshape.attrs["shape"] == [sym("n"), 4, 16, sym("w") // 2]
    # the element counts agree at even widths only: recorded for the runtime to check
    assert dynamic.assumptions == [("Reshape_15", 32 * sym("n") * sym("w"), 64 * sym("n") * (sym("w") // 2))]
    for n, w in ((1, 8), (3, 14), (4, 64)):  # (the model takes even widths)
        assert_same_as_static(dynamic, import_model(model, {"x": (n, 4, 8, w)}), {"n": n, "w": w})


def binary_model(op: str, b_dims: list[Any]) -> onnx.ModelProto:
    """``y = op(x, b)`` with ``x`` of dims ``[n, w]``."""
    x = helper.make_tensor_value_info("x", F, ["n", "w"])
    b = helper.make_tensor_value_info("b", F, b_dims)
    y = helper.make_tensor_value_info("y", F, [None, None])
    graph = helper.make_graph([N(op, ["x", "b"], ["y"])], "g", [x, b], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_inputs_that_must_agree_and_never_do_are_a_shape_error() -> None:
    model = binary_model("Add", ["n", 5])
    with pytest.raises(ShapeError, match=r"node 'Add_0' \(Add\): its inputs' dim 1 \(w and 5\) differ at "
                                         r"every size in the ranges"):
        import_model(model, dims={"n": (1, 4), "w": (8, 64)})
    assert import_model(model, dims={"n": (1, 4), "w": (1, 64)}).assumptions == []  # (w = 1 broadcasts)


def test_matmul_inner_dims_must_agree() -> None:
    model = binary_model("MatMul", ["v", 3])
    dynamic = import_model(model, dims={"n": (1, 4), "w": (8, 64), "v": (8, 64)})
    assert dynamic.assumptions == [("MatMul_0", sym("w"), sym("v"))]
    with pytest.raises(ShapeError, match=r"node 'MatMul_0' \(MatMul\): its inputs' inner dims \(w and v\) "
                                         r"differ at every size in the ranges"):
        import_model(model, dims={"n": (1, 4), "w": (8, 16), "v": (17, 64)})
