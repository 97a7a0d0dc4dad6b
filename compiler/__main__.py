"""``python -m compiler`` runs the ``onnx-aot`` command line."""

import sys

from compiler.cli import main

sys.exit(main())
