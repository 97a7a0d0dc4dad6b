#!/usr/bin/env bash
# Set everything up (scripts/setup.sh, into the active venv), compile ResNet-50 (the onnx package's
# light model with seeded random weights) into artifacts/resnet50, run it, compare with onnxruntime.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=${PYTHON:-python3}
"$PY" -m scripts.demo "$@"
