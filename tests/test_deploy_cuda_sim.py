"""The CUDA halves of profiling and I/O binding, without a GPU: the simulated cupy of
``test_cuda_runtime.py`` (device memory is host memory) plus events and a device array type.
On a real GPU, ``test_deploy_memory.py::test_gpu_io_binding_options_and_caller_device_arena``
covers the same paths."""

from __future__ import annotations

import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import runtime.providers.cuda as cuda
from runtime.memory import memory_space
from tests.test_cuda_runtime import DevArray
from tests.test_cuda_runtime import FakeCupy
from tests.test_cuda_runtime import fake_artifact


class DeviceArray(DevArray):
    """A bindable "cupy array": contiguous, with nbytes."""

    def __init__(self, host: np.ndarray) -> None:
        super().__init__(host.view(np.uint8).reshape(-1))
        self.typed = host
        self.nbytes = host.nbytes
        self.dtype = host.dtype
        self.shape = host.shape
        self.flags = types.SimpleNamespace(c_contiguous=True)


class Event:
    def __init__(self) -> None:
        self.t = 0.0

    def record(self, stream: Any = None) -> None:
        time.sleep(0.0005)
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass


@pytest.fixture()
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeCupy:
    cp = FakeCupy()
    cp.ndarray = DevArray  # type: ignore[attr-defined]
    cp.cuda.Event = Event
    cp.cuda.get_elapsed_time = lambda start, end: (end.t - start.t) * 1000.0  # milliseconds
    kinds: list[int] = []
    copy = cp.cuda.runtime.memcpyAsync

    def memcpy(dst: int, src: int, n: int, kind: int, stream: int) -> None:
        kinds.append(kind)
        copy(dst, src, n, kind, stream)

    cp.cuda.runtime.memcpyAsync = memcpy
    cp.kinds = kinds  # type: ignore[attr-defined]
    monkeypatch.setattr(cuda, "_CUPY", cp)
    return cp


def test_cuda_partition_times_each_step_with_events(tmp_path: Path, fake: FakeCupy) -> None:
    artifact, record = fake_artifact(tmp_path, cubins={"sm_90": ["mul", "scale"]})
    space = memory_space("cuda")
    part = cuda.CudaPartition(artifact, record, space.upload(artifact.weights), capture=True)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    y = np.empty((2, 4), np.float32)
    timings = np.zeros(5, np.float64)
    part.run({"cuda": space.allocate(512, 256)}, {"x": x, "y": y}, timings)
    np.testing.assert_array_equal(y, x * np.arange(1, 9, dtype=np.float32).reshape(2, 4) * 2)
    assert part.graphs_captured == 0  # profiling runs eagerly
    # copy, mul, scale, (view: no op), copy
    assert all(timings[i] > 0 for i in (0, 1, 2, 4)) and timings[3] == 0
    assert fake.launches == ["mul", "scale"]


def test_device_arrays_bound_to_a_cuda_plan_are_copied_device_to_device(
        tmp_path: Path, fake: FakeCupy) -> None:
    artifact, record = fake_artifact(tmp_path, cubins={"sm_90": ["mul", "scale"]})
    space = memory_space("cuda")
    part = cuda.CudaPartition(artifact, record, space.upload(artifact.weights))
    x = DeviceArray(np.arange(8, dtype=np.float32).reshape(2, 4))
    y = DeviceArray(np.zeros((2, 4), np.float32))
    part.run({"cuda": space.allocate(512, 256)}, {"x": x, "y": y})  # type: ignore[dict-item]
    np.testing.assert_array_equal(y.typed, x.typed * np.arange(1, 9, dtype=np.float32).reshape(2, 4) * 2)
    assert fake.kinds == [cuda.MEMCPY_DEFAULT, cuda.MEMCPY_DEFAULT]  # type: ignore[attr-defined]
    fake.kinds.clear()  # type: ignore[attr-defined]
    host_y = np.zeros((2, 4), np.float32)
    part.run({"cuda": space.allocate(512, 256)}, {"x": x.typed.copy(), "y": host_y})
    assert fake.kinds == [1, 2]  # type: ignore[attr-defined]  # H2D, D2H as planned


def test_a_profiled_session_on_a_compiled_cuda_plan(tmp_path: Path, fake: FakeCupy,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Session-level: profile=True on a real CUDA plan (the fake kernels compute nothing, so only
    the trace is checked) and a device output bound through IOBinding."""
    import json
    import sys

    from compiler import compile_model
    from runtime import InputError
    from runtime import Session
    from tests.support.models import small_model
    from tests.test_cuda_runtime import _fake_nvrtc
    from tests.test_cuda_runtime import _no_nvcc_build

    # the simulated device (the fake fixture is already cupy) computes nothing: no run to check
    path = compile_model(small_model(), tmp_path / "art", target="cuda", build=_no_nvcc_build(),
                         run_check=False)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setitem(sys.modules, "cupy.cuda", types.SimpleNamespace(nvrtc=_fake_nvrtc([])))
    monkeypatch.setenv("ONNX_AOT_CUDA_CACHE", str(tmp_path / "cache"))
    session = Session(path, profile=True)
    x = np.ones((1, 3, 8, 8), np.float32)
    session.run(None, {"x": x})
    session.run(None, {"x": x})
    events = json.loads(Path(session.end_profiling(tmp_path / "p.json")).read_text())
    steps = session.plan.steps
    nodes = [e for e in events if e["cat"] == "Node"]
    assert len(nodes) == 2 * len(steps)
    assert {e["args"]["provider"] for e in nodes} >= {"cuda"}
    # every step is CUDA: the input and output transfers may read and write device arrays
    assert {"x", session.io.output_values[0]} <= session.io.device_values
    binding = session.io_binding()
    binding.bind_input("x", DeviceArray(x))
    y = DeviceArray(np.zeros((1, 10), np.float32))
    binding.bind_output("y", y)
    fake.kinds.clear()  # type: ignore[attr-defined]
    session.run_with_iobinding(binding)
    assert binding.get_outputs()[0] is y
    assert fake.kinds == [cuda.MEMCPY_DEFAULT, cuda.MEMCPY_DEFAULT]  # type: ignore[attr-defined]
    with pytest.raises(InputError, match="expected a numpy or cupy array"):
        binding.bind_output("y", [0.0] * 10)
