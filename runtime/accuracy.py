"""The manifest's ``accuracy`` record, read on the deploy side: ``verify`` re-checks it, ``inspect`` shows it.

A ``--precision bf16`` or ``--quantize int8`` compile records the built artifact's error against
the fp32 model per output (``compiler/accuracy/record.py``), with the bound ``--max-error`` asked
for (null without it). ``check_record`` refuses a record that contradicts itself (an output the
artifact does not have, a value that is no number, an error at or over its bound: a tampered or
damaged manifest) with an ``ArtifactError``. Where the record was measured on the golden feeds
(bf16: the golden cases' references are the fp32 model's outputs), ``bounded_checks`` holds each
recorded output's golden check to the bound as well as to its own tolerance, so ``verify`` fails
on this machine when the error reaches the bound. A record measured on calibration feeds (int8)
keeps the first of them and their fp32 outputs in ``STORED_FEEDS_FILE`` (optional: ``strip``
removes it, and then the record is checked for consistency only, as ``verify`` says):
``runtime/selftest.py: stored_checks`` reruns them, each output held to the bound.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from runtime.errors import ArtifactError

__all__ = ["RECORD_KEY", "STORED_FEEDS_FILE", "accuracy_line", "accuracy_record", "bounded_checks",
           "check_record", "stored_array", "verify_note"]

RECORD_KEY = "accuracy"
STORED_FEEDS_FILE = "accuracy.bin"  # feeds the artifact cannot regenerate (int8: calibration), optional


def accuracy_record(manifest: Mapping[str, Any]) -> dict[str, Any] | None:
    """The manifest's accuracy record, or None (an fp32 compile, or one older than the record)."""
    record = manifest.get(RECORD_KEY)
    return dict(record) if isinstance(record, Mapping) else None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def check_record(path: Path, manifest: Mapping[str, Any], outputs: Sequence[str]) -> dict[str, Any] | None:
    """The accuracy record, once it is consistent with itself and the artifact's ``outputs``;
    ``ArtifactError`` naming the manifest and the output otherwise."""
    record = accuracy_record(manifest)
    if record is None:
        return None
    where = f"{path}: manifest.json's {RECORD_KEY} record"
    bound, errors = record.get("max_error"), record.get("outputs")
    if bound is not None and (not _number(bound) or bound <= 0):
        raise ArtifactError(f"{where}: max_error {bound!r} is not a positive number")
    if not isinstance(errors, Mapping) or not errors:
        raise ArtifactError(f"{where}: no measured error per output")
    for name, error in errors.items():
        if name not in outputs:
            raise ArtifactError(f"{where}: output {name!r}, which the artifact does not have")
        if not _number(error) or error < 0:
            raise ArtifactError(f"{where}: output {name!r}: measured error {error!r} is not a number >= 0")
        if bound is not None and not error < bound:
            raise ArtifactError(f"{where}: output {name!r}: measured error {error:.3g} is not under its "
                                f"bound {bound:g} (a compile never records that: the manifest was changed)")
    return record


def bounded_checks(record: Mapping[str, Any] | None, checks: Sequence[Any]) -> list[Any]:
    """``checks`` (``runtime.selftest.OutputCheck``) with each recorded output's tolerance at most the
    bound, where the record was measured on the golden feeds and has a bound."""
    if record is None or record.get("feeds") != "golden" or record.get("max_error") is None:
        return list(checks)
    bound, names = float(record["max_error"]), set(record["outputs"])
    # (the bound is a strict one: an error equal to it misses; the nearest float below stands in)
    below = math.nextafter(bound, 0.0)
    return [replace(c, tolerance=min(c.tolerance, below)) if c.output in names else c for c in checks]


def stored_array(path: Path, blob: bytes, entry: Any) -> np.ndarray:
    """One array of STORED_FEEDS_FILE (``blob``) by its index ``entry``."""
    try:
        dtype = np.dtype(str(entry["dtype"])).newbyteorder("<")
        shape = tuple(int(d) for d in entry["shape"])
        offset, nbytes = int(entry["offset"]), int(entry["nbytes"])
        if offset < 0 or nbytes != math.prod(shape) * dtype.itemsize or offset + nbytes > len(blob):
            raise ValueError("offset or size outside the file")
        array = np.frombuffer(blob, dtype=dtype, count=math.prod(shape), offset=offset).reshape(shape)
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"{path}: bad stored-feed record {entry!r}: {exc}") from None
    return array.astype(array.dtype.newbyteorder("="))


def verify_note(record: Mapping[str, Any] | None) -> str | None:
    """What ``verify`` checked of the accuracy record (None: the artifact has none)."""
    if record is None:
        return None
    bound = record.get("max_error")
    worst = max(record["outputs"].values(), default=0.0)
    if bound is None:
        return (f"accuracy: {record.get('precision')} error {worst:.3g} against fp32 recorded at compile "
                f"time (no --max-error bound)")
    if record.get("feeds") == "golden":
        return (f"accuracy: every output held to the --max-error bound {bound:g} on the golden cases "
                f"(compiled with error {worst:.3g})")
    if record.get("stored_feeds"):
        return (f"accuracy: every output held to the --max-error bound {bound:g} on "
                f"{len(record['stored_feeds'])} of the {record.get('feed_count')} {record.get('feeds')} "
                f"feeds, which the artifact carries (compiled with error {worst:.3g} over all of them)")
    return (f"accuracy: --max-error {bound:g} was measured on {record.get('feed_count')} "
            f"{record.get('feeds')} feed(s) at compile time (error {worst:.3g}); the artifact does not "
            f"carry them: the record is consistent, and the golden cases check the steps")


def accuracy_line(manifest: Mapping[str, Any]) -> str | None:
    """``inspect``'s line: the bound, the error per output, and the steps reduced / put back."""
    record = accuracy_record(manifest)
    if record is None:
        return None
    bound = record.get("max_error")
    errors = record.get("outputs") or {}
    restored = list(record.get("restored_to_fp32") or [])
    head = "no --max-error bound" if bound is None else f"--max-error {bound:g}"
    line = (f"accuracy ({head}; measured on {record.get('feed_count')} {record.get('feeds')} feed(s)): "
            + ", ".join(f"{name} {float(v):.3g}" for name, v in errors.items())
            + f"; {record.get('steps_reduced')} of {record.get('steps_total')} step(s) in "
            f"{record.get('precision')}")
    if restored:
        more = ", ..." if len(restored) > 8 else ""
        line += f", {len(restored)} back in fp32: " + ", ".join(restored[:8]) + more
    return line
