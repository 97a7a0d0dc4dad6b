"""Merge duplicate constants and duplicate nodes.

Constants with the same dtype, shape and bytes become one (only constants sharing a dtype and
shape with another are hashed). Nodes with the same kind, attributes and input values (by
identity) become one; the graph order is followed, so merged nodes make their users identical
too and whole duplicate chains go in one sweep. A duplicate that produces a graph output stays.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable
from typing import Any

import numpy as np

from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.passes.base import NONDETERMINISTIC
from compiler.passes.base import Pass
from compiler.passes.base import PassResult
from compiler.passes.base import bypass
from compiler.passes.base import note_eliminated

__all__ = ["EliminateCommonSubexpressions"]


def _freeze(value: Any) -> Hashable:
    """A hashable, type-tagged form of an attribute value (1 and 1.0 and True stay apart)."""
    if isinstance(value, dict):
        return (
            "dict",
            tuple((str(k), _freeze(v)) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))),
        )
    if isinstance(value, (list, tuple)):
        return ("list", tuple(_freeze(v) for v in value))
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, (bool, np.bool_)):
        return ("bool", bool(value))
    if isinstance(value, (int, np.integer)):
        return ("int", int(value))
    if isinstance(value, (float, np.floating)):
        return ("float", float(value).hex())
    if isinstance(value, str):
        return ("str", value)
    if value is None:
        return ("none",)
    raise TypeError(f"attribute value of type {type(value).__name__} cannot be compared")


class EliminateCommonSubexpressions(Pass):
    name = "eliminate_common_subexpressions"

    def run(self, graph: Graph) -> PassResult:
        merged_constants = self._merge_constants(graph)
        removed: list[Node] = []
        seen: dict[Hashable, Node] = {}
        for node in graph:
            if not node.outputs or node.op_type in NONDETERMINISTIC:
                continue
            try:
                attrs = _freeze(node.attrs)
            except TypeError:
                continue
            inputs = tuple(id(v) if v is not None else None for v in node.inputs)
            key = (node.domain, node.op_type, len(node.outputs), inputs, attrs)
            first = seen.setdefault(key, node)
            if first is node or any(graph.is_graph_output(v) for v in node.outputs):
                continue
            bypass(graph, node, first.outputs)
            removed.append(node)
        note_eliminated(graph, removed, self.name)
        if merged_constants:
            graph.prune_constants()
        return PassResult(graph, merged_constants or bool(removed))

    @staticmethod
    def _merge_constants(graph: Graph) -> bool:
        groups: dict[tuple[str, tuple[int, ...]], list[Value]] = {}
        for value in graph.constants.values():
            assert value.const is not None and value.dtype is not None and value.shape is not None
            groups.setdefault((value.dtype.str, value.shape), []).append(value)
        merged = False
        for group in groups.values():
            if len(group) < 2:
                continue
            kept: dict[bytes, Value] = {}
            for value in group:
                assert value.const is not None
                data = np.ascontiguousarray(value.const).tobytes()
                first = kept.setdefault(hashlib.sha256(data).digest(), value)
                if first is value or graph.is_graph_output(value) or not value.uses:
                    continue
                assert first.const is not None
                if np.ascontiguousarray(first.const).tobytes() != data:
                    continue  # a hash collision: keep both
                graph.replace_all_uses(value, first)
                merged = True
        return merged
