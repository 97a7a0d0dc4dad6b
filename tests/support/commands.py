"""The ``onnx-aot`` command line as tests run it: ``python -m compiler ARGS`` in a subprocess, from the
repository root."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

__all__ = ["REPO", "cli"]

REPO = Path(__file__).resolve().parents[2]


def cli(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``onnx-aot ARGS``; with ``ok`` the exit status must be 0 (stderr is the message)."""
    result = subprocess.run([sys.executable, "-m", "compiler", *args], capture_output=True, text=True,
                            cwd=REPO, timeout=300)
    if ok:
        assert result.returncode == 0, result.stderr
    return result
