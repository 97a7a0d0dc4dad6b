"""The README's deploy-only install (issue 23): numpy and the runtime only, in a fresh venv.

The README's "Deploy-only install" section holds one ``pip install`` line, for the distribution in
``packaging/onnx-aot-runtime``. The test builds that distribution's wheel (with this Python's
setuptools, no network), makes a fresh venv, gives it this machine's numpy (linked, so no index is
needed), installs the wheel with ``--no-index``, and checks there: only numpy and the runtime are
installed, ``pip check`` is clean, the compiler (and onnx, jinja2, networkx) cannot be imported,
and ``python -m runtime run | verify | inspect | strip`` and ``Session`` work on an artifact
compiled here.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

import runtime
from compiler import compile_model
from tests.support.models import small_model

REPO = Path(__file__).resolve().parent.parent
DIST = REPO / "packaging" / "onnx-aot-runtime"


def readme_section(title: str) -> str:
    text = (REPO / "README.md").read_text()
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"README has no '## {title}' section"
    return match.group(1)


def test_readme_has_one_pip_install_line_for_the_runtime_distribution() -> None:
    lines = [line for line in readme_section("Deploy-only install").splitlines()
             if line.startswith("pip install")]
    assert lines == ["pip install ./packaging/onnx-aot-runtime"], lines
    assert (REPO / lines[0].split()[-1] / "pyproject.toml").is_file()


def test_the_runtime_distribution_matches_the_package() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((DIST / "pyproject.toml").read_text())
    assert project["project"]["dependencies"] == ["numpy>=1.24"]
    assert project["project"]["version"] == runtime.__version__
    root = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert root["project"]["version"] == runtime.__version__
    listed = set(project["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "runtime").rglob("__init__.py")}
    assert listed == found, f"packaging/onnx-aot-runtime/pyproject.toml packages: {sorted(found ^ listed)}"
    assert (DIST / "LICENSE").read_text() == (REPO / "LICENSE").read_text()


def _setuptools_77() -> str | None:
    """Why the offline wheel build cannot run here (None when it can)."""
    try:
        version = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        return "setuptools is not installed here (pip install -e '.[dev]' brings it)"
    if int(version.split(".")[0]) < 77:
        return f"setuptools {version} is older than 77 (the SPDX license string needs 77)"
    return None


def build_wheel(project: Path, out: Path) -> tuple[Path, str]:
    """Build ``project``'s wheel offline with this Python's setuptools; (the wheel, pip's output)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "--no-index", "-v", "-w", str(out), str(project)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=out.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = out.glob("*.whl")
    return wheel, done.stdout + done.stderr


def _link_numpy(site: Path) -> None:
    """Give the venv this Python's numpy (package, its libs and its dist-info) without an index."""
    dist = importlib.metadata.distribution("numpy")
    tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
    base = Path(str(dist.locate_file("")))
    for top in sorted(tops):
        if (base / top).exists() and not top.endswith(".py"):
            (site / top).symlink_to(base / top)


@pytest.fixture(scope="module")
def deploy_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    why = _setuptools_77()
    if why is not None:
        pytest.skip(f"cannot build the deploy distribution offline: {why}")
    if importlib.util.find_spec("ensurepip") is None:
        pytest.skip("this Python cannot make a venv with pip (Debian/Ubuntu: apt-get install python3-venv)")
    root = tmp_path_factory.mktemp("deploy")
    # a copy of what the distribution builds from, so the build leaves nothing in the repository
    src = root / "src"
    shutil.copytree(DIST, src / "packaging" / "onnx-aot-runtime", symlinks=False)
    shutil.copytree(REPO / "runtime", src / "runtime", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "wheels").mkdir()
    wheel, log = build_wheel(src / "packaging" / "onnx-aot-runtime", root / "wheels")
    assert not [line for line in log.splitlines() if re.search(r"warning|deprecat", line, re.I)], log
    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    _link_numpy(site)
    if run_in(env_dir, "-m", "pip", "show", "-q", "numpy", ok=False).returncode != 0:
        pytest.skip("this Python's numpy does not list its files (a distribution package?): the venv "
                    "cannot be given numpy without an index")
    run_in(env_dir, "-m", "pip", "install", "--no-index", "--disable-pip-version-check", "-q", str(wheel))
    return env_dir


def run_in(env_dir: Path, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the venv's python with ``args`` outside the repository (so only installed code imports)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    cwd = env_dir.parent / "work"
    cwd.mkdir(exist_ok=True)
    done = subprocess.run([str(env_dir / "bin" / "python"), *args], capture_output=True, text=True,
                          timeout=300, env=env, cwd=cwd)
    if ok:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_only_numpy_and_the_runtime_are_installed_and_pip_check_is_clean(deploy_venv: Path) -> None:
    listed = json.loads(run_in(deploy_venv, "-m", "pip", "list", "--format=json",
                               "--disable-pip-version-check").stdout)
    names = {p["name"].lower() for p in listed} - {"pip", "setuptools", "wheel"}  # the venv's own
    assert names == {"numpy", "onnx-aot-runtime"}, names
    assert "No broken requirements" in run_in(deploy_venv, "-m", "pip", "check").stdout
    probe = ("import importlib.util as u, runtime; print(runtime.__file__); "
             "print([m for m in ('compiler', 'onnx', 'jinja2', 'networkx') if u.find_spec(m)])")
    where, missing = run_in(deploy_venv, "-c", probe).stdout.splitlines()
    assert where.startswith(str(deploy_venv)) and missing == "[]", (where, missing)


def test_runtime_commands_and_session_work_there(deploy_venv: Path, tmp_path: Path) -> None:
    art = compile_model(small_model(), tmp_path / "art")
    out = run_in(deploy_venv, "-m", "runtime", "run", str(art), "--runs", "3").stdout
    assert "y: float32 [1, 10] first values" in out and "warm runs: median" in out
    assert "OK: 2 golden case(s)" in run_in(deploy_venv, "-m", "runtime", "verify", str(art)).stdout
    assert "arena host" in run_in(deploy_venv, "-m", "runtime", "inspect", str(art)).stdout
    summary = json.loads(run_in(deploy_venv, "-m", "runtime", "inspect", str(art), "--json").stdout)
    assert "arenas" in summary
    script = ("import numpy as np; from runtime import Session; s = Session(DIR); "
              "(y,) = s.run('y', {'x': np.ones((1, 3, 8, 8), np.float32)}); "
              "print(y.shape, s.verify().verified)")
    assert run_in(deploy_venv, "-c", script.replace("DIR", repr(str(art)))).stdout.strip() == "(1, 10) True"
    assert "removed" in run_in(deploy_venv, "-m", "runtime", "strip", str(art)).stdout
    result = run_in(deploy_venv, "-m", "runtime", "run", str(tmp_path / "model.onnx"), ok=False)
    assert result.returncode == 1 and "onnx-aot compile" in result.stderr and "Traceback" not in result.stderr
