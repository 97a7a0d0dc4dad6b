"""Style gates from STYLE.md #11: ruff on the whole tree, mypy on compiler/ and runtime/; and the
runtime's rule that no pickle, eval or exec runs while loading or running an artifact."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_ruff_is_clean() -> None:
    pytest.importorskip("ruff")
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "compiler", "runtime", "tests",
                             "scripts"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:]


def test_mypy_is_clean() -> None:
    pytest.importorskip("mypy")
    result = subprocess.run([sys.executable, "-m", "mypy", "compiler", "runtime"],
                            capture_output=True, text=True, cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:]


def test_runtime_never_unpickles_or_evaluates() -> None:
    pattern = re.compile(r"\b(pickle|eval|exec)\s*[\(.]|allow_pickle\s*=\s*True")
    offenders = []
    for path in sorted((REPO / "runtime").rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line) and not line.lstrip().startswith("#"):
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
