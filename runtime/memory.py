"""Memory spaces the runtime can hold arenas and weights in: "host" (numpy) and, lazily, others.

A plan names a memory space per arena and per partition. Each space knows how to allocate an
aligned byte arena, keep a copy of weights.bin, and move arrays to and from the host. "cuda" is
provided by the CUDA provider's run side, imported only when a plan needs it; tests may register a
simulated space (``register_memory_space``) to exercise transfers without a device.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from runtime.errors import ArtifactError

__all__ = ["MemorySpace", "HostSpace", "memory_space", "register_memory_space"]


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


def register_memory_space(name: str, space: MemorySpace) -> None:
    _SPACES[name] = space


def memory_space(name: str) -> MemorySpace:
    if name == "cuda" and name not in _SPACES:
        try:  # the CUDA run side registers the space; it imports cupy lazily
            import runtime.providers.cuda  # noqa: F401
        except ImportError:
            pass
    if name not in _SPACES:
        raise ArtifactError(
            f"this plan needs memory space {name!r}, which this runtime does not provide"
            + (" (the CUDA provider's run side is not available here)" if name == "cuda" else "")
        )
    return _SPACES[name]
