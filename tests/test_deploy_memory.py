"""Deploy-time memory control (docs/deploy.md): plans read without loading, runs in caller-owned
buffers, sessions sharing one arena, I/O binding and preallocated outputs, load options."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from compiler import compile_model
from runtime import ConcurrentRunError
from runtime import InputError
from runtime import PlanInfo
from runtime import Session
from runtime import SharedArena
from runtime import load_plan
from runtime.errors import ArtifactError
from runtime.memory import HostSpace
from runtime.run_path import RunContext
from tests.support.models import small_model

PIPELINE = ("squeezenet", "shufflenet", "bvlc_alexnet")


@pytest.fixture(scope="module")
def small_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_model(small_model(), tmp_path_factory.mktemp("deploy") / "small")


def x_small(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, 3, 8, 8)).astype(np.float32)


# -- load_plan ----------------------------------------------------------------------------------
def test_load_plan_reads_sizes_and_interface_without_kernels_or_weights(
        small_artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ctypes
    import shutil

    copy = Path(shutil.copytree(small_artifact, tmp_path / "copy"))
    (copy / "weights.bin").unlink()  # a plan is readable without weights...
    monkeypatch.setattr(ctypes, "CDLL", lambda *a, **k: pytest.fail("load_plan loaded a library"))
    info = load_plan(copy)
    assert isinstance(info, PlanInfo)
    monkeypatch.undo()
    session = Session(small_artifact)
    assert list(info.inputs) == session.inputs and list(info.outputs) == session.outputs
    assert info.arenas == {"host": session.plan.arenas[0].nbytes} and info.arenas["host"] > 0
    assert info.target == "cpu" and info.runnable_from_c and info.num_steps == len(session.plan.steps)
    assert info.weights_nbytes == (small_artifact / "weights.bin").stat().st_size
    with pytest.raises(ArtifactError, match="weights.bin"):  # ...a Session is not
        Session(copy)
    (copy / "plan.json").write_text((copy / "plan.json").read_text().replace('"small"', '"other"'))
    with pytest.raises(ArtifactError, match="plan.json"):
        load_plan(copy)


# -- caller-owned memory -----------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["bytearray", "numpy", "numpy-misaligned"])
def test_caller_owned_buffer_is_bit_identical_and_really_used(
        zoo, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = zoo.artifact("squeezenet")
    feeds = zoo.feeds("squeezenet")
    expected = Session(path).run(None, feeds)
    need = load_plan(path).arenas["host"]
    if kind == "bytearray":
        buffer: Any = bytearray(b"\xa5" * (need + 63))
        raw = np.frombuffer(buffer, np.uint8)
    elif kind == "numpy":
        buffer = raw = np.full(need + 63, 0xA5, np.uint8)
    else:
        base = np.full(need + 128, 0xA5, np.uint8)
        skip = 1 + (-base.ctypes.data) % 64  # one byte past an aligned address
        buffer = raw = base[skip:]
    session = Session(path, arena=buffer)
    ctx = session._fixed
    assert ctx is not None
    start = raw.ctypes.data
    assert start <= ctx.arena_addr and ctx.arena_addr + need <= start + raw.size and ctx.arena_addr % 64 == 0

    def no_allocation(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a run allocated an arena")

    monkeypatch.setattr(HostSpace, "allocate", no_allocation)
    monkeypatch.setattr(RunContext, "fit", no_allocation)  # a pooled context's arenas
    for _ in range(2):
        got = session.run(None, feeds)
        for g, e in zip(got, expected, strict=True):
            np.testing.assert_array_equal(g, e)  # bit-identical
    touched = np.count_nonzero(raw != 0xA5)
    assert touched > need // 4, f"the run wrote only {touched} of the buffer's bytes"
    assert not session._pool  # the session never built a pooled context


def test_caller_buffer_too_small_or_read_only_names_the_size(small_artifact: Path) -> None:
    need = load_plan(small_artifact).arenas["host"]
    with pytest.raises(InputError, match=f"needs {need} bytes"):
        Session(small_artifact, arena=bytearray(need // 2))
    with pytest.raises(InputError, match=f"read-only.*needs {need} bytes"):
        Session(small_artifact, arena=bytes(need + 64))
    frozen = np.zeros(need + 64, np.uint8)
    frozen.setflags(write=False)
    with pytest.raises(InputError, match="read-only"):
        Session(small_artifact, arena=frozen)
    with pytest.raises(InputError, match="no 'cuda' arena"):
        Session(small_artifact, arenas={"host": bytearray(need + 64), "cuda": object()})
    with pytest.raises(InputError, match="only one of"):
        Session(small_artifact, arena=bytearray(need + 64), shared_arena=SharedArena({"host": need}))
    # arenas={"host": ...} is the same as arena=
    session = Session(small_artifact, arenas={"host": np.zeros(need + 64, np.uint8)})
    np.testing.assert_array_equal(session.run(None, {"x": x_small()})[0],
                                  Session(small_artifact).run(None, {"x": x_small()})[0])


class Blocking:
    """A partition that parks its run until released: makes a concurrent call deterministic."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def run(self, arenas: Any, ext: Any, timings: Any = None) -> None:
        self.started.set()
        assert self.release.wait(30)


def _concurrent_call_raises(first: Session, second: Session, feeds: dict[str, np.ndarray],
                            second_feeds: dict[str, np.ndarray] | None = None) -> None:
    second_feeds = feeds if second_feeds is None else second_feeds
    blocker = Blocking()
    saved = list(first._partitions)
    first._partitions[:] = [("reference", blocker)]  # (the static bound plan's list)
    errors: list[BaseException] = []

    def target() -> None:
        try:
            first.run(None, feeds)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    try:
        assert blocker.started.wait(30)
        with pytest.raises(ConcurrentRunError, match="one call at a time"):
            second.run(None, second_feeds)
    finally:
        blocker.release.set()
        thread.join(30)
        first._partitions[:] = saved
    assert not errors, errors
    second.run(None, second_feeds)  # free again once the first run is over


def test_caller_owned_arena_refuses_a_concurrent_call(small_artifact: Path) -> None:
    need = load_plan(small_artifact).arenas["host"]
    session = Session(small_artifact, arena=bytearray(need + 64))
    _concurrent_call_raises(session, session, {"x": x_small()})
    # the default (pooled) session still runs concurrently
    pooled = Session(small_artifact)
    results: list[np.ndarray] = []
    threads = [threading.Thread(target=lambda: results.append(pooled.run(None, {"x": x_small()})[0]))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4 and all(np.array_equal(r, results[0]) for r in results)


# -- a shared arena -----------------------------------------------------------------------------------
def test_three_zoo_models_share_one_arena(zoo) -> None:
    paths = [zoo.artifact(name) for name in PIPELINE]
    sizes = [load_plan(p).arenas["host"] for p in paths]
    arena = SharedArena.for_artifacts(paths)
    assert arena.nbytes == {"host": max(sizes)}  # the largest, not the sum
    assert max(sizes) < sum(sizes)
    shared = [Session(p, shared_arena=arena) for p in paths]
    own = [Session(p) for p in paths]
    for ctx in (s._fixed for s in shared):
        assert ctx is not None and ctx.arena_addr == arena.buffers["host"].ctypes.data
    for seed in (0, 1):  # A, B, C, then A, B, C again with other data: nothing leaks between them
        for name, s, o in zip(PIPELINE, shared, own, strict=True):
            feeds = zoo.feeds(name, seed)
            for got, want in zip(s.run(None, feeds), o.run(None, feeds), strict=True):
                np.testing.assert_array_equal(got, want)
    # a run of one session on the arena while another's is in progress raises
    _concurrent_call_raises(shared[0], shared[1], zoo.feeds(PIPELINE[0]), zoo.feeds(PIPELINE[1]))


def test_shared_arena_too_small_names_the_size(small_artifact: Path) -> None:
    need = load_plan(small_artifact).arenas["host"]
    with pytest.raises(InputError, match=f"has {need - 64} bytes.*needs {need} bytes"):
        Session(small_artifact, shared_arena=SharedArena({"host": need - 64}))
    caller = SharedArena.from_buffers({"host": bytearray(need + 63)})
    assert caller.nbytes["host"] >= need
    np.testing.assert_array_equal(Session(small_artifact, shared_arena=caller).run(None, {"x": x_small()})[0],
                                  Session(small_artifact).run(None, {"x": x_small()})[0])


# -- I/O binding ----------------------------------------------------------------------------------------
def test_io_binding_reads_and_writes_the_bound_arrays(small_artifact: Path) -> None:
    session = Session(small_artifact)
    x = x_small(3)
    expected = session.run(None, {"x": x})[0]
    binding = session.io_binding()
    y = np.full((1, 10), np.nan, np.float32)
    binding.bind_input("x", x)
    binding.bind_output("y", y)
    assert binding._inputs["x"] is x  # bound as is: no copy
    session.run_with_iobinding(binding)
    np.testing.assert_array_equal(y, expected)  # written in place
    assert binding.get_outputs()[0] is y
    x[...] = x_small(4)  # the kernels read the bound array itself on every run
    session.run_with_iobinding(binding)
    np.testing.assert_array_equal(y, session.run(None, {"x": x})[0])


def test_io_binding_preallocated_output_is_reused(small_artifact: Path) -> None:
    session = Session(small_artifact)
    binding = session.io_binding()
    binding.bind_input("x", x_small())
    binding.bind_output("y")  # allocated once by the binding
    session.run_with_iobinding(binding)
    first = binding.get_outputs()[0]
    session.run_with_iobinding(binding)
    assert binding.get_outputs()[0] is first
    np.testing.assert_array_equal(first, session.run(None, {"x": x_small()})[0])
    # unbound outputs are allocated once as well
    other = session.io_binding()
    other.bind_input("x", x_small())
    session.run_with_iobinding(other)
    assert other.copy_outputs_to_cpu()[0].shape == (1, 10)


def test_io_binding_checks_arrays_once(small_artifact: Path) -> None:
    session = Session(small_artifact)
    binding = session.io_binding()
    with pytest.raises(InputError, match="'nope'"):
        binding.bind_input("nope", x_small())
    with pytest.raises(InputError, match="dtype float64"):
        binding.bind_input("x", x_small().astype(np.float64))
    with pytest.raises(InputError, match="shape"):
        binding.bind_output("y", np.zeros((10,), np.float32))
    with pytest.raises(InputError, match="C-contiguous"):
        binding.bind_output("y", np.zeros((1, 20), np.float32)[:, ::2])
    frozen = np.zeros((1, 10), np.float32)
    frozen.setflags(write=False)
    with pytest.raises(InputError, match="writable"):
        binding.bind_output("y", frozen)
    with pytest.raises(InputError, match="'x' are not bound"):
        session.run_with_iobinding(binding)
    strided = np.zeros((1, 3, 8, 16), np.float32)[..., ::2]
    binding.bind_input("x", strided)  # copied once, at bind time
    assert binding._inputs["x"].flags.c_contiguous
    with pytest.raises(InputError, match="another session"):
        Session(small_artifact).run_with_iobinding(binding)


def test_io_binding_on_a_caller_owned_arena(small_artifact: Path) -> None:
    need = load_plan(small_artifact).arenas["host"]
    session = Session(small_artifact, arena=np.zeros(need + 64, np.uint8))
    binding = session.io_binding()
    y = np.empty((1, 10), np.float32)
    binding.bind_input("x", x_small())
    binding.bind_output("y", y)
    session.run_with_iobinding(binding)
    np.testing.assert_array_equal(y, Session(small_artifact).run(None, {"x": x_small()})[0])


# -- options ---------------------------------------------------------------------------------------------
def test_cuda_options_on_a_host_artifact_are_an_error(small_artifact: Path) -> None:
    with pytest.raises(InputError, match="device_id applies to CUDA artifacts"):
        Session(small_artifact, device_id=0)
    with pytest.raises(InputError, match="memory_limit applies to CUDA artifacts"):
        Session(small_artifact, memory_limit=1 << 30)
    with pytest.raises(InputError, match="threads"):
        Session(small_artifact, threads=0)


def test_memory_limit_is_checked_against_the_plan_before_any_allocation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # compiling for CUDA needs no GPU (nvcc or NVRTC builds kernels later); the check needs no cupy
    path = compile_model(small_model(), tmp_path / "cuda", target="cuda")
    info = load_plan(path)
    assert info.target == "cuda" and "cuda" in info.partition_spaces
    need = info.device_nbytes("cuda")
    assert need == info.arenas.get("cuda", 0) + info.weights_nbytes

    def no_device(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("touched the device before checking memory_limit")

    import runtime.providers.cuda as cuda

    monkeypatch.setattr(cuda, "cupy_or_error", no_device)
    with pytest.raises(InputError, match=f"needs {need} bytes of device memory"):
        Session(path, memory_limit=need - 1)


# -- on a GPU ----------------------------------------------------------------------------------------------
def _gpu() -> Any:
    cp = pytest.importorskip("cupy", reason="cupy is not installed: GPU I/O binding and options untested")
    try:
        count = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver
        pytest.skip(f"no usable CUDA device: {exc}")
    if count < 1:
        pytest.skip("no CUDA device is visible")
    return cp


def test_gpu_io_binding_options_and_caller_device_arena(tmp_path: Path) -> None:
    cp = _gpu()
    path = compile_model(small_model(), tmp_path / "cuda", target="cuda")
    info = load_plan(path)
    x = x_small(5)
    expected = Session(path).run(None, {"x": x})[0]
    session = Session(path, device_id=0, memory_limit=info.device_nbytes("cuda") * 4, cuda_graph=True)
    np.testing.assert_allclose(session.run(None, {"x": x})[0], expected, rtol=1e-6, atol=1e-6)
    binding = session.io_binding()
    host_only = {n for n in ("x", "y") if n not in session.io.device_values}
    dx = x if "x" in host_only else cp.asarray(x)
    dy = np.empty((1, 10), np.float32) if "y" in host_only else cp.empty((1, 10), cp.float32)
    binding.bind_input("x", dx)
    binding.bind_output("y", dy)
    for _ in range(2):
        session.run_with_iobinding(binding)
        cp.cuda.get_current_stream().synchronize()
        np.testing.assert_allclose(binding.copy_outputs_to_cpu()[0], expected, rtol=1e-6, atol=1e-6)
    device_arena = cp.zeros(info.arenas.get("cuda", 0) + 256, cp.uint8)
    owned = Session(path, arenas={"host": bytearray(info.arenas.get("host", 0) + 64), "cuda": device_arena})
    np.testing.assert_allclose(owned.run(None, {"x": x})[0], expected, rtol=1e-6, atol=1e-6)
    profiled = Session(path, profile=True)
    profiled.run(None, {"x": x})
    import json

    events = json.loads(Path(profiled.end_profiling(tmp_path / "p.json")).read_text())
    assert sum(e["cat"] == "Node" for e in events) == info.num_steps
