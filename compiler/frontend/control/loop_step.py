"""A ``Loop`` that is not unrolled becomes one ``onnx_aot.Loop`` step running its body per iteration.

That is the rule for a trip count known only at run time, or one whose unrolled body would pass
loops.MAX_UNROLLED_NODES. The body is imported once, as a sub-schedule (program.py) whose arguments
are the iteration number, the condition and the carried values; its condition input is the
constant True (the body only runs while the condition holds), so a condition it passes through
folds. The step's kernel runs the body while the trip count and the condition allow. Refused: a
carried value whose shape changes from one iteration to the next, and scan outputs whose length
is not known at compile time (a run-time trip count, or a condition the body computes).
"""

from __future__ import annotations

import numpy as np
import onnx

from compiler.frontend.control.branches import add_control_step
from compiler.frontend.control.program import Capture
from compiler.frontend.control.scope import ControlScope
from compiler.frontend.control.scope import like_input
from compiler.frontend.control.scope import one_element
from compiler.ir.graph import Value
from runtime.errors import UnsupportedOpError

__all__ = ["MAX_STEP_WORK", "import_loop_step"]

# A loop step whose trip count is known at compile time may run at most this many body steps
# (iterations x body nodes): they run one by one through the reference kernels, at compile time
# too (the golden self-test), at some microseconds each.
MAX_STEP_WORK = 1_000_000


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
    args = [iteration, child.env[cond_name], *proxies]
    return args, {info.name: value.name for info, value in zip(body.input, args, strict=True)}


def import_loop_step(
    scope: ControlScope, node: onnx.NodeProto, body: onnx.GraphProto, name: str, where: str
) -> None:
    n = len(node.input) - 2
    for k, what in enumerate(("the trip count", "the condition")):
        if k < len(node.input) and node.input[k]:
            one_element(scope.value(node.input[k], where), what, where)
    known = scope.env[node.input[0]].const
    if known is not None and int(known.reshape(-1)[0]) * max(len(body.node), 1) > MAX_STEP_WORK:
        raise UnsupportedOpError(
            f"{where}: {int(known.reshape(-1)[0])} iterations of a {len(body.node)}-node body: over the "
            f"{MAX_STEP_WORK} body steps a loop step runs (one by one, with the reference kernels)",
            [(name, "Loop")],
        )
    capture = Capture(scope, name, list(node.input))
    child = capture.child(f"{name}/body")
    args, bindings = _args(capture, child, node, body, name)
    program, outs = capture.program(child, body, f"{name}/body", bindings, args, where)
    program["args"] = [[list(v.shape or ()), str(v.dtype)] for v in args]
    one_element(outs[0], "the body's condition output", where)
    for k, (before, after) in enumerate(zip(args[2:], outs[1 : 1 + n], strict=True)):
        if before.shape != after.shape or before.dtype != after.dtype:
            raise UnsupportedOpError(
                f"{where}: loop-carried value {k} ({node.input[2 + k]!r}) changes from {before.dtype}"
                f"{list(before.shape or ())} to {after.dtype}{list(after.shape or ())} in an iteration; "
                "a loop step needs one static shape",
                [(name, "Loop")],
            )
    like = list(args[2:])
    scans = outs[1 + n :]
    if scans:
        trips = _fixed_trip_count(scope, node, outs[0], where, name)
        like += [Value("", v.dtype, (trips, *(v.shape or ()))) for v in scans]
    add_control_step(scope, node, name, capture, {"body": program, "n_carried": n}, like)


def _fixed_trip_count(
    scope: ControlScope, node: onnx.NodeProto, cond_out: Value, where: str, name: str
) -> int:
    """The number of iterations, when scan outputs need it at compile time."""
    trip = scope.env[node.input[0]].const
    cond = scope.env[node.input[1]].const if len(node.input) > 1 and node.input[1] else np.array(True)
    if trip is None or cond is None or cond_out.const is None or not bool(cond_out.const.reshape(-1)[0]):
        raise UnsupportedOpError(
            f"{where}: the loop has scan outputs, and how many iterations it runs is known only at run time "
            "(its trip count or its condition); --bind the graph inputs they depend on",
            [(name, "Loop")],
        )
    return int(trip.reshape(-1)[0]) if bool(cond.reshape(-1)[0]) else 0
