"""The deploy-machine self-test: rerun an artifact's golden cases and compare with stored outputs.

``golden.json`` / ``golden.bin`` (written by ``compiler/artifact/golden.py``, hashed in the manifest
and so checked when the session loaded) hold a few seeded inputs and the outputs the compiler's
reference provider gave for them. ``run_golden_cases`` runs each case through the session exactly as
a request would run (C kernels, memory plan and all) and measures, per output, the normwise
relative error ``max|got - ref| / max|ref|`` (NaN and Inf must appear where the reference has
them; integers and bools must match exactly). A broken kernel build, a wrong ISA or damaged
weights show up here before a user's request does. ``Session.verify()`` runs them;
``python -m runtime.verify DIR`` (and ``onnx-aot verify DIR``) is the command line.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

import numpy as np

from runtime.errors import ArtifactError
from runtime.errors import OnnxAotError

__all__ = ["GOLDEN_JSON", "GOLDEN_BIN", "SelfTestError", "OutputCheck", "VerifyReport",
           "relative_error", "run_golden_cases"]

Run = Callable[[list[str], dict[str, np.ndarray]], list[np.ndarray]]

GOLDEN_JSON = "golden.json"
GOLDEN_BIN = "golden.bin"


class SelfTestError(ArtifactError):
    """The artifact's golden cases do not reproduce on this machine."""

    def __init__(self, message: str, report: VerifyReport) -> None:
        super().__init__(message)
        self.report = report


@dataclass(frozen=True)
class OutputCheck:
    case: int
    output: str
    error: float  # normwise relative error (inf when NaN/Inf positions or integers differ)
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.error <= self.tolerance


@dataclass
class VerifyReport:
    path: Path
    checks: list[OutputCheck] = field(default_factory=list)
    skipped: str | None = None  # why the artifact has no golden cases

    @property
    def cases(self) -> int:
        return len({c.case for c in self.checks})

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def worst(self) -> OutputCheck | None:
        """The check closest to (or furthest over) its tolerance."""
        if not self.checks:
            return None
        return max(self.checks, key=lambda c: (not c.ok, c.error / c.tolerance if c.tolerance else
                                              (0.0 if c.error == 0 else float("inf"))))

    def summary(self) -> str:
        if self.skipped is not None:
            return f"{self.path}: no golden cases to verify ({self.skipped})"
        worst = self.worst
        assert worst is not None
        verdict = "OK" if self.ok else "MISMATCH"
        bad = [c for c in self.checks if not c.ok]
        detail = "" if self.ok else " (" + ", ".join(
            f"case {c.case} output {c.output!r}: {c.error:.3g}" for c in bad[:5]) + ")"
        return (f"{self.path}: {verdict}: {self.cases} golden case(s), {len(self.checks)} output(s); "
                f"worst relative error {worst.error:.3g} (output {worst.output!r}, case {worst.case}, "
                f"tolerance {worst.tolerance:.3g}){detail}")


def relative_error(got: np.ndarray, ref: np.ndarray) -> float:
    """``max|got - ref| / max|ref|`` over finite values; inf when shapes, non-finite positions or
    (for integers and bools) any value differ."""
    if got.shape != ref.shape:
        return float("inf")
    if ref.dtype.kind not in "fc":
        return 0.0 if np.array_equal(got, ref) else float("inf")
    g = np.asarray(got, dtype=np.complex128 if ref.dtype.kind == "c" else np.float64)
    r = np.asarray(ref, dtype=g.dtype)
    if not np.array_equal(np.isnan(g), np.isnan(r)):
        return float("inf")
    infinite = np.isinf(r)
    if not np.array_equal(g[infinite], r[infinite]):
        return float("inf")
    finite = np.isfinite(r)
    if not np.all(np.isfinite(g[finite])):
        return float("inf")
    if not finite.any():
        return 0.0
    diff = float(np.max(np.abs(g[finite] - r[finite])))
    scale = float(np.max(np.abs(r[finite])))
    if diff == 0.0:
        return 0.0
    return diff / max(scale, np.finfo(np.float32).tiny)


def _read(path: Path, blob: memoryview, record: Any, what: str) -> np.ndarray:
    try:
        dtype = np.dtype(str(record["dtype"])).newbyteorder("<")
        shape = tuple(int(d) for d in record["shape"])
        offset, nbytes = int(record["offset"]), int(record["nbytes"])
        count = int(np.prod(shape, dtype=np.int64))
        if offset < 0 or nbytes != count * dtype.itemsize or offset + nbytes > len(blob):
            raise ValueError("offset or size outside golden.bin")
        array = np.frombuffer(blob, dtype=dtype, count=count, offset=offset).reshape(shape)
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"{path}: bad {what} record {record!r}: {exc}") from None
    return array.astype(array.dtype.newbyteorder("="))


def run_golden_cases(root: Path, manifest: Mapping[str, Any], run: Run, *,
                     raise_on_mismatch: bool = True) -> VerifyReport:
    """Run the golden cases of the artifact at ``root`` (its ``manifest`` already verified) through
    ``run`` (a session's ``run``); raise ``SelfTestError`` on a mismatch unless told not to."""
    files = manifest.get("files", {})
    report = VerifyReport(root)
    if GOLDEN_JSON not in files or GOLDEN_BIN not in files:
        report.skipped = "the artifact carries no golden.json / golden.bin (compiled without them)"
        return report
    index_path, bin_path = root / GOLDEN_JSON, root / GOLDEN_BIN
    try:
        index = json.loads(index_path.read_bytes().decode("utf-8"))
        blob = memoryview(bin_path.read_bytes())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{index_path}: cannot read the golden cases: {exc}") from None
    if not isinstance(index, dict) or not isinstance(index.get("cases"), list):
        raise ArtifactError(f"{index_path}: not a golden index")
    if index.get("skipped") and not index["cases"]:
        report.skipped = str(index["skipped"])
        return report
    for number, case in enumerate(index["cases"]):
        if not isinstance(case, dict):
            raise ArtifactError(f"{index_path}: case {number} is not an object")
        feeds = {str(r.get("name")): _read(index_path, blob, r, "input") for r in case.get("inputs", [])}
        expected = [(str(r.get("name")), _read(index_path, blob, r, "output"), float(r.get("tolerance", 0.0)))
                    for r in case.get("outputs", [])]
        names = [name for name, _, _ in expected]
        try:
            got = run(names, feeds)
        except OnnxAotError as exc:
            raise ArtifactError(f"{root}: golden case {number} does not run: {exc}") from exc
        for (name, ref, tolerance), array in zip(expected, got, strict=True):
            report.checks.append(OutputCheck(number, name, relative_error(np.asarray(array), ref), tolerance))
    if not report.checks:
        report.skipped = "golden.json lists no outputs"
    elif raise_on_mismatch and not report.ok:
        raise SelfTestError(report.summary(), report)
    return report
