"""The worker pool beyond the kernels (issue 31): recurrent steps on it, libraries that need no
libgomp once their kernels are all on it, sessions running concurrently in one process, and a
session's thread count capping the workers its runs use (runtime/providers/c.py: pool_stats).
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest

from compiler.codegen.options import BuildOptions
from compiler.codegen.toolchain import build_units
from compiler.driver import compile_model
from runtime import Session
from runtime.blas import blas_threads
from runtime.blas import set_blas_threads
from runtime.blas import single_threaded_blas
from runtime.providers.c import pool_stats
from runtime.rebuild import rebuild_flags
from runtime.rebuild import uses_openmp
from tests.support.models import ort_run
from tests.test_dynamic_recurrent_pad import recurrent_export
from tests.test_pool import _model
from tests.test_pool import spinning  # noqa: F401  (a fixture: one process spinning beside the test)

CPU = "x86-64-v3"  # the C text checked below is this level's


def _needed(library: Path) -> list[str]:
    """The DT_NEEDED entries of an ELF64 little-endian shared library, read from its dynamic
    section (with readelf's answer compared where readelf is on PATH)."""
    data = library.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        pytest.skip(f"{library} is not a little-endian ELF64 file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + k * shentsize) for k in range(shnum)]
    dynamic = next(s for s in sections if s[1] == 6)  # SHT_DYNAMIC
    strtab = sections[dynamic[6]]  # its sh_link: the string table of the names
    names = []
    for at in range(dynamic[4], dynamic[4] + dynamic[5], 16):
        tag, value = struct.unpack_from("<qQ", data, at)
        if tag == 0:
            break
        if tag == 1:  # DT_NEEDED
            start = strtab[4] + value
            names.append(data[start : data.index(b"\0", start)].decode())
    if shutil.which("readelf"):
        out = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True,
                             check=True).stdout
        assert names == [line.split("[")[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line]
    return names


def _lstm() -> tuple[onnx.ModelProto, dict[str, tuple[int, ...]], dict[str, np.ndarray]]:
    """A bidirectional LSTM large enough for its two directions to be one pool job."""
    x = np.random.default_rng(3).standard_normal((10, 3, 64)).astype(np.float32)
    return recurrent_export("LSTM", 64, 128, "bidirectional"), {"x": x.shape}, {"x": x}


def _kernel_text(art: Path, op_type: str) -> str:
    """The C function of the (only) step of ``op_type``, from the call in its entry."""
    source = (art / "kernels" / "cpu" / "model.c").read_text()
    plan = json.loads((art / "plan.json").read_text())
    step = next(s for s in plan["steps"] if s["op_type"] == op_type)
    assert step["provider"] == "c", step
    start = source.index(f"/* step {step['index']}: ")
    fn = source[source.index("k_", start) : source.index("(", source.index("k_", start))]
    return source[source.index(f"void {fn}_") : source.index("\n}\n", source.index(f"void {fn}("))]


@pytest.mark.usefixtures("spinning")
@pytest.mark.parametrize("case", ["lstm-bidirectional", "gru-split", "gru-dynamic"])
def test_recurrent_steps_run_on_the_pool_bit_identical_at_any_thread_count(case: str, tmp_path: Path) -> None:
    """A bidirectional LSTM (its directions one job), a GRU with linear_before_reset 0 (two
    products a step) and a dynamic one at batches on both sides of its step decision (serial at
    batch 1, STEPPAR): no OpenMP left in the kernel, outputs bit for bit the same at threads 1, 2 and 3
    with a process spinning beside them, and onnxruntime's."""
    if case == "lstm-bidirectional":
        model, shapes, feeds = _lstm()
        runs, dims = [feeds], None
    else:
        model = recurrent_export("GRU", 48, 160, "forward", linear_before_reset=0)
        rng = np.random.default_rng(7)
        sizes = ((12, 3, 48), (1, 1, 48), (6, 4, 48))
        runs = [{"x": rng.standard_normal(s).astype(np.float32)} for s in sizes]
        shapes, dims = ({"x": (12, 3, 48)}, None) if case == "gru-split" else (None, {"seq": (1, 12),
                                                                                      "batch": (1, 4)})
        runs = runs[:1] if case == "gru-split" else runs
    art = compile_model(model, tmp_path / case, shapes=shapes, dims=dims, cpu=CPU, golden_cases=0)
    text = _kernel_text(art, next(n.op_type for n in model.graph.node if n.op_type in ("LSTM", "GRU")))
    assert not uses_openmp(text)
    assert "onnx_aot_parallel(" in text and "_step_h" in text
    assert ("_dirs_task" in text) == (case == "lstm-bidirectional")
    sessions = {n: Session(art, threads=n) for n in (1, 2, 3)}
    for feeds in runs:
        one = sessions[1].run(None, feeds)
        for n in (2, 3):
            for _ in range(2):
                got = sessions[n].run(None, feeds)
                assert all(np.array_equal(a, b) for a, b in zip(one, got, strict=True)), (n, feeds["x"].shape)
        for a, b in zip(one, ort_run(model, feeds), strict=True):  # float32 over 12 steps of 160
            np.testing.assert_allclose(a, b, rtol=1e-3, atol=5e-4)


def test_a_model_all_on_the_pool_needs_no_libgomp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its source has no OpenMP, its recorded flags no -fopenmp, its library (and a rebuild's)
    no libgomp among its NEEDED entries, and it runs right."""
    model, shapes, feeds = _lstm()
    art = compile_model(model, tmp_path / "lstm", shapes=shapes, cpu=CPU, golden_cases=0)
    assert not uses_openmp((art / "kernels" / "cpu" / "model.c").read_text())
    manifest = json.loads((art / "manifest.json").read_text())
    assert all("-fopenmp" not in b["flags"] for b in manifest["target"]["cpu"]["builds"])
    needed = _needed(art / "kernels" / "cpu" / "model.so")
    assert needed and not [n for n in needed if "gomp" in n], needed
    got = Session(art, threads=2).run(None, feeds)
    for a, b in zip(got, ort_run(model, feeds), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)
    monkeypatch.setenv("ONNX_AOT_RUNTIME_CACHE_DIR", str(tmp_path / "rebuilt"))
    rebuilt = Session(art, threads=2, rebuild=True)
    assert rebuilt.cpu_build is not None and rebuilt.cpu_build.rebuilt is not None
    assert not [n for n in _needed(rebuilt.cpu_build.rebuilt) if "gomp" in n]
    assert all(np.array_equal(a, b) for a, b in zip(got, rebuilt.run(None, feeds), strict=True))


def test_openmp_is_linked_exactly_where_a_unit_uses_it(tmp_path: Path) -> None:
    """The toolchain itself: a unit with an OpenMP region gets -fopenmp and libgomp, one without
    neither; a rebuild drops or adds -fopenmp by its source."""
    options = BuildOptions(isa=CPU)
    plain = "void f(float* y, long n) { for (long i = 0; i < n; ++i) y[i] = 1.0f; }\n"
    omp = ("void g(float* y, long n) {\n#pragma omp parallel for\n"
           "  for (long i = 0; i < n; ++i) y[i] = 2.0f;\n}\n")
    for name, units, want in (("plain", [plain], False), ("mixed", [plain, omp], True)):
        (tmp_path / name).mkdir()
        build = build_units(units, tmp_path / name / "model.so", options)
        assert ("-fopenmp" in build.flags) == want, name
        assert any("gomp" in n for n in _needed(tmp_path / name / "model.so")) == want, name
    assert "-fopenmp" not in rebuild_flags(["-O3", "-march=x86-64-v3", "-fopenmp", "-fPIC"], openmp=False)
    assert rebuild_flags(["-O3", "-fPIC"], openmp=True).count("-fopenmp") == 1
    assert "-fopenmp" in rebuild_flags(["-O3", "-fopenmp"])  # no source to say: as recorded


def test_sessions_of_two_models_and_two_threads_on_one_agree_with_serial_runs(tmp_path: Path) -> None:
    """Three Python threads at once: an LSTM session and an encoder session (each its own
    library, one pool), and a second thread on the encoder session (Session.run is safe from many
    threads: docs/reliability.md). Every result is bit for bit the serial run's."""
    lstm, shapes, lstm_feeds = _lstm()
    encoder, encoder_feeds = _model("encoder")
    sessions = {
        "lstm": Session(compile_model(lstm, tmp_path / "lstm", shapes=shapes, golden_cases=0), threads=2),
        "encoder": Session(compile_model(encoder, tmp_path / "enc", golden_cases=0), threads=2),
    }
    feeds = {"lstm": lstm_feeds, "encoder": encoder_feeds}
    expected = {k: sessions[k].run(None, feeds[k]) for k in sessions}
    failures: list[str] = []
    start = threading.Barrier(3)

    def drive(kind: str) -> None:
        start.wait()
        for _ in range(10):
            got = sessions[kind].run(None, feeds[kind])
            if not all(np.array_equal(a, b) for a, b in zip(got, expected[kind], strict=True)):
                failures.append(kind)

    threads = [threading.Thread(target=drive, args=(k,)) for k in ("lstm", "encoder", "encoder")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []


def test_a_sessions_thread_count_caps_the_workers_its_runs_use(tmp_path: Path) -> None:
    """After a run at threads=4 has started three workers, runs at threads=2 claim chunks on
    their caller and worker 1 only, and runs at threads=1 none on the pool at all."""
    model, feeds = _model("encoder")
    art = compile_model(model, tmp_path / "enc", golden_cases=0)
    Session(art, threads=4).run(None, feeds)
    before = pool_stats()
    assert before is not None and before.workers >= 3
    two = Session(art, threads=2)
    for _ in range(5):
        two.run(None, feeds)
    mid = pool_stats()
    assert mid is not None
    used = [b - a for a, b in zip(before.chunks, mid.chunks, strict=False)]
    assert sum(used) > 0 and all(n == 0 for n in used[2:]), used
    one = Session(art, threads=1)
    for _ in range(3):
        one.run(None, feeds)
    after = pool_stats()
    assert after is not None and after.chunks[: len(mid.chunks)] == mid.chunks


@pytest.mark.skipif(blas_threads() is None, reason="numpy's BLAS here is not a loaded OpenBLAS")
def test_overlapping_blas_guards_restore_the_count_only_when_the_last_ends() -> None:
    """Two runs' reference partitions in two threads: the first one out must not hand BLAS its
    threads back while the other is still inside."""
    before = blas_threads()
    assert set_blas_threads(2)
    try:
        first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
        seen: list[int | None] = []

        def second() -> None:
            first_in.wait()
            with single_threaded_blas():
                second_in.set()
                first_out.wait()
                seen.append(blas_threads())

        other = threading.Thread(target=second)
        other.start()
        with single_threaded_blas():
            first_in.set()
            second_in.wait()
        first_out.set()
        other.join()
        assert seen == [1] and blas_threads() == 2
    finally:
        set_blas_threads(before or 1)
