"""A wheel install (not only an editable one) finds its templates and compiles a model."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_every_package_is_listed_for_the_wheel() -> None:
    """pyproject.toml names the packages one by one: a new package left out installs broken."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(REPO).parts)
             for top in ("compiler", "runtime") for p in (REPO / top).rglob("__init__.py")}
    assert found - listed == set(), f"add to [tool.setuptools] packages: {sorted(found - listed)}"


def test_wheel_ships_templates_and_compiles(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(wheels), str(REPO)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = wheels.glob("onnx_aot-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "compiler/_templates/c/conv.c.j2" in names
    assert "compiler/_templates/report/memory.html.j2" in names
    for package in ("compiler/passes/__init__.py", "runtime/kernels/__init__.py",
                    "runtime/providers/c.py", "compiler/providers/c/provider.py",
                    "compiler/providers/cuda/provider.py"):
        assert package in names, package
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    script = textwrap.dedent("""
        import numpy as np
        from onnx import TensorProto, helper
        import compiler, runtime
        from compiler.codegen.env import templates_dir
        assert str(templates_dir()).startswith(SITE), templates_dir()
        assert compiler.__file__.startswith(SITE), compiler.__file__
        g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "w",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
        out = compiler.compile_model(m, "art")
        y = runtime.Session(out).run(None, {"x": np.array([-1, 2, -3, 4], np.float32)})[0]
        assert y.tolist() == [0, 2, 0, 4], y
        print("wheel ok")
    """).replace("SITE", repr(str(site)))
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin:/usr/local/bin"}
    import os

    env.update({k: v for k, v in os.environ.items() if k in ("HOME", "ONNX_AOT_CACHE_DIR")})
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=300, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "wheel ok" in result.stdout
