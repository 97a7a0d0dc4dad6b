"""``python -m runtime.verify DIR`` (and ``onnx-aot verify DIR``): rerun an artifact's golden cases.

Loads the artifact into a ``Session``, runs its self-test (``runtime/selftest.py``), prints the
worst error against its tolerance and exits 1 on a mismatch. Needs only the runtime.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from runtime.errors import OnnxAotError
from runtime.session import Session

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime.verify",
                                     description="rerun an artifact's golden cases on this machine")
    parser.add_argument("artifact")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--verify-weights", action="store_true", help="hash weights.bin fully first")
    args = parser.parse_args(argv)
    try:
        session = Session(args.artifact, threads=args.threads, verify_weights=args.verify_weights)
        report = session.verify(raise_on_mismatch=False)
    except OnnxAotError as exc:
        print(f"onnx-aot: error: {exc}", file=sys.stderr)
        return 1
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
