"""Control flow with run-time lengths (issue 17, item 4; docs/dynamic-shapes.md, "Control flow").

- A Scan over a dynamic axis (``--dim seq=1..64``) and a Loop whose trip count is a dynamic dim
  (``Shape(x)[0]``, as PyTorch exports ``for t in range(x.size(0))``): scan outputs of length
  ``seq``.
- Value symbols (``--value M=0..64``): a Loop whose trip count and first condition are graph inputs
  gets scan outputs of length ``M*cond``; out-of-range values are ``InputError`` naming the input.
- An If whose branches' outputs differ in shape, decided by a value-symbol condition.

Every model is compared with onnxruntime (rtol 1e-3 / atol 1e-4) at several bindings, the range
ends and zero iterations included, and its golden cases (at the min and middle bindings) rerun.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler.cli import parse_value
from compiler.driver import compile_model
from runtime.errors import ArtifactError
from runtime.errors import InputError
from runtime.errors import RuntimeKernelError
from runtime.errors import ShapeError
from runtime.errors import UnsupportedOpError
from runtime.plan_schema import Plan
from runtime.session import Session
from tests.support.commands import cli
from tests.support.models import ort_run

RTOL, ATOL = 1e-3, 1e-4
F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
N = helper.make_node
T = helper.make_tensor_value_info


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
           inits: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "m", inputs, outputs,
                              initializer=[numpy_helper.from_array(v, k) for k, v in (inits or {}).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def _agrees(session: Session, model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    got = session.run(None, feeds)
    want = ort_run(model, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)
    return got


def rnn_scan_model(reshape: bool = False) -> onnx.ModelProto:
    """A tanh RNN as a Scan over axis 1 of ``x [batch, seq, 4]`` (state ``[batch, 4]``);
    ``reshape``: the body also reshapes its slice to ``Shape(xt)[0:1] ++ [4]`` as exporters write it
    (a Reshape to ``[batch, 4]``) and adds ``sum(range(batch))`` (a Range whose limit is the
    symbolic constant ``batch``)."""
    rng = np.random.default_rng(3)
    shaping = [N("Shape", ["xt0"], ["sh"]), N("Slice", ["sh", "zero1", "one1"], ["b"]),
               N("Concat", ["b", "four1"], ["target"], axis=0), N("Reshape", ["xt0", "target"], ["xt"]),
               N("Squeeze", ["b", "zero1"], ["bs"]), N("Range", ["zero", "bs", "one"], ["r"]),
               N("Cast", ["r"], ["rf"], to=F), N("ReduceSum", ["rf"], ["rsum"], keepdims=0),
               N("Mul", ["s2", "s2"], ["y0"]), N("Add", ["y0", "rsum"], ["y"])]
    body = helper.make_graph(
        [*(shaping[:4] if reshape else []),
         N("MatMul", ["s", "W"], ["sw"]), N("Add", ["sw", "xt"], ["a"]), N("Tanh", ["a"], ["s2"]),
         *(shaping[4:] if reshape else [N("Mul", ["s2", "s2"], ["y"])])], "body",
        [T("s", F, ["batch", 4]), T("xt0" if reshape else "xt", F, ["batch", 4])],
        [T("s2", F, ["batch", 4]), T("y", F, ["batch", 4])],
        initializer=[numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (
            ("zero1", [0]), ("one1", [1]), ("four1", [4]), ("zero", 0), ("one", 1))] if reshape else [])
    scan = N("Scan", ["s0", "x"], ["sN", "ys"], num_scan_inputs=1, body=body, scan_input_axes=[1],
             scan_output_axes=[1])
    return _model([scan], [T("s0", F, ["batch", 4]), T("x", F, ["batch", "seq", 4])],
                  [T("sN", F, ["batch", 4]), T("ys", F, ["batch", "seq", 4])],
                  {"W": rng.standard_normal((4, 4)).astype(np.float32) * 0.5})


def test_a_scan_over_a_dynamic_axis_matches_onnxruntime(tmp_path: Path) -> None:
    model = rnn_scan_model()
    path = compile_model(model, tmp_path / "scan", dims={"batch": (1, 4), "seq": (1, 64)})
    plan = json.loads((path / "plan.json").read_text())
    scan = next(s for s in plan["steps"] if s["op_type"] == "Scan")
    assert scan["attrs"]["length"] == {"expr": "seq"}
    assert "schedules" in scan  # a body of symbolic shapes ([batch, 4]), compiled
    session = Session(path)
    assert session.outputs[1].ranges == ((1, 4), (1, 64), (4, 4))
    rng = np.random.default_rng(0)
    for batch, seq in ((1, 1), (2, 33), (4, 64), (3, 7)):
        feeds = {"s0": rng.standard_normal((batch, 4)).astype(np.float32),
                 "x": rng.standard_normal((batch, seq, 4)).astype(np.float32)}
        _agrees(session, model, feeds)
    with pytest.raises(InputError, match=r"input 'x': dim 1 \(seq\) is 65, outside its range 1..64"):
        session.run(None, {"s0": np.zeros((1, 4), np.float32), "x": np.zeros((1, 65, 4), np.float32)})
    assert session.verify().checks


def test_a_body_with_a_symbolic_reshape_target_is_compiled(tmp_path: Path) -> None:
    model = rnn_scan_model(reshape=True)
    path = compile_model(model, tmp_path / "scan", dims={"batch": (1, 4), "seq": (1, 64)})
    steps = json.loads((path / "plan.json").read_text())["steps"]
    body = steps[0]["schedules"][0]
    assert any(v["location"][0] == "symbolic" for v in body["values"].values())
    session = Session(path)
    rng = np.random.default_rng(8)
    for batch, seq in ((1, 1), (3, 9), (4, 64)):
        _agrees(session, model, {"s0": rng.standard_normal((batch, 4)).astype(np.float32),
                                 "x": rng.standard_normal((batch, seq, 4)).astype(np.float32)})
    assert session.verify().checks


def test_a_static_body_over_a_dynamic_axis_is_compiled(tmp_path: Path) -> None:
    model = rnn_scan_model()  # batch fixed at 4: the body is static, its steps C kernels
    path = compile_model(model, tmp_path / "scan", dims={"batch": 4, "seq": (1, 1024)})
    steps = json.loads((path / "plan.json").read_text())["steps"]
    assert [(s["op_type"], s["provider"], "schedules" in s) for s in steps] == [("Scan", "control", True)]
    session = Session(path)
    rng = np.random.default_rng(7)
    for seq in (1, 2, 600, 1024):
        _agrees(session, model, {"s0": rng.standard_normal((4, 4)).astype(np.float32),
                                 "x": rng.standard_normal((4, seq, 4)).astype(np.float32)})
    assert session.verify().checks


def dim_loop_model() -> onnx.ModelProto:
    """``for t in range(x.size(0)): s = s + x[t]; ys.append(s * s)`` as PyTorch exports it: the trip
    count is ``Shape(x)[0]``, the condition a constant True passed through the body."""
    body = helper.make_graph(
        [N("Gather", ["x", "t"], ["xt"], axis=0), N("Add", ["s", "xt"], ["s2"]), N("Identity", ["c"], ["c2"]),
         N("Mul", ["s2", "s2"], ["y"])], "body",
        [T("t", I64, []), T("c", B, []), T("s", F, [4])], [T("c2", B, []), T("s2", F, [4]), T("y", F, [4])])
    nodes = [N("Shape", ["x"], ["shape"]), N("Gather", ["shape", "zero"], ["n"], axis=0),
             N("Loop", ["n", "true", "s0"], ["sN", "ys"], body=body)]
    return _model(nodes, [T("s0", F, [4]), T("x", F, ["seq", 4])], [T("sN", F, [4]), T("ys", F, ["seq", 4])],
                  {"zero": np.array(0, np.int64), "true": np.array(True)})


def test_a_loop_over_a_dynamic_dim_matches_onnxruntime(tmp_path: Path) -> None:
    model = dim_loop_model()
    session = Session(compile_model(model, tmp_path / "loop", dims={"seq": (1, 50)}))
    rng = np.random.default_rng(1)
    for seq in (1, 2, 25, 50):
        _agrees(session, model, {"s0": rng.standard_normal(4).astype(np.float32),
                                 "x": rng.standard_normal((seq, 4)).astype(np.float32)})
    assert session.verify().checks


def value_loop_model(computed_condition: bool = False) -> onnx.ModelProto:
    """``Loop(M, cond, s0)``: ``s += x * t``, scan output ``sin(s)``; the body passes its condition
    through (or, ``computed_condition``, computes ``t < 3``)."""
    cond_node = (N("Less", ["t", "three"], ["c2"]) if computed_condition else N("Identity", ["c"], ["c2"]))
    body = helper.make_graph(
        [N("Cast", ["t"], ["ft"], to=F), N("Mul", ["x", "ft"], ["xt"]), N("Add", ["s", "xt"], ["s2"]),
         cond_node, N("Sin", ["s2"], ["y"])], "body",
        [T("t", I64, []), T("c", B, []), T("s", F, [3])], [T("c2", B, []), T("s2", F, [3]), T("y", F, [3])])
    return _model([N("Loop", ["M", "cond", "s0"], ["sN", "ys"], body=body)],
                  [T("M", I64, []), T("cond", B, []), T("s0", F, [3]), T("x", F, [3])],
                  [T("sN", F, [3]), T("ys", F, ["N", 3])], {"three": np.array(3, np.int64)})


def _loop_feeds(m: int, cond: bool, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"M": np.array(m, np.int64), "cond": np.array(cond),
            "s0": rng.standard_normal(3).astype(np.float32),
            "x": (0.01 * rng.standard_normal(3)).astype(np.float32)}  # (sin of |s| < ~20: well conditioned)


@pytest.fixture(scope="module")
def value_loop(tmp_path_factory: pytest.TempPathFactory) -> tuple[onnx.ModelProto, Session]:
    model = value_loop_model()
    path = compile_model(model, tmp_path_factory.mktemp("vloop") / "a", values={"M": (0, 64), "cond": (0, 1)})
    return model, Session(path)


def test_a_value_symbol_loop_matches_onnxruntime_at_every_binding(value_loop: tuple[onnx.ModelProto, Session],
                                                                   ) -> None:
    model, session = value_loop
    assert session.outputs[1].ranges == ((0, 64), (3, 3))
    assert [s.schedules is not None for s in session.plan.steps] == [True]  # the body compiled
    rng = np.random.default_rng(2)
    shapes = []
    for m, cond in ((0, True), (1, True), (5, False), (37, True), (64, True), (64, False), (2, True)):
        got = _agrees(session, model, _loop_feeds(m, cond, rng))
        shapes.append(got[1].shape[0])
    assert shapes == [0, 1, 0, 37, 64, 0, 2]
    report = session.verify()  # at the min binding (M=0, cond=0) and the middle one (M=32, cond=1)
    assert len(report.checks) == 4 and all(c.error <= c.tolerance for c in report.checks)
    golden = json.loads((session.path / "golden.json").read_text())
    fed = [{r["name"]: (r["generator"], r["seed"]) for r in case["inputs"]} for case in golden["cases"]]
    assert [(f["M"], f["cond"]) for f in fed] == [(("fill", 0), ("fill", 0)), (("fill", 32), ("fill", 1))]


def test_a_nested_schedule_of_a_dynamic_plan_names_only_its_symbols(
        value_loop: tuple[onnx.ModelProto, Session]) -> None:
    _, session = value_loop
    data = json.loads((session.path / "plan.json").read_text())
    Plan.from_json(copy.deepcopy(data), "art/plan.json")  # as compiled: accepted
    schedule = data["steps"][0]["schedules"][0]
    name = next(n for n, v in schedule["values"].items() if v["shape"])
    schedule["values"][name]["shape"][0] = "q"
    with pytest.raises(ArtifactError, match=r"art/plan.json: steps\[0\]\.schedules\[0\]\.values.* names 'q'"):
        Plan.from_json(copy.deepcopy(data), "art/plan.json")
    schedule["values"][name]["shape"][0] = 3
    schedule["buffers"][0]["offset"] = "M"
    with pytest.raises(ArtifactError, match=r"schedules\[0\] places a buffer at an expression"):
        Plan.from_json(data, "art/plan.json")


def test_a_value_symbol_out_of_range_is_an_input_error(value_loop: tuple[onnx.ModelProto, Session]) -> None:
    _, session = value_loop
    rng = np.random.default_rng(3)
    for m in (65, -1):
        with pytest.raises(InputError, match=rf"input 'M': value {m} \(M\) is outside its range 0..64"):
            session.run(None, _loop_feeds(m, True, rng))
    empty = {**_loop_feeds(1, True, rng), "M": np.zeros((0,), np.int64)}
    with pytest.raises(InputError, match=r"input 'M': shape \(0,\), expected one element"):
        session.run(None, empty)


def test_value_symbols_from_the_command_line(tmp_path: Path) -> None:
    assert parse_value("M=0..64") == ("M", (0, 64))
    model = value_loop_model()
    onnx.save(model, tmp_path / "loop.onnx")
    cli("compile", str(tmp_path / "loop.onnx"), "-o", str(tmp_path / "a"), "--value", "M=1..9",
        "--value", "cond=1..1", "-q")
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["options"]["values"] == {"M": [1, 9], "cond": [1, 1]}
    _agrees(Session(tmp_path / "a"), model, _loop_feeds(9, True, np.random.default_rng(4)))
    shown = cli("inspect", str(tmp_path / "a")).stdout
    assert "symbols: M in 1..9 (the value of input 'M'), cond in 1..1" in shown
    assert "output ys: float32 [M*cond in 1..9, 3]" in shown
    assert "ys: float32 [1, 3]" in cli("run", str(tmp_path / "a")).stdout  # random feeds: M at its low end
    wrong = cli("compile", str(tmp_path / "loop.onnx"), "-o", str(tmp_path / "c"), "--value", "M", ok=False)
    assert "expected NAME=LO..HI" in wrong.stderr


def test_a_value_symbol_sizes_a_range_and_a_constant_of_shape(tmp_path: Path) -> None:
    """Outputs whose length is an input's value (``Range(0, M)``, ``ConstantOfShape([M])``)."""
    two = numpy_helper.from_array(np.array([2.0], np.float32), "v")
    nodes = [N("Range", ["zero", "M", "one"], ["r"]), N("Cast", ["r"], ["rf"], to=F),
             N("Mul", ["rf", "x"], ["y"]), N("Unsqueeze", ["M", "ax"], ["m1"]),
             N("ConstantOfShape", ["m1"], ["z"], value=two)]
    inits = {"zero": np.array(0, np.int64), "one": np.array(1, np.int64), "ax": np.array([0], np.int64)}
    model = _model(nodes, [T("M", I64, []), T("x", F, [1])], [T("y", F, ["N"]), T("z", F, ["N"])], inits)
    session = Session(compile_model(model, tmp_path / "a", values={"M": (1, 100)}))
    assert [o.ranges for o in session.outputs] == [((1, 100),), ((1, 100),)]
    for m in (1, 7, 100):
        got = _agrees(session, model, {"M": np.array(m, np.int64), "x": np.array([0.5], np.float32)})
        assert got[0].shape == (m,)


@pytest.mark.parametrize("values, message", [
    ({"x": (0, 4)}, r"--value x: a value symbol is a graph input of one integer or bool element"),
    ({"nope": (0, 4)}, r"--value names no graph input: 'nope'"),
    ({"cond": (0, 2)}, r"--value cond: range 0..2 must have 0 <= LO <= HI <= 1"),
    ({"M": (5, 2)}, r"--value M: range 5..2"),
    ({"M": "lots"}, r"--value M: give a range LO..HI"),
])
def test_value_symbol_mistakes_are_shape_errors(tmp_path: Path, values: dict[str, object],
                                                message: str) -> None:
    with pytest.raises(ShapeError, match=message):
        compile_model(value_loop_model(), tmp_path / "a", values=values)


def test_scan_outputs_whose_length_the_body_decides_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedOpError, match=r"scan outputs, and how many iterations it runs is known "
                                                 r"only at run time .*--value NAME=LO..HI"):
        compile_model(value_loop_model(computed_condition=True), tmp_path / "a", values={"M": (0, 8)})


def if_model() -> onnx.ModelProto:
    """``If(c)``: then ``concat(x, x)`` [6, 2], else ``-x`` [3, 2]."""
    then = helper.make_graph([N("Concat", ["x", "x"], ["y"], axis=0)], "then", [], [T("y", F, [6, 2])])
    other = helper.make_graph([N("Neg", ["x"], ["z"])], "else", [], [T("z", F, [3, 2])])
    return _model([N("If", ["c"], ["out"], then_branch=then, else_branch=other)],
                  [T("c", B, []), T("x", F, [3, 2])], [T("out", F, ["n", 2])])


def test_if_branches_of_different_shapes_follow_a_value_symbol_condition(tmp_path: Path) -> None:
    model = if_model()
    session = Session(compile_model(model, tmp_path / "a", values={"c": (0, 1)}))
    assert session.outputs[0].ranges == ((3, 6), (2, 2))
    rng = np.random.default_rng(5)
    for c in (True, False, True):
        got = _agrees(session, model, {"c": np.array(c), "x": rng.standard_normal((3, 2)).astype(np.float32)})
        assert got[0].shape == ((6, 2) if c else (3, 2))
    assert len(session.verify().checks) == 2
    with pytest.raises(UnsupportedOpError,
                       match=r"output 'out' differs between the branches .*--value NAME=0..1"):
        compile_model(model, tmp_path / "b")


def test_the_backend_compiles_a_loop_once_for_its_trip_counts() -> None:
    from compiler import backend

    model = value_loop_model()
    rep = backend.prepare(model)
    assert rep.value_inputs == ["M", "cond"]
    rng = np.random.default_rng(6)
    for m, cond in ((3, True), (0, True), (9, False), (1024, True)):
        feeds = _loop_feeds(m, cond, rng)
        got = rep.run(feeds)
        want = ort_run(model, feeds)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=1e-3)
    assert len(rep._sessions) == 1  # one artifact for M in 0..1024 and cond in 0..1
    rep.run(_loop_feeds(backend.VALUE_RANGE[1] + 1, True, rng))  # out of range: bound to its value
    assert len(rep._sessions) == 2
    computed = value_loop_model(computed_condition=True)
    refused = backend.prepare(computed)
    feeds = _loop_feeds(5, True, rng)
    out = refused.run(feeds)  # the body decides the length: the values are bound instead
    assert out[1].shape == (4, 3) and refused.value_inputs == []
    np.testing.assert_allclose(out[1], ort_run(computed, feeds)[1], rtol=RTOL, atol=ATOL)


def slicing_loop_model(scan: bool = True, growing: bool = False) -> onnx.ModelProto:
    """ONNX's test_loop11 form: the body slices a constant at its iteration number,
    ``y += x[i:i+1]`` (``growing``: ``y += sum(x[:i+1])``), with the running sum as a scan output
    (or none: then the trip count alone is an input)."""
    start = ["zero1"] if growing else ["s"]
    nodes = [N("Add", ["i", "one"], ["e"]), N("Unsqueeze", ["i", "zero1"], ["s"]),
             N("Unsqueeze", ["e", "zero1"], ["t"]), N("Slice", ["x", start[0], "t"], ["xs"]),
             N("ReduceSum", ["xs", "zero1"], ["xr"], keepdims=1), N("Add", ["y", "xr"], ["y2"]),
             N("Identity", ["c"], ["c2"])]
    outs = [T("c2", B, []), T("y2", F, [1])]
    if scan:
        nodes.append(N("Identity", ["y2"], ["scan"]))
        outs.append(T("scan", F, [1]))
    body = helper.make_graph(nodes, "body", [T("i", I64, []), T("c", B, []), T("y", F, [1])], outs)
    loop = N("Loop", ["M", "cond" if scan else "", "y0"], ["yN", "ys"] if scan else ["yN"], body=body)
    inputs = [T("M", I64, []), *([T("cond", B, [])] if scan else []), T("y0", F, [1])]
    return _model([loop], inputs, [T("yN", F, [1]), *([T("ys", F, ["N", 1])] if scan else [])],
                  {"x": np.arange(1, 6, dtype=np.float32), "one": np.array(1, np.int64),
                   "zero1": np.array([0], np.int64)})


def test_body_shapes_the_iteration_number_decides_are_those_of_its_first_iterations(tmp_path: Path) -> None:
    model = slicing_loop_model()
    session = Session(compile_model(model, tmp_path / "a", values={"M": (0, 64), "cond": (0, 1)}))
    for m, cond in ((0, True), (1, True), (3, True), (5, True), (4, False)):
        feeds = {"M": np.array(m, np.int64), "cond": np.array(cond), "y0": np.array([-2], np.float32)}
        got = _agrees(session, model, feeds)
        assert got[1].shape == (m if cond else 0, 1)
    # an iteration past x's end would slice [0] elements: the kernels check every iteration's shapes
    with pytest.raises(RuntimeKernelError,
                       match=r"onnx_aot\.SliceAt: result 0 has shape \(0,\), expected \(1,\)"):
        session.run(None, {"M": np.array(6, np.int64), "cond": np.array(True), "y0": np.zeros(1, np.float32)})
    # a shape that differs between the first iterations (x[:i+1]) stays a compile-time error
    with pytest.raises(ShapeError, match=r"Slice.*cannot infer a static shape"):
        compile_model(slicing_loop_model(growing=True), tmp_path / "b", values={"M": (0, 64), "cond": (0, 1)})


def test_a_compiled_loop_step_slicing_at_its_iteration_number(tmp_path: Path) -> None:
    model = slicing_loop_model(scan=False)  # a static compile: the body in a nested schedule
    path = compile_model(model, tmp_path / "a")
    steps = json.loads((path / "plan.json").read_text())["steps"]
    assert [(s["op_type"], "schedules" in s) for s in steps] == [("Loop", True)]
    session = Session(path)
    for m in (0, 1, 4, 5):
        _agrees(session, model, {"M": np.array(m, np.int64), "y0": np.array([0.5], np.float32)})
