#!/usr/bin/env bash
# Install onnx-aot (editable) with its dev/test dependencies into the current Python: the venv
# the README's Quick start creates (python3 -m venv .venv && . .venv/bin/activate).
# Needs: python3 >= 3.10 with pip, and a C compiler (cc/gcc) with OpenMP for the C provider.
# Installs nothing outside that Python without saying so first: the one exception is gcc, which it
# installs with apt-get (announced) only when no C compiler is found and it runs as root.
# The memory page's browser test uses chromium when it is installed; nothing installs it here
# (optional: apt-get install chromium; .ci/run does that explicitly), the test is skipped otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
  echo "setup: onnx-aot needs Python >= 3.10 ($PY is $("$PY" -V 2>&1))" >&2
  exit 1
fi
# A system Python that refuses pip installs (PEP 668: Debian, Ubuntu) and is not a venv: say how.
if "$PY" - <<'EOF'
import os, sys, sysconfig
in_venv = sys.prefix != sys.base_prefix
managed = os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))
sys.exit(0 if managed and not in_venv else 1)
EOF
then
  echo "setup: $PY is the system's Python, which does not take pip installs; create and activate" >&2
  echo "setup: a virtual environment first (README, Quick start):" >&2
  echo "setup:     python3 -m venv .venv && . .venv/bin/activate" >&2
  exit 1
fi
if ! "$PY" -m pip --version >/dev/null 2>&1; then
  echo "setup: $PY has no pip (on Debian/Ubuntu: apt-get install python3-venv python3-pip)" >&2
  exit 1
fi
if ! command -v cc >/dev/null 2>&1 && ! command -v gcc >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "setup: no C compiler found; installing gcc and libgomp1 system-wide with apt-get" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libgomp1 >/dev/null
  else
    echo "setup: no C compiler found; install gcc (or clang) with OpenMP, e.g. sudo apt-get install gcc" >&2
    exit 1
  fi
fi
echo "setup: pip install -e '.[dev]' into $("$PY" -c 'import sys; print(sys.prefix)') (numpy, onnx, jinja2," \
     "networkx; pytest, onnxruntime, ruff, mypy, setuptools for the tests)" >&2
"$PY" -m pip install --quiet --disable-pip-version-check -e ".[dev]"
