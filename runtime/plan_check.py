"""A structural check of plan.json before the runtime reads it.

The manifest's hash guards plan.json against damage, but a pipeline that rewrites a plan and
re-hashes the manifest would otherwise reach ``Session`` with missing keys or wrong types and end
in a raw ``KeyError`` or ``TypeError``. ``check_plan`` looks at every field the runtime reads when
it loads an artifact (interface, arenas, partitions, steps) and raises ``ArtifactError`` naming
the file and the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from runtime.errors import ArtifactError

__all__ = ["check_plan"]


def check_plan(plan: dict[str, Any], path: Path) -> None:
    """Raise ``ArtifactError`` when ``plan`` lacks a field the runtime needs, or has it ill-typed."""
    for key in ("inputs", "outputs"):
        for k, record in enumerate(_list(plan, key, path)):
            where = f"{key}[{k}]"
            _str(record, "name", path, where)
            if key == "outputs":
                _str(record, "value", path, where)
            dtype = _str(record, "dtype", path, where)
            try:
                np.dtype(dtype)
            except TypeError:
                raise ArtifactError(f"{path}: {where}.dtype {dtype!r} is not a dtype") from None
            shape = record.get("shape")
            if not isinstance(shape, list) or not all(_count(d) for d in shape):
                raise ArtifactError(f"{path}: {where}.shape must be a list of sizes, got {shape!r}")
    for k, record in enumerate(_list(plan, "arenas", path)):
        where = f"arenas[{k}]"
        _str(record, "memory_space", path, where)
        if not _count(record.get("nbytes")) or not _count(record.get("alignment")) or not record["alignment"]:
            raise ArtifactError(f"{path}: {where} needs byte counts nbytes >= 0 and alignment > 0")
    for k, record in enumerate(_list(plan, "partitions", path)):
        where = f"partitions[{k}]"
        if record.get("index") != k:
            raise ArtifactError(f"{path}: {where}.index must be {k}, got {record.get('index')!r}")
        provider = _str(record, "provider", path, where)
        if provider == "c" or record.get("runner") == "c":
            _str(record, "entry", path, where)
            _str(record, "library", path, where)
            ext = record.get("ext")
            if not isinstance(ext, list) or not all(isinstance(name, str) for name in ext):
                raise ArtifactError(f"{path}: {where}.ext must be a list of value names")
    count = len(plan["partitions"])
    for k, record in enumerate(_list(plan, "steps", path)):
        part = record.get("partition")
        if not isinstance(part, int) or isinstance(part, bool) or not 0 <= part < count:
            raise ArtifactError(f"{path}: steps[{k}].partition must name one of {count} partitions")
    if not isinstance(plan.get("values"), dict):
        raise ArtifactError(f"{path}: 'values' must be an object")


def _list(plan: dict[str, Any], key: str, path: Path) -> list[dict[str, Any]]:
    items = plan.get(key)
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise ArtifactError(f"{path}: '{key}' must be a list of objects")
    return items


def _str(record: dict[str, Any], key: str, path: Path, where: str) -> str:
    value = record.get(key)
    if not isinstance(value, str):
        raise ArtifactError(f"{path}: {where}.{key} must be a string, got {value!r}")
    return value


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
