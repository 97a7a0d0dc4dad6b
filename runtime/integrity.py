"""Checking an artifact's files against its manifest, before anything in them is used.

``manifest.json: files`` maps every artifact-relative path to ``{"size", "sha256"}``; weights.bin
also carries ``sample_sha256``, the digest of 64 evenly spaced 4 KiB blocks (the whole file when
it is smaller), so the default load can catch most damage to a multi-gigabyte weights file in
microseconds. ``verify_files`` checks every size, every sha256 except the weights' (sampled by
default, fully with ``verify_weights``), that no entry points outside the folder and that the
format version is one this runtime reads. A file marked ``"optional": true`` (report, portable
build, golden cases) may be missing: ``onnx-aot strip`` removes them. Every failure is an
``ArtifactError`` naming the file and saying to recompile (or copy the folder again).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runtime.errors import ArtifactError
from runtime.json_fields import is_count

__all__ = ["DAMAGED", "SAMPLE_BLOCKS", "SAMPLE_BLOCK_BYTES", "sha256_file", "sampled_sha256",
           "check_format_version", "verify_files"]

SAMPLE_BLOCKS = 64
DAMAGED = ("the artifact is damaged: recompile the model (onnx-aot compile MODEL.onnx -o DIR) or "
           "copy the artifact folder again")
SAMPLE_BLOCK_BYTES = 4096


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sampled_sha256(path: Path) -> str:
    """sha256 over the file's size and 64 evenly spaced 4 KiB blocks (all of a small file)."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        if size <= SAMPLE_BLOCKS * SAMPLE_BLOCK_BYTES:
            digest.update(f.read())
            return digest.hexdigest()
        last = size - SAMPLE_BLOCK_BYTES
        for k in range(SAMPLE_BLOCKS):
            f.seek(last * k // (SAMPLE_BLOCKS - 1))
            digest.update(f.read(SAMPLE_BLOCK_BYTES))
    return digest.hexdigest()


def check_format_version(version: Any, supported: int, where: Path, written_by: Any = None, *,
                         oldest: int | None = None) -> None:
    """``ArtifactError`` unless ``version`` is ``supported`` (or between ``oldest`` and it)."""
    if version == supported or (oldest is not None and is_count(version) and oldest <= version <= supported):
        return
    by = ""
    if isinstance(written_by, Mapping) and written_by.get("version"):
        by = f" (written by onnx-aot {written_by['version']})"
    if isinstance(version, int) and not isinstance(version, bool) and version > supported:
        raise ArtifactError(
            f"{where}: artifact format version {version}{by} is newer than this runtime reads "
            f"(version {supported}): upgrade the runtime (install onnx-aot again from its repository) "
            f"or recompile the model with the onnx-aot that matches this runtime")
    raise ArtifactError(
        f"{where}: artifact format version {version!r}{by}; this runtime reads version {supported} "
        f"(recompile the model with a matching onnx-aot)")


def _inside(root: Path, rel: Any, where: Path) -> Path:
    if (not isinstance(rel, str) or not rel or rel.startswith(("/", "\\")) or "\\" in rel
            or ".." in Path(rel).parts or Path(rel).is_absolute()):
        raise ArtifactError(f"{where}: file entry {rel!r} points outside the artifact")
    return root / rel


def verify_files(root: Path, manifest: Mapping[str, Any], required: tuple[str, ...], weights: str,
                 *, verify_weights: bool = False) -> None:
    """Check every file the manifest lists (see the module docstring)."""
    where = root / "manifest.json"
    files = manifest.get("files")
    if not isinstance(files, Mapping) or any(r not in files for r in required):
        raise ArtifactError(f"{where}: the file list is missing or incomplete (needs "
                            f"{', '.join(required)})")
    for rel, entry in files.items():
        file = _inside(root, rel, where)
        if not isinstance(entry, Mapping) or not isinstance(entry.get("size"), int) \
                or not isinstance(entry.get("sha256"), str):
            raise ArtifactError(f"{where}: entry for {rel!r} lacks a size or sha256")
        try:
            if not file.is_file():
                if entry.get("optional") is True and not file.exists():
                    continue  # removed on purpose (onnx-aot strip) or by hand: not needed to run
                raise FileNotFoundError(file)
            size = file.stat().st_size
        except (FileNotFoundError, NotADirectoryError):
            raise ArtifactError(f"{file}: listed in the manifest but missing; {DAMAGED}") from None
        except OSError as exc:
            raise ArtifactError(f"{file}: cannot be read ({exc.strerror or exc})") from None
        if size != entry["size"]:
            raise ArtifactError(f"{file}: size {size} does not match the manifest ({entry['size']}): "
                                f"the file is truncated or changed; {DAMAGED}")
        try:
            if rel != weights or verify_weights:
                if sha256_file(file) != entry["sha256"]:
                    raise ArtifactError(f"{file}: contents do not match the manifest's sha256; {DAMAGED}")
            elif "sample_sha256" in entry and sampled_sha256(file) != entry["sample_sha256"]:
                raise ArtifactError(f"{file}: contents do not match the manifest (sampled check); "
                                    f"{DAMAGED}")
        except OSError as exc:
            raise ArtifactError(f"{file}: cannot be read ({exc.strerror or exc})") from None
