"""A Loop or Scan that is not unrolled becomes one ``onnx_aot.Loop`` / ``onnx_aot.Scan`` step.

That is the rule for a Loop whose trip count is known only at run time, and for a Loop or Scan whose
unrolled body would pass loops.MAX_UNROLLED_NODES. The body is imported once, as a sub-schedule
(program.py) whose arguments are, for a Loop, the iteration number, the condition and the carried
values (its condition input is the constant True: the body only runs while the condition holds, so
a condition it passes through folds), and for a Scan the states and each scan input's slice. The
step's kernel runs the body per iteration. Refused: a carried value or state whose shape changes
from one iteration to the next, a Loop's scan outputs whose length is not known at compile time (a
run-time trip count, or a condition the body computes), and more than MAX_STEP_WORK body steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from compiler.frontend.control.branches import add_control_step
from compiler.frontend.control.program import Capture
from compiler.frontend.control.scope import ControlScope
from compiler.frontend.control.scope import element
from compiler.frontend.control.scope import int_list
from compiler.frontend.control.scope import like_input
from compiler.frontend.control.scope import one_element
from compiler.frontend.sequences import refuse_sequences
from compiler.ir.graph import Value
from runtime.errors import ModelError
from runtime.errors import UnsupportedOpError
from runtime.symbolic import Dim
from runtime.symbolic import Expr
from runtime.symbolic import bounds

__all__ = ["MAX_STEP_WORK", "ScanParams", "import_loop_step", "import_scan_step", "scan_params"]

# A loop step whose trip count is known at compile time may run at most this many body steps
# (iterations x body nodes): the golden self-test runs them one by one through the reference
# kernels at compile time, at some microseconds each (and so does the fallback at run time).
MAX_STEP_WORK = 1_000_000
# A loop step's body shapes that depend on the iteration number are taken at iterations 0..K-1,
# where they all agree (x[i:i+1] is [1]; x[:i+1] differs and stays refused)
SAMPLED_ITERATIONS = 3


def _declared(info: onnx.ValueInfoProto, default: tuple[int, ...]) -> tuple[int, ...]:
    dims = info.type.tensor_type.shape.dim if info.type.HasField("tensor_type") else []
    if dims and all(d.HasField("dim_value") for d in dims) and int(np.prod([d.dim_value for d in dims])) == 1:
        return tuple(int(d.dim_value) for d in dims)
    return default


def _args(
    capture: Capture, child: ControlScope, node: onnx.NodeProto, body: onnx.GraphProto, name: str
) -> tuple[list[Value], dict[str, str]]:
    """The body's arguments in ``child`` (iteration number, condition True, carried values) and the
    bindings of its inputs to them."""
    iteration = Value(
        capture.scope.fresh(f"{name}/iteration"), np.dtype(np.int64), _declared(body.input[0], ())
    )
    cond_name = like_input(child, body.input[1], np.array(True), f"{name}/cond")
    carried = [capture.scope.value(n, f"node {name!r} (Loop)") for n in node.input[2:]]
    proxies = [
        Value(capture.scope.fresh(f"{name}/carried{k}"), v.dtype, v.shape) for k, v in enumerate(carried)
    ]
    for value in (iteration, *proxies):
        child.graph.add_input(value)
        child.env[value.name] = value
    # shapes the iteration number decides: those of its first iterations where they agree (the
    # kernels check them at every iteration; docs/dynamic-shapes.md)
    child.samples[id(iteration)] = (iteration, [np.array(i, np.int64).reshape(iteration.shape or ())
                                                for i in range(SAMPLED_ITERATIONS)])
    args = [iteration, child.env[cond_name], *proxies]
    return args, {info.name: value.name for info, value in zip(body.input, args, strict=True)}


def import_loop_step(
    scope: ControlScope, node: onnx.NodeProto, body: onnx.GraphProto, name: str, where: str
) -> None:
    n = len(node.input) - 2
    for k, what in enumerate(("the trip count", "the condition")):
        if k < len(node.input) and node.input[k]:
            one_element(scope.value(node.input[k], where), what, where)
    refuse_sequences([scope.env.get(n) for n in node.input], where, (name, "Loop"),
                     "which a Loop not unrolled (its trip count known only at run time) cannot carry")
    capture = Capture(scope, name, list(node.input))
    child = capture.child(f"{name}/body")
    args, bindings = _args(capture, child, node, body, name)
    program, outs = capture.program(child, body, f"{name}/body", bindings, args, where)
    refuse_sequences(outs, where, (name, "Loop"), "which a Loop not unrolled cannot carry")
    program["args"] = [[list(v.shape or ()), str(v.dtype)] for v in args]
    _check_work(scope, node, body, one_element(outs[0], "the body's condition output", where), name, where)
    _check_carried(args[2:], outs[1 : 1 + n], node, where, name)
    like = list(args[2:])
    scans = outs[1 + n :]
    if scans:
        trips = _fixed_trip_count(scope, node, outs[0], where, name)
        like += [Value("", v.dtype, (trips, *(v.shape or ()))) for v in scans]
    add_control_step(scope, node, name, capture, {"body": program, "n_carried": n}, like)


def _check_work(
    scope: ControlScope, node: onnx.NodeProto, body: onnx.GraphProto, cond_out: Value, name: str, where: str
) -> None:
    """Refuse a loop that surely runs more than MAX_STEP_WORK body steps: a known trip count (its
    max where it is an expression of the symbols) and a condition the body never turns false. (A
    trip count that only bounds a loop whose condition decides, such as PyTorch's while loops with
    M = 2^63 - 1, is not refused.)"""
    endless = cond_out.const is not None and bool(cond_out.const.reshape(-1)[0])
    if not node.input[0]:
        if endless:
            raise UnsupportedOpError(f"{where}: no trip count and a condition the body never turns false: "
                                     f"the loop would never end", [(name, "Loop")])
        return
    known = element(scope.env[node.input[0]])
    most = None if known is None else bounds(known, scope.graph.symbols)[1]
    if most is not None and endless and most * max(len(body.node), 1) > MAX_STEP_WORK:
        raise UnsupportedOpError(
            f"{where}: {most} iterations of a {len(body.node)}-node body: over the "
            f"{MAX_STEP_WORK} body steps a loop step may run (the compile-time self-test runs them one by "
            "one, with the reference kernels)",
            [(name, "Loop")],
        )


def _fixed_trip_count(
    scope: ControlScope, node: onnx.NodeProto, cond_out: Value, where: str, name: str
) -> Dim:
    """The number of iterations, which scan outputs need at compile time: an int, or an expression
    of the symbols (a trip count read off a dynamic dim, a value symbol; a first condition that is
    a value symbol multiplies it). A body that computes its own condition makes the count data
    dependent: refused."""
    trip = element(scope.env[node.input[0]]) if node.input[0] else None
    cond = element(scope.env[node.input[1]]) if len(node.input) > 1 and node.input[1] else True
    if trip is None or cond is None or cond_out.const is None or not bool(cond_out.const.reshape(-1)[0]):
        raise UnsupportedOpError(
            f"{where}: the loop has scan outputs, and how many iterations it runs is known only at run time "
            "(its trip count, its first condition or the condition its body computes); --bind the graph "
            "inputs they depend on, or declare a scalar trip count / condition input a value symbol "
            "(--value NAME=LO..HI)",
            [(name, "Loop")],
        )
    if isinstance(cond, Expr):
        return trip * cond
    return trip if cond else 0


@dataclass(frozen=True)
class ScanParams:
    """A Scan's iteration count and its axes (input axes normalized, for one batch entry in opset 8)."""

    length: Dim  # an expression of the symbols for a Scan over a dynamic axis
    in_axes: list[int]
    in_dirs: list[int]
    out_axes: list[int]
    out_dirs: list[int]


def scan_params(
    scope: ControlScope,
    node: onnx.NodeProto,
    body: onnx.GraphProto,
    n_states: int,
    xs: list[str],
    where: str,
    batched: bool,
) -> ScanParams:
    in_axes = int_list(node, "scan_input_axes", [0] * len(xs))
    in_dirs = int_list(node, "scan_input_directions", int_list(node, "directions", [0] * len(xs)))
    n_out = len(body.output) - n_states
    out_axes = int_list(node, "scan_output_axes", [0] * n_out)
    out_dirs = int_list(node, "scan_output_directions", [0] * n_out)
    if len(in_axes) != len(xs) or len(in_dirs) != len(xs) or len(out_axes) != n_out or len(out_dirs) != n_out:
        raise ModelError(f"{where}: scan axes/directions do not match the number of scan inputs/outputs")
    shapes = [scope.value(x, where).shape or () for x in xs]
    skip = 1 if batched else 0
    axes = [a + len(s) - skip if a < 0 else a for a, s in zip(in_axes, shapes, strict=True)]
    if any(not 0 <= a < len(s) - skip for a, s in zip(axes, shapes, strict=True)):
        raise ModelError(f"{where}: a scan input axis is out of range")
    lengths = {s[a + skip] for a, s in zip(axes, shapes, strict=True)}
    if len(lengths) != 1:
        raise ModelError(
            f"{where}: the scan inputs differ in length along their scan axes: {sorted(lengths)}"
        )
    return ScanParams(lengths.pop(), axes, in_dirs, out_axes, out_dirs)


def import_scan_step(
    scope: ControlScope,
    node: onnx.NodeProto,
    body: onnx.GraphProto,
    params: ScanParams,
    name: str,
    where: str,
) -> None:
    """One ``onnx_aot.Scan`` step running ``body`` per iteration (opset 9 and up); its length may
    be an expression of the graph's symbols (a Scan over a dynamic axis)."""
    most = bounds(params.length, scope.graph.symbols)[1]
    if most * max(len(body.node), 1) > MAX_STEP_WORK:
        raise UnsupportedOpError(
            f"{where}: up to {most} iterations of a {len(body.node)}-node body: over "
            f"the {MAX_STEP_WORK} body steps a scan step runs",
            [(name, "Scan")],
        )
    n = len(node.input) - len(params.in_axes)
    capture = Capture(scope, name, list(node.input))
    child = capture.child(f"{name}/body")
    outer = [scope.value(v, where) for v in node.input]
    shapes = [v.shape or () for v in outer[:n]]
    shapes += [
        tuple(d for k, d in enumerate(v.shape or ()) if k != a)
        for v, a in zip(outer[n:], params.in_axes, strict=True)
    ]
    args = [
        Value(scope.fresh(f"{name}/arg{k}"), v.dtype, shape)
        for k, (v, shape) in enumerate(zip(outer, shapes, strict=True))
    ]
    for value in args:
        child.graph.add_input(value)
        child.env[value.name] = value
    bindings = {info.name: value.name for info, value in zip(body.input, args, strict=True)}
    program, outs = capture.program(child, body, f"{name}/body", bindings, args, where)
    _check_carried(args[:n], outs[:n], node, where, name)
    like = list(outer[:n])
    out_axes = []
    for value, axis in zip(outs[n:], params.out_axes, strict=True):
        shape = list(value.shape or ())
        axis = axis + len(shape) + 1 if axis < 0 else axis
        if not 0 <= axis <= len(shape):
            raise ModelError(f"{where}: scan output axis {axis} out of range for rank {len(shape) + 1}")
        out_axes.append(axis)
        like.append(Value("", value.dtype, (*shape[:axis], params.length, *shape[axis:])))
    attrs = {
        "body": program,
        "n_states": n,
        "length": params.length,
        "in_axes": params.in_axes,
        "in_dirs": params.in_dirs,
        "out_axes": out_axes,
        "out_dirs": params.out_dirs,
    }
    add_control_step(scope, node, name, capture, attrs, like)


def _check_carried(
    before: list[Value], after: list[Value], node: onnx.NodeProto, where: str, name: str
) -> None:
    for k, (old, new) in enumerate(zip(before, after, strict=True)):
        if old.shape != new.shape or old.dtype != new.dtype:
            raise UnsupportedOpError(
                f"{where}: carried value {k} changes from {old.dtype}{list(old.shape or ())} to "
                f"{new.dtype}{list(new.shape or ())} in an iteration; a {node.op_type} step needs one shape",
                [(name, node.op_type)],
            )
