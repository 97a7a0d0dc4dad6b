"""What CPU a C build needs, for ``manifest.json: target.cpu`` (checked by ``runtime/isa.py``).

The C compiler is asked which feature macros its target flags (``-march=...`` and any ``-m...``
option) define; each known macro becomes the ``/proc/cpuinfo`` flag the runtime looks for. The
answer depends only on the compiler and the flags, so two compiles stay byte-identical.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from collections.abc import Sequence
from typing import Any

from runtime.errors import CompileError
from runtime.isa import MACRO_FEATURES

__all__ = ["cpu_target"]


@functools.cache
def _macros(cc: str, target_flags: tuple[str, ...]) -> frozenset[str]:
    argv = [cc, *target_flags, "-dM", "-E", "-x", "c", os.devnull]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise CompileError(f"cannot run C compiler {cc!r}: {exc}") from exc
    if proc.returncode != 0:
        raise CompileError(f"{cc} rejects {' '.join(target_flags)}: {proc.stderr.strip()[:2000]}")
    return frozenset(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("#define "))


def cpu_target(cc: str, flags: Sequence[str], march: str) -> dict[str, Any]:
    """``{"machine", "march", "features"}`` for a library built by ``cc`` with ``flags``."""
    target_flags = tuple(f for f in flags if f.startswith("-m"))
    macros = _macros(cc, target_flags)
    features = sorted({flag for macro, flag in MACRO_FEATURES.items() if macro in macros})
    return {"machine": platform.machine(), "march": march, "features": features}
