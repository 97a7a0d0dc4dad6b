"""The C kernel of ``onnx_aot.ConvNhwc`` (compiler/providers/c/conv_nhwc.py, templates/c/conv_nhwc.c.j2).

Every case is a shape the zoo does not have (odd sizes, channel counts that fill no panel, batch
2, asymmetric pads, strides, dilations, groups, depthwise, H = 1, residual and each activation),
compiled together as one graph of independent ConvNhwc nodes and checked against the reference
kernel (runtime/kernels/nhwc.py) run in float64, on 1 and 2 threads and on the portable
x86-64-v2 build. Each step must run in C, not fall back to the reference provider. The generated
code is checked textually too: which padding method, epilogue in the tile, no scratch where the
input is read in place.
"""

from __future__ import annotations

import json
import math
import platform
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from compiler.driver import compile_graph
from compiler.ir.graph import AOT_DOMAIN
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.passes.base import add_constant
from runtime import Session
from runtime.isa import MARCH_FEATURES
from runtime.isa import TEST_FLAGS_ENV
from runtime.kernels import get_kernel
from runtime.kernels.nhwc import pack_conv_weights

F32 = np.dtype(np.float32)


@dataclass(frozen=True)
class Case:
    n: int
    c: int
    h: int
    w: int
    m: int
    k: tuple[int, int] = (1, 1)
    s: tuple[int, int] = (1, 1)
    p: tuple[int, int, int, int] = (0, 0, 0, 0)
    d: tuple[int, int] = (1, 1)
    g: int = 1
    bias: bool = True
    res: bool = False
    act: str = ""

    @property
    def out(self) -> tuple[int, int, int, int]:
        oh = (self.h + self.p[0] + self.p[2] - (self.k[0] - 1) * self.d[0] - 1) // self.s[0] + 1
        ow = (self.w + self.p[1] + self.p[3] - (self.k[1] - 1) * self.d[1] - 1) // self.s[1] + 1
        return (self.n, oh, ow, self.m)

    @property
    def attrs(self) -> dict[str, Any]:
        bounds = {"Clip": (-0.5, 0.75)}.get(self.act, (-math.inf, math.inf))
        return {"kernel_shape": list(self.k), "strides": list(self.s), "pads": list(self.p),
                "dilations": list(self.d), "group": self.g, "activation": self.act,
                "act_min": bounds[0], "act_max": bounds[1], "act_alpha": 0.1}  # fmt: skip


CASES = {
    # 1x1, stride 1, unpadded: the input read in place, pixel rows x + p * C; 40 = 2.5 panels
    "pointwise": Case(2, 32, 7, 9, 40, act="Relu"),
    # the zero-block method: 3x3 stride 2 with asymmetric pads, 33 channels, batch 2
    "strided_3x3": Case(2, 20, 9, 7, 33, k=(3, 3), s=(2, 2), p=(1, 0, 2, 1), res=True, act="Relu"),
    # the zero-padded copy: a 3-channel 7x7 stem, kernel rows as contiguous 21-value segments
    "stem_7x7": Case(1, 3, 17, 19, 24, k=(7, 7), s=(2, 2), p=(3, 3, 3, 3), act="Clip"),
    # unpadded 3x3 stride 2 of a 3-channel input: kernel rows read in place (SqueezeNet's stem)
    "stem_unpadded": Case(1, 3, 20, 21, 16, k=(3, 3), s=(2, 2)),
    # groups: 1x1 with 6 channels in and 7 out per group (one partial panel each)
    "grouped_1x1": Case(1, 24, 10, 10, 28, g=4, res=True, act="LeakyRelu"),
    # groups with few channels and padding: the copy, one tap per segment
    "grouped_3x3": Case(1, 12, 9, 9, 21, k=(3, 3), p=(1, 2, 0, 1), g=3, res=True),
    # dilation 2 with 16 channels (zero block) and dilations (2, 3) with 6 (copy), pads beyond the taps
    "dilated": Case(1, 16, 12, 12, 18, k=(3, 3), d=(2, 2), p=(2, 2, 2, 2)),
    "dilated_copy": Case(1, 6, 11, 10, 7, k=(3, 2), d=(2, 3), p=(1, 2, 3, 0)),
    # H = 1 (a 1-D conv as 2-D), stride 2 along W
    "one_row": Case(2, 5, 1, 30, 9, k=(1, 5), s=(1, 2), p=(0, 2, 0, 1), act="Relu"),
    # no bias, a residual; a long K (600) and a strided 1x1 with groups (K = 1000 per group)
    "residual_only": Case(2, 40, 6, 6, 64, bias=False, res=True),
    "long_k": Case(1, 600, 4, 5, 17, res=True, act="Relu"),
    # a 7x7 kernel over the whole 7x7 input: one output pixel per image, one tile
    "one_pixel": Case(2, 12, 7, 7, 10, k=(7, 7), act="LeakyRelu"),
    "strided_1x1": Case(1, 2000, 3, 3, 40, s=(2, 2), g=2),
    # panels in chunks of 2 (128 KiB of weights at K = 700): 5 panels per group = two chunks of 2
    # and one of the last, partial panel, with groups and a residual
    "chunked": Case(1, 1400, 4, 5, 144, g=2, res=True, act="Relu"),
    # depthwise: stride 2 and asymmetric pads; interior pixels with a channel tail; dilation
    "depthwise_s2": Case(2, 24, 9, 11, 24, k=(3, 3), s=(2, 2), p=(1, 0, 1, 2), g=24, res=True, act="Relu"),
    "depthwise_tail": Case(2, 20, 9, 21, 20, k=(3, 3), p=(1, 1, 1, 1), g=20, res=True, act="Clip"),
    "depthwise_dilated": Case(1, 35, 7, 26, 35, k=(3, 5), s=(1, 2), d=(1, 2), p=(0, 3, 2, 1), g=35,
                              bias=False),
    # one input channel per group with a channel multiplier of 2 is not depthwise: the GEMM path
    "multiplier": Case(1, 8, 6, 6, 16, k=(3, 3), p=(1, 1, 1, 1), g=8, act="LeakyRelu"),
}


def _conv_node(graph: Graph, name: str, case: Case, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Add ConvNhwc ``name`` (inputs ``name``_x and maybe ``name``_z, output ``name``_y); returns its
    ONNX-layout weights and bias."""
    cg = case.c // case.g
    weights = (rng.standard_normal((case.m, cg, *case.k)) / math.sqrt(cg * case.k[0] * case.k[1])).astype(F32)
    bias = rng.standard_normal(case.m).astype(F32)
    x = graph.add_input(Value(f"{name}_x", F32, (case.n, case.h, case.w, case.c)))
    inputs: list[Value | None] = [x, add_constant(graph, f"{name}_w", pack_conv_weights(weights, case.g))]
    inputs.append(add_constant(graph, f"{name}_b", bias) if case.bias else None)
    if case.res:
        inputs.append(graph.add_input(Value(f"{name}_z", F32, case.out)))
    y = Value(f"{name}_y", F32, case.out)
    graph.add_node(Node("ConvNhwc", inputs, [y], case.attrs, name=name, domain=AOT_DOMAIN))
    graph.outputs.append(y)  # graph construction: no pass API for outputs
    return {"w": weights, "b": bias}


def _expected(case: Case, feeds: dict[str, np.ndarray], name: str,
              params: dict[str, np.ndarray]) -> np.ndarray:
    """The reference kernel in float64."""
    inputs: list[Any] = [feeds[f"{name}_x"].astype(np.float64),
                         pack_conv_weights(params["w"].astype(np.float64), case.g)]
    inputs.append(params["b"].astype(np.float64) if case.bias else None)
    if case.res:
        inputs.append(feeds[f"{name}_z"].astype(np.float64))
    (y,) = get_kernel("onnx_aot.ConvNhwc")(np, inputs, case.attrs, [(case.out, np.dtype(np.float64))])
    return np.asarray(y)


@dataclass
class Compiled:
    art: Path
    feeds: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Compiled:
    rng = np.random.default_rng(7)
    graph = Graph("conv_nhwc_cases")
    params = {name: _conv_node(graph, name, case, rng) for name, case in CASES.items()}
    graph.verify()
    art = compile_graph(graph, tmp_path_factory.mktemp("conv_nhwc") / "art")
    feeds = {v.name: rng.standard_normal(v.shape).astype(F32) for v in graph.inputs if v.shape is not None}
    expected = {f"{name}_y": _expected(case, feeds, name, params[name]) for name, case in CASES.items()}
    return Compiled(art, feeds, expected)


def _check(got: dict[str, np.ndarray], expected: dict[str, np.ndarray], name: str) -> None:
    want = expected[f"{name}_y"]
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got[f"{name}_y"], want, rtol=1e-5, atol=1e-5 * scale, err_msg=name)


@pytest.fixture(scope="module")
def outputs(compiled: Compiled) -> dict[int, dict[str, np.ndarray]]:
    result = {}
    for threads in (1, 2):
        session = Session(compiled.art, threads=threads)
        names = [o.name for o in session.outputs]
        result[threads] = dict(zip(names, session.run(None, compiled.feeds), strict=True))
    return result


def test_every_step_runs_in_c(compiled: Compiled) -> None:
    plan = json.loads((compiled.art / "plan.json").read_text())
    assert [(s["name"], s["op_type"], s["provider"]) for s in plan["steps"]] == [
        (name, "ConvNhwc", "c") for name in CASES
    ]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", list(CASES))
def test_matches_the_reference(outputs: dict[int, dict[str, np.ndarray]], compiled: Compiled, name: str,
                               threads: int) -> None:
    _check(outputs[threads], compiled.expected, name)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 CPU builds")
def test_portable_build_matches_the_reference(compiled: Compiled, monkeypatch: pytest.MonkeyPatch) -> None:
    # SSE: four vectors per panel, two pixel rows per tile
    monkeypatch.setenv(TEST_FLAGS_ENV, " ".join(MARCH_FEATURES["x86-64-v2"]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        session = Session(compiled.art, threads=2)
    assert session.cpu_build is not None and session.cpu_build.march == "x86-64-v2"
    got = dict(zip([o.name for o in session.outputs], session.run(None, compiled.feeds), strict=True))
    for name in CASES:
        _check(got, compiled.expected, name)


def _kernel_of(compiled: Compiled, step: str) -> str:
    """The C function that runs ``step`` (model.c calls step functions through their kernel), with
    the parts of it that run on the worker pool (defined ahead of it)."""
    source = (compiled.art / "kernels" / "cpu" / "model.c").read_text()
    plan = json.loads((compiled.art / "plan.json").read_text())
    index = next(s["index"] for s in plan["steps"] if s["name"] == step)
    call = re.search(rf"/\* step {index}: .*?\*/\s*(k_[0-9a-f]{{16}})\(", source, re.S)
    assert call is not None, f"no call of step {index}"
    name = call.group(1)
    end = source.index(f"void {name}(")
    body = source[source.index(f"void {name}") :]
    return body[: body.index("\n}\n", end - source.index(f"void {name}"))]


def test_padding_methods_and_scratch(compiled: Compiled) -> None:
    plan = json.loads((compiled.art / "plan.json").read_text())
    scratch = {s["name"]: s.get("scratch") for s in plan["steps"]}
    # in place (no scratch) unless the input is copied into a zero-padded image
    for name in ("pointwise", "strided_3x3", "stem_unpadded", "dilated", "long_k", "depthwise_s2"):
        assert not scratch[name], name
    for name in ("stem_7x7", "grouped_3x3", "dilated_copy"):
        assert scratch[name], name
    assert "zeros" in _kernel_of(compiled, "strided_3x3")  # taps in the padding read zeros
    stem = _kernel_of(compiled, "stem_7x7")
    assert "memset" in stem and "for (int k = 0; k < 21; ++k" in stem  # 7 x 3 values a kernel row
    assert "const float* pb0 = xg + (pix + 0) * 32;" in _kernel_of(compiled, "pointwise")


def test_epilogue_in_the_tile(compiled: Compiled) -> None:
    body = _kernel_of(compiled, "strided_3x3")
    # bias and residual start the accumulators; the activation is applied to them when stored
    assert "vf c0_0 = vload(bt + 0) + vload(zr0 + 0)" in body
    assert re.search(r"vstore\(yr0 \+ 0, vselect\(v < vbcast\(0\.0f\)", body)
    # the partial panel (33 = 2 x 16 + 1 channels) never stores past its channel
    assert "memcpy(yr0, st, 1 * sizeof(float));" in body


def test_tiles_run_over_a_chunk_of_panels(compiled: Compiled) -> None:
    # a tile runs over its chunk's panels before the next tile; the last chunk stops at the last panel
    body = _kernel_of(compiled, "chunked")
    assert "const int p1 = ch * 2 + 2 < 5 ? ch * 2 + 2 : 5;" in body
    assert re.search(r"for \(int t = .*?\n\s*/\*.*?\*/\n\s*for \(int p = ch \* 2; p < p1; \+\+p\)", body)
    # fewer than CHUNK_MIN_PANELS panels: each runs over the block's tiles, a chunk of its own
    assert "const int p1 = ch * 1 + 1;" in _kernel_of(compiled, "long_k")


def test_unsupported_dtype_falls_back_to_the_reference(tmp_path: Path) -> None:
    # float64 is not the C kernel's: the reference provider runs the node, with the same result
    case = Case(1, 5, 6, 7, 9, k=(3, 3), p=(1, 1, 1, 1), res=True, act="Relu")
    f64 = np.dtype(np.float64)
    rng = np.random.default_rng(3)
    weights = rng.standard_normal((case.m, case.c, *case.k))
    graph = Graph("f64")
    x = graph.add_input(Value("x", f64, (case.n, case.h, case.w, case.c)))
    z = graph.add_input(Value("z", f64, case.out))
    w = add_constant(graph, "w", pack_conv_weights(weights, 1))
    b = add_constant(graph, "b", rng.standard_normal(case.m))
    y = Value("y", f64, case.out)
    graph.add_node(Node("ConvNhwc", [x, w, b, z], [y], case.attrs, name="conv", domain=AOT_DOMAIN))
    graph.outputs.append(y)
    art = compile_graph(graph, tmp_path / "art")
    plan = json.loads((art / "plan.json").read_text())
    assert [(s["op_type"], s["provider"]) for s in plan["steps"]] == [("ConvNhwc", "reference")]
    feeds = {"x": rng.standard_normal(x.shape), "z": rng.standard_normal(case.out)}
    (got,) = Session(art).run(None, feeds)
    want = _expected(case, {"conv_x": feeds["x"], "conv_z": feeds["z"]}, "conv", {"w": weights, "b": b.const})
    np.testing.assert_allclose(got, want, rtol=1e-12)
