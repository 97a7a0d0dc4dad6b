"""The reference provider, compile side: claims every node whose op the reference kernels know.

It is last in priority order, the completeness fallback: its steps run in the runtime as numpy
(or cupy) kernels from ``runtime/kernels``, so it generates no source.
"""

from __future__ import annotations

from pathlib import Path

from compiler.codegen.options import BuildOptions
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.providers.base import GenPartition
from runtime.kernels import supported_kinds

__all__ = ["ReferenceProvider"]


class ReferenceProvider:
    """``memory_space`` other than "host" runs the same kernels on that space's array module
    (cupy for "cuda"), so an op without a device kernel does not force a round trip to the host.
    """

    runner = "reference"  # the run side in runtime/providers that executes its partitions
    alignment = 64

    def __init__(self, memory_space: str = "host") -> None:
        self.memory_space = memory_space
        self.name = "reference" if memory_space == "host" else f"reference@{memory_space}"

    def claims(self, graph: Graph) -> set[Node]:
        kinds = supported_kinds()
        return {node for node in graph.nodes if node.kind in kinds}

    def scratch_nbytes(self, node: Node) -> int:
        return 0

    def generate(
        self, partitions: list[GenPartition], kernels_dir: Path, options: BuildOptions
    ) -> None:
        return None
