"""Runtime behaviour a deploy-time caller relies on: feed checks, odd arrays, unsupported ops,
determinism of artifacts, a runtime that imports without the compiler's dependencies."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler import compile_model
from runtime import Session
from runtime.errors import InputError
from runtime.errors import ModelError
from runtime.errors import OnnxAotError
from runtime.errors import UnsupportedOpError
from tests.support.models import ort_run
from tests.support.models import small_model

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[onnx.ModelProto, Session]:
    model = small_model()
    return model, Session(compile_model(model, tmp_path_factory.mktemp("small") / "art"))


def test_small_model_matches_onnxruntime(small) -> None:
    model, session = small
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(session.run(None, {"x": x})[0], ort_run(model, {"x": x})[0],
                               rtol=1e-4, atol=1e-5)
    assert [s.name for s in session.inputs] == ["x"]
    assert session.outputs[0].shape == (1, 10) and session.outputs[0].dtype == np.float32


class Exploding:
    """Stands in for every partition: a feed check must fail before any kernel runs."""

    def __getattr__(self, name: str):  # noqa: ANN204
        raise AssertionError("a kernel ran before the feeds were checked")


@pytest.mark.parametrize("feeds, culprit", [
    ({}, "x"),
    ({"x": np.zeros((1, 3, 8, 8), np.float32), "extra": np.zeros(1)}, "extra"),
    ({"x": np.zeros((1, 3, 8, 8), np.float64)}, "x"),
    ({"x": np.zeros((1, 3, 8, 9), np.float32)}, "x"),
    ({"x": np.zeros((3, 8, 8), np.float32)}, "x"),
])
def test_bad_feeds_raise_input_error_naming_the_input(small, feeds, culprit) -> None:
    _, session = small
    saved = list(session._partitions)
    session._partitions[:] = [("c", Exploding())] * len(saved)  # (the static bound plan's list)
    try:
        with pytest.raises(InputError, match=repr(culprit)):
            session.run(None, feeds)
    finally:
        session._partitions[:] = saved


def test_unknown_output_name(small) -> None:
    _, session = small
    with pytest.raises(InputError, match="nope"):
        session.run(["nope"], {"x": np.zeros((1, 3, 8, 8), np.float32)})


def test_non_contiguous_and_read_only_feeds(small) -> None:
    _, session = small
    base = np.random.default_rng(2).standard_normal((1, 3, 8, 16)).astype(np.float32)
    strided = base[..., ::2]
    assert not strided.flags.c_contiguous
    expected = session.run(None, {"x": np.ascontiguousarray(strided)})[0]
    np.testing.assert_array_equal(session.run(None, {"x": strided})[0], expected)
    frozen = np.ascontiguousarray(strided)
    frozen.setflags(write=False)
    np.testing.assert_array_equal(session.run(None, {"x": frozen})[0], expected)
    fortran = np.asfortranarray(np.ascontiguousarray(strided))
    np.testing.assert_array_equal(session.run(None, {"x": fortran})[0], expected)


def test_not_onnx_file_is_a_clear_error(tmp_path) -> None:
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"this is not a protobuf \x00\xff\x10\x99" * 10)
    with pytest.raises(ModelError, match="model.onnx"):
        compile_model(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(ModelError, match="no such model file"):
        compile_model(tmp_path / "missing.onnx", tmp_path / "out")


def test_unsupported_ops_listed_in_one_message(tmp_path) -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="ok_relu"),
        helper.make_node("FancyOp", ["a"], ["b"], name="custom_one", domain="com.example"),
        helper.make_node("Warp", ["b"], ["c"], name="hardmax_node", domain="com.example"),
        helper.make_node("Relu", ["c"], ["y"], name="ok_relu2"),
    ]
    graph = helper.make_graph(
        nodes, "unsupported",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                    helper.make_opsetid("com.example", 1)])
    with pytest.raises(UnsupportedOpError) as info:
        compile_model(model, tmp_path / "out")
    message = str(info.value)
    assert "custom_one" in message and "FancyOp" in message
    assert "hardmax_node" in message and "com.example.Warp" in message
    assert "ok_relu" not in message
    assert {name for name, _ in info.value.nodes} == {"custom_one", "hardmax_node"}
    assert not (tmp_path / "out").exists()


def test_op_only_the_reference_provider_has_runs(tmp_path) -> None:
    # Trilu has no C kernel: the reference provider takes it, the rest stays in C.
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Trilu", ["a"], ["m"], upper=1, name="mean"),
        helper.make_node("Sub", ["a", "m"], ["y"], name="sub"),
    ]
    graph = helper.make_graph(
        nodes, "mixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)
    session = Session(compile_model(model, tmp_path / "out"))
    providers = {r.provider for r in session.plan.onnx_nodes.values() if r.provider is not None}
    assert "reference" in providers
    x = np.random.default_rng(3).standard_normal((3, 5)).astype(np.float32)
    np.testing.assert_allclose(session.run(None, {"x": x})[0], ort_run(model, {"x": x})[0],
                               rtol=1e-5, atol=1e-6)


def test_compiling_twice_is_byte_identical(tmp_path) -> None:
    model = small_model()
    a = compile_model(model, tmp_path / "a")
    b = compile_model(model, tmp_path / "b")
    files_a = sorted(p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file())
    assert files_a == files_b
    assert any(f.endswith(".so") for f in files_a)
    assert "kernels/cpu/model.h" in files_a  # the C header is deterministic too
    for rel in files_a:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel


def test_recompile_replaces_an_artifact_and_refuses_foreign_folders(tmp_path) -> None:
    model = small_model()
    out = compile_model(model, tmp_path / "art")
    compile_model(model, out)  # replacing an artifact is fine
    Session(out)
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "cat.jpg").write_bytes(b"meow")
    with pytest.raises(OnnxAotError, match="not overwriting"):
        compile_model(model, foreign)
    assert (foreign / "cat.jpg").read_bytes() == b"meow"


def test_runtime_imports_without_compiler_dependencies(small) -> None:
    _, session = small
    script = textwrap.dedent(f"""
        import sys, importlib.abc
        BLOCKED = ("onnx", "onnxruntime", "networkx", "jinja2", "compiler")
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError("blocked: " + name)
                return None
        sys.meta_path.insert(0, Block())
        sys.path.insert(0, {str(REPO)!r})
        import numpy as np
        import runtime
        s = runtime.Session({str(session.path)!r})
        y = s.run(None, {{"x": np.ones((1, 3, 8, 8), np.float32)}})[0]
        assert y.shape == (1, 10)
        from runtime.inspection import format_text, inspect_artifact  # onnx-aot inspect's text
        assert "arena host" in format_text(inspect_artifact({str(session.path)!r}))
        assert s.verify().ok  # the golden self-test
        assert not [m for m in sys.modules if m.split(".")[0] in BLOCKED], "leaked import"
        print("ok", [p.provider for p in s.plan.partitions])
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "ok" in result.stdout and "'c'" in result.stdout


def test_concat_in_place_end_to_end(tmp_path) -> None:
    # A DenseNet-like chain: every Concat output feeds the next Concat, and one piece is read
    # again after its Concat. Inputs are produced straight into their slices (NCHW: -O2; in
    # NHWC a channel slice is strided and the Concat copies).
    rng = np.random.default_rng(5)
    inits, nodes, prev = [], [], "x"
    for k in range(3):
        w = numpy_helper.from_array((rng.standard_normal((2, 2 + 2 * k, 3, 3)) * 0.3).astype(np.float32),
                                    f"w{k}")
        inits.append(w)
        nodes += [helper.make_node("Conv", [prev, f"w{k}"], [f"f{k}"], pads=[1, 1, 1, 1], name=f"conv{k}"),
                  helper.make_node("Relu", [f"f{k}"], [f"r{k}"], name=f"relu{k}"),
                  helper.make_node("Concat", [prev, f"r{k}"], [f"y{k}"], axis=1, name=f"cat{k}")]
        prev = f"y{k}"
    nodes.append(helper.make_node("Add", ["y2", "y2"], ["z"], name="double"))
    nodes.append(helper.make_node("ReduceSum", ["r0"], ["s"], axes=[1], keepdims=1, name="late_reader"))
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 5])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 8, 5, 5]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, 1, 5, 5])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=8)
    session = Session(compile_model(model, tmp_path / "art", opt_level=2))
    in_place = {b.id: list(b.values) for b in session.plan.buffers}
    assert any("y0" in values and "y2" in values for values in in_place.values()), in_place
    x = rng.standard_normal((1, 2, 5, 5)).astype(np.float32)
    for got, want in zip(session.run(None, {"x": x}), ort_run(model, {"x": x}), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
