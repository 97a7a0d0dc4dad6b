"""If, Loop and Scan (compiler/frontend/control/): inlined or unrolled at import, checked against
onnxruntime on small models built here, and the refusals that name the node and the reason."""

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
from compiler.frontend.control import loops
from compiler.frontend.importer import import_model
from runtime.errors import UnsupportedOpError
from runtime.session import Session
from tests.support.models import onnx_model
from tests.support.models import ort_run
from tests.support.rehash import write_plan

F = TensorProto.FLOAT


def _const(name: str, array: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(array), name))


def _graph(
    nodes: list[onnx.NodeProto], name: str, inputs: list[onnx.ValueInfoProto], outputs: list[str]
) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, inputs, [helper.make_empty_tensor_value_info(o) for o in outputs])


def _compiled(model: onnx.ModelProto, tmp_path: Path, **options: object) -> Session:
    return Session(compile_model(model, tmp_path / "art", **options))  # type: ignore[arg-type]


def _check(model: onnx.ModelProto, tmp_path: Path, feeds: dict[str, np.ndarray], **options: object) -> None:
    session = _compiled(model, tmp_path, **options)
    binds = options.get("binds") or {}
    ours = session.run(None, {k: v for k, v in feeds.items() if k not in binds})  # type: ignore[operator]
    for got, want in zip(ours, ort_run(model, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _branches(x: str = "x") -> tuple[onnx.GraphProto, onnx.GraphProto]:
    """then: x * 2 (through a nested If on a constant that reads the outer ``x``); else: x - 1. Both
    branches name their result ``r``."""
    inner_then = _graph([helper.make_node("Mul", [x, "two"], ["r2"])], "inner_then", [], ["r2"])
    inner_else = _graph([helper.make_node("Neg", [x], ["r3"])], "inner_else", [], ["r3"])
    then = _graph(
        [
            _const("two", np.float32(2)),
            _const("yes", np.array(True)),
            helper.make_node("If", ["yes"], ["r"], then_branch=inner_then, else_branch=inner_else),
        ],
        "then",
        [],
        ["r"],
    )
    other = _graph(
        [_const("one", np.float32(1)), helper.make_node("Sub", [x, "one"], ["r"])], "else", [], ["r"]
    )
    return then, other


def _if_model(cond_nodes: list[onnx.NodeProto], inputs: list[tuple[str, int, list[int]]]) -> onnx.ModelProto:
    then, other = _branches()
    nodes = [
        *cond_nodes,
        helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
        helper.make_node("Add", ["y", "x"], ["z"]),
    ]
    return onnx_model(nodes, [("x", F, [2, 3]), *inputs], [("z", F, [2, 3])])


@pytest.mark.parametrize("flag", [True, False])
def test_an_if_with_a_constant_condition_inlines_the_branch_taken(tmp_path: Path, flag: bool) -> None:
    model = _if_model([_const("c", np.array(flag))], [])
    graph = import_model(model)
    assert "If" not in {n.op_type for n in graph} and "Where" not in {n.op_type for n in graph}
    assert "Mul" in {n.op_type for n in graph} if flag else "Sub" in {n.op_type for n in graph}
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    _check(model, tmp_path, {"x": x})


def test_an_if_condition_folded_from_a_bound_input_inlines_one_branch(tmp_path: Path) -> None:
    """Silero VAD's pattern: ``sr == 16000`` with ``--bind sr=16000``."""
    model = _if_model(
        [_const("k", np.array(16000, np.int64)), helper.make_node("Equal", ["sr", "k"], ["c"])],
        [("sr", TensorProto.INT64, [])],
    )
    graph = import_model(model, binds={"sr": 16000})
    assert {n.op_type for n in graph} == {"Mul", "Add"}
    x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    _check(model, tmp_path, {"x": x, "sr": np.array(16000, np.int64)}, binds={"sr": 16000})


def test_an_if_condition_known_at_run_time_is_a_conditional_step(tmp_path: Path) -> None:
    model = _if_model([], [("c", TensorProto.BOOL, [])])
    session = _compiled(model, tmp_path)
    assert [(s.op_type, s.domain) for s in session.plan.steps] == [("If", "onnx_aot"), ("Add", "")]
    x = np.random.default_rng(2).standard_normal((2, 3)).astype(np.float32)
    for flag in (True, False):
        feeds = {"x": x, "c": np.array(flag)}
        np.testing.assert_allclose(session.run(None, feeds)[0], ort_run(model, feeds)[0], rtol=1e-6)


def test_branches_of_different_shapes_under_a_run_time_condition_are_refused() -> None:
    then = _graph([helper.make_node("Identity", ["x"], ["r"])], "then", [], ["r"])
    other = _graph([helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0)], "else", [], ["s"])
    model = onnx_model(
        [helper.make_node("If", ["c"], ["y"], name="pick", then_branch=then, else_branch=other)],
        [("x", F, [2, 3]), ("c", TensorProto.BOOL, [])],
        [("y", F, [2, 3])],
    )
    with pytest.raises(UnsupportedOpError, match=r"'pick' \(If\).*run time.*\[2, 3\] vs float32\[\]"):
        import_model(model)


def test_an_unsupported_op_inside_a_branch_is_listed() -> None:
    then = _graph(
        [helper.make_node("NoSuchOp", ["x"], ["r"], name="bad_inner", domain="com.example")],
        "then",
        [],
        ["r"],
    )
    other = _graph([helper.make_node("Identity", ["x"], ["r"])], "else", [], ["r"])
    model = onnx_model(
        [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
        [("x", F, [2]), ("c", TensorProto.BOOL, [])],
        [("y", F, [2])],
    )
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(UnsupportedOpError, match=r"bad_inner \(com.example.NoSuchOp\)"):
        import_model(model)


def _loop_body(early_exit: bool) -> onnx.GraphProto:
    """acc += x[i] (a row picked by the iteration number); scan output acc * 1; cond: acc < 4 when
    ``early_exit`` (a run-time value), else passed through."""
    nodes = [
        helper.make_node("Gather", ["xs", "i"], ["row"], axis=0),
        helper.make_node("Add", ["acc", "row"], ["acc_out"]),
        helper.make_node("Identity", ["acc_out"], ["scan"]),
    ]
    if early_exit:
        nodes += [
            _const("limit", np.float32(4)),
            helper.make_node("ReduceSum", ["acc_out"], ["total"], keepdims=0),
            helper.make_node("Less", ["total", "limit"], ["cond_out"]),
        ]
        outputs = ["cond_out", "acc_out"]
    else:
        nodes.append(helper.make_node("Identity", ["cond"], ["cond_out"]))
        outputs = ["cond_out", "acc_out", "scan"]
    inputs = [
        helper.make_tensor_value_info("i", TensorProto.INT64, []),
        helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
        helper.make_tensor_value_info("acc", F, [3]),
    ]
    return _graph(nodes, "body", inputs, outputs)


def test_a_loop_with_a_known_trip_count_unrolls_with_carried_and_scan_outputs(tmp_path: Path) -> None:
    xs = np.random.default_rng(3).standard_normal((4, 3)).astype(np.float32)
    nodes = [
        _const("xs", xs),
        _const("n", np.array(4, np.int64)),
        _const("go", np.array(True)),
        helper.make_node("Loop", ["n", "go", "acc0"], ["acc", "rows"], body=_loop_body(False)),
    ]
    model = onnx_model(nodes, [("acc0", F, [3])], [("acc", F, [3]), ("rows", F, [4, 3])], opset=13)
    graph = import_model(model)
    assert not {"Loop", "Where"} & {n.op_type for n in graph}
    _check(model, tmp_path, {"acc0": np.ones(3, np.float32)})


@pytest.mark.parametrize("start", [0.0, 1.5, 10.0])
def test_a_loop_condition_known_at_run_time_exits_early(tmp_path: Path, start: float) -> None:
    xs = np.full((5, 3), 0.5, np.float32)
    nodes = [
        _const("xs", xs),
        _const("n", np.array(5, np.int64)),
        helper.make_node("Loop", ["n", "", "acc0"], ["acc"], body=_loop_body(True)),
    ]
    model = onnx_model(nodes, [("acc0", F, [3])], [("acc", F, [3])], opset=13)
    _check(model, tmp_path, {"acc0": np.full(3, start, np.float32)})


def test_scan_outputs_of_a_run_time_trip_count_are_refused_with_the_fix() -> None:
    nodes = [
        _const("xs", np.zeros((4, 3), np.float32)),
        _const("go", np.array(True)),
        helper.make_node("Loop", ["n", "go", "acc0"], ["acc", "rows"], name="lp", body=_loop_body(False)),
    ]
    model = onnx_model(
        nodes,
        [("n", TensorProto.INT64, []), ("acc0", F, [3])],
        [("acc", F, [3]), ("rows", F, ["N", 3])],
        opset=13,
    )
    with pytest.raises(
        UnsupportedOpError, match=r"'lp' \(Loop\): the loop has scan outputs.*run time.*--bind"
    ):
        import_model(model)


def test_a_trip_count_known_only_at_run_time_runs_a_loop_step(tmp_path: Path) -> None:
    """The early-exit body (no scan outputs) under a trip count that is a graph input."""
    nodes = [
        _const("xs", np.full((6, 3), 0.75, np.float32)),
        helper.make_node("Loop", ["n", "", "acc0"], ["acc"], name="lp", body=_loop_body(True)),
    ]
    model = onnx_model(nodes, [("n", TensorProto.INT64, []), ("acc0", F, [3])], [("acc", F, [3])], opset=13)
    session = _compiled(model, tmp_path)
    assert [s.op_type for s in session.plan.steps] == ["Loop"]
    for n, start in ((0, 0.0), (2, 0.0), (5, 0.0), (5, 1.0), (6, 9.0)):
        feeds = {"n": np.array(n, np.int64), "acc0": np.full(3, start, np.float32)}
        np.testing.assert_allclose(session.run(None, feeds)[0], ort_run(model, feeds)[0], rtol=1e-6)


def test_a_run_time_if_nested_in_a_run_time_if_runs_as_nested_conditional_steps(tmp_path: Path) -> None:
    inner_then = _graph([helper.make_node("Mul", ["x", "x"], ["sq"])], "inner_then", [], ["sq"])
    inner_else = _graph([helper.make_node("Abs", ["x"], ["ab"])], "inner_else", [], ["ab"])
    then = _graph(
        [helper.make_node("If", ["d"], ["r"], then_branch=inner_then, else_branch=inner_else)],
        "then",
        [],
        ["r"],
    )
    other = _graph(
        [_const("one", np.float32(1)), helper.make_node("Sub", ["x", "one"], ["s"])], "else", [], ["s"]
    )
    model = onnx_model(
        [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
        [("x", F, [2, 3]), ("c", TensorProto.BOOL, []), ("d", TensorProto.BOOL, [1])],
        [("y", F, [2, 3])],
    )
    session = _compiled(model, tmp_path)
    assert [(s.op_type, s.domain) for s in session.plan.steps] == [("If", "onnx_aot")]
    x = np.random.default_rng(6).standard_normal((2, 3)).astype(np.float32)
    for c in (True, False):
        for d in (True, False):
            feeds = {"x": x, "c": np.array(c), "d": np.array([d])}
            np.testing.assert_allclose(session.run(None, feeds)[0], ort_run(model, feeds)[0], rtol=1e-6)


def test_a_loop_over_the_unroll_cap_becomes_a_loop_step(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from compiler.frontend.control import loops

    monkeypatch.setattr(loops, "MAX_UNROLLED_NODES", 7)
    nodes = [
        _const("xs", np.arange(12, dtype=np.float32).reshape(4, 3)),
        _const("n", np.array(4, np.int64)),
        _const("go", np.array(True)),
        helper.make_node("Loop", ["n", "go", "acc0"], ["acc", "rows"], name="lp", body=_loop_body(False)),
    ]
    model = onnx_model(nodes, [("acc0", F, [3])], [("acc", F, [3]), ("rows", F, [4, 3])], opset=13)
    graph = import_model(model)
    assert [n.kind for n in graph] == ["onnx_aot.Loop"]
    _check(model, tmp_path, {"acc0": np.ones(3, np.float32)})


def _scan_body() -> onnx.GraphProto:
    inputs = [
        helper.make_tensor_value_info("s", F, [2]),
        helper.make_tensor_value_info("a", F, [2]),
        helper.make_tensor_value_info("b", F, [2]),
    ]
    nodes = [
        helper.make_node("Add", ["s", "a"], ["s_out"]),
        helper.make_node("Mul", ["s_out", "b"], ["m"]),
        helper.make_node("Identity", ["s_out"], ["z"]),
    ]
    return _graph(nodes, "body", inputs, ["s_out", "m", "z"])


def _scan9_node(**directions: list[int]) -> onnx.NodeProto:
    """Scan over a (axis 0, reversed) and b (axis 1); outputs y on the last axis, t on axis 0."""
    return helper.make_node("Scan", ["s0", "a", "b"], ["s", "y", "t"], body=_scan_body(), num_scan_inputs=2,
                            scan_input_axes=[0, 1], scan_input_directions=[1, 0], scan_output_axes=[-1, 0],
                            **directions)


def _scan9_model() -> onnx.ModelProto:
    scan = _scan9_node(scan_output_directions=[0, 1])
    return onnx_model(
        [scan],
        [("s0", F, [2]), ("a", F, [4, 2]), ("b", F, [2, 4])],
        [("s", F, [2]), ("y", F, [2, 4]), ("t", F, [4, 2])],
        opset=16,
    )


def _scan9_feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(4)
    return {
        "s0": rng.standard_normal(2).astype(np.float32),
        "a": rng.standard_normal((4, 2)).astype(np.float32),
        "b": rng.standard_normal((2, 4)).astype(np.float32),
    }


def test_scan9_with_axes_and_directions(tmp_path: Path) -> None:
    _check(_scan9_model(), tmp_path, _scan9_feeds())


def test_scan8_scans_each_batch_entry(tmp_path: Path) -> None:
    scan = helper.make_node(
        "Scan", ["", "s0", "a", "b"], ["s", "y", "t"], body=_scan_body(), num_scan_inputs=2, directions=[0, 1]
    )
    model = onnx_model(
        [scan],
        [("s0", F, [3, 2]), ("a", F, [3, 4, 2]), ("b", F, [3, 4, 2])],
        [("s", F, [3, 2]), ("y", F, [3, 4, 2]), ("t", F, [3, 4, 2])],
        opset=8,
    )
    rng = np.random.default_rng(5)
    feeds = {
        k: rng.standard_normal(s).astype(np.float32)
        for k, s in (("s0", (3, 2)), ("a", (3, 4, 2)), ("b", (3, 4, 2)))
    }
    _check(model, tmp_path, feeds)


def test_a_scan_over_the_unroll_cap_becomes_a_scan_step(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from compiler.frontend.control import loops

    monkeypatch.setattr(loops, "MAX_UNROLLED_NODES", 5)
    model = _scan9_model()
    assert [n.kind for n in import_model(model)] == ["onnx_aot.Scan"]
    _check(model, tmp_path, _scan9_feeds())


def test_a_scan8_over_the_unroll_cap_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from compiler.frontend.control import loops

    monkeypatch.setattr(loops, "MAX_UNROLLED_NODES", 5)
    scan = helper.make_node(
        "Scan", ["", "s0", "a", "b"], ["s", "y", "t"], name="sc", body=_scan_body(), num_scan_inputs=2
    )
    model = onnx_model(
        [scan],
        [("s0", F, [3, 2]), ("a", F, [3, 4, 2]), ("b", F, [3, 4, 2])],
        [("s", F, [3, 2]), ("y", F, [3, 4, 2]), ("t", F, [3, 4, 2])],
        opset=8,
    )
    with pytest.raises(
        UnsupportedOpError, match=r"'sc' \(Scan\): 4 iterations of a 3-node body exceed the 5"
    ):
        import_model(model)


def _control_models() -> list[tuple[onnx.ModelProto, list[dict[str, np.ndarray]]]]:
    """A run-time If, a run-time trip count (a loop step) and a Scan over the unroll cap (a scan
    step), with the feeds to run each on."""
    x = np.random.default_rng(7).standard_normal((2, 3)).astype(np.float32)
    if_model = _if_model([], [("c", TensorProto.BOOL, [])])
    loop_nodes = [
        _const("xs", np.full((6, 3), 0.75, np.float32)),
        helper.make_node("Loop", ["n", "", "acc0"], ["acc"], name="lp", body=_loop_body(True)),
    ]
    loop_model = onnx_model(
        loop_nodes, [("n", TensorProto.INT64, []), ("acc0", F, [3])], [("acc", F, [3])], opset=13
    )
    loop_feeds = [
        {"n": np.array(n, np.int64), "acc0": np.full(3, s, np.float32)} for n, s in ((0, 0), (5, 1))
    ]
    length = loops.MAX_UNROLLED_NODES // 3 + 1  # over the unroll cap: a scan step
    scan = _scan9_node()
    scan_model = onnx_model(
        [scan],
        [("s0", F, [2]), ("a", F, [length, 2]), ("b", F, [2, length])],
        [("s", F, [2]), ("y", F, [2, length]), ("t", F, [length, 2])],
        opset=16,
    )
    rng = np.random.default_rng(8)
    scan_feeds = {
        "s0": np.zeros(2, np.float32),
        "a": rng.uniform(-1, 1, (length, 2)).astype(np.float32),
        "b": rng.uniform(0.5, 1, (2, length)).astype(np.float32),
    }
    return [
        (if_model, [{"x": x, "c": np.array(c)} for c in (True, False)]),
        (loop_model, loop_feeds),
        (scan_model, [scan_feeds]),
    ]


def test_control_steps_take_the_reference_path_on_the_cuda_target(tmp_path: Path) -> None:
    """Compiled here without a GPU: the control steps run as reference kernels in the device's
    memory space (cupy), with transfers where their operands cross from CUDA steps."""
    for k, (model, _) in enumerate(_control_models()):
        path = compile_model(model, tmp_path / f"m{k}", target="cuda")
        plan = json.loads((path / "plan.json").read_text())
        control = [
            s for s in plan["steps"] if s["domain"] == "onnx_aot" and s["op_type"] in ("If", "Loop", "Scan")
        ]
        assert [s["provider"] for s in control] == ["reference@cuda"]


def test_control_steps_on_a_gpu_match_onnxruntime(tmp_path: Path) -> None:
    cp = pytest.importorskip("cupy", reason="cupy is not installed")
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device is visible")
    except Exception as exc:  # no driver
        pytest.skip(f"no usable CUDA device: {exc}")
    for k, (model, feeds_list) in enumerate(_control_models()):
        session = Session(compile_model(model, tmp_path / f"m{k}", target="cuda"))
        for feeds in feeds_list:
            for got, want in zip(session.run(None, feeds), ort_run(model, feeds), strict=True):
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_loop_step_over_its_work_cap_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from compiler.frontend.control import loop_step
    from compiler.frontend.control import loops

    monkeypatch.setattr(loops, "MAX_UNROLLED_NODES", 7)
    monkeypatch.setattr(loop_step, "MAX_STEP_WORK", 15)
    nodes = [
        _const("xs", np.zeros((4, 3), np.float32)),
        _const("n", np.array(4, np.int64)),
        _const("go", np.array(True)),
        helper.make_node("Loop", ["n", "go", "acc0"], ["acc", "rows"], name="lp", body=_loop_body(False)),
    ]
    model = onnx_model(nodes, [("acc0", F, [3])], [("acc", F, [3]), ("rows", F, [4, 3])], opset=13)
    with pytest.raises(
        UnsupportedOpError, match=r"'lp' \(Loop\): 4 iterations of a 4-node body: over the 15"
    ):
        import_model(model)


def test_a_while_loop_bounded_by_int64_max_runs_as_a_loop_step(tmp_path: Path) -> None:
    """PyTorch's export of a ``while``: M = 2^63 - 1 and a condition the body computes."""
    body = _graph(
        [
            _const("one", np.array(1, np.int64)),
            _const("limit", np.array(5, np.int64)),
            _const("two", np.float32(2)),
            helper.make_node("Add", ["c", "one"], ["c_out"]),
            helper.make_node("Mul", ["acc", "two"], ["acc_out"]),
            helper.make_node("Less", ["c_out", "limit"], ["cond_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
            helper.make_tensor_value_info("c", TensorProto.INT64, []),
            helper.make_tensor_value_info("acc", F, [3]),
        ],
        ["cond_out", "c_out", "acc_out"],
    )
    nodes = [
        _const("n", np.array(2**63 - 1, np.int64)),
        _const("go", np.array(True)),
        helper.make_node("Loop", ["n", "go", "c0", "acc0"], ["c", "acc"], body=body),
    ]
    model = onnx_model(
        nodes,
        [("c0", TensorProto.INT64, []), ("acc0", F, [3])],
        [("c", TensorProto.INT64, []), ("acc", F, [3])],
        opset=13,
    )
    session = _compiled(model, tmp_path)
    assert [s.op_type for s in session.plan.steps] == ["Loop"]
    for start in (0, 3, 7):
        feeds = {"c0": np.array(start, np.int64), "acc0": np.ones(3, np.float32)}
        for got, want in zip(session.run(None, feeds), ort_run(model, feeds), strict=True):
            np.testing.assert_array_equal(got, want)


_PROGRAM_MUTATIONS = [
    ("unknown kind", lambda b: b["steps"][0].update(kind="NoSuchOp"), "no kernel for 'NoSuchOp'"),
    ("ref past the inputs", lambda b: b["steps"][0]["inputs"].__setitem__(0, "i99"), "'i99' names no input"),
    ("ref to a later result", lambda b: b["steps"][0]["inputs"].__setitem__(0, "t5"), "'t5' names no input"),
    ("not a ref", lambda b: b["outputs"].__setitem__(0, "q0"), "'q0' is not a ref"),
    ("object dtype", lambda b: b["steps"][0]["specs"][0].__setitem__(1, "O"), "not a numeric or bool type"),
    ("negative dim", lambda b: b["steps"][0]["specs"][0].__setitem__(0, [-1]), "is not \\[shape, dtype\\]"),
    ("no steps", lambda b: b.pop("steps"), "needs 'steps' and 'outputs' lists"),
]


@pytest.mark.parametrize("what,mutate,message", _PROGRAM_MUTATIONS, ids=[m[0] for m in _PROGRAM_MUTATIONS])
def test_a_malformed_program_in_a_rehashed_plan_fails_at_load(
    tmp_path: Path, what: str, mutate: Any, message: str
) -> None:
    # the sub-programs of control steps are checked when the plan loads, as every other field is:
    # a broken pipeline's plan never reaches a KeyError or an object array in the middle of a run
    import json

    from runtime.errors import ArtifactError

    model = _if_model([], [("c", TensorProto.BOOL, [])])
    art = compile_model(model, tmp_path / "art", compiled_control=False)  # programs: the fallback
    plan = json.loads((art / "plan.json").read_text())
    (step,) = [s for s in plan["steps"] if s["op_type"] == "If"]
    mutate(step["attrs"]["then_branch"])
    write_plan(art, plan)
    with pytest.raises(ArtifactError, match=message) as info:
        Session(art)
    assert "then_branch" in str(info.value)


def _while_body(endless: bool) -> onnx.GraphProto:
    """acc += 0.5 while sum(acc) < 4 (a run-time condition), or forever when ``endless``."""
    nodes = [_const("half", np.float32(0.5)), helper.make_node("Add", ["acc", "half"], ["acc_out"])]
    if endless:
        nodes.append(helper.make_node("Identity", ["cond"], ["cond_out"]))
    else:
        nodes += [_const("limit", np.float32(4)),
                  helper.make_node("ReduceSum", ["acc_out"], ["total"], keepdims=0),
                  helper.make_node("Less", ["total", "limit"], ["cond_out"])]
    inputs = [helper.make_tensor_value_info("i", TensorProto.INT64, []),
              helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
              helper.make_tensor_value_info("acc", F, [3])]
    return _graph(nodes, "body", inputs, ["cond_out", "acc_out"])


@pytest.mark.parametrize("start", [0.0, 1.2, 10.0])
def test_a_loop_without_a_trip_count_runs_while_its_run_time_condition_holds(
    tmp_path: Path, start: float
) -> None:
    loop = helper.make_node("Loop", ["", "", "acc0"], ["acc"], body=_while_body(False))
    model = onnx_model([loop], [("acc0", F, [3])], [("acc", F, [3])], opset=13)
    _check(model, tmp_path, {"acc0": np.full(3, start, np.float32)})


def test_a_loop_without_a_trip_count_that_never_ends_is_refused() -> None:
    loop = helper.make_node("Loop", ["", "", "acc0"], ["acc"], name="forever", body=_while_body(True))
    model = onnx_model([loop], [("acc0", F, [3])], [("acc", F, [3])], opset=13)
    with pytest.raises(UnsupportedOpError, match="'forever'.*the loop would never end"):
        compile_model(model, "/nonexistent/never-written")
