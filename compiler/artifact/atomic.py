"""Putting a finished artifact folder in place atomically, and sweeping what killed compiles left.

A compile writes into ``.<name>.tmp-<pid>-<random>`` next to the output and only renames it into
place when complete (the manifest is the last file written, so a temp folder without one is
never a whole artifact). Replacing an existing artifact swaps the two folders with
``renameat2(RENAME_EXCHANGE)`` where Linux offers it, so the output path always names one whole
artifact, old or new; elsewhere the old folder is renamed aside first (a kill between the two
renames leaves no output folder, never a partial one). Leftovers of a killed compile carry its
pid; the next compile into the same parent removes those whose process is gone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import shutil
import tempfile
from pathlib import Path

__all__ = ["make_temp_dir", "replace_dir", "sweep_leftovers"]

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def make_temp_dir(out: Path, kind: str = "tmp") -> Path:
    """A fresh hidden sibling of ``out``, named so a later compile can tell whose it was."""
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.{kind}-{os.getpid()}-", dir=out.parent))


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_leftovers(out: Path) -> list[Path]:
    """Remove temp folders of compiles into ``out`` whose process no longer runs; return them."""
    pattern = re.compile(rf"^\.{re.escape(out.name)}\.(tmp|old)-(\d+)-")
    removed: list[Path] = []
    try:
        siblings = list(out.parent.iterdir())
    except OSError:
        return removed
    for path in siblings:
        match = pattern.match(path.name)
        if match and path.is_dir() and not path.is_symlink() and not _alive(int(match.group(2))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2``); False when not available here."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    renameat2.restype = ctypes.c_int
    rc = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    return rc == 0


def replace_dir(tmp: Path, out: Path) -> None:
    """Rename the complete folder ``tmp`` to ``out``, replacing an artifact already there."""
    os.chmod(tmp, 0o755)
    if not out.exists():
        os.rename(tmp, out)
        return
    if _exchange(tmp, out):
        shutil.rmtree(tmp, ignore_errors=True)  # now holds the old artifact
        return
    old = make_temp_dir(out, "old")
    old.rmdir()
    os.rename(out, old)
    try:
        os.rename(tmp, out)
    except BaseException:
        os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)
