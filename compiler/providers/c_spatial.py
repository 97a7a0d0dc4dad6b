"""C kernels (see c_common.py for the kernel registry)."""

from __future__ import annotations

__all__: list[str] = []
