"""CPU targets for tests: which x86-64 level generated text is checked for, and whether this host
can run a build of that level.

A test that checks generated C text compiles for an explicit ``--cpu`` level (``x86-64-v2``,
``-v3`` or ``-v4``), never for the build machine's (``native`` or the default level), so the same
check passes on an AVX2 and on an AVX-512 host. Where the host cannot run the level's build, the
test still compiles it and checks the text, and leaves out the run (``host_runs``).

The host's level is what ``runtime.isa.host_x86_level`` reads, which honours the test-only
``$ONNX_AOT_TEST_CPU_FLAGS``: ``pytest --host-cpu x86-64-v3`` (tests/conftest.py) makes an
AVX-512 machine take every selection an AVX2 machine takes (default builds, the loader's choice,
which tests run their builds).
"""

from __future__ import annotations

import pytest

from runtime.isa import MARCH_FEATURES
from runtime.isa import X86_LEVELS
from runtime.isa import host_x86_level

__all__ = ["LEVELS", "level_params", "host_runs", "features_of"]

LEVELS = X86_LEVELS  # lowest first: x86-64-v2 (16-byte vectors), -v3 (32), -v4 (64)


def host_runs(level: str) -> bool:
    """Whether this host (as ``--host-cpu`` may lower it) runs code built for ``level``."""
    host = host_x86_level()
    return host is not None and LEVELS.index(level) <= LEVELS.index(host)


def level_params() -> list[object]:
    """``LEVELS`` as pytest params, ids ``v2`` / ``v3`` / ``v4``, for text checks of every level."""
    return [pytest.param(level, id=level.rsplit("-", 1)[1]) for level in LEVELS]


def features_of(level: str) -> str:
    """The ``/proc/cpuinfo`` flags of ``level``, as ``$ONNX_AOT_TEST_CPU_FLAGS`` takes them."""
    return " ".join(MARCH_FEATURES[level])
