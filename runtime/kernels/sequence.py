"""Reference kernels (see runtime/kernels/__init__.py for the kernel contract)."""

from __future__ import annotations

from runtime.kernels.registry import register  # noqa: F401

__all__: list[str] = []
