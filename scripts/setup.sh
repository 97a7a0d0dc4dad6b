#!/usr/bin/env bash
# Install onnx-aot (editable) with its dev/test dependencies into the current Python.
# Needs: python3 >= 3.10 with pip, and a C compiler (cc/gcc) with OpenMP for the C provider.
# Where apt-get works (root), also installs Debian's chromium for the memory page's browser test
# (tests/test_report.py skips that test without it). Quiet, and a no-op once installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! command -v cc >/dev/null 2>&1 && ! command -v gcc >/dev/null 2>&1; then
  echo "setup: no C compiler found; installing gcc (Debian/Ubuntu)" >&2
  if command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq gcc libgomp1 >/dev/null
  else
    echo "setup: please install a C compiler (gcc or clang with OpenMP)" >&2
    exit 1
  fi
fi
"$PY" -m pip install --quiet --disable-pip-version-check -e ".[dev]"
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
      >/dev/null 2>&1; then
    echo "setup: could not install chromium; the memory page's browser test will be skipped" >&2
  fi
fi
