"""Generated CUDA kernels executed on the host CPU (``tests/support/cuda_host``), no GPU needed.

The fast subset of ``scripts/cuda_host_check.py``: every kernel-shape model (partial tiles, odd
sizes, every template variant) and the CUDA test models run step by step against the reference
kernels. Then the check itself is checked: bugs injected into a generated kernel (a tile bound off
by one, a deleted ``__syncthreads``, a warp reduction's mask, a barrier only part of the block
reaches) are each caught, and hand-written kernels show that a partial barrier, a bad shuffle mask
and a memory fault are reported as errors naming kernel, block and thread -- in a subprocess with a
timeout, so a hang would fail the test instead of the suite.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from compiler import compile_model
from compiler.codegen.options import BuildOptions
from runtime.artifact import load_artifact
from runtime.errors import ArtifactError
from runtime.providers.cuda_program import parse_steps
from scripts import cuda_host_check
from tests.support.cuda_host.build import HostKernelError
from tests.support.cuda_host.build import HostModule
from tests.support.cuda_host.build import kernel_names
from tests.support.cuda_host.build import prepare_source
from tests.support.cuda_host.models import SHAPE_MODELS
from tests.support.cuda_host.models import SPECIAL_FEEDS
from tests.support.cuda_host.models import random_feeds
from tests.support.cuda_host.models import shape_model
from tests.support.cuda_host.runner import HostRun
from tests.support.cuda_host.runner import StepCheck

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")

NO_NVCC = BuildOptions(extra={"nvcc": "none"})
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _host_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep CI builds in the session's temp folder unless a cache folder is configured."""
    import os

    if "ONNX_AOT_CUDA_HOST_CACHE" not in os.environ:
        monkeypatch.setenv("ONNX_AOT_CUDA_HOST_CACHE", str(tmp_path_factory.getbasetemp() / "cuda_host"))


def _compile(name: str, tmp_path: Path) -> Path:
    return compile_model(shape_model(name), tmp_path / name, target="cuda", build=NO_NVCC, golden_cases=0)


def _run(path: Path, source: str | None = None, isolate: bool = True, reverse: bool = False,
         special: bool = False) -> list[StepCheck]:
    module = HostModule(source, reverse=reverse) if source is not None else None
    run = HostRun(path, module, isolate=isolate, reverse=reverse)
    return run.run(random_feeds(run.plan.inputs, special=special))


def _source(path: Path) -> str:
    return (path / "kernels" / "cuda" / "model.cu").read_text()


# -- the generated kernels match the reference -------------------------------------------------------
@pytest.mark.parametrize("name", list(SHAPE_MODELS))
def test_kernel_shapes_match_the_reference(name: str, tmp_path: Path) -> None:
    path = _compile(name, tmp_path)
    for reverse in (False, True):  # blocks and threads in ascending, then descending order
        checks = _run(path, reverse=reverse, special=name in SPECIAL_FEEDS)
        assert checks, "no CUDA step ran"
        bad = [c.describe() for c in checks if not c.ok]
        assert not bad, "\n".join(bad)


def test_a_concat_produced_in_place_launches_nothing_but_is_checked(tmp_path: Path) -> None:
    """The runtime drops a Concat whose inputs all sit in their slices (found by this check: it
    failed the load), after checking the locations: an input moved out of its slice fails."""
    path = _compile("concat_in_place", tmp_path)
    artifact = load_artifact(path)
    plan = artifact.plan
    (cat,) = [s for s in plan.steps if s.op_type == "Concat"]
    part = plan.partitions[cat.partition]
    assert cat.launches == ()
    assert all(op.step != cat.name for op in parse_steps(plan, part, int(artifact.weights.size), 0))
    value = plan.values[str(cat.inputs[1])]
    moved = dataclasses.replace(value, location=dataclasses.replace(value.location,
                                                                    offset=value.location.offset + 256))
    broken = dataclasses.replace(plan, values={**plan.values, value.name: moved})
    with pytest.raises(ArtifactError, match=r"step 'cat' \(Concat\) in CUDA partition \d+ has no launches"):
        parse_steps(broken, part, int(artifact.weights.size), 0)


def test_script_counts_kernels_and_templates(capsys: pytest.CaptureFixture[str]) -> None:
    status = cuda_host_check.main(["codegen_block", "codegen_chain", "transformer", "concat_rows"])
    lines = capsys.readouterr().out.strip().splitlines()
    match = re.fullmatch(r"(\d+)/(\d+) CUDA kernels match the reference; templates covered (\d+)/(\d+)",
                         lines[-1])
    assert match, lines[-1]
    n, m, t, u = map(int, match.groups())
    assert n == m >= 20 and u == len(list((REPO / "templates" / "cuda").glob("*.cu.j2")))
    assert t < u and status == 1  # these models leave the conv and pool templates uncovered
    assert "template pool.cu.j2 not covered" in "\n".join(lines)


def test_functions_equal_but_for_their_name_count_once() -> None:
    src = ('/* a */\nextern "C" __global__ void __launch_bounds__(256) k1(float* y)\n{ y[0] = 1.0f; }\n'
           '/* b */\nextern "C" __global__ void __launch_bounds__(256) k7(float* y)\n{ y[0] = 1.0f; }\n')
    functions = cuda_host_check._functions(src)
    assert list(functions) == ["k1", "k7"] and functions["k1"] == functions["k7"]


# -- injected bugs are caught ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gemm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gemm_odd: a 70 x 45 x 33 tiled GEMM (32 x 32 tiles: partial in m, n and k)."""
    return _compile("gemm_odd", tmp_path_factory.mktemp("gemm"))


def _only(checks: list[StepCheck]) -> StepCheck:
    (check,) = checks
    return check


def test_the_uninjected_gemm_matches(gemm: Path) -> None:
    assert _only(_run(gemm)).ok


def test_an_off_by_one_tile_bound_is_caught(gemm: Path) -> None:
    src = _source(gemm)
    # the epilogue's row bound: row m == M is stored past the output
    broken = src.replace("if (m >= 70)", "if (m > 70)")
    check = _only(_run(gemm, broken))  # each operand alone, a guard page right behind it
    fault = (r"kernel k1 block \(\d+,2,0\) thread \(\d+,0,0\): memory fault \(SIGSEGV\) at address "
             r"0x[0-9a-f]+ "
             r"\(\d+ bytes past the end of output 'y'\)")
    assert not check.ok and re.fullmatch(fault, check.detail), check.detail
    check = _only(_run(gemm, broken, isolate=False))  # in the plan's arena: a stray write
    assert not check.ok and "outside its outputs" in check.detail, check.describe()
    # the k bound of the A-tile load: A's row past K is read
    broken = src.replace("kq < 33)", "kq <= 33)", 1)
    check = _only(_run(gemm, broken))
    assert not check.ok and "past the end of input 'a" in check.detail, check.detail
    check = _only(_run(gemm, broken, isolate=False))  # the bytes after A are poisoned: NaN in the sum
    assert not check.ok and "element(s) off" in check.detail, check.describe()
    # the n bound of the B-tile load: B's column past N only reaches accumulators that are never
    # stored, so only the guard page sees it (on a GPU: a read past the allocation may fault)
    broken = src.replace("n < 45 &&", "n <= 45 &&", 1)
    assert _only(_run(gemm, broken, isolate=False)).ok
    check = _only(_run(gemm, broken))
    assert not check.ok and "past the end of input 'b'" in check.detail, check.detail


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("which", [0, 1])
def test_a_missing_syncthreads_is_caught(gemm: Path, which: int, reverse: bool) -> None:
    src = _source(gemm)
    at = [m.start() for m in re.finditer(r"__syncthreads\(\);", src)]
    assert len(at) == 2
    broken = src[: at[which]] + src[at[which] + len("__syncthreads();"):]
    check = _only(_run(gemm, broken, reverse=reverse))
    assert not check.ok and "element(s) off" in check.detail, check.describe()
    assert check.kernels == ("k1",) and check.op_type == "Gemm"


def test_a_barrier_part_of_the_block_skips_is_an_error(gemm: Path) -> None:
    src = _source(gemm)
    broken = src.replace("__syncthreads();", "if (threadIdx.x == 255) return;\n    __syncthreads();", 1)
    check = _only(_run(gemm, broken))
    assert not check.ok
    assert check.detail == ("kernel k1 block (0,0,0) thread (255,0,0): exited while 255 of 256 threads of "
                            "the block wait at __syncthreads (a barrier part of the block never reaches)")
    # the other order: the thread that skips the barrier exits before the others arrive
    broken = src.replace("__syncthreads();", "if (threadIdx.x == 0) return;\n    __syncthreads();", 1)
    check = _only(_run(gemm, broken))
    assert not check.ok
    want = ("kernel k1 block (0,0,0) thread (1,0,0): __syncthreads reached by 1 of 256 threads of the block; "
            "1 exited before it (first: thread (0,0,0))")
    assert check.detail == want, check.detail


def test_a_wrong_warp_mask_is_an_error(tmp_path: Path) -> None:
    path = _compile("softmax_long", tmp_path)
    src = _source(path)
    assert src.count("__shfl_xor_sync(0xffffffffu") == 2  # oa_warp_sum and oa_warp_max
    check = _only(_run(path, src.replace("__shfl_xor_sync(0xffffffffu", "__shfl_xor_sync(0x0000ffffu", 1)))
    found = re.search(r"kernel k1 block \(0,0,0\) thread \((\d+),0,0\): __shfl_xor_sync mask 0x0000ffff "
                      r"leaves out the calling lane (\d+)$", check.detail)
    assert not check.ok and found, check.detail
    assert found.group(1) == found.group(2) and int(found.group(2)) >= 16, check.detail


def test_a_kernel_that_leaves_output_unwritten_is_caught(tmp_path: Path) -> None:
    path = _compile("transpose", tmp_path)
    src = _source(path)
    check = _only(_run(path, src.replace("if (flat64 >= 210)", "if (flat64 >= 209)")))
    assert not check.ok and "1 element(s) differ" in check.detail, check.describe()


# -- the header's semantics on hand-written kernels ----------------------------------------------------
KERNELS = r"""
extern "C" __global__ void __launch_bounds__(64) reverse_sum(const float* x, float* y, int* count)
{
  extern __shared__ float tile[];
  const int t = threadIdx.x;
  tile[t] = x[blockIdx.x * 64 + t];
  __syncthreads();
  float v = tile[63 - t];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  v = __shfl_sync(0xffffffffu, v, 0);
  if (__any_sync(0xffffffffu, t == 40)) atomicAdd(count, 1);
  y[blockIdx.x * 64 + t] = v;
}
extern "C" __global__ void __launch_bounds__(64) early_exit(float* y)
{
  if (threadIdx.x >= 60) return;
  __syncthreads();
  y[threadIdx.x] = 1.0f;
}
extern "C" __global__ void __launch_bounds__(48) short_warp(float* y)
{
  y[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}
extern "C" __global__ void __launch_bounds__(32) exited_lane(float* y)
{
  if (threadIdx.x == 7) return;
  y[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 2.0f, 4);
}
extern "C" __global__ void __launch_bounds__(32) outside_mask(float* y)
{
  if (threadIdx.x < 16) y[threadIdx.x] = __shfl_sync(0x0000ffffu, 3.0f, 20);
}
extern "C" __global__ void __launch_bounds__(32) split_wait(float* y)
{
  if (threadIdx.x == 0) __syncthreads();
  else y[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}
extern "C" __global__ void __launch_bounds__(32) shared_overrun(float* y)
{
  extern __shared__ float buf[];
  buf[threadIdx.x] = 1.0f;  // launched with 16 bytes: lanes 4.. write past them
  y[threadIdx.x] = buf[threadIdx.x];
}
extern "C" __global__ void __launch_bounds__(32) past_the_end(const float* x, float* y)
{
  y[threadIdx.x] = x[threadIdx.x + 1024];  // one past the 4096-byte buffer
}
"""

SCRIPT = r"""
import sys, numpy as np
sys.path.insert(0, sys.argv[1])
from tests.support.cuda_host.build import HostModule, HostKernelError
mod = HostModule(open(sys.argv[2]).read())
buf = mod.alloc(4096)
def ptr(offset):
    return np.uint64(buf.address + offset)
results = {}
x = buf.array[:1024].view(np.float32)
x[...] = np.arange(256, dtype=np.float32)
buf.array[2048:2052] = 0
try:
    mod.launch("reverse_sum", (4, 1, 1), (64, 1, 1), 64 * 4, [ptr(0), ptr(1024), ptr(2048)])
    y = buf.array[1024:2048].view(np.float32).reshape(4, 64)
    xb = x.reshape(4, 64)
    want = np.concatenate([np.repeat(xb[:, 32:].sum(axis=1, keepdims=True), 32, axis=1),
                           np.repeat(xb[:, :32].sum(axis=1, keepdims=True), 32, axis=1)], axis=1)
    count = int(buf.array[2048:2052].view(np.int32)[0])
    results["reverse_sum"] = "ok" if np.array_equal(y, want) and count == 128 else f"wrong {y} {count}"
except HostKernelError as exc:
    results["reverse_sum"] = str(exc)
for name, grid, block, args in [("early_exit", 1, 64, [ptr(0)]), ("short_warp", 1, 48, [ptr(0)]),
                                ("exited_lane", 1, 32, [ptr(0)]), ("outside_mask", 1, 32, [ptr(0)]),
                                ("split_wait", 1, 32, [ptr(0)]), ("past_the_end", 2, 32, [ptr(0), ptr(0)]),
                                ("shared_overrun", 1, 32, [ptr(0)])]:
    try:
        mod.launch(name, (grid, 1, 1), (block, 1, 1), 16 if name == "shared_overrun" else 0, args)
        results[name] = "no error"
    except HostKernelError as exc:
        results[name] = str(exc)
buf.free()
import json; print(json.dumps(results))
"""


def test_header_semantics_and_errors_not_hangs(tmp_path: Path) -> None:
    source = tmp_path / "kernels.cu"
    source.write_text(KERNELS)
    assert kernel_names(KERNELS)[:2] == ["reverse_sum", "early_exit"]
    assert "float* const tile = (float*)oa_dyn_shared;" in prepare_source(KERNELS)
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(REPO), str(source)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(done.stdout.strip().splitlines()[-1])
    assert r["reverse_sum"] == "ok"
    assert r["early_exit"] == ("kernel early_exit block (0,0,0) thread (60,0,0): exited while 60 of 64 "
                               "threads of the block wait at __syncthreads (a barrier part of the block "
                               "never reaches)")
    assert "thread (32,0,0): __shfl_xor_sync mask 0xffffffff names lane 16, which does not exist (the " \
        "block has 48 threads)" in r["short_warp"], r["short_warp"]
    assert "__shfl_xor_sync mask 0xffffffff" in r["exited_lane"] and "lane 7" in r["exited_lane"] and \
        "exited" in r["exited_lane"], r["exited_lane"]
    assert "__shfl_sync reads lane 20, which is not in its mask 0x0000ffff" in r["outside_mask"], \
        r["outside_mask"]
    assert "__syncthreads never completes" in r["split_wait"] or "waits for lane 0" in r["split_wait"], \
        r["split_wait"]
    assert re.search(r"kernel past_the_end block \(0,0,0\) thread \(\d+,0,0\): memory fault \(SIGSEGV\)",
                     r["past_the_end"]), r["past_the_end"]
    overrun = r["shared_overrun"]
    assert overrun.startswith("kernel shared_overrun block (0,0,0) thread (4,0,0): memory fault"), overrun


def test_a_kernel_error_names_the_kernel(tmp_path: Path) -> None:
    mod = HostModule(KERNELS)
    with pytest.raises(HostKernelError, match="not in the module"):
        mod.launch("nope", (1, 1, 1), (1, 1, 1), 0, [])
    buf = mod.alloc(256)
    try:
        with pytest.raises(HostKernelError, match=r"bad launch: grid \(1,1,1\) block \(2048,1,1\)"):
            mod.launch("early_exit", (1, 1, 1), (2048, 1, 1), 0, [np.uint64(buf.address)])
        with pytest.raises(HostKernelError, match=r"bad launch: grid \(1,65536,1\)"):
            mod.launch("early_exit", (1, 65536, 1), (64, 1, 1), 0, [np.uint64(buf.address)])
        bounds = r"kernel early_exit block \(0,0,0\): launched with 128 threads per block; its "
        with pytest.raises(HostKernelError, match=bounds + "__launch_bounds__ allows 64"):
            mod.launch("early_exit", (1, 1, 1), (128, 1, 1), 0, [np.uint64(buf.address)])
    finally:
        buf.free()
