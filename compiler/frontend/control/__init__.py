"""If, Loop and Scan at import: inlined, unrolled, or turned into control steps.

The importer hands every control-flow node to :func:`import_control_flow` as it reaches it, with the
outer scope's values visible inside the subgraphs. ``branches.py`` inlines the If branch taken, or
makes an ``onnx_aot.If`` step when the condition is known only at run time; ``loops.py`` unrolls
Loop and Scan, and ``loop_step.py`` makes an ``onnx_aot.Loop`` / ``onnx_aot.Scan`` step of one it
does not unroll; ``program.py`` writes a subgraph as the sub-schedule such a step runs; ``scope.py``
holds what they share (fresh names, inlining a subgraph).
"""

from __future__ import annotations

import onnx

from compiler.frontend.control.branches import import_if
from compiler.frontend.control.loops import import_loop
from compiler.frontend.control.loops import import_scan
from compiler.frontend.control.scope import CONTROL_FLOW_OPS
from compiler.frontend.control.scope import ControlScope
from compiler.frontend.control.scope import is_control_flow
from compiler.frontend.control.scope import names_in
from compiler.frontend.control.scope import outer_names
from compiler.frontend.control.scope import referenced_names
from compiler.frontend.control.scope import subgraphs
from compiler.frontend.control.scope import walk_nodes

__all__ = [
    "CONTROL_FLOW_OPS",
    "ControlScope",
    "import_control_flow",
    "is_control_flow",
    "names_in",
    "outer_names",
    "referenced_names",
    "subgraphs",
    "walk_nodes",
]


def import_control_flow(scope: ControlScope, node: onnx.NodeProto, name: str) -> None:
    """Import control-flow ``node`` (named ``name`` in messages) into ``scope``'s graph."""
    where = f"node {name!r} ({node.op_type})"
    if node.op_type == "If":
        import_if(scope, node, name, where)
    elif node.op_type == "Loop":
        import_loop(scope, node, name, where)
    else:
        import_scan(scope, node, name, where)
