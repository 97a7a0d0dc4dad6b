"""An artifact's golden output records beside the reference arrays golden.bin stores for them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["golden_outputs"]


def golden_outputs(artifact: Path) -> list[tuple[dict[str, Any], np.ndarray]]:
    """Each case's output records (golden.json) and their stored references (flat: whole or sampled)."""
    golden = json.loads((artifact / "golden.json").read_text())
    blob = (artifact / "golden.bin").read_bytes()
    found = []
    for case in golden["cases"]:
        for record in case["outputs"]:
            dtype = np.dtype(record["dtype"])
            count = record["nbytes"] // dtype.itemsize
            found.append((record, np.frombuffer(blob, dtype, count, record["offset"])))
    return found
