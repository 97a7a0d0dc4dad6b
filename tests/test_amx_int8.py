"""The AMX-INT8 tile paths of the integer GEMM and convolution (issue 32; templates/c/qamx.c.j2).

An x86-64 AVX-512 build (x86-64-v4, or ``native`` on an AVX-512 host) carries the AMX loops as
inline asm and takes them at run time where the CPU has AMX-TILE and AMX-INT8, the kernel lets the
process use the tile state, and ``$ONNX_AOT_NO_AMX`` is unset (read at each run). On shapes the
tiles were not tuned on (M / N / K not multiples of 16 / 64, a K tail, channel blocks of fewer than
32 rows, odd pixel vectors, groups, u8 and s8 A / X, u8 and s8 B / W, per-tensor and per-column
zero points, int32 / requantized / float outputs) every output must be the same with the tiles
and with ``ONNX_AOT_NO_AMX=1`` (the VNNI or pmaddwd loops), and equal the reference kernels'
(runtime/kernels, what opt level 0 runs), at 1 and 2 threads. The runs skip where the CPU lacks
AMX; the text checks name their ``--cpu`` level and run everywhere.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnxruntime.quantization import QuantType
from onnxruntime.quantization import quantize_dynamic

from compiler import compile_model
from runtime import Session
from runtime.isa import host_cpu_flags
from tests.cpu_targets import host_runs
from tests.support.qconv_models import QConvCase
from tests.support.qgemm_models import integer_feeds
from tests.support.qgemm_models import integer_matmuls
from tests.test_qconv import _merged
from tests.test_qgemm import _linear_model

# the artifacts here are built without the golden self-test (golden_cases=0)
pytestmark = pytest.mark.filterwarnings("ignore::runtime.errors.UncheckedArtifactWarning")

# (A's shape, N, A's type, B's type, per-column B parameters, QLinearMatMul), as qgemm_models
GEMMS = (
    ((47, 200), 50, np.uint8, np.int8, True, False),  # 32 + 15 rows (a 1-row-tile block), K tail
    ((70, 64), 33, np.int8, np.int8, False, False),  # K one step, 3 panels (a 1-column-tile group)
    ((2, 40, 333), 100, np.uint8, np.uint8, True, True),  # batched; K = 5 steps + 4 groups
    ((17, 1000), 31, np.int8, np.uint8, True, True),
    ((1, 7), 3, np.uint8, np.int8, False, False),  # one row, K inside one group
    ((96, 768), 64, np.int8, np.int8, True, False),  # whole tiles only
    ((33, 129), 48, np.uint8, np.int8, False, True),
)
CONVS = {
    "k3_tail": QConvCase(c=37, m=40, hw=(13, 11)),  # K = 333, 32 + 8 channels
    "pw_s8": QConvCase(c=70, m=20, hw=(9, 9), kernel=(1, 1), pads=(0, 0, 0, 0), x="int8", y="int8"),
    "groups_u8w": QConvCase(c=16, m=48, hw=(8, 8), group=2, strides=(2, 2), w="uint8", per_channel=False),
    "int_k64": QConvCase(c=64, m=33, hw=(7, 9), kernel=(1, 1), pads=(0, 0, 0, 0), integer=True),
    "stem": QConvCase(c=3, m=64, hw=(30, 30), kernel=(7, 7), strides=(2, 2), pads=(3, 3, 3, 3), w_zero=False),
    "few_channels": QConvCase(c=96, m=7, hw=(5, 5), x="int8"),
}


def _amx_reason() -> str | None:
    """Why this host cannot run the AMX paths (None: it can)."""
    flags = host_cpu_flags()
    if flags is None or not {"amx_tile", "amx_int8"} <= flags:
        return "this CPU has no AMX-INT8 (the tile paths are not taken here)"
    if not host_runs("x86-64-v4"):
        return "this host does not run x86-64-v4 code"
    return None


def _outputs(art: Path, feeds: dict[str, np.ndarray], threads: int) -> list[np.ndarray]:
    return Session(art, threads=threads).run(None, feeds)


def _same_with_and_without_amx(art: Path, feeds: dict[str, np.ndarray], want: list[np.ndarray],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    for threads in (1, 2):
        monkeypatch.delenv("ONNX_AOT_NO_AMX", raising=False)
        tiles = _outputs(art, feeds, threads)
        monkeypatch.setenv("ONNX_AOT_NO_AMX", "1")
        loops = _outputs(art, feeds, threads)
        for i, (t, v, w) in enumerate(zip(tiles, loops, want, strict=True)):
            assert t.dtype == w.dtype and np.array_equal(t, v), f"output {i}, threads {threads}: AMX vs not"
            assert np.array_equal(t, w), f"output {i}, threads {threads}: AMX vs the reference"


@pytest.fixture(scope="module")
def gemm_arts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("amx_gemm")
    model = integer_matmuls(3, GEMMS)
    return {"v4": compile_model(model, root / "v4", cpu="x86-64-v4", golden_cases=0),
            "native": compile_model(model, root / "native", cpu="native", golden_cases=0),
            "reference": compile_model(model, root / "ref", opt_level=0, golden_cases=0)}


@pytest.mark.parametrize("build", ["v4", "native"])
def test_qgemm_tiles_equal_the_loops_and_the_reference(gemm_arts: dict[str, Path], build: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    if (reason := _amx_reason()) is not None:
        pytest.skip(reason)
    feeds = integer_feeds(4, GEMMS)
    want = _outputs(gemm_arts["reference"], feeds, 1)
    _same_with_and_without_amx(gemm_arts[build], feeds, want, monkeypatch)


def test_qconv_tiles_equal_the_loops_and_the_reference(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    if (reason := _amx_reason()) is not None:
        pytest.skip(reason)
    model, feeds = _merged(CONVS)
    art = compile_model(model, tmp_path / "v4", cpu="x86-64-v4", golden_cases=0)
    want = _outputs(compile_model(model, tmp_path / "ref", opt_level=0, golden_cases=0), feeds, 1)
    _same_with_and_without_amx(art, feeds, want, monkeypatch)


def test_dynamic_chain_is_the_same_on_the_tiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """quantize_dynamic's chain (A quantized inside QGemm, a float epilogue with the bias): the
    tiles' integer sums are the loops', so the outputs are too."""
    if (reason := _amx_reason()) is not None:
        pytest.skip(reason)
    onnx.save(_linear_model(45, 333, 70, 1), tmp_path / "fp.onnx")
    quantize_dynamic(str(tmp_path / "fp.onnx"), str(tmp_path / "q.onnx"), weight_type=QuantType.QInt8)
    art = compile_model(tmp_path / "q.onnx", tmp_path / "a", cpu="x86-64-v4", golden_cases=0)
    x = {"x": np.random.default_rng(2).standard_normal((2, 45, 333)).astype(np.float32)}
    monkeypatch.setenv("ONNX_AOT_NO_AMX", "1")
    want = _outputs(art, x, 1)
    monkeypatch.delenv("ONNX_AOT_NO_AMX")
    _same_with_and_without_amx(art, x, want, monkeypatch)


@pytest.mark.parametrize("cpu", ["x86-64-v3", "x86-64-v4"])
def test_generated_text_carries_the_tiles_on_avx512_only(tmp_path: Path, cpu: str) -> None:
    """x86-64-v4 carries both AMX loops behind onnx_aot_amx_usable; x86-64-v3 (AVX2) none."""
    model, _ = _merged({"k3": CONVS["k3_tail"]})
    gemm = integer_matmuls(3, GEMMS[:1])
    texts = [(compile_model(m, tmp_path / f"{i}", cpu=cpu, golden_cases=0) / "kernels" / "cpu" / "model.c")
             .read_text() for i, m in enumerate((gemm, model))]
    for text, op in zip(texts, ("tdpbusd", "tdpbsud"), strict=True):
        amx = ("onnx_aot_amx_usable(ONNX_AOT_AMX_INT8)", op, "tileloadd", "tilerelease")
        assert all((t in text) == (cpu == "x86-64-v4") for t in amx), (cpu, op)
