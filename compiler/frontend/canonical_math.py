"""Canonical forms of further ONNX ops (see canonical.py and docs/ops.md)."""

from __future__ import annotations

from compiler.frontend.canonical import CanonContext, register  # noqa: F401

__all__: list[str] = []
