"""``If`` at import: the branch taken is inlined, or a conditional step runs it at run time.

A condition known at compile time (a constant, or folded from ``--bind`` inputs and static shapes)
inlines the branch it takes; the other is never imported. A condition known only at run time makes
one ``onnx_aot.If`` step holding both branches as sub-schedules (programs, see program.py); its
reference kernel runs the one the condition picks. The branches' outputs must agree in dtype and
shape, unless the condition is a value symbol (``--value``, compiler/frontend/value_symbols.py):
then an output may differ in its dims between the branches and takes the shape the condition picks,
``C*then + (1-C)*else`` (same rank and dtype).
"""

from __future__ import annotations

from collections.abc import Mapping

import onnx

from compiler.frontend.control.program import BODIES
from compiler.frontend.control.program import Capture
from compiler.frontend.control.scope import ControlScope
from compiler.frontend.control.scope import element
from compiler.frontend.control.scope import inline
from compiler.frontend.sequences import SeqValue
from compiler.frontend.sequences import element_name
from compiler.ir.graph import AOT_DOMAIN
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from runtime.errors import ModelError
from runtime.errors import UnsupportedOpError
from runtime.symbolic import Expr
from runtime.symbolic import bounds

__all__ = ["import_if", "bind_outputs", "add_control_step"]


def import_if(scope: ControlScope, node: onnx.NodeProto, name: str, where: str) -> None:
    branches = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}
    if set(branches) != {"then_branch", "else_branch"}:
        raise ModelError(f"{where}: an If needs then_branch and else_branch graphs")
    cond = scope.value(node.input[0], where)
    if cond.size != 1:
        raise ModelError(f"{where}: the condition has {cond.size} elements, not one")
    known = element(cond)
    if known is None or isinstance(known, Expr):  # (an Expr: a value symbol, 0 or 1)
        _conditional_step(scope, node, name, branches, where, known)
        return
    taken = "then_branch" if known else "else_branch"
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
    scope: ControlScope, node: onnx.NodeProto, name: str, branches: dict[str, onnx.GraphProto], where: str,
    chooser: Expr | None = None,
) -> None:
    """One ``onnx_aot.If`` step whose reference kernel runs the sub-schedule of the branch taken.
    Where the condition is ``chooser`` (an expression of value symbols, 0 or 1), outputs whose
    shapes differ between the branches get the shape ``chooser*then + (1-chooser)*else``."""
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
    names, like = [], []
    for out, a, b in zip(node.output, then, other, strict=True):
        for k, (x, y) in _elements(out, a, b, where, name):
            names.append(out if k < 0 else scope.fresh(element_name(out, k)) if out else "")
            like.append(_either(scope, names[-1] or out, x, y, chooser, where))
    add_control_step(scope, node, name, capture, programs, like, names)
    flat = iter(names)
    for out, a in zip(node.output, then, strict=True):
        if isinstance(a, SeqValue):  # the step has one output per element
            items = [scope.env[next(flat)] for _ in a.items]
            if out:
                scope.env[out] = SeqValue(out, items, a.elem_dtype)
        else:
            next(flat)


def _elements(out: str, a: Value, b: Value, where: str, name: str) -> list[tuple[int, tuple[Value, Value]]]:
    """The pairs of then / else values an If output ``out`` is made of: ``[(-1, (a, b))]`` for a
    tensor, one pair per element (numbered) for sequences of one length."""
    if not isinstance(a, SeqValue) and not isinstance(b, SeqValue):
        return [(-1, (a, b))]
    if not isinstance(a, SeqValue) or not isinstance(b, SeqValue) or len(a.items) != len(b.items):
        lengths = [len(v.items) if isinstance(v, SeqValue) else "a tensor" for v in (a, b)]
        raise UnsupportedOpError(
            f"{where}: the condition is known only at run time and output {out!r} is a sequence of "
            f"{lengths[0]} element(s) in one branch, {lengths[1]} in the other; onnx-aot needs one length "
            "(--bind the inputs the condition depends on to decide it at compile time)", [(name, "If")])
    return list(enumerate(zip(a.items, b.items, strict=True)))


def _either(scope: ControlScope, out: str, a: Value, b: Value, chooser: Expr | None, where: str) -> Value:
    """The If's output ``out``: ``a`` (then) where the branches agree, else a shape chosen by the
    value-symbol condition ``chooser``; refused where nothing decides the shape."""
    if a.shape == b.shape and a.dtype == b.dtype:
        return a
    sa, sb = list(a.shape or ()), list(b.shape or ())
    decided = chooser is not None and bounds(chooser, scope.graph.symbols) in ((0, 1), (0, 0), (1, 1))
    if not decided or a.dtype != b.dtype or len(sa) != len(sb):
        raise UnsupportedOpError(
            f"{where}: the condition is known only at run time and output {out!r} differs between the "
            f"branches ({a.dtype}{sa} vs {b.dtype}{sb}); onnx-aot needs one shape, or ranks and dtypes "
            "that agree and a condition that is a value symbol (--value NAME=0..1) so that the shape "
            "follows it; --bind the inputs the condition depends on to decide it earlier"
        )
    assert chooser is not None
    shape = tuple(x if x == y else chooser * x + (1 - chooser) * y for x, y in zip(sa, sb, strict=True))
    return Value("", a.dtype, shape)


def add_control_step(
    scope: ControlScope,
    node: onnx.NodeProto,
    name: str,
    capture: Capture,
    attrs: Mapping[str, object],
    like: list[Value],
    names: list[str] | None = None,
) -> None:
    """Add the ``onnx_aot.<op>`` step for ``node``: its inputs are what ``capture`` collected, its
    outputs the node's (or ``names``: an If's with sequences, one per element), each with the dtype
    and shape of the value in ``like`` at its position."""
    names = list(node.output) if names is None else names
    outputs = [
        Value(out or scope.fresh(f"{name}/unused"), v.dtype, v.shape)
        for out, v in zip(names, like, strict=True)
    ]
    step = Node(
        node.op_type, capture.values(), outputs, {**attrs, BODIES: list(capture.bodies)}, name=name,
        domain=AOT_DOMAIN, origin=[name]
    )
    scope.graph.add_node(step)
    for out, value in zip(names, outputs, strict=True):
        if out:
            scope.env[out] = value
