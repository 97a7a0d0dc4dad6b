"""``--precision bf16``: a tensor only bf16 convs read is stored as bfloat16 (compiler/providers/c/
conv_amx.py: ``bf16_link``).

Chains of three convs (1x1 + Relu, then k x k + Relu, then 1x1 + residual Add + Relu; NCHW in and
out, the NHWC region between) whose middle conv takes each AMX path: taps read in place (C 64,
rows 14 wide), windows gathered block by block from the bf16 image (C 48), windows gathered
through scratch (rows 5 wide, K 576), and taps in place after a 3x3 stride-2 MaxPool (which then
runs on the codes, pool_bf16.py). The two tensors between the convs are stored as bf16 codes:
on the AMX and vdpbf16ps paths the artifact is bit for bit the one that keeps them fp32 (each
reader rounded the same fp32 value to nearest even); the fallback ($ONNX_AOT_NO_AMX=1, fp32
products) reads the rounded values, so it stays within bf16's rounding of the fp32-tensor
artifact; every path the same at 1 and 2 threads, verify passing. A tensor that another step reads
too (here a graph output) stays fp32. Compiled for ``--cpu x86-64-v3`` (tests/cpu_targets.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler import compile_model
from compiler.providers.c import conv_amx
from runtime import Session
from tests.test_amx_bf16 import PATHS
from tests.test_amx_bf16 import _use_path

CPU = "x86-64-v3"
# input channels, first conv's outputs, size, middle kernel, outputs
CHAINS = {"taps": (64, 64, 14, 3, 96), "fused": (256, 48, 12, 3, 64), "gathered": (64, 64, 5, 3, 64),
          "fan_out": (64, 64, 14, 3, 96), "pool": (64, 64, 14, 3, 96)}


def _size(case: str) -> int:
    """The second conv's spatial size (the pool case: after a 3x3 stride-2 MaxPool)."""
    s = CHAINS[case][2]
    return (s - 1) // 2 + 1 if case == "pool" else s


def _conv(name: str, x: str, y: str, cin: int, cout: int, k: int, rng: np.random.Generator) -> tuple:
    w = (rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32) * 0.1
    node = helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [y], name=name, kernel_shape=[k, k],
                            pads=[k // 2] * 4)
    return node, [numpy_helper.from_array(w, f"{name}_w"), numpy_helper.from_array(b, f"{name}_b")]


def _chain(case: str) -> onnx.ModelProto:
    c, m1, s0, k, m3 = CHAINS[case]
    rng, s, pool = np.random.default_rng(c + m1 + s0), _size(case), case == "pool"
    parts = [_conv("c1", "x", "c1", c, m1, 1, rng), _conv("c2", "p1" if pool else "r1", "c2", m1, m1, k, rng),
             _conv("c3", "r2", "c3", m1, m3, 1, rng)]
    between = [helper.make_node("MaxPool", ["r1"], ["p1"], name="pool", kernel_shape=[3, 3], strides=[2, 2],
                                pads=[1] * 4)] if pool else []
    nodes = [parts[0][0], helper.make_node("Relu", ["c1"], ["r1"], name="relu1"), *between, parts[1][0],
             helper.make_node("Relu", ["c2"], ["r2"], name="relu2"), parts[2][0],
             helper.make_node("Add", ["c3", "z"], ["s"], name="residual"),
             helper.make_node("Relu", ["s"], ["y"], name="relu3")]
    io = [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
          for name, shape in (("x", [1, c, s0, s0]), ("z", [1, m3, s, s]), ("y", [1, m3, s, s]))]
    outs = io[2:] + ([helper.make_tensor_value_info("r2", TensorProto.FLOAT, [1, m1, s, s])]
                     if case == "fan_out" else [])
    graph = helper.make_graph(nodes, case, io[:2], outs, [t for _, ts in parts for t in ts])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def chains(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    root = tmp_path_factory.mktemp("bf16_links")
    out = {}
    with pytest.MonkeyPatch.context() as patch:
        for case in CHAINS:
            patch.setattr(conv_amx, "BF16_LINKS", False)
            wide = compile_model(_chain(case), root / f"{case}_fp32", cpu=CPU, precision="bf16")
            patch.setattr(conv_amx, "BF16_LINKS", True)
            out[case] = (compile_model(_chain(case), root / case, cpu=CPU, precision="bf16"), wide)
    return out


def _feeds(case: str) -> dict[str, np.ndarray]:
    c, _, s0, _, m3 = CHAINS[case]
    rng, s = np.random.default_rng(3), _size(case)
    return {"x": rng.standard_normal((1, c, s0, s0)).astype(np.float32),
            "z": rng.standard_normal((1, m3, s, s)).astype(np.float32)}


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("case", list(CHAINS))
def test_bf16_tensors_between_convs(chains: dict, case: str, path: str,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    _use_path(path, monkeypatch)
    art, wide = chains[case]
    feeds = _feeds(case)
    one, two = (Session(art, threads=threads).run(None, feeds) for threads in (1, 2))
    assert all(np.array_equal(a, b) for a, b in zip(one, two, strict=True)), "threads 1 and 2 differ"
    want = Session(wide).run(None, feeds)
    if path == "fallback":
        scale = float(np.abs(want[0]).max())
        np.testing.assert_allclose(one[0], want[0], rtol=0, atol=2e-2 * scale)
    else:
        assert all(np.array_equal(a, b) for a, b in zip(one, want, strict=True)), "not the fp32-tensor bits"
    assert Session(art).verify().ok


NARROWED = {"taps": 2, "fused": 1, "gathered": 2, "fan_out": 1, "pool": 2}  # c1 and c2; c2 alone read by c3


@pytest.mark.parametrize("case", list(CHAINS))
def test_which_tensors_are_bf16(chains: dict, case: str) -> None:
    """The convs writing bf16 codes (their step functions' ``uint16_t* y``), in the text of each
    artifact: none where every tensor stays fp32; c2's output stays fp32 where the graph returns it
    (fan_out) or its reader computes in fp32 (fused: c3's 64 x 64 at 12 x 12)."""
    art, wide = chains[case]
    text, before = ((a / "kernels" / "cpu" / "model.c").read_text() for a in (art, wide))
    written = re.compile(r"^void k_\w+\(const (float|uint16_t)\* restrict a, .*uint16_t\* y, ", re.M)
    assert len(written.findall(before)) == 0
    assert len(written.findall(text)) == NARROWED[case]
    pool = re.compile(r"^void k_\w+\(const uint16_t\* restrict x, uint16_t\* restrict y\)", re.M)
    assert len(pool.findall(text)) == (case == "pool") and not pool.findall(before)
