"""The reference provider, compile side: claims every node whose op the reference kernels know.

It is last in priority order, the completeness fallback: its steps run in the runtime as numpy
(or cupy) kernels from ``runtime/kernels``, so it generates no source.
"""

from __future__ import annotations

from pathlib import Path

from compiler.ir.graph import Graph, Node
from compiler.providers.base import BuildOptions, PartitionPlan
from runtime.kernels import supported_kinds

__all__ = ["ReferenceProvider"]


class ReferenceProvider:
    name = "reference"
    memory_space = "host"
    alignment = 64

    def claims(self, graph: Graph) -> set[Node]:
        kinds = supported_kinds()
        return {node for node in graph.nodes if node.kind in kinds}

    def scratch_nbytes(self, node: Node) -> int:
        return 0

    def generate(
        self, partitions: list[PartitionPlan], kernels_dir: Path, options: BuildOptions
    ) -> dict[str, object]:
        return {}
