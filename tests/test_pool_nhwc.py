"""The C kernels of the channels-last pools: MaxPoolNhwc, AveragePoolNhwc, GlobalAveragePoolNhwc,
LRNNhwc (compiler/providers/c/pool_nhwc.py, templates/c/pool_nhwc.c.j2, channel_nhwc.c.j2).

Each test compiles one IR graph holding several nodes on shapes the zoo does not have (odd sizes,
channel counts below, at and past a vector, batch 2, asymmetric and oversized pads, ceil mode,
dilations, count_include_pad both ways), checks in plan.json that every node ran in C, and
compares with the reference kernels of runtime/kernels/nhwc.py: MaxPool and AveragePool to the
bit (the kernels fold the taps in the reference's order), NaN and -Inf included; GlobalAveragePool
and LRN (float32 sums, square roots) within float32 rounding. The x86-64-v2 build (4-float
vectors) runs the same cases; the x86-64-v4 build (AVX-512) is compiled. Textual checks: the
interior pixels' taps are unrolled at constant offsets, LRN's beta 0.75 uses square roots.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from compiler.codegen.options import BuildOptions
from compiler.driver import compile_graph
from compiler.ir.evaluate import evaluate
from compiler.ir.graph import AOT_DOMAIN
from compiler.ir.graph import Graph
from compiler.providers.c.pool_nhwc import MAX_LRN_CHANNELS
from compiler.providers.c.pool_nhwc import channel_walk
from compiler.providers.c.provider import CProvider
from runtime import Session
from runtime.kernels.window import pool_out_size
from tests.cpu_targets import level_params
from tests.support.graphs import Builder

# (name, NHWC shape, kernel, strides, pads, dilations, ceil_mode)
POOLS: list[tuple[str, tuple[int, int, int, int], list[int], list[int], list[int], list[int], int]] = [
    ("k3s2_ceil_asym", (2, 9, 11, 13), [3, 3], [2, 2], [1, 0, 1, 2], [1, 1], 1),
    ("k3s1_c5", (1, 12, 10, 5), [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 0),
    ("k2s2_c40", (2, 7, 8, 40), [2, 2], [2, 2], [0, 0, 0, 0], [1, 1], 0),
    ("k3s2_ceil_c19", (1, 10, 10, 19), [3, 3], [2, 2], [0, 0, 0, 0], [1, 1], 1),
    ("k3_dilated", (1, 9, 8, 17), [3, 3], [1, 2], [2, 1, 2, 1], [2, 1], 0),
    ("k2_pads_past_kernel", (1, 3, 3, 8), [2, 2], [1, 1], [2, 2, 2, 2], [1, 1], 0),
    ("k3s2p1_c64", (1, 15, 15, 64), [3, 3], [2, 2], [1, 1, 1, 1], [1, 1], 0),
    ("k5x3_c70_asym", (2, 8, 9, 70), [5, 3], [2, 1], [2, 0, 1, 1], [1, 1], 1),
    ("k7_whole", (1, 7, 7, 36), [7, 7], [1, 1], [0, 0, 0, 0], [1, 1], 0),
    ("k9_taps_in_loops", (1, 12, 11, 12), [9, 9], [1, 2], [1, 2, 0, 1], [1, 1], 0),  # 81 taps
]


def _pool_attrs(kind: str, kernel: list[int], strides: list[int], pads: list[int], dilations: list[int],
                ceil: int, include_pad: int) -> dict[str, Any]:  # fmt: skip
    attrs: dict[str, Any] = {"kernel_shape": kernel, "strides": strides, "pads": pads, "ceil_mode": ceil}
    if kind == "MaxPoolNhwc" or dilations != [1, 1]:
        attrs["dilations"] = dilations
    if kind == "AveragePoolNhwc":
        attrs["count_include_pad"] = include_pad
    return attrs


def _out_shape(shape: tuple[int, ...], attrs: dict[str, Any]) -> tuple[int, int, int, int]:
    n, h, w, c = shape
    k, s, p = attrs["kernel_shape"], attrs["strides"], attrs["pads"]
    d = attrs.get("dilations", [1, 1])
    oh = pool_out_size(h, k[0], s[0], d[0], p[0], p[2], attrs["ceil_mode"])
    ow = pool_out_size(w, k[1], s[1], d[1], p[1], p[3], attrs["ceil_mode"])
    return n, oh, ow, c


NodeSpec = tuple[str, str, tuple[int, ...], tuple[int, ...], dict[str, Any]]


def _graph(nodes: list[NodeSpec], dtype: Any = np.float32) -> Graph:
    """One graph with an input and an output per (name, kind, in shape, out shape, attrs)."""
    b = Builder("nhwc_pools")
    outs = []
    for name, kind, shape, out_shape, attrs in nodes:
        x = b.input(f"x_{name}", shape, dtype)
        outs.append(b.op(kind, x, out_shape=out_shape, name=name, domain=AOT_DOMAIN, **attrs))
    return b.output(*outs)


def _feeds(graph: Graph, seed: int, specials: bool = False) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in graph.inputs:
        assert value.shape is not None and value.dtype is not None
        x = rng.standard_normal(value.shape).astype(value.dtype)
        if specials and x.size > 4:
            flat = x.reshape(-1)
            flat[rng.choice(x.size, 3, replace=False)] = [np.nan, -np.inf, np.inf]
        feeds[value.name] = x
    return feeds


def _run(graph: Graph, path: Path, feeds: dict[str, np.ndarray], provider: str = "c",
         isa: str | None = None) -> tuple[list[np.ndarray], Path]:  # fmt: skip
    kinds = {n.name: n.op_type for n in graph.nodes}
    build = BuildOptions(isa=isa) if isa is not None else None
    art = compile_graph(graph, path, build=build)
    plan = json.loads((art / "plan.json").read_text())
    assert {s["name"]: s["provider"] for s in plan["steps"]} == dict.fromkeys(kinds, provider)
    return Session(art).run(None, feeds), art


def _pool_nodes(kind: str, include_pad: int) -> list[NodeSpec]:
    nodes = []
    for name, shape, kernel, strides, pads, dilations, ceil in POOLS:
        attrs = _pool_attrs(kind, kernel, strides, pads, dilations, ceil, include_pad)
        nodes.append((f"{name}_{include_pad}", kind, shape, _out_shape(shape, attrs), attrs))
    return nodes


@pytest.mark.parametrize(
    "kind,include_pad", [("MaxPoolNhwc", 0), ("AveragePoolNhwc", 0), ("AveragePoolNhwc", 1)]
)
def test_pools_match_the_reference_to_the_bit(kind: str, include_pad: int, tmp_path: Path) -> None:
    graph = _graph(_pool_nodes(kind, include_pad))
    feeds = _feeds(graph, 1, specials=kind == "MaxPoolNhwc")
    expected = evaluate(graph, feeds)
    got, _ = _run(graph, tmp_path / "a", feeds)
    for node, g, e in zip(graph.nodes, got, expected, strict=True):
        assert g.shape == e.shape and g.dtype == np.float32, node.name
        np.testing.assert_array_equal(g, e, err_msg=node.name)
    if kind == "MaxPoolNhwc":
        assert any(np.isnan(e).any() for e in expected) and any(np.isneginf(e).any() for e in expected)


MAX_BUILTIN = {  # the machine's max instruction per level (NaN handled around it)
    "x86-64-v2": "__builtin_ia32_maxps(",
    "x86-64-v3": "__builtin_ia32_maxps256(",
    "x86-64-v4": "__builtin_ia32_maxps512_mask(",
}


@pytest.mark.parametrize("isa", level_params())
def test_pool_source_for_each_vector_width(isa: str, tmp_path: Path) -> None:
    """The generated text at each x86-64 level (compiled, not run: checks that hold on any host)."""
    nodes = _pool_nodes("MaxPoolNhwc", 0) + _pool_nodes("AveragePoolNhwc", 1)
    art = compile_graph(_graph(nodes), tmp_path / "a", build=BuildOptions(isa=isa))
    source = (art / "kernels" / "cpu" / "model.c").read_text()
    # the interior of k3s2p1_c64 (15x15x64 -> 8x8): taps unrolled at constant offsets from the
    # window's first element, e.g. (row 2, column 2) at (2 * 15 + 2) * 64, no bounds checks
    assert f"vload(p + c + {(2 * 15 + 2) * 64})" in source
    assert "for (int i = 0; i < 9; ++i) {" in source  # k9_taps_in_loops: 81 taps, not unrolled
    assert re.search(r"#define k_[0-9a-f]{16}_max\(a, b\) " + re.escape(MAX_BUILTIN[isa]), source)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # LRN of inf: NaN
def test_pools_on_other_vector_widths(tmp_path: Path) -> None:
    """x86-64-v2 (4-float vectors) runs every pool and channel kernel; the AVX-512 build compiles
    (its global pool and LRN too: the text test above has only the window pools)."""
    nodes = _pool_nodes("MaxPoolNhwc", 0)[:4] + _pool_nodes("AveragePoolNhwc", 1)[:4]
    nodes += [
        ("gap", "GlobalAveragePoolNhwc", (2, 5, 3, 9), (2, 1, 1, 9), {}),
        ("lrn", "LRNNhwc", (1, 3, 4, 6), (1, 3, 4, 6), {"size": 3, "alpha": 0.1, "beta": 0.75, "bias": 1.0}),
    ]
    graph = _graph(nodes)
    feeds = _feeds(graph, 2, specials=True)
    expected = evaluate(graph, feeds)
    got, _ = _run(graph, tmp_path / "v2", feeds, isa="x86-64-v2")
    for node, g, e in zip(graph.nodes, got, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6, err_msg=node.name)
    art = compile_graph(_graph(nodes), tmp_path / "v4", build=BuildOptions(isa="x86-64-v4"))
    assert MAX_BUILTIN["x86-64-v4"] in (art / "kernels" / "cpu" / "model.c").read_text()


def test_global_average_pool_and_lrn(tmp_path: Path) -> None:
    lrn = {"alpha": 2e-3, "bias": 1.5}
    nodes = [
        ("gap_odd", "GlobalAveragePoolNhwc", (2, 5, 7, 13), (2, 1, 1, 13), {}),
        ("gap_chunks", "GlobalAveragePoolNhwc", (1, 3, 3, 300), (1, 1, 1, 300), {}),  # 256 + 44 channels
        ("gap_one", "GlobalAveragePoolNhwc", (1, 1, 1, 3), (1, 1, 1, 3), {}),
        ("lrn_5", "LRNNhwc", (2, 5, 3, 13), (2, 5, 3, 13), {**lrn, "size": 5, "beta": 0.75}),
        ("lrn_3_sqrt", "LRNNhwc", (1, 4, 4, 96), (1, 4, 4, 96), {**lrn, "size": 3, "beta": 0.5}),
        ("lrn_even", "LRNNhwc", (1, 3, 2, 11), (1, 3, 2, 11), {**lrn, "size": 4, "beta": 1.0}),
        ("lrn_pow", "LRNNhwc", (1, 2, 3, 20), (1, 2, 3, 20), {**lrn, "size": 5, "beta": 0.6}),
        ("lrn_wide", "LRNNhwc", (1, 2, 2, 3), (1, 2, 2, 3), {**lrn, "size": 7, "beta": 0.75}),  # window > C
    ]
    graph = _graph(nodes)
    feeds = _feeds(graph, 3)
    feeds = {k: v * 4 for k, v in feeds.items()}  # LRN denominators well above the bias
    expected = evaluate(graph, feeds)
    got, art = _run(graph, tmp_path / "a", feeds)
    for node, g, e in zip(graph.nodes, got, expected, strict=True):
        assert g.shape == e.shape, node.name
        np.testing.assert_allclose(g, e, rtol=2e-6, atol=1e-6, err_msg=node.name)
    source = (art / "kernels" / "cpu" / "model.c").read_text()
    assert "yp[c] = xp[c] / (r * sqrtf(r));" in source  # beta 0.75: no powf
    assert source.count("powf(") == 1  # only beta 0.6


def test_unsupported_nodes_run_on_the_reference(tmp_path: Path) -> None:
    attrs = _pool_attrs("MaxPoolNhwc", [3, 3], [2, 2], [1, 1, 1, 1], [1, 1], 0, 0)
    nodes = [
        ("max64", "MaxPoolNhwc", (1, 5, 6, 4), (1, 3, 3, 4), attrs),
        ("gap64", "GlobalAveragePoolNhwc", (1, 5, 6, 4), (1, 1, 1, 4), {}),
    ]
    graph = _graph(nodes, dtype=np.float64)
    feeds = _feeds(graph, 4)
    expected = evaluate(graph, feeds)
    got, _ = _run(graph, tmp_path / "a", feeds, provider="reference")
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_array_equal(g, e)


def test_lrn_with_more_channels_than_the_stack_row_holds_is_declined() -> None:
    b = Builder()
    attrs = {"size": 5, "alpha": 1e-4, "beta": 0.75, "bias": 1.0}
    for c in (MAX_LRN_CHANNELS, MAX_LRN_CHANNELS + 1):
        x = b.input(f"x{c}", (1, 1, 2, c))
        b.op("LRNNhwc", x, out_shape=(1, 1, 2, c), name=f"lrn{c}", domain=AOT_DOMAIN, **attrs)
    assert [CProvider().supports(node) for node in b.graph.nodes] == [True, False]


def test_channel_walk() -> None:
    """Channels in blocks of 4 vectors, single vectors (the last overlapping the one before when
    the vector does not divide C), scalars only below a vector."""
    walks = [channel_walk(c, 8) for c in (70, 48, 13, 8, 5)]
    assert [(w.blocks, w.singles, w.scalar) for w in walks] == [
        (2, (62,), 0),
        (1, (32, 40), 0),
        (0, (0, 5), 0),
        (0, (0,), 0),
        (0, (), 5),
    ]
