"""Artifacts that cannot be tampered with: every damaged, truncated, missing or foreign file is the
project's ArtifactError naming the file, raised before any kernel library is loaded; a newer
format, another CPU's ISA or another GPU arch say what is needed."""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from compiler import compile_model
from runtime import Session
from runtime.artifact import FORMAT_VERSION
from runtime.artifact import load_artifact
from runtime.errors import ArtifactError
from runtime.integrity import sampled_sha256
from runtime.integrity import sha256_file
from runtime.isa import MARCH_FEATURES
from runtime.isa import check_cpu_target
from runtime.isa import host_cpu_flags
from runtime.isa import missing_features
from runtime.isa import required_features
from runtime.plan_schema import CudaModule
from runtime.providers.cuda_module import DeviceInfo
from runtime.providers.cuda_module import arch_mismatch
from tests.support.models import small_model


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_model(small_model(), tmp_path_factory.mktemp("integrity") / "art")


@pytest.fixture
def art(pristine: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "art"
    shutil.copytree(pristine, copy)
    return copy


@pytest.fixture
def no_library_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to dlopen a kernel library fails the test: checks must come first."""
    import runtime.providers.c as c

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a kernel library was loaded before the artifact was verified")

    monkeypatch.setattr(c.CLibrary, "__init__", refuse)


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset % len(data)] ^= 0x5A
    path.write_bytes(bytes(data))


def _manifest(art: Path) -> dict:
    return json.loads((art / "manifest.json").read_text())


def _write_manifest(art: Path, manifest: dict) -> None:
    (art / "manifest.json").write_text(json.dumps(manifest, indent=1))


# Every way a file can be damaged, for every file: (file, damage) -> the error must name the file.
FILES = [
    "plan.json",
    "kernels/cpu/model.so",
    "kernels/cpu/model.c",
    "weights.bin",
    "golden.json",
    "golden.bin",
    "report/memory.json",
    "report/memory.html",
]
DAMAGE = ["flip_first", "flip_middle", "flip_last", "truncate", "append", "missing", "empty"]
OPTIONAL = {"golden.json", "golden.bin", "report/memory.json", "report/memory.html"}  # onnx-aot strip


@pytest.mark.parametrize("rel", FILES)
@pytest.mark.parametrize("damage", DAMAGE)
def test_damaged_file_is_detected_before_loading(
    art: Path, rel: str, damage: str, no_library_loads: None
) -> None:
    path = art / rel
    size = path.stat().st_size
    if damage.startswith("flip"):
        _flip(path, {"flip_first": 0, "flip_middle": size // 2, "flip_last": size - 1}[damage])
    elif damage == "truncate":
        path.write_bytes(path.read_bytes()[: size // 2])
    elif damage == "append":
        path.write_bytes(path.read_bytes() + b"\0")
    elif damage == "missing":
        path.unlink()
        if rel in OPTIONAL:  # an optional part is not needed to load (the rest is still checked)
            assert load_artifact(art).plan is not None
            return
    else:
        path.write_bytes(b"")
    with pytest.raises(ArtifactError) as info:
        Session(art)
    assert str(path) in str(info.value)


def test_weights_flip_outside_the_sample_needs_the_full_hash(tmp_path: Path) -> None:
    # Weights over 256 KiB are sampled (64 blocks of 4 KiB) at load; the full hash is on request.
    from onnx import TensorProto
    from onnx import helper
    from onnx import numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 512])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 512])],
        initializer=[w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    art = compile_model(model, tmp_path / "big")
    weights = art / "weights.bin"
    assert weights.stat().st_size == 512 * 512 * 4
    entry = _manifest(art)["files"]["weights.bin"]
    assert entry["sample_sha256"] == sampled_sha256(weights)
    Session(art, verify_weights=True)
    _flip(weights, 4096 * 3 + 100)  # inside a sampled block (block 0 starts at 0, blocks are spread)
    _flip(weights, 0)
    with pytest.raises(ArtifactError, match="sampled"):
        Session(art)
    _flip(weights, 0)
    _flip(weights, 4096 * 3 + 100)
    # a byte no sampled block covers: the fast check passes, the full hash does not
    spacing = (weights.stat().st_size - 4096) // 63
    _flip(weights, spacing // 2 + 4096)
    Session(art)
    with pytest.raises(ArtifactError, match="weights.bin: contents do not match"):
        Session(art, verify_weights=True)


def test_manifest_damage(art: Path, no_library_loads: None) -> None:
    good = _manifest(art)
    cases = {
        "not json": b"{ nope",
        "not an object": b"[1, 2]",
        "no files": json.dumps({**good, "files": None}).encode(),
        "plan not listed": json.dumps(
            {**good, "files": {k: v for k, v in good["files"].items() if k != "plan.json"}}
        ).encode(),
        "entry not an object": json.dumps({**good, "files": {**good["files"], "plan.json": 5}}).encode(),
        "size not a number": json.dumps(
            {
                **good,
                "files": {
                    **good["files"],
                    "plan.json": {"size": "12", "sha256": good["files"]["plan.json"]["sha256"]},
                },
            }
        ).encode(),
        "escapes the folder": json.dumps(
            {**good, "files": {**good["files"], "../secret": {"size": 1, "sha256": "0" * 64}}}
        ).encode(),
        "absolute path": json.dumps(
            {**good, "files": {**good["files"], "/etc/passwd": {"size": 1, "sha256": "0" * 64}}}
        ).encode(),
        "listed but missing": json.dumps(
            {**good, "files": {**good["files"], "extra.bin": {"size": 1, "sha256": "0" * 64}}}
        ).encode(),
    }
    for what, data in cases.items():
        (art / "manifest.json").write_bytes(data)
        with pytest.raises(ArtifactError) as info:
            Session(art)
        assert "manifest.json" in str(info.value) or "extra.bin" in str(info.value), what
    (art / "manifest.json").unlink()
    with pytest.raises(ArtifactError, match="manifest.json"):
        Session(art)


def test_newer_format_version_says_what_is_needed(art: Path, no_library_loads: None) -> None:
    manifest = _manifest(art)
    newer = FORMAT_VERSION + 1
    _write_manifest(art, {**manifest, "format_version": newer, "compiler": {"version": "9.0"}})
    with pytest.raises(
        ArtifactError, match=rf"format version {newer} \(written by onnx-aot 9.0\) is newer.*upgrade"
    ):
        Session(art)
    _write_manifest(art, {**manifest, "format_version": "one"})
    with pytest.raises(ArtifactError, match="format version 'one'"):
        Session(art)


def test_manifest_records_the_cpu_target(pristine: Path) -> None:
    cpu = _manifest(pristine)["target"]["cpu"]
    assert cpu["march"] and isinstance(cpu["features"], list)
    flags = host_cpu_flags()
    if flags is not None:  # built with -march=native here: this host has every feature
        assert not missing_features(cpu["features"], flags)


def test_another_cpu_isa_is_refused_before_loading(art: Path, no_library_loads: None) -> None:
    manifest = _manifest(art)
    cpu = manifest["target"]["cpu"]
    if platform.machine() == "x86_64":
        assert [b["march"] for b in cpu["builds"]][1:] == ["x86-64-v2"]  # the portable build
    for build in cpu["builds"]:  # no build fits: refused, naming every build's missing features
        build["features"] = [*build["features"], "avx9_imaginary"]
        build["march"] = "future-cpu"
    _write_manifest(art, manifest)
    with pytest.raises(ArtifactError, match=r"-march=future-cpu\) needs avx9_imaginary.*recompile"):
        Session(art)
    del cpu["builds"]  # a manifest from before the portable build: target.cpu alone is checked
    cpu["features"] = [*cpu["features"], "avx9_imaginary"]
    cpu["march"] = "future-cpu"
    _write_manifest(art, manifest)
    with pytest.raises(ArtifactError, match=r"-march=future-cpu.*avx9_imaginary.*recompile"):
        Session(art)
    manifest["target"]["cpu"]["machine"] = "riscv64"
    _write_manifest(art, manifest)
    with pytest.raises(ArtifactError, match="built for riscv64"):
        Session(art)


AVX2_HOST = frozenset(
    {
        "sse",
        "sse2",
        "pni",
        "ssse3",
        "sse4_1",
        "sse4_2",
        "popcnt",
        "avx",
        "avx2",
        "fma",
        "f16c",
        "bmi1",
        "bmi2",
        "abm",
        "movbe",
    }
)


@pytest.mark.parametrize(
    "cpu, missing",
    [
        (
            {"machine": "x86_64", "march": "x86-64-v4"},
            ["avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"],
        ),
        ({"machine": "x86_64", "march": "sapphirerapids+0123abcd"}, ["avx512f"]),
        ({"machine": "x86_64", "march": "x86-64-v3"}, []),
        ({"machine": "x86_64", "march": "x86-64-v2"}, []),
        ({"machine": "x86_64", "march": "native", "features": ["avx2", "fma", "avx512f"]}, ["avx512f"]),
        ({"machine": "x86_64", "march": "unknown-name"}, []),  # nothing known to check: accepted
    ],
)
def test_isa_check_is_a_pure_function_of_the_flags(cpu: dict, missing: list[str]) -> None:
    if missing:
        with pytest.raises(ArtifactError) as info:
            check_cpu_target(cpu, where="m.json", machine="x86_64", flags=AVX2_HOST)
        for feature in missing:
            assert feature in str(info.value)
        assert "lower target" in str(info.value)
    else:
        check_cpu_target(cpu, where="m.json", machine="x86_64", flags=AVX2_HOST)
    assert set(MARCH_FEATURES["x86-64-v3"]) <= AVX2_HOST
    assert required_features({"march": "x86-64-v4+abc"})[-1] == "avx512vl"


def test_cpu_flags_parse_x86_and_arm() -> None:
    assert host_cpu_flags("processor: 0\nflags\t\t: fpu sse avx2\n") == {"fpu", "sse", "avx2"}
    assert host_cpu_flags("Features\t: fp asimd sve\n") == {"fp", "asimd", "sve"}
    assert host_cpu_flags("nothing here") is None
    check_cpu_target(
        {"machine": "aarch64", "march": "armv8.2-a", "features": ["asimd", "sve"]},
        where="m",
        machine="arm64",
        flags={"fp", "asimd", "sve"},
    )


MODULE = CudaModule("kernels/cuda/model.cu", {"sm_80": "a.cubin", "sm_90": "b.cubin"},
                    "kernels/cuda/model.ptx")
FACTS = {"cuda_version": "12.4", "ptx_arch": "compute_80"}


def test_gpu_arch_mismatch_is_a_clear_message() -> None:
    assert arch_mismatch(MODULE, FACTS, DeviceInfo(90, 12040)) is None  # its cubin
    assert arch_mismatch(MODULE, FACTS, DeviceInfo(86, 12040)) is None  # sm_80 runs on 8.6
    assert arch_mismatch(MODULE, FACTS, DeviceInfo(100, 12080)) is None  # PTX, driver new enough
    old = arch_mismatch(MODULE, FACTS, DeviceInfo(75, 12040))
    assert old is not None and "sm_80, sm_90" in old and "sm_75" in old
    assert "compute capability 8.0 or newer" in old and "Recompile with --target cuda for sm_75" in old
    stale = arch_mismatch(MODULE, FACTS, DeviceInfo(100, 12020))
    assert stale is not None and "driver for CUDA 12.4 or newer, this one is 12.2" in stale
    bare = arch_mismatch(CudaModule("kernels/cuda/model.cu", {}, None), {}, DeviceInfo(90, 12040))
    assert bare is not None and "no cubins were built" in bare and "NVRTC" in bare


def test_sha256_helpers_agree(pristine: Path) -> None:
    entry = _manifest(pristine)["files"]["plan.json"]
    assert sha256_file(pristine / "plan.json") == entry["sha256"]


# A plan rewritten and re-hashed into the manifest (a broken pipeline, not damage) must still end
# in ArtifactError naming plan.json and the field, never a KeyError/TypeError, before any load.
_PLAN_MUTATIONS = [
    ("inputs", lambda p: p.pop("inputs"), "inputs is missing"),
    ("inputs not a list", lambda p: p.update(inputs={}), "inputs must be a list"),
    ("input shape", lambda p: p["inputs"][0].update(shape="1x3"), r"inputs\[0\]\.shape"),
    ("output dtype", lambda p: p["outputs"][0].update(dtype="float33"), r"outputs\[0\]\.dtype"),
    ("output value", lambda p: p["outputs"][0].pop("value"), r"outputs\[0\]\.value"),
    ("arena size", lambda p: p["arenas"][0].update(nbytes=-1), r"arenas\[0\]"),
    ("entry", lambda p: p["partitions"][0].pop("entry"), r"partitions\[0\]\.entry"),
    ("ext", lambda p: p["partitions"][0].update(ext="x"), r"partitions\[0\]\.ext"),
    ("step partition", lambda p: p["steps"][0].update(partition=7), r"steps\[0\]\.partition"),
    ("values", lambda p: p.update(values=[]), "values must be an object"),
    ("library", lambda p: p["partitions"][0].pop("library"), r"partitions\[0\]\.library is missing"),
    ("step index", lambda p: p["steps"][0].update(index=3), r"steps\[0\]\.index must be 0"),
    ("value location", lambda p: next(iter(p["values"].values())).update(location=["disk", 0]),
     r"values\['x'\]\.location must be"),
    ("format version", lambda p: p.update(format_version=FORMAT_VERSION + 1),
     f"plan format version {FORMAT_VERSION + 1}"),
]


@pytest.mark.parametrize("what,mutate,message", _PLAN_MUTATIONS, ids=[m[0] for m in _PLAN_MUTATIONS])
def test_malformed_but_rehashed_plan_is_an_artifact_error(
    art: Path, no_library_loads: None, what: str, mutate: Any, message: str
) -> None:
    from runtime import load_plan

    plan = json.loads((art / "plan.json").read_text())
    mutate(plan)
    data = json.dumps(plan).encode()
    (art / "plan.json").write_bytes(data)
    manifest = _manifest(art)
    manifest["files"]["plan.json"] = {**manifest["files"]["plan.json"], "size": len(data),
                                      "sha256": hashlib.sha256(data).hexdigest()}
    _write_manifest(art, manifest)
    for load in (Session, load_plan):
        with pytest.raises(ArtifactError, match=message) as info:
            load(art)
        assert "plan.json" in str(info.value)
