"""One meaning for unknown dims (compiler/frontend/dims.py, loader.bind_input_shapes, cli --shape).

A ``dim_param``, a dim with no value and a negative ``dim_value`` (PaddlePaddle's -1) are all
unknown, and ``--shape`` / ``shapes=`` binds any of them; ``dim_value: 0`` is a real zero (an empty
tensor). An unbound unknown dim is one error for all such inputs, ending in ``--shape`` text that
compiles when pasted as it is.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler.driver import compile_model
from compiler.frontend.dims import known_size
from compiler.frontend.dims import placeholders
from compiler.frontend.dims import shape_arg
from compiler.frontend.importer import import_model
from compiler.frontend.loader import bind_input_shapes
from compiler.frontend.loader import bind_input_values
from runtime import Session
from runtime.errors import ModelError
from runtime.errors import ShapeError
from tests.support.commands import cli
from tests.support.models import ort_run

F = TensorProto.FLOAT
UNKNOWN = {"dim_param": "N", "missing": None, "minus_one": -1}


def add_model(x_dims: list[Any], w_dims: tuple[int, ...] = (3,), *,
              value_info: list[Any] | None = None, out_dims: list[Any] | None = None) -> onnx.ModelProto:
    """y = relu(x + w): ``x`` declared with ``x_dims``; ``value_info`` / ``out_dims`` declare the
    intermediate ``s`` and the output ``y`` as an exporter might (None: the output's rank only)."""
    w = numpy_helper.from_array(np.arange(np.prod(w_dims), dtype=np.float32).reshape(w_dims), "w")
    nodes = [helper.make_node("Add", ["x", "w"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    infos = [helper.make_tensor_value_info("s", F, value_info)] if value_info is not None else []
    out = out_dims if out_dims is not None else [f"o{k}" for k in range(len(x_dims))]
    graph = helper.make_graph(nodes, "dims", [helper.make_tensor_value_info("x", F, x_dims)],
                              [helper.make_tensor_value_info("y", F, out)], initializer=[w],
                              value_info=infos)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def pasted(message: str) -> list[str]:
    """The ``--shape`` arguments a message ends with, as a shell would split them."""
    assert "): --shape " in message, message
    return shlex.split(message.rsplit("): ", 1)[1])


def check_runs(out: Path, model: onnx.ModelProto, shape: tuple[int, ...]) -> None:
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    got = Session(out).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, ort_run(model, {"x": x})[0], rtol=1e-6)


# -- what a dim means --------------------------------------------------------------------------
def test_a_dim_param_no_value_and_a_negative_value_are_unknown_zero_is_a_size() -> None:
    info = helper.make_tensor_value_info("x", F, ["N", None, -1, 0, 5])
    assert [known_size(d) for d in info.type.tensor_type.shape.dim] == [None, None, None, 0, 5]


@pytest.mark.parametrize(("sizes", "want"), [
    ((None, 3, None, None), (1, 3, 224, 224)),  # PP-OCR det: -1x3x?x?
    ((None, 3, 48, None), (1, 3, 48, 48)),      # PP-OCR rec: a known spatial dim is copied
    ((2, None, 8, 8), (2, 3, 8, 8)),            # channels
    ((None, None, 7), (1, 224, 7)),             # a sequence
    ((None,), (1,)),
    ((None, 3, None, 16, None), (1, 3, 16, 16, 16)),
])
def test_placeholders(sizes: tuple[int | None, ...], want: tuple[int, ...]) -> None:
    assert placeholders(sizes) == want


def test_a_named_dim_gets_one_placeholder_across_inputs() -> None:
    chosen: dict[str, int] = {}
    assert placeholders((None, None), ("batch", "seq"), chosen) == (1, 224)
    assert placeholders((4, None, None), ("", "batch", "seq"), chosen) == (4, 1, 224)
    assert placeholders((None, None), ("?", "?")) == (1, 224)  # PaddlePaddle's '?' names no dim


def test_shape_arg_quotes_names_a_shell_would_split() -> None:
    assert shape_arg("x", (1, 3)) == "--shape x=1x3"
    assert shlex.split(shape_arg("my input", (2,))) == ["--shape", "my input=2"]


# -- binding -------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", sorted(UNKNOWN))
def test_shapes_bind_every_kind_of_unknown_dim(kind: str) -> None:
    graph = import_model(add_model([UNKNOWN[kind], 3]), {"x": (5, 3)})
    assert graph.inputs[0].shape == (5, 3) and graph.outputs[0].shape == (5, 3)


@pytest.mark.parametrize("kind", sorted(UNKNOWN))
def test_an_unbound_unknown_dim_names_input_dim_and_label(kind: str) -> None:
    with pytest.raises(ShapeError) as info:
        import_model(add_model([UNKNOWN[kind], 3]))
    label = {"dim_param": "'N'", "missing": "no value", "minus_one": "-1"}[kind]
    message = str(info.value)
    assert f"input 'x' has an unknown dim: dim 0 ({label})" in message
    assert pasted(message) == ["--shape", "x=1x3"]


def test_negative_dims_the_model_declares_inside_are_unknown_too() -> None:
    # what onnx's shape inference writes into value_info for a PaddlePaddle model run unbound
    model = add_model([-1, 3], value_info=[-1, 3], out_dims=[-1, 3])
    graph = import_model(model, {"x": (4, 3)})
    assert graph.outputs[0].shape == (4, 3)
    assert all(v.shape is not None and -1 not in v.shape for v in graph.values())


@pytest.mark.parametrize("binds", [{"c": True}, None])
def test_negative_dims_declared_in_subgraphs_are_unknown_too(tmp_path: Path,
                                                            binds: dict[str, Any] | None) -> None:
    # onnx refused its inferred size 2 against the branch output's declared -1
    def branch(op: str) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node(op, ["x"], ["o"])], op, [],
                                 [helper.make_tensor_value_info("o", F, [-1, 3])])

    node = helper.make_node("If", ["c"], ["y"], then_branch=branch("Relu"), else_branch=branch("Neg"))
    graph = helper.make_graph([node], "if", [helper.make_tensor_value_info("x", F, [-1, 3]),
                                             helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", F, [-1, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    out = compile_model(model, tmp_path / "a", shapes={"x": (2, 3)}, binds=binds, golden_cases=0)
    x = np.array([[1, -2, 3], [-4, 5, -6]], np.float32)
    feeds = {"x": x} if binds else {"x": x, "c": np.array(True)}
    np.testing.assert_array_equal(Session(out).run(None, feeds)[0], np.maximum(x, 0))


def test_bind_reads_a_negative_dim_as_unknown() -> None:
    shape_in = helper.make_tensor_value_info("shape", TensorProto.INT64, [-1])
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], "r",
                              [helper.make_tensor_value_info("x", F, [2, 6]), shape_in],
                              [helper.make_tensor_value_info("y", F, ["a", "b"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    bound = bind_input_values(model, {"shape": [3, 4]})
    assert numpy_helper.to_array(bound.graph.initializer[0]).tolist() == [3, 4]
    assert import_model(model, binds={"shape": [3, 4]}).outputs[0].shape == (3, 4)


def test_every_unbound_input_is_in_one_error_with_consistent_placeholders() -> None:
    nodes = [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Add", ["s", "c"], ["y"])]
    inputs = [helper.make_tensor_value_info("a", F, ["batch", "seq"]),
              helper.make_tensor_value_info("b", F, ["batch", -1]),
              helper.make_tensor_value_info("c", F, [1, None])]
    graph = helper.make_graph(nodes, "three", inputs, [helper.make_tensor_value_info("y", F, ["p", "q"])])
    with pytest.raises(ShapeError) as info:
        import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    message = str(info.value)
    assert message.startswith("3 inputs have unknown dims: 'a' dim 0 ('batch'), dim 1 ('seq'); "
                              "'b' dim 0 ('batch'), dim 1 (-1); 'c' dim 1 (no value)")
    assert pasted(message) == ["--shape", "a=1x224", "--shape", "b=1x224", "--shape", "c=1x224"]


def test_an_input_without_a_shape_needs_every_dim() -> None:
    # the ONNX checker refuses such a graph input; bind_input_shapes runs on any proto
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "noshape",
                              [helper.make_tensor_value_info("a", F, None),
                               helper.make_tensor_value_info("b", F, ["n", 4])],
                              [helper.make_tensor_value_info("y", F, ["n", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ShapeError) as info:
        bind_input_shapes(model, None)
    message = str(info.value)
    assert message.startswith("2 inputs have unknown dims: 'a' no shape (not even a rank); 'b' dim 0 ('n'); "
                              "give every dim of 'a' with --shape NAME=D0xD1x...")
    assert pasted(message) == ["--shape", "b=1x4"]
    bound = bind_input_shapes(model, {"a": (2, 4), "b": (2, 4)})
    dims = [[d.dim_value for d in i.type.tensor_type.shape.dim] for i in bound.graph.input]
    assert dims == [[2, 4], [2, 4]]


@pytest.mark.parametrize(("shapes", "match"), [
    ({"x": (2, 4)}, r"input 'x' dim 1 is fixed at 3 by the model, --shape gives 4; e\.g\. --shape x=2x3$"),
    ({"x": (2, 3, 1)}, r"input 'x' has rank 2 \(\['N', 3\]\) but --shape gives 3 dims; e\.g\. --shape x=1x3"),
    ({"z": (2, 3)}, r"--shape names no graph input: z \(inputs: x\)"),
    ({"x": (2, 3), "w": (3,)}, r"no graph input: w \(inputs: x\); 'w' is a constant"),
    ({"x": (-1, 3)}, r"--shape for 'x': dim 0 is -1, a negative size"),
    ({"x": ("N", 3)}, r"--shape for 'x': dim 0 is 'N', not a number"),
    ({"x": (2.0, 3)}, r"dim 0 is 2\.0, not a number"),
])
def test_a_bad_binding_says_what_and_where(shapes: dict[str, Any], match: str) -> None:
    with pytest.raises(ShapeError, match=match):
        import_model(add_model(["N", 3]), shapes)


def test_numpy_integers_are_sizes(tmp_path: Path) -> None:
    assert import_model(add_model(["N", 3]), {"x": np.array([2, 3])}).inputs[0].shape == (2, 3)
    out = compile_model(add_model(["N", 3]), tmp_path / "a", shapes={"x": np.array([2, 3])}, golden_cases=0)
    assert json.loads((out / "manifest.json").read_text())["options"]["shapes"] == {"x": [2, 3]}


# -- zero is a size: empty tensors ----------------------------------------------------------------
def test_a_zero_dim_is_a_real_zero_and_a_contradiction_when_bound_otherwise() -> None:
    assert import_model(add_model([0, 3])).inputs[0].shape == (0, 3)
    with pytest.raises(ShapeError, match="dim 0 is fixed at 0 by the model, --shape gives 2"):
        import_model(add_model([0, 3]), {"x": (2, 3)})


def conv_model(channels: int) -> onnx.ModelProto:
    w = np.random.default_rng(1).standard_normal((channels, channels, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Concat", ["r", "x"], ["y"], axis=1)]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", F, ["N", channels, 8, 8])],
                              [helper.make_tensor_value_info("y", F, ["N", 2 * channels, 8, 8])],
                              initializer=[numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(("channels", "opt_level"), [(4, 0), (4, 3), (16, 3)])
def test_a_node_whose_outputs_are_empty_is_a_constant(tmp_path: Path, channels: int, opt_level: int) -> None:
    # at -O3 the 4-channel conv was an NHWC conv whose C kernel's tiling divided by zero pixels, the
    # 16-channel one a Winograd conv; an empty result needs no kernel at all
    model = conv_model(channels)
    graph = import_model(model, {"x": (0, channels, 8, 8)})
    assert not graph.nodes and set(graph.eliminated.values()) == {"empty tensor"}
    out = compile_model(model, tmp_path / "a", opt_level=opt_level, shapes={"x": (0, channels, 8, 8)},
                        golden_cases=0)
    y = Session(out).run(None, {"x": np.zeros((0, channels, 8, 8), np.float32)})[0]
    assert y.shape == (0, 2 * channels, 8, 8)


def test_an_empty_slice_is_a_constant() -> None:
    inits = [numpy_helper.from_array(np.array([k], np.int64), n) for n, k in (("s", 0), ("e", 0), ("a", 0))]
    graph = helper.make_graph([helper.make_node("Slice", ["x", "s", "e", "a"], ["y"], name="slice")], "s",
                              [helper.make_tensor_value_info("x", F, [4, 6])],
                              [helper.make_tensor_value_info("y", F, [0, 6])], initializer=inits)
    imported = import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    assert not imported.nodes and imported.eliminated == {"slice": "empty tensor"}
    assert imported.outputs[0].shape == (0, 6)


def test_a_softmax_over_an_empty_axis_is_empty(tmp_path: Path) -> None:
    # the reference kernel's max over the empty axis failed at run time
    graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"])], "s",
                              [helper.make_tensor_value_info("x", F, [3, 0])],
                              [helper.make_tensor_value_info("y", F, [3, 0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    out = compile_model(model, tmp_path / "a", golden_cases=0)
    assert Session(out).run(None, {"x": np.zeros((3, 0), np.float32)})[0].shape == (3, 0)


def test_a_split_with_an_empty_piece_runs_and_matches(tmp_path: Path) -> None:
    nodes = [helper.make_node("Split", ["x", "sizes"], ["a", "b"], axis=1),
             helper.make_node("Relu", ["b"], ["y"])]
    graph = helper.make_graph(nodes, "split", [helper.make_tensor_value_info("x", F, [2, 4])],
                              [helper.make_tensor_value_info("a", F, [2, 0]),
                               helper.make_tensor_value_info("y", F, [2, 4])],
                              initializer=[numpy_helper.from_array(np.array([0, 4], np.int64), "sizes")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    out = compile_model(model, tmp_path / "a", golden_cases=0)
    steps = json.loads((out / "plan.json").read_text())["steps"]
    assert {s["op_type"] for s in steps} == {"Split", "Relu"}
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    for got, want in zip(Session(out).run(None, {"x": x}), ort_run(model, {"x": x}), strict=True):
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)


# -- the command line ------------------------------------------------------------------------------
def test_the_hint_is_pasteable_for_every_kind_of_unknown_dim(tmp_path: Path) -> None:
    model = add_model(["N", 3, None, -1], w_dims=(1, 1, 1))
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    result = cli("compile", str(path), "-o", str(tmp_path / "a"), ok=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    message = result.stderr.strip().splitlines()[-1]
    assert "input 'x' has unknown dims: dim 0 ('N'), dim 2 (no value), dim 3 (-1)" in message
    args = pasted(message)
    assert args == ["--shape", "x=1x3x224x224"]
    cli("compile", str(path), "-o", str(tmp_path / "a"), "-q", "--golden-cases", "0", *args)
    check_runs(tmp_path / "a", model, (1, 3, 224, 224))


@pytest.mark.parametrize(("arg", "said"), [
    ("image=Nx3x32x32", "dim 0 is 'N', not a number; every dim must be a number >= 0 (the size to "
                        "compile for), e.g. --shape image=1x3x32x32"),
    ("x=-1x3x48x-1", "dim 0 is '-1', a negative size; every dim must be a number >= 0 (the size to "
                     "compile for), e.g. --shape x=1x3x48x48"),
    ("x=2x3.5", "dim 1 is '3.5', not a number"),
])
def test_a_shape_that_is_not_numbers_is_a_usage_error(tmp_path: Path, arg: str, said: str) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(add_model(["N", 3]), path)
    result = cli("compile", str(path), "-o", str(tmp_path / "a"), "--shape", arg, ok=False)
    assert result.returncode == 2 and said in result.stderr and "Traceback" not in result.stderr


def test_cli_binds_a_paddle_style_minus_one_and_names_contradictions(tmp_path: Path) -> None:
    model = add_model([-1, 3], value_info=[-1, 3], out_dims=[-1, 3])
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    result = cli("compile", str(path), "-o", str(tmp_path / "a"), "--shape", "x=2x4", ok=False)
    assert result.returncode == 1
    assert "input 'x' dim 1 is fixed at 3 by the model, --shape gives 4; e.g. --shape x=2x3" in result.stderr
    result = cli("compile", str(path), "-o", str(tmp_path / "a"), "--shape", "x=1x3", "--shape", "y=1x3",
                 ok=False)
    assert result.returncode == 1 and "--shape names no graph input: y (inputs: x)" in result.stderr
    cli("compile", str(path), "-o", str(tmp_path / "a"), "-q", "--golden-cases", "0", "--shape", "x=2x3")
    check_runs(tmp_path / "a", model, (2, 3))


def test_sizes_the_model_cannot_take_are_shape_errors_at_compile_time() -> None:
    # models often hard-code what follows their input size: AlexNet's Reshape to 9216 (= 256x6x6 at
    # 224) and ResNet's final 7x7 average pool; at a smaller --shape both are refused naming the node
    from tests.support.zoo import zoo_model

    for name, size, expect in (("bvlc_alexnet", 64, r"cannot reshape \(1, 256, 1, 1\) \(256 elements\) "
                                                    r"into \(1, 9216\)"),
                               ("resnet50", 192, r"\(AveragePool\): the window does not fit the input: "
                                                 r"spatial input \(6, 6\) gives output sizes \(0, 0\)")):
        model = zoo_model(name)
        for dim in model.graph.input[0].type.tensor_type.shape.dim[2:]:
            dim.dim_param = "side"
        with pytest.raises(ModelError, match=expect):
            import_model(model, shapes={model.graph.input[0].name: (1, 3, size, size)})
