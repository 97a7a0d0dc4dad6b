"""Channels-last conv tiles of two or three panels (compiler/providers/c/conv_nhwc.py: PAIR_PANELS,
SPAN_PANELS): with AVX-512 (a 16-channel panel is one vector) a tile runs over two or three
neighbouring full panels of its chunk, so each broadcast input value feeds two or three FMAs; a
chunk's odd last panel, the partial panel and AVX2 builds (two vectors a panel) keep single-panel
tiles. Each output channel's sum runs over
K in the same order either way: outputs bit for bit those of single-panel tiles."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler.driver import compile_model
from compiler.providers.c import conv_nhwc
from runtime import Session
from tests.cpu_targets import host_runs
from tests.support.models import ort_run


def _convs() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """1x1 (72 channels: four full panels and a partial one) with ReLU, 3x3 stride 2, and a 1x1
    expansion with a residual Add, as a PyTorch export writes them (Conv with bias, then Relu / Add)."""
    rng = np.random.default_rng(11)
    layers = [("a", 32, 72, 1, 1, 0), ("b", 72, 64, 3, 2, 1), ("c", 64, 96, 1, 1, 0)]
    inits, nodes, x = [], [], "x"
    for name, c, m, k, s, pad in layers:
        w = (rng.standard_normal((m, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"{name}.w"),
                  numpy_helper.from_array(rng.standard_normal(m).astype(np.float32) * 0.1, f"{name}.b")]
        nodes.append(helper.make_node("Conv", [x, f"{name}.w", f"{name}.b"], [f"{name}.y"], name=name,
                                      kernel_shape=[k, k], strides=[s, s], pads=[pad] * 4))
        x = f"{name}.y"
        if name != "c":
            nodes.append(helper.make_node("Relu", [x], [f"{name}.r"], name=f"{name}.relu"))
            x = f"{name}.r"
    inits.append(numpy_helper.from_array(rng.standard_normal((1, 96, 8, 8)).astype(np.float32), "skip"))
    nodes.append(helper.make_node("Add", [x, "skip"], ["y"], name="residual"))
    graph = helper.make_graph(nodes, "pairs",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 96, 8, 8])],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return model, {"x": rng.standard_normal((1, 32, 16, 16)).astype(np.float32)}


def _conv_kernels(art: Path) -> list[str]:
    """The text of each ConvNhwc step's tile part (the pool part holding its tiles)."""
    source = (art / "kernels" / "cpu" / "model.c").read_text()
    plan = json.loads((art / "plan.json").read_text())
    steps = [s for s in plan["steps"] if s["op_type"] == "ConvNhwc"]
    assert len(steps) == 3, [s["op_type"] for s in plan["steps"]]
    texts = []
    for step in steps:
        start = source.index(f"/* step {step['index']}: ")
        fn = source[source.index("k_", start) : source.index("(", source.index("k_", start))]
        part = source.index(f"void {fn}_tiles")
        texts.append(source[part : source.index("\n}\n", part)])
    return texts


@pytest.mark.parametrize("cpu", ["x86-64-v4", "x86-64-v3"])
def test_avx512_tiles_pair_panels_with_outputs_unchanged(cpu: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    model, feeds = _convs()
    paired = compile_model(model, tmp_path / "paired", cpu=cpu, golden_cases=0)
    texts = _conv_kernels(paired)
    # the pair's second panel is read one panel stride (K * 16 floats) past the first
    strides = [32 * 16, 72 * 9 * 16, 64 * 16]
    for text, stride in zip(texts, strides, strict=True):
        assert ("++p;" in text) == (cpu == "x86-64-v4"), cpu
        assert (f"vload(bk + {stride})" in text) == (cpu == "x86-64-v4"), cpu
    # 96 channels, six panels a chunk: tiles of three (the third panel two strides on); four full
    # panels a chunk (64 channels) go as two pairs
    assert ("p += 2;" in texts[2] and f"vload(bk + {2 * 64 * 16})" in texts[2]) == (cpu == "x86-64-v4")
    assert "p += 2;" not in texts[1]
    # weights prefetched 8 k steps ahead in the multi-panel tiles of segments >= 64 long (b: 72 or
    # more, c: 64), not in a's (32 channels)
    assert ["__builtin_prefetch" in text for text in texts] == [False] + [cpu == "x86-64-v4"] * 2
    monkeypatch.setattr(conv_nhwc, "PAIR_PANELS", False)
    single = compile_model(model, tmp_path / "single", cpu=cpu, golden_cases=0)
    assert all("++p;" not in text for text in _conv_kernels(single))
    if not host_runs(cpu):
        return
    want = ort_run(model, feeds)
    for threads in (1, 2, 3):
        got = Session(paired, threads=threads).run(None, feeds)
        base = Session(single, threads=threads).run(None, feeds)
        assert all(np.array_equal(a, b) for a, b in zip(got, base, strict=True)), threads
        np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
