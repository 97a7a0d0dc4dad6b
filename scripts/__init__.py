"""Developer scripts (benchmarks, conformance, fuzzing, GPU checks), run from the repository root as
``python -m scripts.NAME``; they import shared code from ``tests.support``."""
