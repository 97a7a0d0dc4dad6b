"""The manifest's ``accuracy`` record: the built artifact's error against the fp32 model, per output.

A reduced-precision compile (``--precision bf16``, ``--quantize int8``) measures the artifact it
built, in its temporary folder before it is put in place (``compile_graph``'s ``accuracy`` hook,
after the golden check): for bf16 the golden check's own figures (the golden cases' references are
the fp32 model's outputs, ``compiler/artifact/golden_precision.py``), so ``verify`` recomputes the
very same numbers on a deploy machine (an output too large for the golden budget is stored and
checked as a sample with its max |.|: there the error is over that sample); for int8 a run on the
calibration feeds against the fp32 model's outputs on them. The record (``RECORD_KEY`` in
manifest.json; ``runtime/accuracy.py`` reads it) holds the metric, the feeds, the bound
(``--max-error``, null without it), the error per output and which steps run reduced. An error at
or over the bound raises ``BoundMissed``: the compile puts more steps back in fp32 and builds again
(``compiler/accuracy/__init__.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from compiler.artifact.writer import dump_json
from runtime.accuracy import RECORD_KEY
from runtime.accuracy import STORED_FEEDS_FILE
from runtime.artifact import MANIFEST
from runtime.artifact import sha256_file
from runtime.errors import AccuracyBoundError
from runtime.errors import CompileError
from runtime.selftest import VerifyReport

__all__ = ["BoundMissed", "StepCounts", "accuracy_hook", "golden_errors", "missed_bound", "store_feeds",
           "write_record"]

# (errors per output, feed count), or None: not measured here
Measure = Callable[[Path, VerifyReport | None], tuple[dict[str, float], int] | None]
Stored = Callable[[Path], list[dict[str, Any]]]


class BoundMissed(CompileError):
    """The built artifact's error is at or over ``--max-error`` (caught by the compile, which
    restores more steps; never reaches the user)."""

    def __init__(self, error: float, errors: Mapping[str, float]) -> None:
        super().__init__(f"measured error {error:.3g}")
        self.error = error
        self.errors = dict(errors)


@dataclass(frozen=True)
class StepCounts:
    """The reduced-precision steps: how many stay reduced of how many, and those put back in fp32."""

    precision: str  # "bf16" or "int8"
    total: int
    restored: tuple[str, ...]

    @property
    def reduced(self) -> int:
        return self.total - len(self.restored)


def golden_errors(folder: Path, report: VerifyReport | None) -> tuple[dict[str, float], int] | None:
    """Per output, the largest relative error of the golden check, and its number of cases (None:
    it did not run here)."""
    if report is None:
        return None
    errors: dict[str, float] = {}
    for check in report.checks:
        errors[check.output] = max(errors.get(check.output, 0.0), check.error)
    return errors, report.cases


def write_record(folder: Path, record: Mapping[str, Any]) -> None:
    """Add ``record`` to the manifest of the artifact at ``folder`` (not yet in place), and the
    file of its stored feeds (``store_feeds``), optional, to the manifest's files."""
    path = folder / MANIFEST
    manifest = json.loads(path.read_text(encoding="utf-8"))
    manifest[RECORD_KEY] = dict(record)
    stored = folder / STORED_FEEDS_FILE
    if stored.is_file():
        manifest["files"][STORED_FEEDS_FILE] = {"size": stored.stat().st_size, "sha256": sha256_file(stored),
                                                "optional": True}
    path.write_bytes(dump_json(manifest))


Pair = tuple[Mapping[str, np.ndarray], Sequence[tuple[str, np.ndarray]]]


def store_feeds(folder: Path, pairs: Sequence[Pair]) -> list[dict[str, Any]]:
    """Write the (feeds, named fp32 outputs) ``pairs`` into the artifact's STORED_FEEDS_FILE, raw
    little-endian, 64-byte aligned; their index for the record (``verify`` reruns them)."""
    blob = bytearray()

    def put(name: str, array: np.ndarray) -> dict[str, Any]:
        blob.extend(b"\0" * (-len(blob) % 64))
        data = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False)
        entry = {"name": name, "dtype": data.dtype.name, "shape": list(data.shape), "offset": len(blob),
                 "nbytes": int(data.nbytes)}
        blob.extend(data.tobytes())
        return entry

    index = [{"inputs": [put(n, a) for n, a in sorted(feeds.items())],
              "outputs": [put(n, a) for n, a in outs]} for feeds, outs in pairs]
    (folder / STORED_FEEDS_FILE).write_bytes(bytes(blob))
    return index


def _record(errors: Mapping[str, float], bound: float | None, steps: StepCounts, feeds: str,
            count: int) -> dict[str, Any]:
    return {"metric": "max |artifact - fp32 model| / max |fp32 model| per output and feed, the largest "
                      "over the feeds",
            "feeds": feeds, "feed_count": count, "max_error": bound,
            "outputs": {name: float(v) for name, v in errors.items()},
            "precision": steps.precision, "steps_total": steps.total, "steps_reduced": steps.reduced,
            "restored_to_fp32": list(steps.restored)}


def accuracy_hook(measure: Measure, bound: float | None, steps: StepCounts, feeds: str,
                  say: Callable[[str], None], store: Stored | None = None
                  ) -> Callable[[Path, VerifyReport | None], None]:
    """The hook ``compile_graph`` calls on the built, checked artifact: measure it (``measure``), say
    the error, raise ``BoundMissed`` at or over ``bound``, else record it in the manifest."""

    def hook(folder: Path, report: VerifyReport | None) -> None:
        measured = measure(folder, report)
        if measured is None:
            if bound is not None:
                raise CompileError(f"--max-error {bound:g}: the artifact's run could not be checked on this "
                                   "machine (see the warning), so its error cannot be measured")
            return
        errors, count = measured
        worst = max(errors.values(), default=0.0)
        say(f"{steps.precision} error against fp32 on the {count} {feeds} feed(s), max |{steps.precision} - "
            f"fp32| / max |fp32|: "
            + ", ".join(f"{name} {value:.4g}" for name, value in errors.items())
            + ("" if bound is None else f" (bound {bound:g}); {steps.reduced} of {steps.total} "
               f"step(s) in {steps.precision}"))
        if bound is not None and not worst < bound:
            raise BoundMissed(worst, errors)
        record = _record(errors, bound, steps, feeds, count)
        if store is not None:  # feeds verify cannot regenerate, kept for it
            record["stored_feeds"] = store(folder)
        write_record(folder, record)

    return hook


def missed_bound(bound: float, error: float, steps: StepCounts, feeds: str) -> AccuracyBoundError:
    """The error for a bound missed with every step back in fp32."""
    return AccuracyBoundError(
        f"--max-error {bound:g} cannot be met: with all {steps.total} {steps.precision} step(s) back in "
        f"fp32 the artifact's error against the fp32 model on the {feeds} feeds is still {error:.3g} "
        f"(its fp32 kernels round differently from the reference); nothing was written: ask for a bound "
        f"above {error:.3g}, or compile without --max-error")
