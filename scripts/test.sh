#!/usr/bin/env bash
# Set everything up (scripts/setup.sh: into the active venv), then run the whole test suite; pytest
# prints one line of progress per test file (pyproject.toml: [tool.pytest.ini_options]).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=${PYTHON:-python3}
set +e
"$PY" -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests; that is a failure here" >&2
  exit 1
fi
exit "$rc"
