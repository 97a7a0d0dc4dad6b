"""Loading a kernel library so that the bytes loaded are the bytes on disk now.

``dlopen`` returns the library already loaded under the same path name (and, failing that, under
the same device and inode) without reading the file again. When an artifact is recompiled in
place and loaded again in the same process, the new ``model.so`` has the old path, so a plain
``ctypes.CDLL`` would hand back the *old* code for the new plan: wrong results or worse, from a
library whose bytes no longer match any manifest. ``open_library`` remembers which file each
path name was loaded from; when the file at a path has changed since, it loads a private copy
under a fresh name instead (the copy is unlinked once mapped).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import tempfile
import threading
from pathlib import Path

__all__ = ["open_library"]

_LOADED: dict[str, tuple[int, int, int, int]] = {}  # path name -> (dev, inode, size, mtime_ns)
_ALIASES: dict[tuple[str, tuple[int, int, int, int]], ctypes.CDLL] = {}  # changed files, loaded once
_LOCK = threading.Lock()


def _identity(path: Path) -> tuple[int, int, int, int]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def open_library(path: str | os.PathLike[str]) -> ctypes.CDLL:
    """``ctypes.CDLL(path)``, never a stale library loaded earlier from the same path."""
    name = os.path.abspath(path)
    with _LOCK:
        identity = _identity(Path(name))
        seen = _LOADED.get(name)
        if seen is None or seen == identity:
            library = ctypes.CDLL(name)
            _LOADED[name] = identity
            return library
        if (name, identity) in _ALIASES:
            return _ALIASES[(name, identity)]
        private = tempfile.mkdtemp(prefix="onnx-aot-lib-")
        try:
            alias = os.path.join(private, os.path.basename(name))
            shutil.copyfile(name, alias)
            library = ctypes.CDLL(alias)
        finally:
            shutil.rmtree(private, ignore_errors=True)
        _ALIASES[(name, identity)] = library
        return library
