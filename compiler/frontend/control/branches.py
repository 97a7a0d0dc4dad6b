"""``If`` at import: the branch taken is inlined, or a conditional step runs it at run time.

A condition known at compile time (a constant, or folded from ``--bind`` inputs and static shapes)
inlines the branch it takes; the other is never imported. A condition known only at run time makes
one ``onnx_aot.If`` step holding both branches as sub-schedules (programs, see program.py); its
reference kernel runs the one the condition picks. The branches' outputs must agree in dtype and
shape (outputs of different shapes come with dynamic shapes).
"""

from __future__ import annotations

from collections.abc import Mapping

import onnx

from compiler.frontend.control.program import BODIES
from compiler.frontend.control.program import Capture
from compiler.frontend.control.scope import ControlScope
from compiler.frontend.control.scope import inline
from compiler.ir.graph import AOT_DOMAIN
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from runtime.errors import ModelError
from runtime.errors import UnsupportedOpError

__all__ = ["import_if", "bind_outputs", "add_control_step"]


def import_if(scope: ControlScope, node: onnx.NodeProto, name: str, where: str) -> None:
    branches = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}
    if set(branches) != {"then_branch", "else_branch"}:
        raise ModelError(f"{where}: an If needs then_branch and else_branch graphs")
    cond = scope.value(node.input[0], where)
    if cond.size != 1:
        raise ModelError(f"{where}: the condition has {cond.size} elements, not one")
    if cond.const is None:
        _conditional_step(scope, node, name, branches, where)
        return
    taken = "then_branch" if bool(cond.const.reshape(-1)[0]) else "else_branch"
    outs = inline(scope, branches[taken], f"{name}/{taken.split('_')[0]}", {}, where)
    scope.graph.eliminated[name] = f"If: condition known at compile time, {taken} inlined"
    bind_outputs(scope, node, outs, where)


def bind_outputs(scope: ControlScope, node: onnx.NodeProto, outs: list[str], where: str) -> None:
    """The node's outputs are the values named ``outs`` (by position; unnamed outputs skipped)."""
    if len(outs) != len(node.output):
        raise ModelError(f"{where}: {len(outs)} values for the node's {len(node.output)} outputs")
    for out, inner in zip(node.output, outs, strict=True):
        if out:
            scope.env[out] = scope.env[inner]


def _conditional_step(
    scope: ControlScope, node: onnx.NodeProto, name: str, branches: dict[str, onnx.GraphProto], where: str
) -> None:
    """One ``onnx_aot.If`` step whose reference kernel runs the sub-schedule of the branch taken."""
    capture = Capture(scope, name, [node.input[0]])
    programs, results = {}, []
    for key in ("then_branch", "else_branch"):
        child = capture.child(f"{name}/{key}")
        programs[key], outs = capture.program(
            child, branches[key], f"{name}/{key.split('_')[0]}", {}, [], where
        )
        results.append(outs)
    then, other = results
    if len(then) != len(other) or len(then) != len(node.output):
        raise ModelError(
            f"{where}: the branches have {len(then)} and {len(other)} outputs, the node {len(node.output)}"
        )
    for out, a, b in zip(node.output, then, other, strict=True):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise UnsupportedOpError(
                f"{where}: the condition is known only at run time and output {out!r} differs between the "
                f"branches ({a.dtype}{list(a.shape or ())} vs {b.dtype}{list(b.shape or ())}); onnx-aot "
                "needs one static shape (--bind the inputs the condition depends on to decide it earlier)"
            )
    add_control_step(scope, node, name, capture, programs, then)


def add_control_step(
    scope: ControlScope,
    node: onnx.NodeProto,
    name: str,
    capture: Capture,
    attrs: Mapping[str, object],
    like: list[Value],
) -> None:
    """Add the ``onnx_aot.<op>`` step for ``node``: its inputs are what ``capture`` collected, its
    outputs the node's, each with the dtype and shape of the value in ``like`` at its position."""
    outputs = [
        Value(out or scope.fresh(f"{name}/unused"), v.dtype, v.shape)
        for out, v in zip(node.output, like, strict=True)
    ]
    step = Node(
        node.op_type, capture.values(), outputs, {**attrs, BODIES: list(capture.bodies)}, name=name,
        domain=AOT_DOMAIN, origin=[name]
    )
    scope.graph.add_node(step)
    for out, value in zip(node.output, outputs, strict=True):
        if out:
            scope.env[out] = value
