"""What the C and CUDA providers share: the kernel table, the kernel base, kernel parameters and
the base of the contexts their templates render.

A kernel (``Kernel``) runs one or more op kinds: ``supports`` decides the claim from the node's
attributes, dtypes and shapes, ``scratch_nbytes`` sizes the step's scratch (none by default), and
each provider adds its own ``build`` (a C function, CUDA launches). Each kernel module lists its
kernels in ``KERNELS``; a provider builds its ``KernelTable`` from the explicit list of its kernel
modules (``KERNEL_MODULES`` in ``c/provider.py`` and ``cuda/provider.py``), so what a provider
runs is written in one place and importing a module registers nothing by itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Generic
from typing import TypeVar

from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from runtime.errors import CompileError
from runtime.errors import OnnxAotError
from runtime.symbolic import Expr

__all__ = ["Kernel", "KernelContext", "KernelTable", "Param", "comment"]


class Kernel:
    """The base of every generated kernel: the op kinds it runs, its claim, its scratch."""

    kinds: tuple[str, ...] = ()
    # takes nodes with symbolic dims (a dynamic graph: sizes from the binding at run time, see
    # compiler/codegen/cdims.py); other kernels see static nodes only
    dynamic: bool = False

    def supports(self, node: Node) -> bool:
        """Whether this kernel runs ``node`` with its attributes, dtypes and shapes."""
        raise NotImplementedError

    def scratch_nbytes(self, node: Node) -> int:
        """Bytes of scratch one step of ``node`` needs (none unless a kernel says otherwise)."""
        return 0

    def overwritable_input(self, node: Node) -> int | None:
        """The input whose memory a step of ``node`` may write its output over (same shape and
        dtype, dying at the step; compiler/memory/lifetimes.py decides), though its kind is not
        elementwise: None unless a kernel reads every element of it before storing that element."""
        return None


K = TypeVar("K", bound=Kernel)


class KernelTable(Generic[K]):
    """One provider's kernels by op kind (one kernel per kind), from its kernel modules' ``KERNELS``."""

    def __init__(self, provider: str, modules: Sequence[ModuleType]) -> None:
        self.provider = provider
        self._kernels: dict[str, K] = {}
        for module in modules:
            self._add(module.KERNELS, module.__name__)

    def _add(self, kernels: Iterable[K], where: str) -> None:
        for kernel in kernels:
            for kind in kernel.kinds:
                if kind in self._kernels:
                    raise ValueError(f"{self.provider} kernel for {kind} registered twice ({where})")
                self._kernels[kind] = kernel

    def kinds(self) -> frozenset[str]:
        return frozenset(self._kernels)

    def supports(self, node: Node) -> bool:
        """Whether a kernel runs ``node``; a kernel's check failing on odd attributes is a no.

        Empty tensors are each kernel's to accept or refuse (the C kernels for slices, splits, tiles,
        pads and reductions handle them; tests/test_c_indexing.py); a node whose outputs are all
        empty never gets here from a model, the importer makes those outputs constants.
        """
        kernel = self._kernels.get(node.kind)
        if kernel is None:
            return False
        if not kernel.dynamic and any(v is not None and v.is_symbolic for v in (*node.inputs, *node.outputs)):
            return False
        try:
            return bool(kernel.supports(node))
        except (OnnxAotError, KeyError, TypeError, ValueError, IndexError):
            return False

    def claims(self, graph: Graph) -> set[Node]:
        return {node for node in graph.nodes if self.supports(node)}

    def kernel(self, node: Node) -> K:
        """The kernel that runs ``node``; CompileError naming the node when none does."""
        if not self.supports(node):
            raise CompileError(f"{node.describe()} is not supported by the {self.provider} provider")
        return self._kernels[node.kind]

    def scratch_nbytes(self, node: Node) -> int:
        n = self.kernel(node).scratch_nbytes(node)
        return n if isinstance(n, Expr) else int(n)  # type: ignore[return-value]  # a dynamic node's: an Expr

    def overwritable_input(self, node: Node) -> int | None:
        return self.kernel(node).overwritable_input(node)


@dataclass(frozen=True)
class Param:
    """One pointer parameter of a kernel function (``restrict`` only where nothing may alias)."""

    name: str
    ctype: str
    const: bool
    restrict: bool


@dataclass(frozen=True)
class KernelContext:
    """What every kernel template renders from: the kernel function's pointer parameters, which
    ``signature`` / ``parallel_part`` / ``parallel_run`` (c/common.c.j2) and the CUDA kernel heads
    read as ``ctx.params``. Each kernel's context is a frozen subclass adding its own sizes."""

    params: tuple[Param, ...]


def comment(node: Node) -> str:
    """The node's kind and name, safe inside a C comment."""
    text = f"{node.kind} {node.name}"
    return "".join(ch if ch.isalnum() or ch in " ._:/-" else "_" for ch in text)
