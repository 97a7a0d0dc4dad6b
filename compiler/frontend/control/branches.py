"""``If`` at import: the branch taken is inlined, or both are and ``Where`` picks each output.

A condition known at compile time (a constant, or folded from ``--bind`` inputs and static shapes)
inlines the branch it takes; the other is never imported. A condition known only at run time
inlines both branches and selects each output with ``Where``: both are computed, which is valid
because ONNX ops have no side effects, and their outputs must agree in dtype and shape.
"""

from __future__ import annotations

import onnx

from compiler.frontend.control.scope import ControlScope
from compiler.frontend.control.scope import inline
from compiler.frontend.control.scope import scalar
from compiler.frontend.control.scope import select
from runtime.errors import ModelError

__all__ = ["import_if", "bind_outputs"]


def import_if(scope: ControlScope, node: onnx.NodeProto, name: str, where: str) -> None:
    branches = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}
    if set(branches) != {"then_branch", "else_branch"}:
        raise ModelError(f"{where}: an If needs then_branch and else_branch graphs")
    cond = scope.value(node.input[0], where)
    if cond.const is not None:
        if cond.const.size != 1:
            raise ModelError(f"{where}: the condition has {cond.const.size} elements, not one")
        taken = "then_branch" if bool(cond.const.reshape(-1)[0]) else "else_branch"
        outs = inline(scope, branches[taken], f"{name}/{taken.split('_')[0]}", {}, where)
        scope.graph.eliminated[name] = f"If: condition known at compile time, {taken} inlined"
    else:
        if cond.size != 1:
            raise ModelError(f"{where}: the condition has {cond.size} elements, not one")
        then = inline(scope, branches["then_branch"], f"{name}/then", {}, where)
        other = inline(scope, branches["else_branch"], f"{name}/else", {}, where)
        if len(then) != len(other):
            raise ModelError(f"{where}: the branches have {len(then)} and {len(other)} outputs")
        flag = scalar(scope, node.input[0], name)
        outs = [
            select(scope, flag, a, b, f"{name}/out{k}", where)
            for k, (a, b) in enumerate(zip(then, other, strict=True))
        ]
        scope.graph.eliminated[name] = (
            "If: both branches inlined, each output selected by the condition (Where)"
        )
    bind_outputs(scope, node, outs, where)


def bind_outputs(scope: ControlScope, node: onnx.NodeProto, outs: list[str], where: str) -> None:
    """The node's outputs are the values named ``outs`` (by position; unnamed outputs skipped)."""
    if len(outs) != len(node.output):
        raise ModelError(f"{where}: {len(outs)} values for the node's {len(node.output)} outputs")
    for out, inner in zip(node.output, outs, strict=True):
        if out:
            scope.env[out] = scope.env[inner]
