"""A busy machine for tests of the worker pool: one process spinning on a core for a while."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["busy_core"]


@contextmanager
def busy_core() -> Iterator[None]:
    """One other process spinning (normal priority) while the block runs."""
    process = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        process.kill()
        process.wait()
