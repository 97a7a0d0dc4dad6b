"""The build cache shared by every compile-time build: C kernels, CUDA kernels, the planner's C loop.

Each build's output is stored under a key that is the sha256 of everything the output depends on
(the source text, flags, the toolchain's identity, the target), so an identical build is never
run twice, on any model. The folders: ``$ONNX_AOT_CACHE_DIR`` when set, else
``~/.cache/onnx-aot/cc``, for C objects and libraries (the planner's library included); the
``cuda`` folder beside them (``$ONNX_AOT_CACHE_DIR/cuda`` or ``~/.cache/onnx-aot/cuda``) for
cubins and PTX. Entries are written atomically (a temporary file renamed into place), so a
killed build or two builds at once never leave a partial entry; an unwritable cache only costs
a rebuild next time.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

__all__ = ["c_cache_dir", "cuda_cache_dir", "content_key", "copy_atomic", "trim_output", "BuildCache"]

CACHE_ENV = "ONNX_AOT_CACHE_DIR"
OUTPUT_LIMIT = 4000  # characters of a tool's output kept in a CompileError


def c_cache_dir() -> Path:
    """``$ONNX_AOT_CACHE_DIR`` when set, else ``~/.cache/onnx-aot/cc``."""
    env = os.environ.get(CACHE_ENV, "")
    return Path(env) if env else Path.home() / ".cache" / "onnx-aot" / "cc"


def cuda_cache_dir() -> Path:
    """``$ONNX_AOT_CACHE_DIR/cuda`` when set, else ``~/.cache/onnx-aot/cuda``."""
    env = os.environ.get(CACHE_ENV, "")
    return (Path(env) if env else Path.home() / ".cache" / "onnx-aot") / "cuda"


def content_key(**parts: object) -> str:
    """The sha256 (hex) of ``parts`` as sorted JSON: what a cache entry is named after."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def copy_atomic(src: Path, dst: Path, mode: int = 0o755) -> None:
    """Copy ``src`` to ``dst`` through a temporary file renamed into place."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, dst)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def trim_output(text: str) -> str:
    """A tool's output cut to ``OUTPUT_LIMIT`` characters for an error message."""
    text = text.strip()
    if len(text) <= OUTPUT_LIMIT:
        return text
    return text[:OUTPUT_LIMIT] + f"\n... ({len(text) - OUTPUT_LIMIT} more characters)"


class BuildCache:
    """One cache folder: entries are ``<key><suffix>`` files, read and written whole."""

    def __init__(self, folder: Path, mode: int = 0o755) -> None:
        self.folder = folder
        self.mode = mode  # file mode of entries and of the copies taken from them

    def path(self, key: str, suffix: str) -> Path:
        return self.folder / f"{key}{suffix}"

    def has(self, key: str, suffix: str) -> bool:
        return self.path(key, suffix).is_file()

    def fetch(self, key: str, suffix: str, dst: Path) -> bool:
        """Copy the entry to ``dst`` (atomically); False when there is none."""
        entry = self.path(key, suffix)
        if not entry.is_file():
            return False
        copy_atomic(entry, dst, self.mode)
        return True

    def store(self, src: Path, key: str, suffix: str) -> bool:
        """Store ``src`` as the entry; False when the cache cannot be written (only costs a rebuild)."""
        try:
            copy_atomic(src, self.path(key, suffix), self.mode)
        except OSError:
            return False
        return True
