#!/usr/bin/env bash
# Set everything up on a fresh machine, compile the ResNet-50 shipped inside the onnx package
# into artifacts/resnet50, run it with the runtime and print a summary.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=${PYTHON:-python3}
"$PY" -m scripts.demo "$@"
