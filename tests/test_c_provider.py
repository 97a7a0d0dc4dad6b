"""The C execution provider: generated kernels against onnxruntime, ABI, determinism, toolchain.

Each numeric case builds a one-node IR graph by hand (canonical attributes, docs/ops.md), plans
it by hand (inputs and outputs in ext slots, constants in a weights buffer, scratch in the
arena), generates and builds it with ``CProvider``, runs it through ``runtime.providers.c`` and
compares with onnxruntime on the equivalent ONNX node(s). Shapes are deliberately odd (not
multiples of any tile). Libraries go through the build cache, so reruns are fast.
"""

from __future__ import annotations

import ctypes
import json
import math
import re
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler.codegen import toolchain
from compiler.codegen.elementwise import coalesce
from compiler.codegen.elementwise import emit_program
from compiler.codegen.elementwise import literal
from compiler.codegen.elementwise import node_program
from compiler.codegen.env import render
from compiler.codegen.env import templates_dir
from compiler.codegen.options import BuildOptions
from compiler.driver import compile_model
from compiler.ir.graph import AOT_DOMAIN
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.providers.base import GeneratedC
from compiler.providers.base import GenLocation
from compiler.providers.base import GenPartition
from compiler.providers.base import GenStep
from compiler.providers.c.provider import CProvider
from runtime import Session
from runtime.errors import ArtifactError
from runtime.errors import CompileError
from runtime.errors import RuntimeKernelError
from runtime.providers.c import CLibrary
from tests.cpu_targets import host_runs
from tests.cpu_targets import level_params

RTOL, ATOL = 1e-4, 1e-5
PROVIDER = CProvider()


# -- harness ------------------------------------------------------------------------------------


def aligned_buffer(nbytes: int) -> np.ndarray:
    raw = np.zeros(nbytes + 128, np.uint8)
    start = (-raw.ctypes.data) % 64
    return raw[start : start + max(nbytes, 64)]


def _round(n: int) -> int:
    return (n + 63) // 64 * 64


@dataclass
class Built:
    graph: Graph
    lib: CLibrary | None  # None: built for a CPU level this host cannot run (text checks only)
    locations: dict[str, GenLocation]
    ext_names: tuple[str, ...]
    arena: np.ndarray
    weights: np.ndarray
    kernels_dir: Path
    facts: GeneratedC
    views: dict[str, str] = field(default_factory=dict)

    def run(self, feeds: dict[str, np.ndarray], timings: np.ndarray | None = None) -> list[np.ndarray]:
        arrays = {v.name: np.ascontiguousarray(feeds[v.name]) for v in self.graph.inputs}
        for v in self.graph.outputs:
            if self.locations[v.name].kind == "ext":
                arrays[v.name] = (
                    np.full(v.shape, np.nan, v.dtype) if v.dtype.kind == "f" else np.zeros(v.shape, v.dtype)
                )
        ext = (ctypes.c_void_p * max(1, len(self.ext_names)))(
            *[arrays[n].ctypes.data for n in self.ext_names]
        )
        t_addr = 0 if timings is None else timings.ctypes.data
        assert self.lib is not None, "built for a CPU level this host cannot run"
        self.lib.entry("part0")(ext, self.arena.ctypes.data, self.weights.ctypes.data, t_addr)
        outs = []
        for v in self.graph.outputs:
            loc = self.locations[v.name]
            if loc.kind == "ext":
                outs.append(arrays[v.name])
            else:
                outs.append(
                    self.arena[loc.offset : loc.offset + v.nbytes].view(v.dtype).reshape(v.shape).copy()
                )
        return outs


def build(
    graph: Graph,
    out_dir: Path,
    *,
    outputs_in_arena: bool = False,
    same_location: dict[str, str] | None = None,
    isa: str = "native",
) -> Built:
    """Plan ``graph`` by hand (one partition) and generate + build it into ``out_dir``.

    ``same_location`` maps a node output to an earlier value whose location it reuses (in place).
    ``isa`` is the ``-march`` value; an x86-64 level this host cannot run is built but not loaded.
    """
    same_location = same_location or {}
    locations: dict[str, GenLocation] = {}
    blobs: list[tuple[int, bytes]] = []
    w_off = 0
    for name, value in graph.constants.items():
        assert value.const is not None
        data = np.ascontiguousarray(value.const).tobytes()
        locations[name] = GenLocation("weights", w_off)
        blobs.append((w_off, data))
        w_off += _round(len(data))
    ext_names = [v.name for v in graph.inputs]
    if not outputs_in_arena:
        ext_names += [v.name for v in graph.outputs]
    for k, name in enumerate(ext_names):
        locations[name] = GenLocation("ext", k)
    a_off = 0
    steps = []
    for i, node in enumerate(graph.nodes):
        for value in node.outputs:
            if value.name in same_location:
                locations[value.name] = locations[same_location[value.name]]
            elif value.name not in locations:
                locations[value.name] = GenLocation("arena", a_off)
                a_off += _round(value.nbytes)
        scratch_n = PROVIDER.scratch_nbytes(node)
        scratch = None
        if scratch_n:
            scratch = GenLocation("arena", a_off)
            a_off += _round(scratch_n)
        ins = tuple(locations[v.name] if v is not None else None for v in node.inputs)
        outs = tuple(locations[v.name] for v in node.outputs)
        steps.append(GenStep(i, i, node, ins, outs, scratch, scratch_n))
    part = GenPartition(0, "c", "part0", tuple(steps), tuple(ext_names))
    facts = PROVIDER.generate([part], out_dir, BuildOptions(isa=isa))
    weights = aligned_buffer(w_off)
    for off, data in blobs:
        weights[off : off + len(data)] = np.frombuffer(data, np.uint8)
    lib = CLibrary(out_dir / "model.so") if isa == "native" or host_runs(isa) else None
    return Built(graph, lib, locations, tuple(ext_names), aligned_buffer(a_off), weights, out_dir, facts)


InputSpec = tuple[str, np.ndarray, bool] | None  # (name, data, is_constant)


def single_node_graph(
    op_type: str,
    inputs: list[InputSpec],
    attrs: dict[str, Any],
    out_shape: tuple[int, ...],
    out_dtype: np.dtype | type = np.float32,
    domain: str = "",
) -> Graph:
    graph = Graph("case")
    values: list[Value | None] = []
    for spec in inputs:
        if spec is None:
            values.append(None)
            continue
        name, data, const = spec
        values.append(
            graph.add_constant(name, data) if const else graph.add_input(Value(name, data.dtype, data.shape))
        )
    y = graph.make_value("y", out_dtype, out_shape)
    graph.add_node(Node(op_type, values, [y], attrs, name="n0", domain=domain))
    graph.outputs.append(y)
    graph.verify()
    return graph


def ort_eval(
    nodes: list[onnx.NodeProto], feeds: dict[str, np.ndarray], inits: dict[str, np.ndarray]
) -> np.ndarray:
    import onnxruntime as ort

    ins = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for n, a in feeds.items()
    ]
    dtype = next(iter(feeds.values())).dtype  # every case's output has its first feed's dtype
    out = [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(dtype), None)]
    graph = helper.make_graph(
        nodes, "ref", ins, out, [numpy_helper.from_array(a, n) for n, a in inits.items()]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 10
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(["y"], feeds)[0]


@dataclass
class Case:
    """One node: IR inputs/attrs, and the ONNX nodes computing the same ``y`` for onnxruntime."""

    op_type: str
    inputs: list[InputSpec]
    attrs: dict[str, Any]
    onnx_nodes: list[onnx.NodeProto] | None = None  # default: the same op with the same attrs
    onnx_inits: dict[str, np.ndarray] = field(default_factory=dict)
    domain: str = ""

    def reference(self) -> np.ndarray:
        feeds = {s[0]: s[1] for s in self.inputs if s is not None and not s[2]}
        inits = {s[0]: s[1] for s in self.inputs if s is not None and s[2]} | self.onnx_inits
        nodes = self.onnx_nodes or [
            helper.make_node(self.op_type, [s[0] if s else "" for s in self.inputs], ["y"], **self.attrs)
        ]
        return ort_eval(nodes, feeds, inits)


def check_case(case: Case, tmp_path: Path, **kw: Any) -> Built:
    ref = case.reference()
    graph = single_node_graph(case.op_type, case.inputs, case.attrs, ref.shape, ref.dtype, case.domain)
    assert PROVIDER.claims(graph) == set(graph.nodes), f"{case.op_type} not claimed"
    built = build(graph, tmp_path, **kw)
    if built.lib is None:
        return built
    feeds = {s[0]: s[1] for s in case.inputs if s is not None and not s[2]}
    (out,) = built.run(feeds)
    assert out.shape == ref.shape
    np.testing.assert_allclose(out, ref, rtol=RTOL, atol=ATOL)
    return built


RNG = np.random.default_rng(20261122)


def rand(*shape: int, scale: float = 1.0, positive: bool = False) -> np.ndarray:
    data = RNG.standard_normal(shape).astype(np.float32) * np.float32(scale)
    return np.asarray((np.abs(data) + np.float32(0.1)) if positive else data, dtype=np.float32)


# -- Conv / FusedConv ---------------------------------------------------------------------------


def conv_attrs(k: list[int], s: list[int], p: list[int], d: list[int], group: int) -> dict[str, Any]:
    return {"kernel_shape": k, "strides": s, "pads": p, "dilations": d, "group": group}


CONV_CASES = {
    "3x3_pad1": ((1, 5, 13, 11), (7, 5, 3, 3), conv_attrs([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1), True),
    "group5_stride2_asym": (
        (1, 5, 13, 11),
        (10, 1, 3, 3),
        conv_attrs([3, 3], [2, 2], [0, 1, 2, 1], [1, 1], 5),
        True,
    ),
    "depthwise": ((1, 5, 13, 11), (5, 1, 3, 3), conv_attrs([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 5), True),
    "depthwise_s2_d2_asym": (
        (2, 4, 12, 15),
        (8, 1, 3, 2),
        conv_attrs([3, 2], [2, 3], [2, 0, 1, 3], [2, 2], 4),
        True,
    ),
    "dilation2_batch2": (
        (2, 6, 13, 11),
        (7, 6, 3, 3),
        conv_attrs([3, 3], [2, 1], [2, 0, 1, 3], [2, 2], 1),
        False,
    ),
    "group2": ((1, 6, 9, 10), (4, 3, 3, 2), conv_attrs([3, 2], [1, 2], [1, 0, 0, 1], [1, 1], 2), True),
    "1x1_direct": ((1, 8, 16, 16), (12, 8, 1, 1), conv_attrs([1, 1], [1, 1], [0, 0, 0, 0], [1, 1], 1), True),
    "1x1_packed": ((1, 8, 7, 7), (13, 8, 1, 1), conv_attrs([1, 1], [1, 1], [0, 0, 0, 0], [1, 1], 1), True),
    "1x1_direct_tail": (
        (1, 9, 17, 19),
        (20, 9, 1, 1),
        conv_attrs([1, 1], [1, 1], [0, 0, 0, 0], [1, 1], 1),
        False,
    ),
    "1x1_stride2": ((1, 8, 13, 11), (9, 8, 1, 1), conv_attrs([1, 1], [2, 2], [0, 0, 0, 0], [1, 1], 1), True),
    "7x7_stem": ((1, 3, 23, 19), (8, 3, 7, 7), conv_attrs([7, 7], [2, 2], [3, 3, 3, 3], [1, 1], 1), True),
    "wide_k": ((1, 40, 6, 5), (33, 40, 3, 3), conv_attrs([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1), True),
    "conv1d": ((1, 4, 17), (6, 4, 3), conv_attrs([3], [2], [1, 2], [2], 1), True),
}


@pytest.mark.parametrize("name", list(CONV_CASES))
def test_conv(name: str, tmp_path: Path) -> None:
    xs, ws, attrs, bias = CONV_CASES[name]
    fan_in = math.prod(ws[1:])
    inputs: list[InputSpec] = [("x", rand(*xs), False), ("w", rand(*ws, scale=fan_in**-0.5), True)]
    if bias:
        inputs.append(("b", rand(ws[0]), True))
    check_case(Case("Conv", inputs, attrs), tmp_path)


def fused_conv_case(
    activation: str, *, bias: bool, residual: bool, one_by_one: bool = False, depthwise: bool = False,
    width: int = 7,
) -> Case:
    xs, ws = ((1, 6, 8, 8), (5, 6, 1, 1)) if one_by_one else ((1, 4, 9, width), (6, 4, 3, 3))
    if depthwise:
        ws = (4, 1, 3, 3)
    k = list(ws[2:])
    pads = [0, 0, 0, 0] if one_by_one else [1, 1, 1, 1]
    attrs = conv_attrs(k, [1, 1], pads, [1, 1], 4 if depthwise else 1)
    y_shape = (xs[0], ws[0], xs[2], xs[3])
    inputs: list[InputSpec] = [("x", rand(*xs), False), ("w", rand(*ws, scale=0.3), True)]
    inputs.append(("b", rand(ws[0]), True) if bias else None)
    if residual:
        inputs.append(("z", rand(*y_shape), False))
    acts = {
        "": (0.0, 0.0, 0.0),
        "Relu": (0.0, 0.0, 0.0),
        "Clip": (-0.5, 0.75, 0.0),
        "LeakyRelu": (0.0, 0.0, 0.1),
    }
    lo, hi, alpha = acts[activation]
    fused = attrs | {"activation": activation, "act_min": lo, "act_max": hi, "act_alpha": alpha}
    nodes = [helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["c"], **attrs)]
    last = "c"
    if residual:
        nodes.append(helper.make_node("Add", ["c", "z"], ["r"]))
        last = "r"
    inits: dict[str, np.ndarray] = {}
    if activation == "Relu":
        nodes.append(helper.make_node("Relu", [last], ["y"]))
    elif activation == "Clip":
        inits = {"lo": np.array(lo, np.float32), "hi": np.array(hi, np.float32)}
        nodes.append(helper.make_node("Clip", [last, "lo", "hi"], ["y"]))
    elif activation == "LeakyRelu":
        nodes.append(helper.make_node("LeakyRelu", [last], ["y"], alpha=alpha))
    else:
        nodes.append(helper.make_node("Identity", [last], ["y"]))
    while inputs[-1] is None:
        inputs.pop()
    return Case("FusedConv", inputs, fused, nodes, inits, AOT_DOMAIN)


@pytest.mark.parametrize(
    "activation,bias,residual,kind",
    [
        ("Relu", True, False, "3x3"),
        ("Clip", False, False, "3x3"),
        ("LeakyRelu", True, True, "3x3"),
        ("", False, True, "3x3"),
        ("Relu", True, True, "1x1"),
        ("Clip", True, True, "depthwise"),
    ],
)
def test_fused_conv(activation: str, bias: bool, residual: bool, kind: str, tmp_path: Path) -> None:
    case = fused_conv_case(
        activation, bias=bias, residual=residual, one_by_one=kind == "1x1", depthwise=kind == "depthwise"
    )
    check_case(case, tmp_path)


@pytest.mark.parametrize("activation", ["", "Relu", "Clip", "LeakyRelu"])
def test_fused_conv_many_panels_with_nan_and_inf(activation: str, tmp_path: Path) -> None:
    # enough output pixels for many panels on any target (each packed just before its tiles run),
    # 7 output channels (a tail row block), and NaN/Inf flowing through the in-register epilogue
    case = fused_conv_case(activation, bias=True, residual=True)
    x = rand(1, 4, 23, 29)
    x[0, 1, 5, 7], x[0, 2, 11, 3], x[0, 0, 20, 28] = np.nan, np.inf, -np.inf
    w = rand(7, 4, 3, 3, scale=0.3)
    z = rand(1, 7, 23, 29)
    z[0, 3, 0, 0] = np.nan
    case.inputs = [("x", x, False), ("w", w, True), ("b", rand(7), True), ("z", z, False)]
    built = check_case(case, tmp_path)
    (out,) = built.run({"x": x, "z": z})
    assert np.isnan(out).any() and np.isfinite(out).any()


KERNEL_DEF = re.compile(r"^void (k_[0-9a-f]{16})\(", re.M)


def step_function(source: str, fn: str | None = None) -> str:
    """The text of kernel function ``fn`` (the only one when None), from its first worker-pool
    part (``<fn>_<name>``, defined ahead of it) on."""
    if fn is None:
        (fn,) = KERNEL_DEF.findall(source)
    end = source.index("\n}\n", source.index(f"void {fn}("))
    part = source.find(f"void {fn}_")
    start = part if 0 <= part < end else source.index(f"void {fn}(")
    return source[start : end + 3]


@pytest.mark.parametrize("isa", level_params())
def test_fused_conv_epilogue_is_inside_the_conv_function(isa: str, tmp_path: Path) -> None:
    # 9 x 15 = 135 output pixels: whole register tiles at every vector width (64 pixels at v4)
    built = check_case(fused_conv_case("Relu", bias=True, residual=False, width=15), tmp_path, isa=isa)
    source = (built.kernels_dir / "model.c").read_text()
    assert len(KERNEL_DEF.findall(source)) == 1  # one kernel for conv + bias + ReLU
    body = step_function(source)
    tile_loop = body[body.index("for (int k = 0;") :]
    assert "v += biasp[" in tile_loop  # bias in the tile epilogue, after the k loop (tail tiles)
    # full tiles add the bias and apply ReLU to the accumulator registers and store them once
    assert "v += bm;" in tile_loop and "vstore(crow + 0, vselect(v < vbcast(0.0f)" in tile_loop
    assert "crow[j] = (v < 0.0f ? 0.0f : v);" in tile_loop  # ReLU applied on the store


# -- Gemm / FusedGemm / MatMul -------------------------------------------------------------------


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_transposes(trans_a: int, trans_b: int, tmp_path: Path) -> None:
    m, n, k = 17, 29, 33
    a = rand(*((k, m) if trans_a else (m, k)))
    b = rand(*((n, k) if trans_b else (k, n)), scale=0.2)
    attrs = {"alpha": 0.5, "beta": 2.0, "transA": trans_a, "transB": trans_b}
    check_case(Case("Gemm", [("a", a, False), ("b", b, True), ("c", rand(n), True)], attrs), tmp_path)


@pytest.mark.parametrize(
    "m,n,k,trans_b,c_shape",
    [
        (17, 29, 33, 0, (17, 29)),  # full bias
        (17, 29, 33, 1, (17, 1)),  # row bias, packed B^T
        (1, 40, 64, 1, (40,)),  # one row: dot products
        (3, 45, 70, 1, (1,)),  # few rows: dot products, scalar bias
        (5, 1, 37, 0, None),  # one column: dot products
        (70, 100, 19, 0, (1, 100)),  # tail panel, tail rows
        (1, 1000, 300, 0, (1000,)),  # a classifier row with B not transposed
        (23, 70, 1024, 0, (70,)),  # A's rows 4 KB apart: A copied into row blocks too (tail block)
        (37, 19, 2048, 1, None),  # the same with B^T packed
    ],
)
def test_gemm_paths(
    m: int, n: int, k: int, trans_b: int, c_shape: tuple[int, ...] | None, tmp_path: Path
) -> None:
    b = rand(*((n, k) if trans_b else (k, n)), scale=k**-0.5)
    inputs: list[InputSpec] = [("a", rand(m, k), False), ("b", b, True)]
    if c_shape is not None:
        inputs.append(("c", rand(*c_shape), True))
    check_case(Case("Gemm", inputs, {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": trans_b}), tmp_path)


@pytest.mark.parametrize("m", [2, 19])
def test_fused_gemm(m: int, tmp_path: Path) -> None:
    n, k = 23, 31
    attrs = {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 1}
    fused = attrs | {"activation": "Relu", "act_min": 0.0, "act_max": 0.0, "act_alpha": 0.0}
    inputs: list[InputSpec] = [
        ("a", rand(m, k), False),
        ("b", rand(n, k, scale=0.2), True),
        ("c", rand(n), True),
    ]
    nodes = [
        helper.make_node("Gemm", ["a", "b", "c"], ["g"], **attrs),
        helper.make_node("Relu", ["g"], ["y"]),
    ]
    check_case(Case("FusedGemm", inputs, fused, nodes, {}, AOT_DOMAIN), tmp_path)


@pytest.mark.parametrize(
    "a_shape,b_shape",
    [
        ((17, 29), (29, 33)),
        ((2, 3, 5, 7), (7, 4)),
        ((3, 1, 5, 7), (1, 4, 7, 6)),
        ((2, 6, 9), (2, 9, 20)),
        ((2, 19, 1024), (1024, 40)),  # A's rows 4 KB apart: row blocks of every batch copied
        ((7,), (7, 5)),
        ((5, 7), (7,)),
        ((4, 5, 7), (7,)),
        ((9,), (9,)),
    ],
)
def test_matmul(a_shape: tuple[int, ...], b_shape: tuple[int, ...], tmp_path: Path) -> None:
    b = rand(*b_shape, scale=b_shape[-2 if len(b_shape) > 1 else 0] ** -0.5)  # outputs of unit scale
    check_case(Case("MatMul", [("a", rand(*a_shape), False), ("b", b, False)], {}), tmp_path)


# -- pooling, normalization, softmax -------------------------------------------------------------


def pool_attrs(k: list[int], s: list[int], p: list[int], ceil: int, **extra: Any) -> dict[str, Any]:
    return {"kernel_shape": k, "strides": s, "pads": p, "ceil_mode": ceil} | extra


POOL_CASES = {
    "max_3x3_s2_p1": (
        "MaxPool",
        (1, 5, 13, 11),
        pool_attrs([3, 3], [2, 2], [1, 1, 1, 1], 0, dilations=[1, 1]),
    ),
    "max_ceil": ("MaxPool", (1, 3, 13, 11), pool_attrs([2, 2], [2, 2], [0, 0, 0, 0], 1, dilations=[1, 1])),
    "max_dilated_asym": (
        "MaxPool",
        (2, 3, 12, 11),
        pool_attrs([3, 2], [1, 2], [0, 1, 2, 0], 0, dilations=[2, 1]),
    ),
    "max_1d": ("MaxPool", (1, 3, 17), pool_attrs([3], [2], [1, 1], 0, dilations=[1])),
    "avg_exclude_pad": (
        "AveragePool",
        (1, 5, 13, 11),
        pool_attrs([3, 3], [2, 2], [1, 1, 1, 1], 0, count_include_pad=0),
    ),
    "avg_include_pad": (
        "AveragePool",
        (1, 5, 13, 11),
        pool_attrs([3, 3], [2, 2], [1, 0, 1, 2], 0, count_include_pad=1),
    ),
    "avg_ceil_include": (
        "AveragePool",
        (1, 2, 12, 11),
        pool_attrs([3, 3], [2, 2], [1, 1, 1, 1], 1, count_include_pad=1),
    ),
    "avg_ceil_exclude": (
        "AveragePool",
        (1, 2, 12, 11),
        pool_attrs([2, 3], [2, 2], [0, 0, 0, 0], 1, count_include_pad=0),
    ),
    # stride 1 with long interior runs (Inception's branch pools), both count modes
    "avg_s1_exclude_wide": (
        "AveragePool",
        (1, 3, 9, 37),
        pool_attrs([3, 3], [1, 1], [1, 1, 1, 1], 0, count_include_pad=0),
    ),
    "avg_s1_include_asym": (
        "AveragePool",
        (2, 3, 8, 29),
        pool_attrs([3, 5], [1, 1], [1, 2, 0, 1], 0, count_include_pad=1),
    ),
    "max_s1_wide": ("MaxPool", (1, 4, 7, 41), pool_attrs([3, 3], [1, 1], [1, 1, 1, 1], 0, dilations=[1, 1])),
    # the window wider than the padded row: no interior columns at all
    "avg_no_interior": (
        "AveragePool",
        (1, 2, 6, 3),
        pool_attrs([3, 5], [1, 1], [1, 1, 1, 1], 0, count_include_pad=0),
    ),
}


@pytest.mark.parametrize("name", list(POOL_CASES))
def test_pool(name: str, tmp_path: Path) -> None:
    op, xs, attrs = POOL_CASES[name]
    check_case(Case(op, [("x", rand(*xs), False)], attrs), tmp_path)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pool(op: str, tmp_path: Path) -> None:
    check_case(Case(op, [("x", rand(2, 5, 13, 11), False)], {}), tmp_path)


def test_batchnorm(tmp_path: Path) -> None:
    c = 5
    inputs: list[InputSpec] = [
        ("x", rand(2, c, 13, 11), False),
        ("scale", rand(c), True),
        ("b", rand(c), True),
        ("mean", rand(c), True),
        ("var", rand(c, positive=True), True),
    ]
    check_case(Case("BatchNormalization", inputs, {"epsilon": 1e-5}), tmp_path)


@pytest.mark.parametrize("size", [3, 5])
def test_lrn(size: int, tmp_path: Path) -> None:
    attrs = {"alpha": 1e-3, "beta": 0.75, "bias": 2.0, "size": size}
    check_case(Case("LRN", [("x", rand(1, 7, 5, 6), False)], attrs), tmp_path)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("shape,axis", [((3, 4, 5), 0), ((3, 4, 5), 1), ((3, 4, 5), 2), ((7, 1000), 1)])
def test_softmax(op: str, shape: tuple[int, ...], axis: int, tmp_path: Path) -> None:
    check_case(Case(op, [("x", rand(*shape, scale=3.0), False)], {"axis": axis}), tmp_path)


# -- data movement -----------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [0, 1, 3])
def test_concat(axis: int, tmp_path: Path) -> None:
    shapes = [[2, 3, 4, 5] for _ in range(3)]
    for k, s in enumerate(shapes):
        s[axis] += k
    inputs: list[InputSpec] = [
        ("x0", rand(*shapes[0]), False),
        ("x1", rand(*shapes[1]), True),
        ("x2", rand(*shapes[2]), False),
    ]
    check_case(Case("Concat", inputs, {"axis": axis}), tmp_path)


def test_concat_int64(tmp_path: Path) -> None:
    inputs: list[InputSpec] = [
        ("x0", np.arange(6, dtype=np.int64).reshape(2, 3), False),
        ("x1", np.arange(4, dtype=np.int64).reshape(2, 2), False),
    ]
    check_case(Case("Concat", inputs, {"axis": 1}), tmp_path)


@pytest.mark.parametrize(
    "shape,perm", [((2, 3, 4, 5), [0, 2, 3, 1]), ((2, 3, 4, 5), [3, 1, 0, 2]), ((37, 300), [1, 0])]
)
def test_transpose(shape: tuple[int, ...], perm: list[int], tmp_path: Path) -> None:
    check_case(Case("Transpose", [("x", rand(*shape), False)], {"perm": perm}), tmp_path)


def test_reshape_identity_copy(tmp_path: Path) -> None:
    x = rand(2, 3, 4)
    graph = Graph("views")
    xv = graph.add_input(Value("x", np.float32, x.shape))
    a = graph.make_value("a", np.float32, (6, 4))
    b = graph.make_value("b", np.float32, (24,))
    c = graph.make_value("c", np.float32, (24,))
    y = graph.make_value("y", np.float32, (24,))
    graph.add_node(Node("Reshape", [xv], [a], {"shape": [6, 4]}, name="r0"))  # ext -> arena: memcpy
    graph.add_node(Node("Reshape", [a], [b], {"shape": [24]}, name="r1"))  # same address: no code
    graph.add_node(Node("Identity", [b], [c], {}, name="id"))  # same address: no code
    graph.add_node(Node("Copy", [c], [y], {}, name="cp", domain=AOT_DOMAIN))  # arena -> ext
    graph.outputs.append(y)
    assert PROVIDER.claims(graph) == set(graph.nodes)
    built = build(graph, tmp_path, same_location={"b": "a", "c": "a"})
    (out,) = built.run({"x": x})
    np.testing.assert_array_equal(out, x.reshape(-1))
    source = (built.kernels_dir / "model.c").read_text()
    # the two copies are the same kernel (same size and types): one function, called twice
    (fn,) = KERNEL_DEF.findall(source)
    assert source.count(f"  {fn}((const uint32_t*)") == 2


# -- elementwise -------------------------------------------------------------------------------

UNARY_ATTRS: dict[str, dict[str, Any]] = {
    "Relu": {}, "Sigmoid": {}, "Tanh": {}, "Exp": {}, "Log": {}, "Neg": {}, "Abs": {}, "Sqrt": {},
    "Reciprocal": {}, "Erf": {}, "Floor": {}, "Ceil": {}, "Softplus": {}, "Sign": {}, "Sin": {}, "Cos": {},
    "LeakyRelu": {"alpha": 0.01}, "Elu": {"alpha": 0.7}, "HardSigmoid": {"alpha": 0.3, "beta": 0.4},
    "Gelu": {"approximate": "none"}, "HardSwish": {},
}  # fmt: skip
POSITIVE = {"Log", "Sqrt", "Reciprocal"}


@pytest.mark.parametrize("op", list(UNARY_ATTRS))
def test_unary(op: str, tmp_path: Path) -> None:
    x = rand(3, 5, 7, scale=2.0, positive=op in POSITIVE)
    check_case(Case(op, [("x", x, False)], UNARY_ATTRS[op]), tmp_path)


@pytest.mark.parametrize("lo,hi", [(-0.5, 0.8), (0.0, math.inf), (-math.inf, 6.0)])
def test_clip(lo: float, hi: float, tmp_path: Path) -> None:
    inits = {"lo": np.array(max(lo, -3.4e38), np.float32), "hi": np.array(min(hi, 3.4e38), np.float32)}
    nodes = [helper.make_node("Clip", ["x", "lo", "hi"], ["y"])]
    check_case(Case("Clip", [("x", rand(4, 9), False)], {"min": lo, "max": hi}, nodes, inits), tmp_path)


def test_hard_swish_across_its_bends(tmp_path: Path) -> None:
    x = np.concatenate([np.linspace(-5, 5, 41), [-3.0, 3.0, -0.0, 1e-30]]).astype(np.float32)
    check_case(Case("HardSwish", [("x", x, False)], {}), tmp_path)


def test_gelu_tanh_large_parallel(tmp_path: Path) -> None:
    check_case(Case("Gelu", [("x", rand(70001), False)], {"approximate": "tanh"}), tmp_path)


BINARY_SHAPES = [
    ((2, 3, 4, 5), (2, 3, 4, 5)),
    ((2, 3, 4, 5), (3, 1, 5)),
    ((1, 3, 1, 5), (2, 1, 4, 1)),
    ((7, 1), (1,)),
]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"])
@pytest.mark.parametrize(
    "shapes", BINARY_SHAPES, ids=lambda s: "x".join(map(str, s[0])) + "_" + "x".join(map(str, s[1]))
)
def test_binary(op: str, shapes: tuple[tuple[int, ...], tuple[int, ...]], tmp_path: Path) -> None:
    a = rand(*shapes[0], positive=op == "Pow")
    b = rand(*shapes[1], positive=op == "Div")
    check_case(Case(op, [("a", a, False), ("b", b, True)], {}), tmp_path)


def test_binary_large_broadcast(tmp_path: Path) -> None:
    check_case(Case("Add", [("a", rand(1, 64, 30, 31), False), ("b", rand(64, 1, 1), True)], {}), tmp_path)


def test_pow_scalar_constant(tmp_path: Path) -> None:
    built = check_case(
        Case("Pow", [("a", rand(5, 6), False), ("e", np.array(2.0, np.float32), True)], {}), tmp_path
    )
    assert "(x0 * x0)" in (built.kernels_dir / "model.c").read_text()


@pytest.mark.parametrize("op", ["Sum", "Mean", "Max", "Min"])
def test_variadic(op: str, tmp_path: Path) -> None:
    inputs: list[InputSpec] = [("a", rand(3, 4, 5), False), ("b", rand(4, 1), False), ("c", rand(5), True)]
    check_case(Case(op, inputs, {}), tmp_path)


def test_fused_elementwise(tmp_path: Path) -> None:
    program = [
        {"op": "Mul", "args": ["i0", "i1"], "attrs": {}},
        {"op": "Add", "args": ["t0", "i2"], "attrs": {}},
        {"op": "Clip", "args": ["t1"], "attrs": {"min": -1.0, "max": 1.5}},
        {"op": "Less", "args": ["t2", "i1"], "attrs": {}},
        {"op": "Sigmoid", "args": ["t2"], "attrs": {}},
        {"op": "Where", "args": ["t3", "t4", "t1"], "attrs": {}},
    ]
    inputs: list[InputSpec] = [("a", rand(2, 3, 9), False), ("b", rand(3, 1), False), ("c", rand(9), True)]
    inits = {"lo": np.array(-1.0, np.float32), "hi": np.array(1.5, np.float32)}
    nodes = [
        helper.make_node("Mul", ["a", "b"], ["t0"]),
        helper.make_node("Add", ["t0", "c"], ["t1"]),
        helper.make_node("Clip", ["t1", "lo", "hi"], ["t2"]),
        helper.make_node("Less", ["t2", "b"], ["t3"]),
        helper.make_node("Sigmoid", ["t2"], ["t4"]),
        helper.make_node("Where", ["t3", "t4", "t1"], ["y"]),
    ]
    check_case(Case("FusedElementwise", inputs, {"program": program}, nodes, inits, AOT_DOMAIN), tmp_path)


def test_elementwise_in_place(tmp_path: Path) -> None:
    """Relu and a broadcasting Add writing over their input (output address == input address)."""
    x, bias = rand(1, 6, 33, 35), rand(6, 1, 1)
    graph = Graph("inplace")
    xv = graph.add_input(Value("x", np.float32, x.shape))
    bv = graph.add_constant("bias", bias)
    t0, t1, t2, y = (graph.make_value(n, np.float32, x.shape) for n in ("t0", "t1", "t2", "y"))
    graph.add_node(Node("Copy", [xv], [t0], {}, name="cp0", domain=AOT_DOMAIN))
    graph.add_node(Node("Relu", [t0], [t1], {}, name="relu"))
    graph.add_node(Node("Add", [t1, bv], [t2], {}, name="add"))
    graph.add_node(Node("Copy", [t2], [y], {}, name="cp1", domain=AOT_DOMAIN))
    graph.outputs.append(y)
    built = build(graph, tmp_path, same_location={"t1": "t0", "t2": "t0"})
    assert built.locations["t2"] == built.locations["t0"]
    timings = np.full(4, -1.0)
    (out,) = built.run({"x": x}, timings)
    np.testing.assert_allclose(out, np.maximum(x, 0) + bias, rtol=RTOL, atol=ATOL)
    assert (timings >= 0).all()


# -- claims ----------------------------------------------------------------------------------------


def test_claims_reject_what_the_kernels_cannot_do() -> None:
    graph = Graph("rejects")
    x3 = graph.add_input(Value("x3", np.float32, (1, 2, 5, 5, 5)))
    w3 = graph.add_constant("w3", rand(3, 2, 1, 1, 1))
    xi = graph.add_input(Value("xi", np.int64, (4,)))
    x = graph.add_input(Value("x", np.float32, (1, 2, 5, 5)))
    w = graph.add_constant("w", rand(3, 2, 3, 3))
    specs = [
        (np.float32, (1, 3, 5, 5, 5)),
        (np.int64, (4,)),
        (np.float32, (1, 3, 3, 3)),
        (np.float32, (1, 2, 5, 5)),
        (np.float32, (1, 2, 5, 5)),
    ]
    outs = [graph.make_value(f"o{k}", dt, s) for k, (dt, s) in enumerate(specs)]
    conv = conv_attrs([1, 1, 1], [1, 1, 1], [0] * 6, [1, 1, 1], 1)
    graph.add_node(Node("Conv", [x3, w3], [outs[0]], conv, name="conv3d"))
    graph.add_node(Node("Add", [xi, xi], [outs[1]], {}, name="int_add"))
    bad_act = conv_attrs([3, 3], [1, 1], [0] * 4, [1, 1], 1) | {
        "activation": "Swish",
        "act_min": 0.0,
        "act_max": 0.0,
        "act_alpha": 0.0,
    }
    graph.add_node(Node("FusedConv", [x, w], [outs[2]], bad_act, name="swish", domain=AOT_DOMAIN))
    graph.add_node(Node("Mish", [x], [outs[3]], {}, name="unknown"))
    graph.add_node(Node("Relu", [x], [outs[4]], {}, name="ok"))
    assert {n.name for n in PROVIDER.claims(graph)} == {"ok"}
    assert PROVIDER.name == "c" and PROVIDER.memory_space == "host" and PROVIDER.alignment == 64


# -- ABI, determinism, toolchain -------------------------------------------------------------------


def tiny_graph() -> Graph:
    return single_node_graph("Relu", [("x", rand(3, 4), False)], {}, (3, 4))


def test_generate_is_byte_identical(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    graph = single_node_graph("Conv", [("x", rand(1, 3, 9, 9), False), ("w", rand(4, 3, 3, 3), True)],
                              conv_attrs([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1), (1, 4, 9, 9))  # fmt: skip
    results = []
    for k in range(2):
        monkeypatch.setenv("ONNX_AOT_CACHE_DIR", str(tmp_path / f"cache{k}"))  # really compile twice
        built = build(graph, tmp_path / f"build{k}")
        (only,) = built.facts.builds
        assert only.source == "model.c" and only.library == "model.so"
        assert "-O3" in only.flags and "-ffast-math" not in only.flags
        results.append(
            ((tmp_path / f"build{k}/model.c").read_bytes(), (tmp_path / f"build{k}/model.so").read_bytes())
        )
    assert results[0][0] == results[1][0]
    assert results[0][1] == results[1][1]


def test_build_cache_hits_the_second_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONNX_AOT_CACHE_DIR", str(tmp_path / "cache"))
    source = "int onnx_aot_cache_probe(void) { return 7; }\n"
    first = toolchain.build_units([source], tmp_path / "a.so", BuildOptions())
    second = toolchain.build_units([source], tmp_path / "b.so", BuildOptions())
    assert first.cached is False and second.cached is True
    assert (tmp_path / "a.so").read_bytes() == (tmp_path / "b.so").read_bytes()
    assert len(list((tmp_path / "cache").glob("*.so"))) == 1


def test_compile_error_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONNX_AOT_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(CompileError, match="error") as info:
        toolchain.build_units(["void broken( {\n"], tmp_path / "bad.so", BuildOptions(), "bad.c")
    assert f"C compilation of {tmp_path / 'bad.c'} failed in kernel broken" in str(info.value)
    assert not (tmp_path / "bad.so").exists()


def test_runtime_library_errors_and_threads(tmp_path: Path) -> None:
    built = build(tiny_graph(), tmp_path / "ok")
    x = rand(3, 4)
    for threads in (1, 2):
        built.lib.set_threads(threads)
        np.testing.assert_array_equal(built.run({"x": x})[0], np.maximum(x, 0))
    built.lib.set_threads(0)
    # two objects over one library path keep their own thread counts (the library's is global)
    import runtime.providers.c as run_c

    other = CLibrary(built.kernels_dir / "model.so")
    other.set_threads(2)
    built.lib.set_threads(1)
    other_out = np.empty_like(x)
    ext = (ctypes.c_void_p * 2)(x.ctypes.data, other_out.ctypes.data)
    other.entry("part0")(ext, built.arena.ctypes.data, built.weights.ctypes.data, 0)
    assert run_c._THREADS_IN_LIBRARY[other._handle] == 2
    built.run({"x": x})
    assert run_c._THREADS_IN_LIBRARY[other._handle] == 1
    np.testing.assert_array_equal(other_out, np.maximum(x, 0))
    with pytest.raises(RuntimeKernelError, match="returned 1"):
        built.lib.entry("part0")(None, 0, 0, 0)  # type: ignore[arg-type]
    with pytest.raises(ArtifactError, match="no entry"):
        built.lib.entry("missing_entry")
    (tmp_path / "junk.so").write_bytes(b"not a library")
    with pytest.raises(ArtifactError, match="junk.so"):
        CLibrary(tmp_path / "junk.so")


def test_bad_entry_symbol_is_rejected(tmp_path: Path) -> None:
    graph = tiny_graph()
    node = graph.nodes[0]
    step = GenStep(0, 0, node, (GenLocation("ext", 0),), (GenLocation("ext", 1),), None, 0)
    with pytest.raises(CompileError, match="entry symbol"):
        PROVIDER.generate([GenPartition(0, "c", "step_0", (step,), ("x", "y"))], tmp_path, BuildOptions())


# -- emitter and environment ---------------------------------------------------------------------


def test_emitter_literals_and_index_math() -> None:
    for value in (0.1, 1e-5, -2.0, 3.4028235e38, 1.0 / 3.0):
        text = literal(value)
        assert np.float32(float(text.strip("()").rstrip("f"))) == np.float32(value)
    assert literal(math.inf) == "INFINITY" and literal(-math.inf) == "(-INFINITY)"
    dims, strides = coalesce((2, 3, 4, 5), [(60, 20, 5, 1), (0, 5, 0, 1)])
    assert dims == (2, 3, 4, 5) and strides[1] == (0, 5, 0, 1)
    dims, strides = coalesce((2, 3, 4, 5), [(60, 20, 5, 1), (60, 20, 5, 1)])
    assert dims == (120,) and strides == ((1,), (1,))
    program = node_program("Clip", {"min": 0.0, "max": math.inf}, 1)
    assert emit_program(program, ["x"]).temps == (("float", "t0", "(x < 0.0f ? 0.0f : x)"),)


def test_environment_finds_templates_and_wants_frozen_contexts() -> None:
    assert (templates_dir() / "c" / "model.c.j2").is_file()

    @dataclass
    class Loose:
        fn: str

    with pytest.raises(TypeError, match="frozen"):
        render("c/copy.c.j2", Loose("f"))


@pytest.mark.parametrize("level", level_params())
@pytest.mark.parametrize("m,k,n,trans_b", [(23, 1024, 250, 0), (13, 37, 250, 1), (40, 64, 64, 1)])
def test_packed_gemm_at_every_level(level: str, m: int, k: int, n: int, trans_b: int, tmp_path: Path) -> None:
    """A Gemm whose constant B the C target packs into 64-column panels ahead of time
    (onnx_aot.PackedGemm), with a Relu folded in: tail tiles, tail panels, A copied into row
    blocks when its rows are 4 KB apart; each x86-64 level's tile width reads the same panels."""
    b, c = rand(*((n, k) if trans_b else (k, n)), scale=k**-0.5), rand(n)
    nodes = [helper.make_node("Gemm", ["a", "b", "c"], ["g"], transB=trans_b),
             helper.make_node("Relu", ["g"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
                              [numpy_helper.from_array(b, "b"), numpy_helper.from_array(c, "c")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    out = compile_model(model, tmp_path / "a", cpu=level, golden_cases=0)
    plan = json.loads((out / "plan.json").read_text())
    assert [(s["op_type"], s["provider"]) for s in plan["steps"]] == [("PackedGemm", "c")]
    if not host_runs(level):
        return
    a = rand(m, k)
    (y,) = Session(out).run(None, {"a": a})
    want = np.maximum(a.astype(np.float64) @ (b.T if trans_b else b).astype(np.float64) + c, 0)
    np.testing.assert_allclose(y, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("level", level_params())
def test_elementwise_chain_runs_on_vectors_at_every_level(level: str, tmp_path: Path) -> None:
    """A chain with transcendental functions fused into one FusedElementwise runs its innermost
    loop on whole vectors (the vector math, elementwise_vector.py) and the scalar program for the
    tail (37 = 2 x 16 + 5): a contiguous operand, one broadcast along that loop, a constant."""
    names = ["Tanh", "Add", "Sigmoid", "HardSwish", "Erf"]
    nodes = [helper.make_node("Mul", ["x", "half"], ["t0"])]
    for k, op in enumerate(names):
        args = [f"t{k}", "b"] if op == "Add" else [f"t{k}"]
        nodes.append(helper.make_node(op, args, [f"t{k + 1}"] if k + 1 < len(names) else ["y"]))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 37]),
              helper.make_tensor_value_info("b", TensorProto.FLOAT, [5, 1])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 37])]
    half = numpy_helper.from_array(np.array(0.5, np.float32), "half")
    graph = helper.make_graph(nodes, "g", inputs, outputs, [half])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    out = compile_model(model, tmp_path / "a", cpu=level, golden_cases=0)
    source = (out / "kernels" / "cpu" / "model.c").read_text()
    kernels = source[source.index("const vf x0 ="):]  # the kernels, after the vector math's definitions
    assert "= vtanh(v" in kernels and "= vsigmoid(v" in kernels and "= verf(x0)" in kernels
    assert "vbcast(in2[" in kernels  # b, broadcast along the vector loop
    if not host_runs(level):
        return
    x, b = rand(5, 37, scale=3.0), rand(5, 1)
    (y,) = Session(out).run(None, {"x": x, "b": b})
    s = 1 / (1 + np.exp(-(np.tanh(x.astype(np.float64) * 0.5) + b)))
    want = np.vectorize(math.erf)(s * np.clip(s / 6 + 0.5, 0, 1))
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-7)
