"""Rewrite an artifact's plan.json and re-hash it into the manifest, as a broken build pipeline
would: what the load-time checks of the plan (not the integrity checks) must catch."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

__all__ = ["write_plan"]


def write_plan(art: Path, plan: dict[str, Any]) -> None:
    data = json.dumps(plan).encode()
    (art / "plan.json").write_bytes(data)
    manifest = json.loads((art / "manifest.json").read_text())
    manifest["files"]["plan.json"].update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    manifest["files"]["plan.json"].pop("sample_sha256", None)
    (art / "manifest.json").write_text(json.dumps(manifest))
