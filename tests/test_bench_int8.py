"""scripts/bench_int8.py --smoke: every quantized form of SqueezeNet and a tiny encoder gets its row
(a file onnx-aot cannot compile yet is a row saying why, not a crash), and the summary."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_bench_int8_script_smoke() -> None:
    result = subprocess.run([sys.executable, "-m", "scripts.bench_int8", "--smoke"],
                            capture_output=True, text=True, cwd=REPO, timeout=900)
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| squeezenet")
            or line.startswith("| encoder_smoke")]
    forms = {tuple(cell.strip() for cell in line.split("|")[1:3]) for line in rows}
    assert forms == {("squeezenet", "qdq"), ("squeezenet", "qoperator"), ("encoder_smoke", "dynamic"),
                     ("encoder_smoke", "qdq")}
    assert "files compiled and ran" in result.stdout
    assert "| squeezenet | qdq | failed" not in result.stdout  # QDQ files compile today
