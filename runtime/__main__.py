"""``python -m runtime run | verify | inspect | strip DIR`` (``runtime/cli.py``): numpy only."""

from __future__ import annotations

import sys

from runtime.cli import main

if __name__ == "__main__":
    sys.exit(main())
