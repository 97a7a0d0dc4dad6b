"""Memory spaces the runtime can hold arenas and weights in: "host" (numpy) and, lazily, others.

A plan names a memory space per arena and per partition. Each space knows how to allocate an
aligned byte arena, keep a copy of weights.bin, and move arrays to and from the host. Spaces other
than "host" come from the layers above: ``register_space_factory(name, factory)`` adds a factory
called the first time a plan names the space (``runtime/__init__.py`` registers "cuda", whose
factory imports the CUDA provider's run side), so this module never names a provider; tests may
register a simulated space (``register_memory_space``) to exercise transfers without a device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from typing import Protocol

import numpy as np

from runtime.errors import ArtifactError

__all__ = ["MemorySpace", "HostSpace", "memory_space", "register_memory_space", "register_space_factory"]


class MemorySpace(Protocol):
    name: str
    xp: Any  # the array module kernels in this space are written against

    def allocate(self, nbytes: int, alignment: int) -> Any:
        """A 1-D uint8 array of ``nbytes`` whose first byte is ``alignment``-aligned."""
        ...

    def upload(self, weights: np.ndarray) -> Any:
        """This space's copy of weights.bin (made once per Session)."""
        ...

    def from_host(self, array: np.ndarray) -> Any: ...

    def to_host(self, array: Any) -> np.ndarray: ...


class HostSpace:
    """Plain numpy memory."""

    xp: Any = np

    def __init__(self, name: str = "host") -> None:
        self.name = name

    def allocate(self, nbytes: int, alignment: int) -> np.ndarray:
        raw = np.empty(nbytes + alignment, dtype=np.uint8)
        start = (-raw.ctypes.data) % alignment
        return raw[start:start + nbytes]

    def upload(self, weights: np.ndarray) -> np.ndarray:
        return weights

    def from_host(self, array: np.ndarray) -> np.ndarray:
        return array

    def to_host(self, array: Any) -> np.ndarray:
        return np.asarray(array)


_SPACES: dict[str, MemorySpace] = {"host": HostSpace()}
_FACTORIES: dict[str, Callable[[], MemorySpace]] = {}


def register_memory_space(name: str, space: MemorySpace) -> None:
    _SPACES[name] = space


def register_space_factory(name: str, factory: Callable[[], MemorySpace]) -> None:
    """Make space ``name`` with ``factory()`` the first time a plan needs it (an ``ImportError``
    it raises means the space's provider is not available here)."""
    _FACTORIES[name] = factory


def memory_space(name: str) -> MemorySpace:
    if name not in _SPACES and name in _FACTORIES:
        try:
            _SPACES[name] = _FACTORIES[name]()
        except ImportError as exc:
            raise ArtifactError(f"this plan needs memory space {name!r}, whose provider is not available "
                                f"here ({exc})") from None
    if name not in _SPACES:
        raise ArtifactError(f"this plan needs memory space {name!r}, which this runtime does not provide")
    return _SPACES[name]
