"""The reference kernels' registry: node kind -> kernel, filled by explicit registration.

A kind is the op_type for ONNX-domain ops ("Conv") and ``"onnx_aot.<Op>"`` for ours
("onnx_aot.FusedConv"). Each kernel module registers its kernels with :func:`register`;
``runtime.kernels`` imports every module, so importing it fills the registry. Nothing is found by
scanning names (STYLE.md #6).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runtime.errors import UnsupportedOpError

__all__ = ["REGISTRY", "Kernel", "OutputSpec", "get_kernel", "register", "supported_kinds"]

# (shape, dtype) of one expected output.
OutputSpec = tuple[tuple[int, ...], Any]
# kernel(xp, inputs, attrs, outputs) -> list of arrays with exactly the outputs' shapes and dtypes.
Kernel = Callable[[Any, list[Any], dict[str, Any], list[OutputSpec]], list[Any]]

REGISTRY: dict[str, Kernel] = {}


def register(*kinds: str) -> Callable[[Kernel], Kernel]:
    """Decorator registering one kernel under each of ``kinds``; a kind registered twice is a bug."""

    def decorate(kernel: Kernel) -> Kernel:
        for kind in kinds:
            if kind in REGISTRY:
                raise ValueError(f"reference kernel for {kind!r} registered twice")
            REGISTRY[kind] = kernel
        return kernel

    return decorate


def get_kernel(kind: str) -> Kernel:
    """The reference kernel for node kind ``kind``; UnsupportedOpError naming it when absent."""
    try:
        return REGISTRY[kind]
    except KeyError:
        raise UnsupportedOpError(f"the reference provider has no kernel for {kind!r}") from None


def supported_kinds() -> frozenset[str]:
    """Every node kind the reference provider can run."""
    return frozenset(REGISTRY)
