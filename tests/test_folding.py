"""Import-time folding (compiler/frontend/folding.py) and the errors for shapes that cannot be known.

The central case is the pads chain PyTorch's ``F.pad`` export writes (Silero VAD's STFT padding):
Constant -> ConstantOfShape -> Concat -> Reshape -> Slice (reversed) -> Transpose -> Reshape -> Cast
-> Pad. onnx's shape inference cannot see through the Transpose, so the Pad's output shape is known
only once the chain is folded; every node of the chain is evaluated at import, whatever its op.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler.frontend.folding import FOLD_MAX_BYTES
from compiler.frontend.folding import Knowledge
from compiler.frontend.folding import Producer
from compiler.frontend.folding import is_random
from compiler.frontend.importer import import_model
from compiler.ir.evaluate import evaluate
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.passes import optimize
from runtime.errors import ModelError
from runtime.errors import ShapeError
from tests.support.models import ort_run

F32 = np.float32
I64 = np.int64
INT64_MIN = np.iinfo(np.int64).min


def _const(name: str, array: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], name=name, value=numpy_helper.from_array(array))


def torch_pad_nodes(x: str, rank: int, pads_source: str | None = None) -> list[onnx.NodeProto]:
    """``F.pad(x, (128, 128), mode="reflect")`` as torch.onnx exports it (names as in Silero VAD).

    The pads (last axis first, begin/end pairs) are padded with zeros to all axes, put in ONNX order
    by a reversed Slice and a Transpose, flattened and cast. ``pads_source`` names a graph input
    holding the (128, 128) pair instead of the Constant.
    """
    p = "/stft/padding/"
    nodes = [] if pads_source else [_const(p + "Constant_1_output_0", np.array([128, 128], I64))]
    pair = pads_source or p + "Constant_1_output_0"
    nodes += [
        _const(p + "Constant_output_0", np.array([2 * rank - 2], I64)),
        helper.make_node("ConstantOfShape", [p + "Constant_output_0"], [p + "ConstantOfShape_output_0"],
                         name=p + "ConstantOfShape", value=numpy_helper.from_array(np.array([0], I64))),
        helper.make_node("Concat", [pair, p + "ConstantOfShape_output_0"], [p + "Concat_output_0"],
                         name=p + "Concat", axis=0),
        _const(p + "Constant_2_output_0", np.array([-1, 2], I64)),
        helper.make_node("Reshape", [p + "Concat_output_0", p + "Constant_2_output_0"],
                         [p + "Reshape_output_0"], name=p + "Reshape", allowzero=0),
        _const(p + "Constant_3_output_0", np.array([0], I64)),
        _const(p + "Constant_4_output_0", np.array([-1], I64)),
        _const(p + "Constant_5_output_0", np.array([INT64_MIN + 1], I64)),
        _const(p + "Constant_6_output_0", np.array([-1], I64)),
        helper.make_node("Slice",
                         [p + "Reshape_output_0", *(f"{p}Constant_{k}_output_0" for k in (4, 5, 3, 6))],
                         [p + "Slice_output_0"], name=p + "Slice"),
        helper.make_node("Transpose", [p + "Slice_output_0"], [p + "Transpose_output_0"],
                         name=p + "Transpose", perm=[1, 0]),
        _const(p + "Constant_7_output_0", np.array([-1], I64)),
        helper.make_node("Reshape", [p + "Transpose_output_0", p + "Constant_7_output_0"],
                         [p + "Reshape_1_output_0"], name=p + "Reshape_1", allowzero=0),
        helper.make_node("Cast", [p + "Reshape_1_output_0"], [p + "Cast_output_0"], name=p + "Cast",
                         to=TensorProto.INT64),
        helper.make_node("Pad", [x, p + "Cast_output_0"], ["y"], name=p + "Pad", mode="reflect"),
    ]
    return nodes


def pad_model(rank: int = 3, pads_source: str | None = None) -> onnx.ModelProto:
    shape = [1, 1, 576][-rank:]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)]
    if pads_source:
        inputs.append(helper.make_tensor_value_info(pads_source, TensorProto.INT64, [2]))
    # as exported: the Pad's output declared with symbolic dims
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a"] * rank)
    graph = helper.make_graph(torch_pad_nodes("x", rank, pads_source), "pad", inputs, [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])
    onnx.checker.check_model(model)
    return model


def _model(nodes: list[onnx.NodeProto], x: tuple[str, list[int]], y: tuple[str, list[object]],
           opset: int) -> onnx.ModelProto:
    """A float32 model with one input and one output."""
    float_info = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "folding", [float_info(x[0], TensorProto.FLOAT, x[1])],
                              [float_info(y[0], TensorProto.FLOAT, y[1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def kinds(graph: Graph) -> list[str]:
    return [node.kind for node in graph.nodes]


@pytest.mark.parametrize("rank", [2, 3])
def test_torch_pad_chain_folds_through_the_transpose(rank: int) -> None:
    model = pad_model(rank)
    # onnx's own inference cannot see through the chain: the Pad's shape is unknown without folding
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    dims = inferred.graph.output[0].type.tensor_type.shape.dim
    assert not all(d.HasField("dim_value") for d in dims)

    graph = import_model(model)
    assert kinds(graph) == ["Pad"]
    pad = graph.nodes[0]
    assert pad.attrs["pads"] == [0] * (rank - 1) + [128] + [0] * (rank - 1) + [128]
    assert graph.outputs[0].shape == (1, 1, 832)[-rank:]
    chain = [n.name for n in model.graph.node if n.op_type not in ("Constant", "Pad")]
    assert {graph.eliminated[name] for name in chain} == {"folded at import"}
    x = np.random.default_rng(0).standard_normal((1, 1, 576)[-rank:]).astype(F32)
    (want,) = ort_run(model, {"x": x})
    (got,) = evaluate(graph, {"x": x})
    np.testing.assert_array_equal(got, want)


def test_pads_from_a_graph_input_name_the_input_and_the_bind_that_fixes_it() -> None:
    model = pad_model(3, pads_source="pad_pair")
    with pytest.raises(ShapeError) as info:
        import_model(model)
    message = str(info.value)
    assert message.startswith("node '/stft/padding/Pad' (Pad): cannot infer a static shape for output 'y'")
    assert "depends on the value of input 1 ('/stft/padding/Cast_output_0')" in message
    assert "it comes from graph input 'pad_pair'" in message
    assert "--bind pad_pair=VALUES" in message
    # following the advice compiles, to the same graph as the constant pads
    graph = import_model(model, binds={"pad_pair": [128, 128]})
    assert kinds(graph) == ["Pad"] and graph.outputs[0].shape == (1, 1, 832)


def test_an_input_that_must_be_constant_names_its_graph_inputs() -> None:
    # Pad's shape does not depend on its fill value, so inference succeeds and the canonical form
    # asks (a run-time Clip bound no longer does: it becomes a Where, tests/test_clip_runtime.py)
    pads = numpy_helper.from_array(np.array([1, 1], np.int64), "pads")
    nodes = [helper.make_node("Neg", ["lo"], ["neg"], name="neg"),
             helper.make_node("Pad", ["x", "pads", "neg"], ["y"], name="pad")]
    graph = helper.make_graph(
        nodes, "pad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
                       helper.make_tensor_value_info("lo", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [6])], initializer=[pads])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(ModelError) as info:
        import_model(model)
    message = str(info.value)
    assert message.startswith("node 'pad' (Pad): input 2 (constant_value, 'neg') must be a constant")
    assert "it comes from graph input 'lo'" in message and "--bind lo=VALUES" in message
    assert kinds(import_model(model, binds={"lo": 1.0})) == ["Pad"]


def _reshape_by(shape_nodes: list[onnx.NodeProto], shape_name: str, x_shape: list[int]) -> onnx.ModelProto:
    nodes = [*shape_nodes, helper.make_node("Reshape", ["x", shape_name], ["y"], name="reshape")]
    return _model(nodes, ("x", x_shape), ("y", ["a", "b"]), 17)


def test_a_shape_from_a_result_over_the_cap_names_the_node_that_stayed() -> None:
    n = FOLD_MAX_BYTES // 8 + 1  # one int64 over the cap
    nodes = [
        _const("n", np.array([n], I64)),
        helper.make_node("ConstantOfShape", ["n"], ["ones"], name="big",
                         value=numpy_helper.from_array(np.array([1], I64))),
        helper.make_node("ReduceSum", ["ones"], ["total"], name="sum", keepdims=1),
        helper.make_node("Div", ["total", "total"], ["one"], name="div"),
        _const("minus1", np.array([-1], I64)),
        helper.make_node("Concat", ["one", "minus1"], ["target"], name="concat", axis=0),
    ]
    with pytest.raises(ShapeError) as info:
        import_model(_reshape_by(nodes, "target", [2, 3]))
    message = str(info.value)
    assert "node 'reshape' (Reshape)" in message and "input 1 ('target')" in message
    assert "node 'big' (ConstantOfShape) stays a node" in message
    assert f"({n * 8:,} bytes) are over the {FOLD_MAX_BYTES:,}-byte cap" in message
    assert "graph input" not in message


def _constant_chain(op: str, array: np.ndarray, out_shape: tuple[int, ...] | None = None,
                    **attrs: object) -> onnx.ModelProto:
    """y = x + op(c): op's input is a constant, so op folds when the rule allows."""
    shape = list(out_shape or array.shape)
    nodes = [_const("c", array), helper.make_node(op, ["c"], ["f"], name="op", **attrs),
             helper.make_node("Add", ["x", "f"], ["y"], name="add")]
    return _model(nodes, ("x", shape), ("y", shape), 17)


@pytest.mark.parametrize(("op", "attrs"),
                         [("Transpose", {"perm": [1, 0]}), ("Sin", {}), ("Softmax", {"axis": 1})])
def test_any_op_with_known_inputs_folds_not_only_shape_ops(op: str, attrs: dict) -> None:
    c = np.arange(12, dtype=F32).reshape(4, 3) / 7
    model = _constant_chain(op, c, (3, 4) if op == "Transpose" else None, **attrs)
    graph = import_model(model)
    assert kinds(graph) == ["Add"] and graph.eliminated["op"] == "folded at import"
    x = np.ones(graph.inputs[0].shape, F32)
    np.testing.assert_allclose(evaluate(graph, {"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-6)


def test_the_cap_is_on_result_bytes_and_the_level_1_pass_folds_past_it() -> None:
    at_cap = np.zeros((FOLD_MAX_BYTES // 4,), F32)
    assert kinds(import_model(_constant_chain("Sin", at_cap))) == ["Add"]
    over = np.zeros((FOLD_MAX_BYTES // 4 + 1,), F32)
    graph = import_model(_constant_chain("Sin", over))
    assert kinds(graph) == ["Sin", "Add"]  # -O0 keeps it: a node computes it at run time
    assert kinds(optimize(graph, 1)) == ["Add"]  # the level-1 pass trades weights bytes for time


def test_random_ops_are_never_evaluated_and_the_reason_is_kept() -> None:
    # onnx-aot runs no random op at all (the import refuses them), so the rule is checked directly
    c = Value("c", const=np.ones((2, 3), F32))
    out = Value("r", F32, (2, 3))
    proto = helper.make_node("RandomNormalLike", ["c"], ["r"], name="rnd", seed=1.0)
    knowledge = Knowledge([])
    assert knowledge.fold(proto, "rnd", [Node("RandomNormalLike", [c], [out], {"seed": 1.0})], [out]) is None
    assert knowledge.explain("r") == "node 'rnd' (RandomNormalLike) stays a node: a random op is never " \
        "evaluated at compile time"
    assert is_random("Bernoulli", []) and is_random("SomeOp", ["seed"]) and not is_random("Identity", [])


def test_dropout_folds_its_seed_unused() -> None:
    # inference Dropout is an Identity: the canonical form decides, not the ONNX op's seed attribute
    graph = import_model(_constant_chain("Dropout", np.ones((2, 3), F32), seed=2))
    assert kinds(graph) == ["Add"] and graph.eliminated["op"] == "folded at import"


def test_a_shape_known_only_after_an_upstream_fold_reaches_the_nodes_after_it() -> None:
    # onnx loses the shape at the Pad; the Relu and Reshape after it get theirs from the folded pads
    nodes = [*torch_pad_nodes("x", 3), helper.make_node("Relu", ["y"], ["r"], name="relu"),
             _const("flat", np.array([-1], I64)),
             helper.make_node("Reshape", ["r", "flat"], ["z"], name="flatten")]
    model = _model(nodes, ("x", [1, 1, 576]), ("z", ["n"]), 16)
    imported = import_model(model)
    assert kinds(imported) == ["Pad", "Relu", "Reshape"]
    assert [n.outputs[0].shape for n in imported.nodes] == [(1, 1, 832), (1, 1, 832), (832,)]


def test_explain_walks_past_known_values_to_graph_inputs_and_unrecorded_producers() -> None:
    # t = Mul(a, u) where a is a graph input and u comes from a node folding never saw (a data-dependent
    # If, say); s = Relu(t). Constants on the way are not listed: only what is unknown is followed.
    knowledge = Knowledge(["a", "b"])
    knowledge.stays(Producer("mul", "Mul", ("a", "u"), ""), ["t"])
    knowledge.stays(Producer("relu", "Relu", ("t",), ""), ["s"])
    assert knowledge.sources("s") == (["a"], [], ["u"])
    message = knowledge.explain("s")
    assert message.startswith("it comes from graph input 'a'; if its value is fixed for your use, make it a "
                              "constant with --bind a=VALUES")
    assert message.endswith("; 'u' comes from a node the folding does not evaluate")


def test_a_kernel_that_refuses_leaves_the_node_and_says_why() -> None:
    # GatherElements with an out-of-range constant index: the reference kernel raises, so the node stays
    # (to fail at run time, as onnxruntime does) and the reason is kept for the messages
    data = Value("data", const=np.arange(4, dtype=F32))
    index = Value("index", const=np.array([7], I64))
    out = Value("g", F32, (1,))
    proto = helper.make_node("GatherElements", ["data", "index"], ["g"], name="gather")
    knowledge = Knowledge([])
    assert knowledge.fold(proto, "gather", [Node("GatherElements", [data, index], [out], {"axis": 0})],
                          [out]) is None
    why = knowledge.explain("g")
    assert why.startswith("node 'gather' (GatherElements) stays a node: evaluating it failed (")


def test_a_shape_through_a_run_time_if_names_the_graph_input_of_its_condition() -> None:
    def branch(name: str, target: list[int]) -> onnx.GraphProto:
        out = helper.make_tensor_value_info(f"{name}_shape", TensorProto.INT64, [2])
        return helper.make_graph([_const(f"{name}_shape", np.array(target, I64))], name, [], [out])

    nodes = [helper.make_node("If", ["flag"], ["target"], name="choose", then_branch=branch("wide", [2, 6]),
                              else_branch=branch("tall", [6, 2])),
             helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape")]
    graph = helper.make_graph(nodes, "if", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [12]),
                                            helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ShapeError) as info:
        import_model(model)
    message = str(info.value)
    assert message.startswith("node 'reshape' (Reshape): cannot infer a static shape for output 'y': it "
                              "depends on the value of input 1 ('target')")
    assert "it comes from graph input 'flag'" in message and "--bind flag=VALUES" in message
    assert import_model(model, binds={"flag": True}).outputs[0].shape == (2, 6)


def test_input_shapes_that_do_not_fit_the_op_are_named_as_the_cause() -> None:
    # the Concat's second input gets its shape only once a Transpose chain is folded (onnx's own
    # inference cannot see it); the two inputs then differ off the axis, as PP-OCRv4 rec does at a
    # height other than 48: the error says so instead of blaming the inputs' values
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Transpose", ["dims"], ["dims_t"], perm=[1, 0]),
             helper.make_node("Reshape", ["dims_t", "flat"], ["target"]),
             helper.make_node("Reshape", ["b", "target"], ["b3"]),
             helper.make_node("Relu", ["a"], ["ra"]),
             helper.make_node("Concat", ["ra", "b3"], ["y"], axis=2, name="cat")]
    graph = helper.make_graph(
        nodes, "g", [vi("a", TensorProto.FLOAT, [1, 2, 4]), vi("b", TensorProto.FLOAT, [12])],
        [vi("y", TensorProto.FLOAT, ["p", "q", "r"])],
        [numpy_helper.from_array(np.array([[1, 3, 4]], np.int64), "dims"),
         numpy_helper.from_array(np.array([-1], np.int64), "flat")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ShapeError) as info:
        import_model(model)
    message = str(info.value)
    assert "node 'cat' (Concat): cannot infer a static shape for output 'y'" in message
    assert "its input shapes (1x2x4, 1x3x4) do not fit the op" in message
    assert "--bind" not in message and "check the --shape sizes" in message
