"""``python -m runtime.verify DIR``: the same as ``python -m runtime verify DIR`` (``runtime/cli.py``)
and ``onnx-aot verify DIR``: rerun an artifact's golden cases, exit 1 on a mismatch or when the
artifact carries none to run.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from runtime.cli import main as cli_main

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    return cli_main(["verify", *(sys.argv[1:] if argv is None else argv)], prog="python -m runtime")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
