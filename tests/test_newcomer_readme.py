"""What a newcomer reads and installs (issue 23): the README's Quick start works on a stock Python
(a venv first), nothing is installed outside it unannounced, the README names only files the
repository has, and the distribution builds without warnings and without fetching mypy."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_deploy_install import _setuptools_77
from tests.test_deploy_install import build_wheel
from tests.test_deploy_install import readme_section

REPO = Path(__file__).resolve().parent.parent


def test_quick_start_makes_a_venv_then_runs_the_two_commands() -> None:
    section = readme_section("Quick start")
    (block,) = re.findall(r"```bash\n(.*?)```", section, re.S)
    commands = [line for line in block.splitlines() if line and not line.startswith("#")]
    assert commands == ["python3 -m venv .venv && . .venv/bin/activate", "bash scripts/demo.sh",
                        "bash scripts/test.sh"]
    assert "Chromium" in section and "skipped" in section  # the optional browser is announced


def test_setup_installs_nothing_outside_the_venv_unannounced() -> None:
    setup = (REPO / "scripts/setup.sh").read_text()
    code = [line for line in setup.splitlines() if not line.lstrip().startswith("#")]
    installs = [line for line in code if "apt-get install" in line and "echo" not in line]
    assert len(installs) == 1 and "gcc" in installs[0] and "chromium" not in setup.split("set -euo")[1]
    before = code[code.index(installs[0]) - 1]
    assert before.strip().startswith('echo "setup: no C compiler found; installing gcc'), before
    assert "EXTERNALLY-MANAGED" in setup and "python3 -m venv .venv" in setup
    ci = (REPO / ".ci/run").read_text()
    assert "apt-get install -y -qq chromium" in ci and "bash scripts/test.sh" in ci


def test_setup_refuses_a_system_managed_python_outside_a_venv(tmp_path: Path) -> None:
    """A Python whose stdlib holds EXTERNALLY-MANAGED (PEP 668) and that is not a venv: setup.sh
    installs nothing and prints the venv line."""
    (tmp_path / "EXTERNALLY-MANAGED").write_text("[externally-managed]\n")
    (tmp_path / "sitecustomize.py").write_text(
        "import sys, sysconfig\n"
        "real = sysconfig.get_path\n"
        f"sysconfig.get_path = lambda name, *a, **k: {str(tmp_path)!r} if name == 'stdlib' \\\n"
        "    else real(name, *a, **k)\n"
        "sys.base_prefix = sys.prefix\n")
    fake = tmp_path / "python3"
    fake.write_text(f'#!/bin/sh\nPYTHONPATH={tmp_path} exec {sys.executable} "$@"\n')
    fake.chmod(0o755)
    done = subprocess.run(["bash", str(REPO / "scripts/setup.sh")], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": str(fake)}, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "python3 -m venv .venv && . .venv/bin/activate" in done.stderr
    assert "setup: pip install -e" not in done.stderr  # refused before installing


def test_readme_names_only_files_the_repository_has() -> None:
    text = (REPO / "README.md").read_text()
    assert "../" not in text
    tops = "docs|scripts|tests|compiler|runtime|templates|packaging|kernels"
    paths = set(re.findall(rf"`((?:{tops})/[\w./-]*)`", text))
    missing = [p for p in sorted(paths) if not (REPO / p.rstrip("/")).exists()
               and not p.startswith("kernels/")]  # kernels/...: inside an artifact folder
    assert len(paths) > 10 and not missing, missing
    assert "pip install onnx-aot" not in text and 'pip install "onnx-aot' not in text  # not on a registry


def test_packaging_metadata() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["build-system"]["requires"] == ["setuptools>=77"]
    meta = project["project"]
    assert meta["license"] == "Apache-2.0" and meta["license-files"] == ["LICENSE"]
    assert "Apache License" in (REPO / "LICENSE").read_text()[:200]
    assert len(meta["classifiers"]) >= 5 and not [c for c in meta["classifiers"] if c.startswith("License")]


def test_the_wheel_builds_without_warnings(tmp_path: Path) -> None:
    why = _setuptools_77()
    if why is not None:
        pytest.skip(f"cannot build the wheel offline: {why}")
    (tmp_path / "wheels").mkdir()
    wheel, log = build_wheel(REPO, tmp_path / "wheels")
    assert wheel.name.startswith("onnx_aot-")
    noisy = [line for line in log.splitlines() if re.search(r"warning|deprecat|absent from", line, re.I)]
    assert not noisy, noisy
