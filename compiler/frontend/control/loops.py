"""``Loop`` and ``Scan`` at import: unrolled, the body imported once per iteration.

Every iteration imports the body with its iteration number a constant (so indices computed from it
fold) and the loop-carried values of the previous iteration as its inputs; scan outputs are the
iterations' values stacked along the scan axis. A Loop unrolls when its trip count is known at
compile time and the unrolled body stays within MAX_UNROLLED_NODES nodes, or when it has no trip
count but scan outputs (their length must be known: its condition must fold); other Loops become
a loop step (loop_step.py). A Scan over the cap becomes a scan step.

A Loop's condition that is known only at run time is honoured with ``Where``: from the iteration in
which it turns false, the carried values stay as they were (the later iterations' results are
computed and dropped). Scan outputs then would have a length that depends on the data: refused, as
is a Loop with neither a trip count nor a condition known at compile time.
"""

from __future__ import annotations

import numpy as np
import onnx

from compiler.frontend.control.branches import bind_outputs
from compiler.frontend.control.loop_step import ScanParams
from compiler.frontend.control.loop_step import import_loop_step
from compiler.frontend.control.loop_step import import_scan_step
from compiler.frontend.control.loop_step import scan_params
from compiler.frontend.control.scope import ControlScope
from compiler.frontend.control.scope import element
from compiler.frontend.control.scope import inline
from compiler.frontend.control.scope import like_input
from compiler.frontend.control.scope import one_element
from compiler.frontend.control.scope import scalar
from compiler.frontend.control.scope import select
from compiler.frontend.sequences import refuse_sequences
from runtime.errors import ModelError
from runtime.errors import UnsupportedOpError
from runtime.symbolic import Expr

__all__ = ["MAX_UNROLLED_NODES", "import_loop", "import_scan"]

# An unrolled Loop or Scan may add at most this many body nodes (iterations x body nodes); past it a
# Loop or Scan becomes a step that runs its body per iteration. Unrolled nodes cost compile time
# (a chain of 9 elementwise ops per iteration, all passes and C builds: 1,800 nodes 2.9 s, 4,500
# 18.5 s, 18,000 276 s on the 2-core build machine).
MAX_UNROLLED_NODES = 2_000

Flag = bool | str  # True / False known at compile time, or the name of a run-time bool scalar


def _body(node: onnx.NodeProto, where: str) -> onnx.GraphProto:
    for attr in node.attribute:
        if attr.name == "body" and attr.type == onnx.AttributeProto.GRAPH:
            return attr.g
    raise ModelError(f"{where}: no body graph")


def _check_size(name: str, where: str, iterations: int, body: onnx.GraphProto) -> None:
    if iterations * max(len(body.node), 1) > MAX_UNROLLED_NODES:
        raise UnsupportedOpError(
            f"{where}: {iterations} iterations of a {len(body.node)}-node body exceed the "
            f"{MAX_UNROLLED_NODES} nodes onnx-aot unrolls a Scan (or a Loop without a trip count) into",
            [(name, "Loop/Scan")],
        )


def _stack(scope: ControlScope, names: list[str], axis: int, base: str, where: str) -> str:
    """The values ``names`` (one shape) stacked along a new axis ``axis`` (negative: from the end)."""
    if not names:
        raise UnsupportedOpError(
            f"{where}: a scan output of zero iterations (empty tensors are not supported)"
        )
    shapes = {scope.env[n].shape for n in names}
    if len(shapes) != 1:
        found = ", ".join(sorted(map(str, shapes)))
        raise UnsupportedOpError(f"{where}: a scan output's iterations differ in shape: {found}")
    shape = list(shapes.pop() or ())
    axis = axis + len(shape) + 1 if axis < 0 else axis
    if not 0 <= axis <= len(shape):
        raise ModelError(f"{where}: scan output axis {axis} out of range for rank {len(shape) + 1}")
    target = scope.constant(f"{base}/shape", np.array([*shape[:axis], 1, *shape[axis:]], np.int64))
    parts = [scope.emit("Reshape", [n, target], base) for n in names]
    return parts[0] if len(parts) == 1 else scope.emit("Concat", parts, base, axis=axis)


def _take(scope: ControlScope, x: str, index: int, axis: int, base: str) -> str:
    """``x``'s slice ``index`` along ``axis`` (the axis removed)."""
    return scope.emit(
        "Gather", [x, scope.constant(f"{base}/index", np.array(index, np.int64))], base, axis=axis
    )


def _initial_flag(scope: ControlScope, node: onnx.NodeProto, name: str, where: str) -> Flag:
    if len(node.input) < 2 or not node.input[1]:
        return True
    cond = scope.value(node.input[1], where)
    if cond.size != 1:
        raise ModelError(f"{where}: the condition has {cond.size} elements, not one")
    if cond.const is not None:
        return bool(cond.const.reshape(-1)[0])
    return scalar(scope, node.input[1], name)


def _trip_count(scope: ControlScope, node: onnx.NodeProto, where: str) -> int | Expr | None:
    """The trip count: an int, an expression of the symbols (a dim of a dynamic input, a value
    symbol), or None (none given, or known only at run time)."""
    if not node.input or not node.input[0]:
        return None
    trip = element(one_element(scope.value(node.input[0], where), "the trip count", where))
    return None if trip is None else int(trip) if not isinstance(trip, Expr) else trip


def _unrolls(scope: ControlScope, node: onnx.NodeProto, body: onnx.GraphProto, where: str) -> bool:
    """Unroll unless a trip count is given that is known only at run time, an expression of the
    symbols or over the unroll cap, or the first condition is an expression of the symbols; a loop
    with no trip count unrolls only when it has scan outputs (unrolling is how their length is
    known), else it is a loop step that runs while its condition holds."""
    if len(node.input) > 1 and node.input[1] and isinstance(element(scope.value(node.input[1], where)), Expr):
        return False
    if not node.input or not node.input[0]:
        return len(body.output) > len(node.input) - 1
    trip = _trip_count(scope, node, where)
    return isinstance(trip, int) and trip * max(len(body.node), 1) <= MAX_UNROLLED_NODES


def _next_flag(scope: ControlScope, flag: Flag, cond_out: str, base: str, where: str) -> Flag:
    value = one_element(scope.env[cond_out], "the body's condition output", where)
    if value.const is not None:
        keep = bool(value.const.reshape(-1)[0])
        return flag if keep else False
    now = scalar(scope, cond_out, base)
    return now if flag is True else scope.emit("And", [str(flag), now], base)


def import_loop(scope: ControlScope, node: onnx.NodeProto, name: str, where: str) -> None:
    body = _body(node, where)
    carried = list(node.input[2:])
    n_scan = len(body.output) - 1 - len(carried)
    if len(body.input) != len(carried) + 2 or n_scan < 0 or len(node.output) != len(carried) + n_scan:
        raise ModelError(
            f"{where}: the body's inputs/outputs do not match the node's "
            f"({len(body.input)} in, {len(body.output)} out for {len(carried)} carried values)"
        )
    if not all(carried):
        raise ModelError(f"{where}: a loop-carried input has no name")
    if not _unrolls(scope, node, body, where):
        import_loop_step(scope, node, body, name, where)
        return
    trip = _trip_count(scope, node, where)
    assert not isinstance(trip, Expr)  # (an expression makes a loop step)
    flag = _initial_flag(scope, node, name, where)
    scans: list[list[str]] = [[] for _ in range(n_scan)]
    i = 0
    while (trip is None or i < trip) and flag is not False:
        if not isinstance(flag, bool) and (trip is None or n_scan):
            what = (
                "it has no trip count"
                if trip is None
                else "the length of its scan outputs would depend on it"
            )
            raise UnsupportedOpError(
                f"{where}: the loop condition is known only at run time and {what}; "
                "--bind the graph inputs it depends on",
                [(name, "Loop")],
            )
        _check_size(name, where, i + 1, body)
        base = f"{name}/iter{i}"
        cond_in = (
            like_input(scope, body.input[1], np.array(True), f"{base}/cond") if flag is True else str(flag)
        )
        bindings = {
            body.input[0].name: like_input(scope, body.input[0], np.array(i, np.int64), f"{base}/i"),
            body.input[1].name: cond_in,
            **{info.name: value for info, value in zip(body.input[2:], carried, strict=True)},
        }
        outs = inline(scope, body, base, bindings, where)
        new = outs[1 : 1 + len(carried)]
        if flag is not True:
            refuse_sequences([scope.env[n] for n in new], where, (name, "Loop"),
                             "which a condition known only at run time cannot keep or drop")
            new = [
                select(scope, str(flag), n, c, f"{base}/keep", where)
                for n, c in zip(new, carried, strict=True)
            ]
        carried = new
        for k, out in enumerate(outs[1 + len(carried) :]):
            scans[k].append(out)
        flag = _next_flag(scope, flag, outs[0], f"{base}/cond", where)
        i += 1
    stacked = [_stack(scope, elems, 0, f"{name}/scan{k}", where) for k, elems in enumerate(scans)]
    bind_outputs(scope, node, carried + stacked, where)
    scope.graph.eliminated[name] = f"Loop: unrolled, {i} iteration(s)"


def _scan_iterations(
    scope: ControlScope,
    body: onnx.GraphProto,
    states: list[str],
    xs: list[str],
    params: ScanParams,
    base: str,
    where: str,
) -> tuple[list[str], list[str]]:
    """Unroll the Scan (opset 9 semantics) over ``xs`` from ``states``: (final states, scan outputs)."""
    seq, axes, in_dirs, out_axes, out_dirs = (
        params.length,
        params.in_axes,
        params.in_dirs,
        params.out_axes,
        params.out_dirs,
    )
    n_out = len(out_axes)
    assert isinstance(seq, int)  # (a Scan over a dynamic axis is a scan step)
    _check_size(base, where, seq, body)
    elems: list[list[str]] = [[] for _ in range(n_out)]
    for t in range(seq):
        step = f"{base}/iter{t}"
        slices = [
            _take(scope, x, seq - 1 - t if d else t, a, step)
            for x, a, d in zip(xs, axes, in_dirs, strict=True)
        ]
        bindings = {info.name: v for info, v in zip(body.input, states + slices, strict=True)}
        outs = inline(scope, body, step, bindings, where)
        states = outs[: len(states)]
        for k, out in enumerate(outs[len(states) :]):
            elems[k].append(out)
    outputs = [
        _stack(scope, e[::-1] if d else e, a, f"{base}/scan{k}", where)
        for k, (e, a, d) in enumerate(zip(elems, out_axes, out_dirs, strict=True))
    ]
    return states, outputs


def import_scan(scope: ControlScope, node: onnx.NodeProto, name: str, where: str) -> None:
    body = _body(node, where)
    n_in = [int(a.i) for a in node.attribute if a.name == "num_scan_inputs"]
    if not n_in:
        raise ModelError(f"{where}: no num_scan_inputs attribute")
    batched = scope.opset < 9
    inputs = list(node.input[1:] if batched else node.input)
    n_states = len(inputs) - n_in[0]
    if n_states < 0 or len(body.input) != len(inputs) or not all(inputs):
        raise ModelError(
            f"{where}: the body's {len(body.input)} inputs do not match the node's {len(inputs)}"
        )
    params = scan_params(scope, node, body, n_states, inputs[n_states:], where, batched)
    if batched:
        _import_scan8(scope, node, body, inputs[:n_states], inputs[n_states:], params, name, where)
    elif isinstance(params.length, Expr) or params.length * max(len(body.node), 1) > MAX_UNROLLED_NODES:
        import_scan_step(scope, node, body, params, name, where)
        return
    else:
        states, outs = _scan_iterations(
            scope, body, inputs[:n_states], inputs[n_states:], params, name, where
        )
        bind_outputs(scope, node, states + outs, where)
    scope.graph.eliminated[name] = "Scan: unrolled"


def _import_scan8(
    scope: ControlScope,
    node: onnx.NodeProto,
    body: onnx.GraphProto,
    states: list[str],
    xs: list[str],
    params: ScanParams,
    name: str,
    where: str,
) -> None:
    """Scan-8: every input has a leading batch axis; each batch entry is scanned on its own."""
    if node.input[0] and scope.value(node.input[0], where).const is None:
        raise UnsupportedOpError(f"{where}: sequence_lens known only at run time", [(name, "Scan")])
    if node.input[0]:
        lens = scope.env[node.input[0]].const
        full = (scope.value(xs[0], where).shape or (0, 0))[1]
        if lens is not None and np.any(lens != full):
            raise UnsupportedOpError(f"{where}: sequences shorter than the scan axis", [(name, "Scan")])
    batch = (scope.value((states + xs)[0], where).shape or (0,))[0]
    results: list[list[str]] = []
    for b in range(batch):
        base = f"{name}/batch{b}"
        own_states = [_take(scope, s, b, 0, base) for s in states]
        own_xs = [_take(scope, x, b, 0, base) for x in xs]
        finals, outs = _scan_iterations(scope, body, own_states, own_xs, params, base, where)
        results.append(finals + outs)
    columns = [[row[k] for row in results] for k in range(len(node.output))]
    stacked = [_stack(scope, col, 0, f"{name}/out{k}", where) for k, col in enumerate(columns)]
    bind_outputs(scope, node, stacked, where)
