"""Control steps compiled into nested schedules (compiler/nested.py, runtime/providers/control.py):
an If with a run-time condition, Loop and Scan steps run their branches / bodies as C partitions
whose values live in the step's region of the arena; checked by reading the plan and against
onnxruntime, nested control flow and outer-scope reads included."""

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
from runtime.errors import ArtifactError
from runtime.plan_schema import PlanSchedule
from runtime.plan_schema import PlanStep
from runtime.session import Session
from tests.support.models import onnx_model
from tests.support.models import ort_run
from tests.support.rehash import write_plan

F = TensorProto.FLOAT
I64 = TensorProto.INT64
RNG = np.random.default_rng(15)
W = RNG.standard_normal((4, 4)).astype(np.float32)


def _const(name: str, array: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(array), name))


def _graph(nodes: list[onnx.NodeProto], name: str, inputs: list[onnx.ValueInfoProto],
           outputs: list[str]) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, inputs, [helper.make_empty_tensor_value_info(o) for o in outputs])


def _vi(name: str, elem: int, shape: list[int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _check(session: Session, model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    for got, want in zip(session.run(None, feeds), ort_run(model, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)


def _control_steps(steps: tuple[PlanStep, ...]) -> list[PlanStep]:
    return [s for s in steps if s.schedules is not None]


def _assert_compiled(schedule: PlanSchedule) -> None:
    """Every kernel step of ``schedule`` runs C code, and its intermediates have arena offsets
    inside the schedule's part of the region."""
    kernels = [s for s in schedule.steps if s.schedules is None]
    assert kernels and all(s.provider == "c" for s in kernels), [(s.op_type, s.provider) for s in kernels]
    assert all(p.runner in ("c", "control") and (p.runner != "c" or p.library) for p in schedule.partitions)
    bound = {*schedule.inputs, *schedule.outputs}
    inner = [v for name, v in schedule.values.items() if name not in bound]
    assert inner and all(v.location.kind in ("arena", "weights") for v in inner)
    arena = [v for v in inner if v.location.kind == "arena"]
    assert all(v.location.offset + v.nbytes <= schedule.arena_nbytes for v in arena)


# -- If ---------------------------------------------------------------------------------------------
def _if_model() -> onnx.ModelProto:
    """y = relu(x @ W + 1) * x when sum(x) > 0, else (x - W[0]) * 2: both read the outer x and W."""
    then = _graph([_const("one", np.float32(1)), helper.make_node("MatMul", ["x", "w"], ["m"]),
                   helper.make_node("Add", ["m", "one"], ["a"]), helper.make_node("Relu", ["a"], ["r"]),
                   helper.make_node("Mul", ["r", "x"], ["y_then"])], "then", [], ["y_then"])
    other = _graph([_const("two", np.float32(2)), _const("zero", np.array([0], np.int64)),
                    helper.make_node("Gather", ["w", "zero"], ["row"], axis=0),
                    helper.make_node("Sub", ["x", "row"], ["d"]),
                    helper.make_node("Mul", ["d", "two"], ["y_else"])], "else", [], ["y_else"])
    nodes = [_const("w", W), helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             _const("zero_f", np.float32(0)), helper.make_node("Greater", ["s", "zero_f"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
             helper.make_node("Sigmoid", ["y"], ["z"])]
    return onnx_model(nodes, [("x", F, [3, 4])], [("z", F, [3, 4])])


def test_a_run_time_if_runs_both_branches_compiled_in_the_arena(tmp_path: Path) -> None:
    model = _if_model()
    session = Session(compile_model(model, tmp_path / "art"))
    (step,) = _control_steps(session.plan.steps)
    assert step.op_type == "If" and session.plan.partitions[step.partition].runner == "control"
    assert step.schedules is not None and len(step.schedules) == 2
    for branch in step.schedules:
        _assert_compiled(branch)
    # the branches share the step's region: its scratch, in the outer arena
    assert step.scratch is not None
    assert step.scratch.nbytes >= max(b.arena_nbytes for b in step.schedules) > 0
    buffers = {b.id: b for b in session.plan.buffers}
    assert buffers[f"scratch/{step.index}"].nbytes == step.scratch.nbytes
    report = json.loads((session.path / "report" / "memory.json").read_text())
    branches = report["nested"][str(step.index)]
    assert [r["arenas"]["host"]["arena_nbytes"] for r in branches] == [b.arena_nbytes for b in step.schedules]
    for sign in (1.0, -1.0):
        _check(session, model, {"x": (sign * np.abs(RNG.standard_normal((3, 4)))).astype(np.float32)})


def test_the_reference_fallback_gives_the_same_numbers(tmp_path: Path) -> None:
    model = _if_model()
    compiled = Session(compile_model(model, tmp_path / "a"))
    fallback = Session(compile_model(model, tmp_path / "b", compiled_control=False))
    (step,) = [s for s in fallback.plan.steps if s.op_type == "If"]
    assert step.schedules is None and step.provider == "reference" and "then_branch" in step.attrs
    for sign in (1.0, -1.0):
        x = (sign * np.abs(RNG.standard_normal((3, 4)))).astype(np.float32)
        np.testing.assert_allclose(compiled.run(None, {"x": x})[0], fallback.run(None, {"x": x})[0],
                                   rtol=1e-5, atol=1e-6)


# -- Loop -------------------------------------------------------------------------------------------
def _loop_body(scan: bool, nested_if: bool = False) -> onnx.GraphProto:
    """acc = tanh(acc @ W + b * i); scan output acc * 2 (when ``scan``); with ``nested_if`` the
    update is added only in odd iterations, by a run-time If that reads the outer b."""
    nodes = [helper.make_node("Cast", ["i"], ["fi"], to=F), helper.make_node("Mul", ["b", "fi"], ["bi"]),
             helper.make_node("MatMul", ["acc", "w"], ["m"]), helper.make_node("Add", ["m", "bi"], ["p"]),
             helper.make_node("Tanh", ["p"], ["new"]), helper.make_node("Identity", ["cond"], ["cond_out"])]
    if nested_if:
        _two = _const("two_i", np.array(2, np.int64))
        odd = [_two, helper.make_node("Mod", ["i", "two_i"], ["r"]), _const("one_i", np.array(1, np.int64)),
               helper.make_node("Equal", ["r", "one_i"], ["odd"])]
        then = _graph([helper.make_node("Add", ["new", "b"], ["t"])], "then", [], ["t"])
        other = _graph([helper.make_node("Neg", ["new"], ["e"])], "else", [], ["e"])
        nodes += [*odd, helper.make_node("If", ["odd"], ["acc_out"], then_branch=then, else_branch=other)]
    else:
        nodes.append(helper.make_node("Identity", ["new"], ["acc_out"]))
    outputs = ["cond_out", "acc_out"]
    if scan:
        nodes += [_const("two", np.float32(2)), helper.make_node("Mul", ["acc_out", "two"], ["row"])]
        outputs.append("row")
    inputs = [_vi("i", I64, []), _vi("cond", TensorProto.BOOL, []), _vi("acc", F, [2, 4])]
    return _graph(nodes, "body", inputs, outputs)


def _loop_model(*, scan: bool, nested_if: bool = False) -> onnx.ModelProto:
    loop = helper.make_node("Loop", ["n", "", "acc0"], ["acc", *(["rows"] if scan else [])],
                            body=_loop_body(scan, nested_if))
    nodes = [_const("w", W * 0.5), loop]
    outputs = [("acc", F, [2, 4]), *([("rows", F, [5, 2, 4])] if scan else [])]
    if scan:
        nodes.insert(0, _const("n", np.array(5, np.int64)))
        inputs = [("acc0", F, [2, 4]), ("b", F, [4])]
    else:
        inputs = [("n", I64, []), ("acc0", F, [2, 4]), ("b", F, [4])]
    return onnx_model(nodes, inputs, outputs, opset=13)


def _loop_feeds(n: int | None = None) -> dict[str, np.ndarray]:
    feeds = {"acc0": RNG.standard_normal((2, 4)).astype(np.float32),
             "b": RNG.standard_normal(4).astype(np.float32)}
    if n is not None:
        feeds["n"] = np.array(n, np.int64)
    return feeds


def test_a_loop_step_runs_its_compiled_body(tmp_path: Path) -> None:
    model = _loop_model(scan=False)
    session = Session(compile_model(model, tmp_path / "art"))
    (step,) = _control_steps(session.plan.steps)
    assert step.op_type == "Loop" and step.schedules is not None
    _assert_compiled(step.schedules[0])
    assert step.scratch is not None and step.attrs["carried"][0][1] + 32 <= step.scratch.nbytes
    for n in (0, 1, 7):  # zero iterations: the initial values come out
        _check(session, model, _loop_feeds(n))


def test_a_loop_step_with_scan_outputs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(loops, "MAX_UNROLLED_NODES", 5)
    model = _loop_model(scan=True)
    session = Session(compile_model(model, tmp_path / "art"))
    (step,) = _control_steps(session.plan.steps)
    _assert_compiled(step.schedules[0])  # type: ignore[index]
    _check(session, model, _loop_feeds())


def test_a_run_time_if_nested_in_a_loop_body_reads_the_outermost_scope(tmp_path: Path) -> None:
    model = _loop_model(scan=False, nested_if=True)
    session = Session(compile_model(model, tmp_path / "art"))
    (loop,) = _control_steps(session.plan.steps)
    body = loop.schedules[0]  # type: ignore[index]
    (inner,) = _control_steps(body.steps)
    assert inner.op_type == "If" and body.partitions[inner.partition].runner == "control"
    for branch in inner.schedules:  # type: ignore[union-attr]
        assert all(s.provider == "c" for s in branch.steps)
    assert inner.scratch is None or inner.scratch.offset + inner.scratch.nbytes <= body.arena_nbytes
    for n in (0, 3, 6):
        _check(session, model, _loop_feeds(n))


# -- Scan -------------------------------------------------------------------------------------------
def _scan_model() -> onnx.ModelProto:
    """Scan over a (axis 0, reversed) and b (axis 1); outputs y on the last axis, t on axis 0
    (reversed); the body reads the outer v."""
    body = _graph([helper.make_node("Add", ["s", "x"], ["s1"]), helper.make_node("Mul", ["s1", "v"], ["s2"]),
                   helper.make_node("Sub", ["s2", "z"], ["yb"]), helper.make_node("Relu", ["s2"], ["tb"])],
                  "body", [_vi("s", F, [2]), _vi("x", F, [2]), _vi("z", F, [2])], ["s2", "yb", "tb"])
    scan = helper.make_node("Scan", ["s0", "a", "b"], ["s", "y", "t"], body=body, num_scan_inputs=2,
                            scan_input_directions=[1, 0], scan_input_axes=[0, 1], scan_output_axes=[1, 0],
                            scan_output_directions=[0, 1])
    return onnx_model([_const("v", np.float32([0.5, -1.5])), scan],
                      [("s0", F, [2]), ("a", F, [4, 2]), ("b", F, [2, 4])],
                      [("s", F, [2]), ("y", F, [2, 4]), ("t", F, [4, 2])])


def test_a_scan_step_runs_its_compiled_body(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(loops, "MAX_UNROLLED_NODES", 5)
    model = _scan_model()
    session = Session(compile_model(model, tmp_path / "art"))
    (step,) = _control_steps(session.plan.steps)
    assert step.op_type == "Scan"
    _assert_compiled(step.schedules[0])  # type: ignore[index]
    assert step.attrs["slices"][0] is None and step.attrs["slices"][1] is not None  # axis 1: copied
    feeds = {k: RNG.standard_normal(s).astype(np.float32)
             for k, s in (("s0", (2,)), ("a", (4, 2)), ("b", (2, 4)))}
    _check(session, model, feeds)


# -- plan.json --------------------------------------------------------------------------------------
_SCHEDULE_MUTATIONS = [
    ("ref", lambda s: s["refs"].__setitem__(0, "x0"), r"refs must be one \"i<k>\" or \"a<k>\""),
    ("value past the arena", lambda s: s.update(arena_nbytes=0), "lies past the schedule's 0 bytes"),
    ("unbound input", lambda s: s["inputs"].__setitem__(0, "nowhere"), "binds 'nowhere'"),
    ("step partition", lambda s: s["steps"][0].update(partition=9), r"steps\[0\]\.partition"),
]


@pytest.mark.parametrize("what,mutate,message", _SCHEDULE_MUTATIONS, ids=[m[0] for m in _SCHEDULE_MUTATIONS])
def test_a_malformed_nested_schedule_fails_at_load(tmp_path: Path, what: str, mutate: Any,
                                                   message: str) -> None:
    art = compile_model(_if_model(), tmp_path / "art")
    plan = json.loads((art / "plan.json").read_text())
    (step,) = [s for s in plan["steps"] if "schedules" in s]
    mutate(step["schedules"][0])
    write_plan(art, plan)
    with pytest.raises(ArtifactError, match=message) as info:
        Session(art)
    assert f"steps[{step['index']}].schedules[0]" in str(info.value)


@pytest.mark.parametrize("which", ["if", "loop"])
def test_concurrent_runs_of_a_control_step_do_not_share_bindings(tmp_path: Path, which: str) -> None:
    # each run binds its own region (its pooled arena) and pointer arrays (an If's: per thread)
    from concurrent.futures import ThreadPoolExecutor

    if which == "if":
        model = _if_model()
        cases = [{"x": (s * np.abs(RNG.standard_normal((3, 4)))).astype(np.float32)} for s in (1, -1) * 8]
    else:
        model = _loop_model(scan=False)
        cases = [_loop_feeds(n) for n in (2, 9, 4, 7) * 4]
    session = Session(compile_model(model, tmp_path / "art"), threads=1)
    wants = [ort_run(model, feeds) for feeds in cases]
    with ThreadPoolExecutor(4) as pool:
        gots = list(pool.map(lambda feeds: session.run(None, feeds), cases))
    for got, want in zip(gots, wants, strict=True):
        np.testing.assert_allclose(got[0], want[0], rtol=1e-3, atol=1e-4)


def test_a_body_mixing_c_and_reference_partitions_carries_its_values(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # int64 Add / Mod run on the reference kernels, reading and writing carried buffers in the region
    monkeypatch.setattr(loops, "MAX_UNROLLED_NODES", 5)
    node = helper.make_node
    nodes = [_const("three", np.array(3, np.int64)), _const("seven", np.array(7, np.int64)),
             node("Add", ["cnt", "three"], ["t"]), node("Mod", ["t", "seven"], ["cnt_out"]),
             node("Cast", ["cnt_out"], ["f"], to=F), node("Add", ["acc", "f"], ["acc_out"]),
             node("Mul", ["acc_out", "acc_out"], ["sq"]), node("Identity", ["cond"], ["cond_out"])]
    args = [_vi("i", I64, []), _vi("cond", TensorProto.BOOL, []), _vi("cnt", I64, [3]), _vi("acc", F, [3])]
    body = _graph(nodes, "body", args, ["cond_out", "cnt_out", "acc_out", "sq"])
    loop = helper.make_node("Loop", ["n", "", "cnt0", "acc0"], ["cnt", "acc", "sqs"], body=body)
    outputs = [("cnt", I64, [3]), ("acc", F, [3]), ("sqs", F, [6, 3])]
    inputs = [("cnt0", I64, [3]), ("acc0", F, [3])]
    model = onnx_model([_const("n", np.array(6, np.int64)), loop], inputs, outputs, opset=13)
    session = Session(compile_model(model, tmp_path / "art"))
    (step,) = _control_steps(session.plan.steps)
    runners = {p.runner for p in step.schedules[0].partitions}  # type: ignore[index]
    assert runners == {"c", "reference"}
    _check(session, model, {"cnt0": np.array([1, 5, 9], np.int64), "acc0": np.ones(3, np.float32)})


def test_a_loop_slot_outside_the_region_fails_at_load(tmp_path: Path) -> None:
    art = compile_model(_loop_model(scan=False), tmp_path / "art")
    plan = json.loads((art / "plan.json").read_text())
    (step,) = [s for s in plan["steps"] if "schedules" in s]
    step["attrs"]["carried"][0][1] = step["scratch"]["nbytes"]
    write_plan(art, plan)
    with pytest.raises(ArtifactError, match="its slots in the region: .* does not fit"):
        Session(art)
