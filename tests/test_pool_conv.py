"""The NCHW convolution kernels on the worker pool (issue 31): conv.c.j2 (packed panels, packed
rows and the direct 1x1 path), depthwise.c.j2, winograd.c.j2, spatial_conv_transpose.c.j2 and
conv_dynamic.c.j2 (run-time sizes). Each model is compiled at opt level 2 (NCHW: the NHWC layout
is level 3's) for an explicit ``--cpu`` level; the C text shows every convolution step calling
its parts through ``onnx_aot_parallel`` and no OpenMP left in them; runs at threads 1, 2 and 3,
with a process spinning beside them, agree bit for bit and with onnxruntime.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler.driver import compile_model
from runtime.session import Session
from tests import test_pool
from tests.cpu_targets import host_runs
from tests.support.models import ort_run

CPU = "x86-64-v3"
RTOL, ATOL = 1e-3, 1e-3
spinning = test_pool.spinning  # the fixture: a process spinning beside the runs

# (op, name, output channels, kernel, stride, group, pad); "+" after a Conv: add its input back
Layer = tuple[str, str, int, int, int, int, int]
MODELS: dict[str, tuple[list[Layer], list[Any]]] = {
    # 1x1 direct (and a residual), 5x5 packed over many panels, 3x3 / stride 4 packed (few panels,
    # row blocks split), grouped
    "conv": ([("Conv+", "pw", 24, 1, 1, 1, 0), ("Conv", "k5", 16, 5, 1, 1, 2),
              ("Conv", "s4", 32, 3, 4, 2, 1)], [2, 24, 30, 30]),
    # depthwise, then a channel multiplier of 2 with stride 2
    "depthwise": ([("Conv", "dw", 32, 3, 1, 32, 1), ("Conv", "dm", 64, 5, 2, 32, 2)], [2, 32, 17, 19]),
    # Winograd F(4x4) at 20x20, a strided conv, Winograd F(2x2) at 10x10
    "winograd": ([("Conv", "w4", 32, 3, 1, 1, 1), ("Conv", "s2", 24, 3, 2, 1, 1),
                  ("Conv", "w2", 16, 3, 1, 1, 1)], [2, 24, 20, 20]),
    "transpose": ([("ConvTranspose", "up", 8, 3, 2, 2, 1), ("ConvTranspose", "up4", 6, 4, 2, 1, 1)],
                  [2, 16, 9, 11]),
    # run-time batch and sizes: direct 1x1, Winograd, depthwise, packed, ConvTranspose
    "dynamic": ([("Conv", "pw", 24, 1, 1, 1, 0), ("Conv", "w3", 24, 3, 1, 1, 1),
                 ("Conv", "dw", 24, 3, 1, 24, 1), ("Conv", "k5", 16, 5, 2, 1, 2),
                 ("ConvTranspose", "up", 8, 3, 2, 2, 1)], ["n", 24, "h", "w"]),
}
DIMS = {"n": (1, 3), "h": (8, 40), "w": (8, 40)}
SHAPES = {"dynamic": [(1, 24, 8, 9), (3, 24, 40, 37), (2, 24, 23, 16)]}
# the pool parts each op's kernel has (templates' parallel_part names)
PARTS = {"Conv": {"panels", "pack", "tiles", "planes"}, "FusedConv": {"panels", "pack", "tiles", "planes"},
         "WinogradConv": {"input", "products", "output"}, "ConvTranspose": {"tiles", "rows"}}
EXPECTED = {"conv": {"panels", "pack", "tiles"}, "depthwise": {"planes"},
            "winograd": {"input", "products", "output", "pack", "tiles"},
            "transpose": {"tiles", "rows"},
            "dynamic": {"tiles", "input", "products", "output", "planes", "panels", "pack", "rows"}}


def _layer(op: str, name: str, x: str, c: int, spec: Layer, rng: np.random.Generator) -> tuple[list, list]:
    _, _, m, k, s, group, pad = spec
    shape = (c, m // group, k, k) if op == "ConvTranspose" else (m, c // group, k, k)
    w = (rng.standard_normal(shape) / np.sqrt(c * k * k / group)).astype(np.float32)
    inits = [numpy_helper.from_array(w, f"{name}.w"),
             numpy_helper.from_array((rng.standard_normal(m) * 0.1).astype(np.float32), f"{name}.b")]
    extra = {"output_padding": [1, 1]} if op == "ConvTranspose" and k % 2 else {}
    node = helper.make_node(op, [x, f"{name}.w", f"{name}.b"], [f"{name}.c"], name=name, kernel_shape=[k, k],
                            strides=[s, s], group=group, pads=[pad] * 4, **extra)
    return inits, [node]


def _model(kind: str) -> onnx.ModelProto:
    layers, shape = MODELS[kind]
    rng = np.random.default_rng(len(kind))
    inits, nodes = [], []
    x, c = "x", shape[1]
    for spec in layers:
        op, name, m = spec[0], spec[1], spec[2]
        more_inits, more_nodes = _layer(op.rstrip("+"), name, x, c, spec, rng)
        inits += more_inits
        nodes += more_nodes
        out = f"{name}.c"
        if op.endswith("+"):
            nodes.append(helper.make_node("Add", [out, x], [f"{name}.sum"], name=f"{name}.add"))
            out = f"{name}.sum"
        nodes.append(helper.make_node("Relu", [out], [f"{name}.r"], name=f"{name}.relu"))
        x, c = f"{name}.r", m
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)]
    outputs = [helper.make_tensor_value_info(x, TensorProto.FLOAT, [None] * 4)]
    graph = helper.make_graph(nodes, kind, inputs, outputs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _conv_kernels(art: Path) -> dict[str, tuple[str, str]]:
    """Each convolution step's name: its op type and its C text (the pool parts ahead of the
    kernel, then the kernel)."""
    source = (art / "kernels" / "cpu" / "model.c").read_text()
    found = {}
    for step in json.loads((art / "plan.json").read_text())["steps"]:
        if step["op_type"] not in PARTS:
            continue
        assert step["provider"] == "c", step
        call = re.search(rf"/\* step {step['index']}: .*?\*/\s*(k_[0-9a-f]{{16}})\(", source, re.S)
        assert call is not None, step
        fn = call.group(1)
        start = source.find(f"void {fn}_")
        end = source.index("\n}\n", source.index(f"void {fn}("))
        found[step["name"]] = (step["op_type"], source[start if 0 <= start < end else 0 : end])
    return found


@pytest.mark.parametrize("kind", list(MODELS))
def test_nchw_convs_run_on_the_pool_bit_identical_at_any_thread_count(kind: str, tmp_path: Path,
                                                                     spinning: None) -> None:
    model = _model(kind)
    dims = DIMS if kind == "dynamic" else None
    art = compile_model(model, tmp_path / kind, opt_level=2, dims=dims, cpu=CPU, golden_cases=0)
    kernels = _conv_kernels(art)
    assert len(kernels) == len(MODELS[kind][0]), kernels.keys()
    used: set[str] = set()
    for name, (op_type, text) in kernels.items():
        assert "#pragma omp" not in text and "omp_" not in text, name
        parts = set(re.findall(r"onnx_aot_parallel\(k_[0-9a-f]{16}_(\w+)_task", text))
        assert parts and parts <= PARTS[op_type], (name, op_type, parts)
        used |= parts
    assert used == EXPECTED[kind]
    if kind == "winograd":
        assert [op for op, _ in kernels.values()].count("WinogradConv") == 2
    if not host_runs(CPU):
        return
    sessions = [Session(art, threads=threads) for threads in (1, 2, 3)]
    for shape in SHAPES.get(kind, [tuple(MODELS[kind][1])]):
        feeds = {"x": np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)}
        (want,) = ort_run(model, feeds)
        (one,) = sessions[0].run(None, feeds)
        np.testing.assert_allclose(one, want, rtol=RTOL, atol=ATOL, err_msg=f"{kind} at {shape}")
        for session in sessions[1:]:  # with a process spinning beside them (the fixture)
            for _ in range(3):
                (got,) = session.run(None, feeds)
                assert np.array_equal(got, one), (kind, shape)
