"""The CUDA provider's run side (``runtime/providers/cuda*.py``).

Without a GPU: the runtime imports without cupy, the "cuda" space names the install hint, the
cubin / PTX / NVRTC choice and the NVRTC cache key are pure functions, and a CUDA partition runs
end to end against a simulated cupy whose "device" memory is host memory (launch arguments really
are pointers: the fake kernels read and write through them), eagerly and as captured graphs.
With cupy and a device: compiled models match onnxruntime, with and without CUDA graphs, and the
NVRTC path compiles once and then hits its cache.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import json
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import runtime.providers.cuda as cuda
from runtime.artifact import Artifact
from runtime.errors import ArtifactError
from runtime.errors import RuntimeKernelError
from runtime.json_fields import Where
from runtime.memory import memory_space
from runtime.plan_schema import FORMAT_VERSION
from runtime.plan_schema import CudaModule
from runtime.plan_schema import Plan
from runtime.plan_schema import PlanPartition
from runtime.providers.cuda_module import DeviceInfo
from runtime.providers.cuda_module import choose_module
from runtime.providers.cuda_module import module_candidates
from runtime.providers.cuda_module import nvrtc_cache_dir
from runtime.providers.cuda_module import nvrtc_cache_key
from runtime.providers.cuda_module import nvrtc_cache_path
from runtime.providers.cuda_module import parse_cuda_version

REPO = Path(__file__).resolve().parent.parent


# -- without cupy -----------------------------------------------------------------------------------
def test_runtime_imports_without_cupy() -> None:
    code = (
        "import sys\n"
        "sys.modules['cupy'] = None  # any 'import cupy' now fails, installed or not\n"
        "import runtime, runtime.providers.cuda\n"
        "from runtime.memory import memory_space\n"
        "space = memory_space('cuda')\n"
        "assert space.name == 'cuda'\n"
        "try:\n"
        "    space.allocate(16, 256)\n"
        "except runtime.ArtifactError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "install onnx-aot[cuda] (cupy-cuda12x) or [cuda13]" in result.stdout


def test_cuda_space_without_cupy_names_the_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)
    monkeypatch.setattr(cuda, "_CUPY", None)
    space: Any = memory_space("cuda")
    for use in (lambda: space.xp, lambda: space.allocate(64, 256), lambda: space.check(),
                lambda: space.upload(np.zeros(4, np.uint8)), lambda: space.from_host(np.zeros(2))):
        with pytest.raises(ArtifactError, match=re.escape("needs CUDA: install onnx-aot[cuda]")):
            use()
    assert not cuda.cuda_available()


# -- module choice and the NVRTC cache ---------------------------------------------------------------
MODULE = {"source": "kernels/cuda/model.cu",
          "cubins": {"sm_80": "kernels/cuda/model.sm_80.cubin", "sm_90": "kernels/cuda/model.sm_90.cubin"},
          "ptx": "kernels/cuda/model.ptx"}
FACTS_12 = {"nvcc_version": "12.4.131", "cuda_version": "12.4", "archs": ["sm_80", "sm_90"],
            "ptx_arch": "compute_80", "min_driver": 12040}


@pytest.mark.parametrize("cc, driver, facts, module, kind, path", [
    (90, 12040, FACTS_12, MODULE, "cubin", "kernels/cuda/model.sm_90.cubin"),  # H100
    (80, 12020, FACTS_12, MODULE, "cubin", "kernels/cuda/model.sm_80.cubin"),  # A100, older 12.x driver
    (86, 12040, FACTS_12, MODULE, "cubin", "kernels/cuda/model.sm_80.cubin"),  # same major, newer minor
    (100, 12080, FACTS_12, MODULE, "ptx", "kernels/cuda/model.ptx"),  # Blackwell: no cubin, PTX JIT
    (100, 12020, FACTS_12, MODULE, "nvrtc", "kernels/cuda/model.cu"),  # driver older than the PTX
    # CUDA 13 binaries on a CUDA 12 driver, then on a CUDA 13 one
    (90, 12080, {**FACTS_12, "cuda_version": "13.0"}, MODULE, "nvrtc", "kernels/cuda/model.cu"),
    (90, 13000, {**FACTS_12, "cuda_version": "13.0"}, MODULE, "cubin", "kernels/cuda/model.sm_90.cubin"),
    (75, 12040, FACTS_12, MODULE, "nvrtc", "kernels/cuda/model.cu"),  # PTX arch 8.0 > device 7.5
    (90, 12040, {}, {"source": "kernels/cuda/model.cu", "cubins": {}, "ptx": None}, "nvrtc",
     "kernels/cuda/model.cu"),  # no nvcc at compile time
    (90, 12040, FACTS_12, {**MODULE, "cubins": {"sm_90a": "a.cubin", "sm_90": "b.cubin"}}, "cubin",
     "a.cubin"),
    (91, 12040, FACTS_12, {**MODULE, "cubins": {"sm_90a": "a.cubin"}}, "ptx", "kernels/cuda/model.ptx"),
])
def test_module_choice(cc: int, driver: int, facts: dict[str, Any], module: dict[str, Any], kind: str,
                       path: str) -> None:
    choice = choose_module(CudaModule.from_json(module, Where()), facts, DeviceInfo(cc, driver))
    assert (choice.kind, choice.path, choice.arch) == (kind, path, f"sm_{cc}")


def test_candidates_always_end_with_nvrtc_on_the_source() -> None:
    module = CudaModule.from_json(MODULE, Where())
    kinds = [c.kind for c in module_candidates(module, FACTS_12, DeviceInfo(90, 12040))]
    assert kinds == ["cubin", "ptx", "nvrtc"]
    last = module_candidates(module, FACTS_12, DeviceInfo(90, 12040))[-1]
    assert last.path == "kernels/cuda/model.cu"
    with pytest.raises(ArtifactError, match=r"plan.json: partitions\[0\]\.module\.source is missing"):
        CudaModule.from_json({"cubins": {}, "ptx": None}, Where(path="partitions[0].module"))
    with pytest.raises(ArtifactError, match="must name the module's source"):
        CudaModule.from_json({"source": "", "cubins": {}, "ptx": None}, Where())


@pytest.mark.parametrize("text, value", [
    ("12.4", 12040), ("12.4.131", 12040), ("V12.4.131", 12040), ("release 13.0, V13.0.48", 13000),
    (12080, 12080), (None, None), ("", None), (12, None)])
def test_cuda_versions_parse(text: Any, value: int | None) -> None:
    assert parse_cuda_version(text) == value


def test_nvrtc_cache_folder_and_key(tmp_path: Path) -> None:
    assert nvrtc_cache_dir({"ONNX_AOT_CUDA_CACHE": str(tmp_path)}) == tmp_path
    assert nvrtc_cache_dir({"ONNX_AOT_CUDA_CACHE": ""}) == Path.home() / ".cache/onnx-aot/cuda"
    assert nvrtc_cache_dir({}) == Path.home() / ".cache/onnx-aot/cuda"
    sha = hashlib.sha256(b"__global__ void k() {}").hexdigest()
    key = nvrtc_cache_key(sha, "sm_90", ("--std=c++17",), (12, 4))
    assert key.startswith(f"{sha}-sm_90-")
    assert key == nvrtc_cache_key(sha, "sm_90", ["--std=c++17"], (12, 4))  # deterministic
    others = {nvrtc_cache_key(sha, "sm_80", ("--std=c++17",), (12, 4)),
              nvrtc_cache_key(sha, "sm_90", ("--std=c++17", "--use_fast_math"), (12, 4)),
              nvrtc_cache_key(sha, "sm_90", ("--std=c++17",), (13, 0)),
              nvrtc_cache_key(hashlib.sha256(b"x").hexdigest(), "sm_90", ("--std=c++17",), (12, 4))}
    assert key not in others and len(others) == 4
    assert nvrtc_cache_path(tmp_path, key) == tmp_path / f"{key}.cubin"
    with pytest.raises(ArtifactError):
        nvrtc_cache_key("not-a-hash", "sm_90", (), (12, 4))


# -- a simulated cupy -------------------------------------------------------------------------------
class DevArray:
    """A "device" byte array: host memory with cupy's ``.data.ptr``."""

    def __init__(self, host: np.ndarray) -> None:
        self.host = host
        self.data = types.SimpleNamespace(ptr=int(host.ctypes.data))
        self.size = host.size

    def __getitem__(self, key: slice) -> DevArray:
        return DevArray(self.host[key])


def _floats(ptr: int, n: int) -> np.ndarray:
    return np.ctypeslib.as_array((ctypes.c_float * n).from_address(int(ptr)))


KERNELS = {  # the fake "device code": kernels reading and writing through their pointer arguments
    "mul": lambda a, b, out, n: np.multiply(_floats(a, n), _floats(b, n), out=_floats(out, n)),
    "scale": lambda x, out, n, alpha: np.multiply(_floats(x, n), np.float32(alpha), out=_floats(out, n)),
}


class FakeCupy:
    """Just what ``runtime/providers/cuda*.py`` uses of cupy; it records launches and captures."""

    uint8 = np.uint8

    def __init__(self, cc: str = "90", driver: int = 12040) -> None:
        fake = self
        self.launches: list[str] = []
        self.loaded: list[str] = []
        self.captures = 0
        self.current: list[Any] = []

        class Stream:
            def __init__(self, non_blocking: bool = False) -> None:
                self.ptr = id(self)
                self.capturing: list[Any] | None = None

            def __enter__(self) -> Stream:
                fake.current.append(self)
                return self

            def __exit__(self, *exc: Any) -> None:
                fake.current.pop()

            def synchronize(self) -> None:
                assert self.capturing is None

            def record(self) -> object:
                return object()

            def wait_event(self, event: object) -> None:
                pass

            def begin_capture(self) -> None:
                self.capturing = []

            def end_capture(self) -> Any:
                ops, self.capturing = self.capturing, None
                assert ops is not None
                fake.captures += 1
                return types.SimpleNamespace(launch=lambda stream=None: [op() for op in ops])

        class Kernel:
            max_threads_per_block = 1024
            max_dynamic_shared_size_bytes = 48 * 1024

            def __init__(self, name: str) -> None:
                self.name = name

            def __call__(self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...],
                         shared_mem: int = 0) -> None:
                assert all(isinstance(a, np.generic) for a in args)
                stream = fake.cuda.get_current_stream()

                def launch() -> None:
                    fake.launches.append(self.name)
                    if self.name in KERNELS:
                        KERNELS[self.name](*args)

                if stream.capturing is not None:
                    stream.capturing.append(launch)
                else:
                    launch()

        class RawModule:
            def __init__(self, path: str) -> None:
                data = Path(path).read_bytes()
                # a fake cubin lists its kernel names; a real one (nvcc's) "has" every kernel
                self.names = json.loads(data) if data.startswith(b"[") else None
                fake.loaded.append(Path(path).name)

            def get_function(self, name: str) -> Kernel:
                if self.names is not None and name not in self.names:
                    raise RuntimeError(f"CUDA_ERROR_NOT_FOUND: {name}")
                return Kernel(name)

        null = Stream()
        self.RawModule = RawModule
        self.cuda = types.SimpleNamespace(
            Stream=Stream,
            Device=lambda: types.SimpleNamespace(compute_capability=cc),
            get_current_stream=lambda: fake.current[-1] if fake.current else null,
            runtime=types.SimpleNamespace(
                getDeviceCount=lambda: 1, driverGetVersion=lambda: driver,
                memcpyAsync=lambda dst, src, n, kind, stream: ctypes.memmove(dst, src, n)))

    def empty(self, n: int, dtype: Any) -> DevArray:
        return DevArray(np.zeros(n, np.uint8))

    def asarray(self, array: np.ndarray) -> DevArray:
        return DevArray(np.array(array, copy=True))


KERNEL_NAME = r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\("
CU_SOURCE = ('extern "C" __global__ void mul(const float* a, const float* b, float* y, int n) {}\n'
             'extern "C" __global__ void scale(const float* x, float* y, int n, float alpha) {}\n')


def fake_plan(cubins: dict[str, list[str]]) -> dict[str, Any]:
    """x (ext) -> Transfer -> mul by weight -> scale by 2 in place -> Reshape view -> Transfer -> y."""

    def value(location: list[Any]) -> dict[str, Any]:
        return {"dtype": "float32", "shape": [2, 4], "location": location}

    def step(index: int, name: str, op: str, ins: list[str], outs: list[str], **extra: Any) -> dict[str, Any]:
        return {"index": index, "name": name, "op_type": op, "domain": extra.pop("domain", ""),
                "provider": "cuda", "partition": 0, "onnx_nodes": [name], "inputs": ins, "outputs": outs,
                "attrs": extra.pop("attrs", {}), "scratch": None, **extra}

    spec = {"dtype": "float32", "shape": [2, 4]}
    module = {"source": "kernels/cuda/model.cu",
              "cubins": {arch: f"kernels/cuda/model.{arch}.cubin" for arch in cubins}, "ptx": None}
    return {
        "format_version": FORMAT_VERSION, "name": "fake", "symbols": [], "assumptions": [],
        "inputs": [{"name": "x", **spec}],
        "outputs": [{"name": "y", **spec, "value": "y"}], "constants": [], "weights_nbytes": 128,
        "arenas": [{"memory_space": "cuda", "nbytes": 512, "alignment": 256, "lower_bound_nbytes": 512,
                    "naive_nbytes": 512, "strategy": "fake"}],
        "buffers": [],
        "values": {"x": value(["ext", "x"]), "xd": value(["arena", 0, "cuda"]), "w": value(["weights", 64]),
                   "yd": value(["arena", 256, "cuda"]), "v": value(["arena", 256, "cuda"]),
                   "y": value(["ext", "y"])},
        "steps": [
            step(0, "x.to_cuda", "Transfer", ["x"], ["xd"], domain="onnx_aot",
                 attrs={"from": "host", "to": "cuda"}, launches=[]),
            step(1, "mul", "Mul", ["xd", "w"], ["yd"], launches=[
                {"kernel": "mul", "grid": [1, 1, 1], "block": [128, 1, 1], "shared": 0,
                 "args": [["ptr", "arena", 0], ["ptr", "weights", 64], ["ptr", "arena", 256], ["i32", 8]]}]),
            step(2, "scale", "Mul", ["yd"], ["yd"], launches=[
                {"kernel": "scale", "grid": [1], "block": [128], "shared": 0,
                 "args": [["ptr", "arena", 256], ["ptr", "arena", 256], ["i32", 8], ["f32", 2.0]]}]),
            step(3, "view", "Reshape", ["yd"], ["v"], launches=[]),
            step(4, "y.to_host", "Transfer", ["v"], ["y"], domain="onnx_aot",
                 attrs={"from": "cuda", "to": "host"}, launches=[]),
        ],
        "partitions": [{"index": 0, "provider": "cuda", "runner": "cuda", "memory_space": "cuda",
                        "entry": "onnx_aot_partition_0", "first_step": 0, "last_step": 4, "ext": ["x", "y"],
                        "module": module}],
        "onnx_nodes": {},
    }


def fake_artifact(root: Path, *, cubins: dict[str, list[str]], facts: dict[str, Any] | None = None,
                  ) -> tuple[Artifact, PlanPartition]:
    """An artifact folder holding ``fake_plan``'s CUDA source and cubins (each a JSON list of the
    kernels it has), and its one partition."""
    (root / "kernels/cuda").mkdir(parents=True)
    files = {"kernels/cuda/model.cu": CU_SOURCE.encode()}
    for arch, names in cubins.items():
        files[f"kernels/cuda/model.{arch}.cubin"] = json.dumps(names).encode()
    for rel, data in files.items():
        (root / rel).write_bytes(data)
    listed = {rel: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for rel, d in files.items()}
    manifest = {"files": listed,
                "target": {"providers": {"cuda": facts if facts is not None else FACTS_12}}}
    weights = np.zeros(128, np.uint8)
    weights[64:96] = np.arange(1, 9, dtype=np.float32).view(np.uint8)
    plan = Plan.from_json(fake_plan(cubins))
    return Artifact(root, manifest, plan, weights), plan.partitions[0]


@pytest.fixture()
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeCupy:
    cp = FakeCupy()
    monkeypatch.setattr(cuda, "_CUPY", cp)
    return cp


def _run(part: cuda.CudaPartition, arena: DevArray, x: np.ndarray) -> np.ndarray:
    y = np.empty((2, 4), np.float32)
    part.run({"cuda": arena, "host": np.zeros(0, np.uint8)}, {"x": x, "y": y})
    return y


def test_a_partition_runs_its_launches_and_transfers(tmp_path: Path, fake: FakeCupy) -> None:
    artifact, record = fake_artifact(tmp_path, cubins={"sm_90": ["mul", "scale"]})
    space = memory_space("cuda")
    part = cuda.CudaPartition(artifact, record, space.upload(artifact.weights))
    assert part.module_source == "cubin" and fake.loaded == ["model.sm_90.cubin"]
    assert [type(op).__name__ for op in part.program] == ["Copy", "Launch", "Launch", "Copy"]  # view dropped
    x = np.arange(8, dtype=np.float32).reshape(2, 4) - 3
    want = x * np.arange(1, 9, dtype=np.float32).reshape(2, 4) * 2
    for arena in (space.allocate(512, 256), space.allocate(512, 256)):  # two run contexts
        np.testing.assert_array_equal(_run(part, arena, x), want)
    assert fake.launches == ["mul", "scale"] * 2


def test_cuda_graphs_capture_once_per_arena_and_replay(tmp_path: Path, fake: FakeCupy) -> None:
    artifact, record = fake_artifact(tmp_path, cubins={"sm_90": ["mul", "scale"]})
    space = memory_space("cuda")
    part = cuda.CudaPartition(artifact, record, space.upload(artifact.weights), capture=True)
    arena = space.allocate(512, 256)
    w = np.arange(1, 9, dtype=np.float32).reshape(2, 4)
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal((2, 4)).astype(np.float32)
        np.testing.assert_array_equal(_run(part, arena, x), x * w * 2)  # new inputs, same graph
    assert fake.captures == 1 and part.graphs_captured == 1
    assert fake.launches == ["mul", "scale"] * 3
    other = space.allocate(512, 256)
    np.testing.assert_array_equal(_run(part, other, w), w * w * 2)
    assert fake.captures == 2  # another arena address: captured again


def test_a_cubin_without_the_kernels_falls_through_to_nvrtc_and_caches(
        tmp_path: Path, fake: FakeCupy, monkeypatch: pytest.MonkeyPatch) -> None:
    compiled: list[str] = []
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace())
    monkeypatch.setitem(sys.modules, "cupy.cuda", types.SimpleNamespace(nvrtc=_fake_nvrtc(compiled)))
    monkeypatch.setenv("ONNX_AOT_CUDA_CACHE", str(tmp_path / "cache"))
    artifact, record = fake_artifact(tmp_path / "art", cubins={"sm_90": ["mul"]})  # "scale" missing
    weights = memory_space("cuda").upload(artifact.weights)
    part = cuda.CudaPartition(artifact, record, weights)
    assert part.module_source == "nvrtc" and part.module.cache_hit is False
    assert compiled == ["--std=c++17 --gpu-architecture=sm_90"]
    assert "scale" in part.module.notes[0]
    assert part.module.path.parent == tmp_path / "cache"
    again = cuda.CudaPartition(artifact, record, weights)
    assert again.module_source == "nvrtc" and again.module.cache_hit is True and len(compiled) == 1
    x = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(_run(again, memory_space("cuda").allocate(512, 256), x),
                                  np.arange(1, 9, dtype=np.float32).reshape(2, 4) * 2)
    # the shipped source is hash-checked before NVRTC sees it
    (tmp_path / "art/kernels/cuda/model.cu").write_text(CU_SOURCE + "// tampered\n")
    with pytest.raises(ArtifactError, match="sha256"):
        cuda.CudaPartition(artifact, record, weights)


def test_bad_launch_records_are_clear_errors(tmp_path: Path, fake: FakeCupy) -> None:
    cubins = {"sm_90": ["mul", "scale"]}
    artifact, _ = fake_artifact(tmp_path, cubins=cubins)
    weights = memory_space("cuda").upload(artifact.weights)

    def load(change: Any) -> None:
        data = fake_plan(cubins)
        change(data["steps"][1])
        plan = Plan.from_json(data)  # the schema's checks, then the CUDA run side's
        cuda.CudaPartition(dataclasses.replace(artifact, plan=plan), plan.partitions[0], weights)

    cases = [("args", [["ptr", "arena", 4096]], "outside"),
             ("args", [["ptr", "ext", 0]], r"steps\[1\]\.launches\[0\]\.args\[0\] is a bad pointer"),
             ("args", [["u8", 1]], "unknown argument"), ("grid", [0, 1, 1], r"launches\[0\]\.grid"),
             ("block", [2048, 1, 1], "2048 threads")]
    for key, bad, message in cases:
        with pytest.raises(ArtifactError, match=message):
            load(lambda step, key=key, bad=bad: step["launches"][0].update({key: bad}))
    with pytest.raises(ArtifactError, match="'mul' .*has no launches"):
        load(lambda step: step.pop("launches"))


def test_a_failing_launch_names_the_step(tmp_path: Path, fake: FakeCupy) -> None:
    artifact, record = fake_artifact(tmp_path, cubins={"sm_90": ["mul", "scale"]})
    space = memory_space("cuda")
    part = cuda.CudaPartition(artifact, record, space.upload(artifact.weights))
    with pytest.raises(RuntimeKernelError, match="step 'x.to_cuda'"):
        part.run({"cuda": space.allocate(512, 256)}, {"x": np.zeros(3, np.float32), "y": np.zeros(8)})


def test_a_session_runs_a_compiled_cuda_plan_through_the_fake(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real compile side's plan, run by Session on the simulated cupy: every launch in plan
    order, the input copied in and the output copied out, eagerly and with graphs."""
    from compiler import compile_model
    from runtime import Session
    from tests.support.transformer_model import transformer_input
    from tests.support.transformer_model import transformer_model

    model = transformer_model(batch=1, seq=8, dim=32, heads=2, ffn=64)
    path = compile_model(model, tmp_path / "art", target="cuda",
                         build=_no_nvcc_build())
    plan = json.loads((path / "plan.json").read_text())
    assert {p["runner"] for p in plan["partitions"]} == {"cuda"}
    expected = [launch["kernel"] for step in plan["steps"] for launch in step.get("launches") or []]
    fake = FakeCupy()
    monkeypatch.setattr(cuda, "_CUPY", fake)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace())
    monkeypatch.setitem(sys.modules, "cupy.cuda", types.SimpleNamespace(nvrtc=_fake_nvrtc([])))
    monkeypatch.setenv("ONNX_AOT_CUDA_CACHE", str(tmp_path / "cache"))
    session = Session(path)
    parts = [p for kind, p in session._partitions if kind == "cuda"]
    assert parts and all(p.module_source == "nvrtc" for p in parts)  # no cubins were built
    x = transformer_input(model)
    y = session.run(None, x)[0]
    assert fake.launches == expected and y.shape == (1, 8, 32)
    graphed = _graphed(session)
    fake.launches.clear()
    graphed.run(None, x)
    graphed.run(None, x)
    assert fake.launches == expected * 2
    assert sum(p.graphs_captured for kind, p in graphed._partitions if kind == "cuda") == len(parts)


def _no_nvcc_build() -> Any:
    from compiler.codegen.options import BuildOptions

    return BuildOptions(extra={"nvcc": "none"})


def _fake_nvrtc(compiled: list[str]) -> Any:
    def compile_program(program: str, flags: list[str]) -> None:
        compiled.append(" ".join(flags))

    return types.SimpleNamespace(
        getVersion=lambda: (12, 4), createProgram=lambda src, name, h, i: src,
        compileProgram=compile_program, getProgramLog=lambda p: "",
        getCUBIN=lambda src: json.dumps(re.findall(KERNEL_NAME, src)).encode(),
        destroyProgram=lambda p: None)


def _graphed(session: Any) -> Any:
    _enable_graphs(session)
    return session


# -- on a GPU ---------------------------------------------------------------------------------------
def _gpu() -> Any:
    cp = pytest.importorskip("cupy", reason="cupy is not installed")
    try:
        count = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver
        pytest.skip(f"no usable CUDA device: {exc}")
    if count < 1:
        pytest.skip("no CUDA device is visible")
    return cp


def _compile_cuda(model: Any, out: Path) -> Path:
    from compiler import compile_model

    return compile_model(model, out, target="cuda")


@pytest.mark.parametrize("name", ["transformer", "transformer_erf", "squeezenet", "resnet50"])
def test_gpu_matches_onnxruntime_with_and_without_graphs(tmp_path: Path, name: str) -> None:
    _gpu()
    from runtime import Session
    from tests.support.models import ort_run
    from tests.support.transformer_model import transformer_input
    from tests.support.transformer_model import transformer_model
    from tests.support.zoo import dummy_input
    from tests.support.zoo import zoo_model

    if name.startswith("transformer"):
        model = transformer_model(erf=name.endswith("erf"))
        feeds = transformer_input(model)
    else:
        model = zoo_model(name)
        feeds = dummy_input(model)
    session = Session(_compile_cuda(model, tmp_path / name))
    parts = [p for kind, p in session._partitions if kind == "cuda"]
    assert parts and all(p.module_source in ("cubin", "ptx", "nvrtc") for p in parts)
    want = ort_run(model, feeds)
    for _ in range(2):
        for got, ref in zip(session.run(None, feeds), want, strict=True):
            np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-4)
    graphed = Session(_compile_cuda(model, tmp_path / name), **_graph_option())
    _enable_graphs(graphed)
    for _ in range(3):
        for got, ref in zip(graphed.run(None, feeds), want, strict=True):
            np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-4)


def _graph_option() -> dict[str, Any]:
    import inspect

    from runtime import Session

    return {"cuda_graph": True} if "cuda_graph" in inspect.signature(Session).parameters else {}


def _enable_graphs(session: Any) -> None:
    """Until Session takes ``cuda_graph=True``, rebuild its CUDA partitions with ``capture=True``."""
    for i, (kind, part) in enumerate(session._partitions):
        if kind == "cuda" and not part.capture:
            record = session.plan.partitions[i]
            session._partitions[i] = ("cuda", cuda.CudaPartition(
                session._artifact, record, session._weights["cuda"], capture=True))


def test_gpu_nvrtc_compiles_once_then_hits_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _gpu()
    from runtime import Session
    from tests.support.transformer_model import transformer_model

    monkeypatch.setenv("ONNX_AOT_CUDA_CACHE", str(tmp_path / "cache"))
    session = Session(_compile_cuda(transformer_model(seq=16, dim=64, ffn=128), tmp_path / "art"))
    for i, (kind, _part) in enumerate(session._partitions):
        if kind != "cuda":
            continue
        record = session.plan.partitions[i]
        assert record.module is not None
        record = dataclasses.replace(record, module=dataclasses.replace(record.module, cubins={}, ptx=None))
        # as if nvcc was absent
        first = cuda.CudaPartition(session._artifact, record, session._weights["cuda"])
        second = cuda.CudaPartition(session._artifact, record, session._weights["cuda"])
        assert first.module_source == second.module_source == "nvrtc"
        assert second.module.cache_hit is True
        assert second.module.path.parent == tmp_path / "cache"
