"""``--quantize int8``'s accuracy: the artifact measured on the calibration feeds against the fp32 model.

The calibration feeds ran through the fp32 model on the reference kernels when the ranges were
observed (``compiler/quantize/observe.py``), so their fp32 outputs are at hand: the built artifact
(still in its temporary folder) runs each feed once, and the error per output (max |int8 - fp32| /
max |fp32| per feed, the largest over the feeds) goes into the manifest's accuracy record.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from compiler.accuracy.record import StepCounts
from compiler.accuracy.record import accuracy_hook
from compiler.quantize import Quantized
from runtime.selftest import VerifyReport
from runtime.selftest import relative_error

__all__ = ["calibration_errors", "int8_hook"]


def calibration_errors(folder: Path, quantized: Quantized) -> dict[str, float]:
    """Per output, the artifact at ``folder``'s largest relative error over the calibration feeds."""
    from runtime.session import Session

    session = Session(folder)
    errors = {spec.name: 0.0 for spec in session.outputs}
    for feed, refs in zip(quantized.feeds, quantized.reference, strict=True):
        for spec, got, ref in zip(session.outputs, session.run(None, feed), refs, strict=True):
            ref = np.asarray(ref)
            if ref.dtype.kind == "f":
                errors[spec.name] = max(errors[spec.name], relative_error(np.asarray(got), ref))
    return errors


def int8_hook(quantized: Quantized, bound: float | None, say: Callable[[str], None],
              restored: tuple[str, ...] = ()) -> Callable[[Path, VerifyReport | None], None]:
    """The accuracy hook of an int8 compile (``restored``: the steps ``--max-error`` kept fp32)."""
    counts = StepCounts("int8", int(quantized.record.get("steps_total", 0)) or len(restored), restored)

    def measure(folder: Path, _report: VerifyReport | None) -> tuple[dict[str, float], int]:
        return calibration_errors(folder, quantized), len(quantized.feeds)

    return accuracy_hook(measure, bound, counts, "calibration", say)
