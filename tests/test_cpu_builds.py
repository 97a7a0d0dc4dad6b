"""CPU targets: the preferred + portable C builds, choosing one at load, falling back, rebuilding.

Host CPUs other than this one are faked with ``ONNX_AOT_TEST_CPU_FLAGS`` (test-only, read by
``runtime.isa.host_cpu_flags``); both builds still run here, because this machine has at least
x86-64-v2.
"""

from __future__ import annotations

import hashlib
import json
import platform
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from compiler import compile_model
from compiler.bench import for_onnxruntime
from compiler.cli import main
from compiler.driver import resolve_cpu
from runtime import Session
from runtime.errors import ArtifactError
from runtime.errors import CpuFallbackWarning
from runtime.isa import MARCH_FEATURES
from runtime.isa import TEST_FLAGS_ENV
from runtime.isa import host_x86_level
from tests.support.models import small_model
from tests.support.zoo import random_weight_model
from tests.support.zoo import strip_softmax

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 CPU targets")

V2_HOST = " ".join(MARCH_FEATURES["x86-64-v2"])
AVX2_HOST = " ".join(MARCH_FEATURES["x86-64-v3"])


def _feeds(session: Session, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {s.name: rng.standard_normal(s.shape).astype(s.dtype) for s in session.inputs}


def _folder_digest(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def v4_small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_model(small_model(), tmp_path_factory.mktemp("v4") / "art", cpu="x86-64-v4")


def test_default_target_is_the_build_machines_level(tmp_path: Path) -> None:
    assert resolve_cpu(None) == (host_x86_level() or "native")
    with pytest.raises(Exception, match="unknown CPU target 'x86-64-v9'"):
        resolve_cpu("x86-64-v9")
    art = compile_model(small_model(), tmp_path / "v2", cpu="x86-64-v2", golden_cases=0)
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["options"]["cpu"] == "x86-64-v2"
    assert [b["march"] for b in manifest["target"]["cpu"]["builds"]] == ["x86-64-v2"]  # no second
    assert not (art / "kernels/cpu/x86-64-v2").exists()


def test_zoo_model_builds_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both builds of a zoo model: one plan, every file hashed, same outputs within tolerance."""
    if host_x86_level() in (None, "x86-64-v2"):
        pytest.skip("a host at x86-64-v2 (or --host-cpu x86-64-v2) builds only the portable level")
    model = strip_softmax(random_weight_model("squeezenet"))
    art = compile_model(model, tmp_path / "sq")
    manifest = json.loads((art / "manifest.json").read_text())
    cpu = manifest["target"]["cpu"]
    builds = cpu["builds"]
    assert manifest["options"]["cpu"] == host_x86_level()
    assert builds[0]["library"] == "kernels/cpu/model.so" and builds[0]["source"] == "kernels/cpu/model.c"
    assert builds[-1] == {**builds[-1], "library": "kernels/cpu/x86-64-v2/model.so",
                          "source": "kernels/cpu/x86-64-v2/model.c", "march": "x86-64-v2"}
    assert "-march=x86-64-v2" in builds[-1]["flags"] and "avx" not in builds[-1]["features"]
    assert cpu["march"] == builds[0]["march"] and cpu["features"] == builds[0]["features"]
    for build in builds:
        for rel in (build["library"], build["source"]):
            assert manifest["files"][rel]["sha256"] == hashlib.sha256((art / rel).read_bytes()).hexdigest()
    primary = Session(art, threads=2)
    assert primary.cpu_build is not None and primary.cpu_build.index == 0
    feeds = _feeds(primary)
    want = primary.run(None, feeds)
    monkeypatch.setenv(TEST_FLAGS_ENV, V2_HOST)
    with pytest.warns(CpuFallbackWarning, match=r"lacks .*avx2.*x86-64-v2/model.so"):
        portable = Session(art, threads=2)
    assert portable.cpu_build is not None and portable.cpu_build.library == builds[-1]["library"]
    got = portable.run(None, feeds)
    reference = ort.InferenceSession(for_onnxruntime(model).SerializeToString(),
                                     providers=["CPUExecutionProvider"]).run(None, feeds)
    for a, b, r in zip(want, got, reference, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(b, r, rtol=1e-3, atol=1e-4)
    portable.verify()


def test_v4_artifact_falls_back_to_v2_on_an_avx2_host(v4_small: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TEST_FLAGS_ENV, AVX2_HOST)
    with pytest.warns(CpuFallbackWarning) as caught:
        session = Session(v4_small)
    message = str(caught[0].message)
    assert "avx512f" in message and "x86-64-v4" in message and "kernels/cpu/x86-64-v2/model.so" in message
    assert session.cpu_build is not None and session.cpu_build.fallback
    assert session.cpu_build.march == "x86-64-v2" and "avx512f" in session.cpu_build.preferred_missing
    model = small_model()
    feeds = _feeds(session)
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = reference.run(None, feeds)
    np.testing.assert_allclose(session.run(None, feeds)[0], want[0], rtol=1e-4, atol=1e-4)
    # a CPU below x86-64-v2: no build fits, the error names what is missing
    monkeypatch.setenv(TEST_FLAGS_ENV, "sse sse2 ssse3")
    with pytest.raises(ArtifactError, match=r"no C kernel build.*x86-64-v2\) needs pni.*sse4_2.*recompile"):
        Session(v4_small)
    # an AVX-512 host takes the preferred build without a warning (nothing is loaded for it here)
    monkeypatch.setenv(TEST_FLAGS_ENV, " ".join(MARCH_FEATURES["x86-64-v4"]))
    from runtime.artifact import load_artifact

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        chosen = load_artifact(v4_small).cpu_build
    assert chosen is not None and chosen.index == 0 and chosen.march == "x86-64-v4"


def test_rebuild_goes_to_a_cache_never_the_artifact(v4_small: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("ONNX_AOT_RUNTIME_CACHE_DIR", str(cache))
    before = _folder_digest(v4_small)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CpuFallbackWarning)  # this host may lack AVX-512
        session = Session(v4_small, rebuild=True)
    build = session.cpu_build
    assert build is not None and build.rebuilt is not None and build.rebuilt.parent == cache
    assert [p.name for p in cache.iterdir()] == [build.rebuilt.name]  # no temporary left behind
    feeds = _feeds(session)
    want = ort.InferenceSession(small_model().SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(session.run(None, feeds)[0], want[0], rtol=1e-4, atol=1e-4)
    assert _folder_digest(v4_small) == before  # byte-identical artifact folder
    # no C compiler (its version is part of the cache key): a clear error, not a crash
    monkeypatch.setenv("CC", "onnx-aot-no-such-cc")
    with pytest.raises(ArtifactError, match="needs a C compiler.*onnx-aot-no-such-cc"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CpuFallbackWarning)
            Session(v4_small, rebuild=True, threads=1)
    monkeypatch.delenv("CC")
    # the next load reuses the cached library
    mtime = build.rebuilt.stat().st_mtime_ns
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CpuFallbackWarning)
        again = Session(v4_small, rebuild=True)
    assert again.cpu_build is not None and again.cpu_build.rebuilt == build.rebuilt
    assert build.rebuilt.stat().st_mtime_ns == mtime
    assert _folder_digest(v4_small) == before


def test_rebuild_checks_the_source_hash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime.artifact import load_artifact
    from runtime.rebuild import rebuild_library

    art = compile_model(small_model(), tmp_path / "art", golden_cases=0)
    loaded = load_artifact(art)
    assert loaded.cpu_build is not None and loaded.cpu_build.source is not None
    source = art / loaded.cpu_build.source
    source.write_text(source.read_text() + "\n/* changed after the load was verified */\n")
    with pytest.raises(ArtifactError, match="sha256 does not match"):
        rebuild_library(art, loaded.manifest, loaded.cpu_build, cache=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_cli_cpu_and_rebuild(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    import onnx

    monkeypatch.setenv("ONNX_AOT_RUNTIME_CACHE_DIR", str(tmp_path / "cache"))
    onnx.save(small_model(), tmp_path / "m.onnx")
    assert main(["compile", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "art"), "--cpu", "x86-64-v3",
                 "-q", "--golden-cases", "0"]) == 0
    manifest = json.loads((tmp_path / "art/manifest.json").read_text())
    assert [b["march"] for b in manifest["target"]["cpu"]["builds"]] == ["x86-64-v3", "x86-64-v2"]
    assert main(["run", str(tmp_path / "art"), "--rebuild"]) == 0
    assert "ran in" in capsys.readouterr().out
    assert len(list((tmp_path / "cache").glob("*.so"))) == 1


def test_build_choice_and_rebuild_need_no_compiler_packages() -> None:
    import ast

    import runtime.cpu_builds
    import runtime.rebuild

    banned = {"onnx", "onnxruntime", "networkx", "jinja2", "compiler"}
    for module in (runtime.cpu_builds, runtime.rebuild):
        assert module.__file__ is not None
        for node in ast.walk(ast.parse(Path(module.__file__).read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            assert not {n.split(".")[0] for n in names} & banned, (module.__name__, names)
