"""Issue 19's bench: a YOLOv8n-style detector (``tests/support/yolo_model.py``) against onnxruntime.

Builds the static export at 320x320, batch 1 (seeded weights), compiles it into a temporary folder
and runs ``compiler.bench.bench`` with ``--compare`` semantics at 1 and 2 threads: runs alternating
with onnxruntime in this process on identical feeds, median latency ratio onnx-aot / onnxruntime
(< 1 is faster; issue 19 asks for <= 0.90 at 2 threads) and the max error. ``--busy N`` keeps N
other processes spinning meanwhile. Not part of CI, except ``--smoke`` (a 64x64 image, 2 runs).

Usage: python -m scripts.bench_yolo [--runs N] [--threads N ...] [--busy N] [--smoke]
"""

from __future__ import annotations

import sys

from scripts.bench_crnn import bench_arguments
from scripts.bench_crnn import compare_model
from tests.support.yolo_model import yolov8n_model


def main() -> int:
    args = bench_arguments(__doc__, default_runs=50)
    size = 64 if args.smoke else 320
    return compare_model(yolov8n_model(height=size, width=size), "yolov8n", args)


if __name__ == "__main__":
    sys.exit(main())
