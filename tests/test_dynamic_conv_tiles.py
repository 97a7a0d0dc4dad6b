"""The register tile of an NCHW Conv with run-time sizes (``conv_dynamic.c.j2``): chosen for the
most output pixels the ranges allow (a Silero-style STFT conv of 3-4 columns gets the static
kernel's one-vector tile, not 64-column panels of padding), and a last panel run on as many
vectors as its columns take (switched on at run time). Checked against onnxruntime at sizes that
give one column, a tail of each vector count and full panels; the C text of an explicit ``--cpu``
level shows the tile.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler.driver import compile_model
from runtime.session import Session
from tests.cpu_targets import host_runs
from tests.support.models import ort_run

RTOL, ATOL = 1e-3, 1e-4


def _stft_model(m: int, kernel: int, stride: int, pads: tuple[int, int]) -> onnx.ModelProto:
    """x [n, L] -> Unsqueeze -> Conv1d (m filters over one channel, ``kernel`` / ``stride``, as
    an STFT front end exports it) -> Relu -> a Conv1d of kernel 3 over the m channels."""
    rng = np.random.default_rng(m + kernel)
    w1 = (rng.standard_normal((m, 1, kernel)) / np.sqrt(kernel)).astype(np.float32)
    w2 = (rng.standard_normal((24, m, 3)) / np.sqrt(3 * m)).astype(np.float32)
    b2 = (rng.standard_normal(24) * 0.1).astype(np.float32)
    nodes = [
        helper.make_node("Unsqueeze", ["x", "axes"], ["u"], name="unsqueeze"),
        helper.make_node("Conv", ["u", "w1"], ["s"], name="stft", kernel_shape=[kernel], strides=[stride],
                         pads=list(pads)),
        helper.make_node("Relu", ["s"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "w2", "b2"], ["y"], name="enc", kernel_shape=[3], pads=[1, 1]),
    ]
    inits = [numpy_helper.from_array(np.array([1], np.int64), "axes"), numpy_helper.from_array(w1, "w1"),
             numpy_helper.from_array(w2, "w2"), numpy_helper.from_array(b2, "b2")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "L"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 3)
    graph = helper.make_graph(nodes, "stft", [x], [y], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _kernel_of(art: Path, step: str) -> str:
    """The C function that runs ``step``, from its first part on the worker pool (defined ahead of it)."""
    source = (art / "kernels" / "cpu" / "model.c").read_text()
    plan = json.loads((art / "plan.json").read_text())
    index = next(s["index"] for s in plan["steps"] if s["name"] == step)
    call = re.search(rf"/\* step {index}: .*?\*/\s*(k_[0-9a-f]{{16}})\(", source, re.S)
    assert call is not None, f"no call of step {index}"
    body = source[source.index(f"void {call.group(1)}_") :]
    return body[: body.index("\n}\n", body.index(f"void {call.group(1)}("))]


def _check_runs(model: onnx.ModelProto, art: Path, cpu: str, sizes: list[tuple[int, int]]) -> None:
    plan = json.loads((art / "plan.json").read_text())
    convs = [s for s in plan["steps"] if s["name"] in ("stft", "enc")]
    assert len(convs) == 2 and all(s["provider"] == "c" and s["op_type"] in ("Conv", "FusedConv")
                                   for s in convs), convs
    if not host_runs(cpu):
        return
    session = Session(art, threads=1)
    for n, length in sizes:
        x = np.random.default_rng(n * length).standard_normal((n, length)).astype(np.float32)
        (got,), (want,) = session.run(None, {"x": x}), ort_run(model, {"x": x})
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=f"at {(n, length)}")


@pytest.mark.parametrize("cpu", ["x86-64-v2", "x86-64-v4"])
def test_few_pixels_take_the_static_tile(tmp_path: Path, cpu: str) -> None:
    """Silero VAD's STFT shape: kernel 256, stride 128, pads 64 + 64 and a length of 512..576 give
    4 output columns; the tile is one vector wide (4 floats on SSE, 16 on AVX-512), not four."""
    model = _stft_model(40, 256, 128, (64, 64))
    art = compile_model(model, tmp_path / "a", dims={"n": (1, 3), "L": (512, 576)}, cpu=cpu, golden_cases=0)
    vw = 16 if cpu == "x86-64-v4" else 4
    for step in ("stft", "enc"):
        text = _kernel_of(art, step)
        assert "const long NP" in text, step  # the run-time-sizes kernel
        assert "c0_0" in text and "c0_1" not in text, step  # one vector per tile row
        # a packed panel is the tile's width: K x vw floats (K = 256 taps, 120 for enc)
        k = 256 if step == "stft" else 120
        assert f"scratch + (long)p * {k * vw};" in text, step
    _check_runs(model, art, cpu, [(1, 512), (2, 555), (3, 576), (1, 575)])


@pytest.mark.parametrize("cpu", ["x86-64-v2", "x86-64-v4"])
def test_the_last_panel_runs_on_the_vectors_its_columns_take(tmp_path: Path, cpu: str) -> None:
    """A mel-style Conv1d (kernel 32, stride 8) over 40..2600 samples: 2..321 columns, panels of
    nr columns and a tail of every vector count (the switch on them)."""
    model = _stft_model(20, 32, 8, (0, 0))
    art = compile_model(model, tmp_path / "a", dims={"n": (1, 2), "L": (40, 2600)}, cpu=cpu, golden_cases=0)
    vw = 16 if cpu == "x86-64-v4" else 4
    text = _kernel_of(art, "stft")
    assert f"switch ((nc + {vw - 1}) / {vw})" in text
    assert "c0_3" in text if cpu == "x86-64-v4" else "c0_1" in text  # a full panel's widest tile
    # columns: 2 (one vector), then tails of 1..4 vectors around panel multiples, the range ends
    lengths = [40, 48, 160, 288, 416, 544, 552, 1032, 2592, 2600]
    _check_runs(model, art, cpu, [(1 + k % 2, length) for k, length in enumerate(lengths)])
