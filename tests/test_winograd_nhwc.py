"""The C kernel of onnx_aot.WinogradConvNhwc (compiler/providers/c/winograd_nhwc.py).

Against the direct convolution in float64 and the reference kernel (runtime/kernels/nhwc.py) on
shapes the zoo does not have: odd sizes, asymmetric pads 0-2, batch 2, channel counts that fill
no vector or panel (and fewer than a vector), both tile sizes, no bias, residual and each
activation; in each of the kernel's modes (serial, one shared block, blocks per thread), with
1 and 2 threads (the same bits), and in the x86-64-v2 build of an x86-64-v4 artifact. The
transform programs are checked against their matrices, and the source textually: the products
on the GEMM tile, the epilogue in the output transform.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

import compiler.providers.c.winograd_nhwc as K
from compiler.codegen.options import BuildOptions
from compiler.driver import compile_graph
from compiler.ir.evaluate import evaluate
from compiler.ir.graph import AOT_DOMAIN
from compiler.ir.graph import Graph
from compiler.passes.use_winograd import winograd_weights
from compiler.providers.c.winograd_nhwc import Program
from compiler.providers.c.winograd_nhwc import _blocks
from compiler.providers.c.winograd_nhwc import transform_program
from runtime import Session
from runtime.errors import CpuFallbackWarning
from runtime.isa import MARCH_FEATURES
from runtime.isa import TEST_FLAGS_ENV
from runtime.kernels.conv import conv
from runtime.kernels.fused import apply_activation
from runtime.kernels.nhwc import TO_NCHW
from runtime.kernels.nhwc import TO_NHWC
from runtime.kernels.nhwc import pack_winograd_weights
from runtime.kernels.winograd import MATRICES
from tests.support.graphs import CONV_ATTRS
from tests.support.graphs import Builder

ACTIVATIONS = {
    "": {"activation": "", "act_min": 0.0, "act_max": 0.0, "act_alpha": 0.0},
    "Relu": {"activation": "Relu", "act_min": 0.0, "act_max": 0.0, "act_alpha": 0.0},
    "Clip": {"activation": "Clip", "act_min": -0.5, "act_max": 0.75, "act_alpha": 0.0},
    "LeakyRelu": {"activation": "LeakyRelu", "act_min": 0.0, "act_max": 0.0, "act_alpha": 0.1},
}


# -- the transform programs ------------------------------------------------------------------------


def _evaluate(prog: Program, x: np.ndarray) -> np.ndarray:
    values = list(x)
    for terms in prog.temps:
        values.append(sum(t.sign * float(t.lit[:-1] if t.lit else 1.0) * values[t.src] for t in terms))
    return np.array([sum(t.sign * float(t.lit[:-1] if t.lit else 1.0) * values[t.src] for t in terms)
                     for terms in prog.outs])


@pytest.mark.parametrize("tile", [2, 4])
@pytest.mark.parametrize("which", [0, 2])  # B^T, A^T
def test_transform_programs_compute_their_matrices(tile: int, which: int) -> None:
    matrix = np.array(MATRICES[tile][which])
    prog = transform_program(MATRICES[tile][which])
    x = np.random.default_rng(tile + which).standard_normal((matrix.shape[1], 5))
    np.testing.assert_allclose(_evaluate(prog, x), matrix @ x, rtol=1e-12, atol=1e-12)
    # vector operations: a sum of k terms is k - 1 (multiply-)adds
    plain = sum(int(np.count_nonzero(row)) - 1 for row in matrix)
    shared = sum(len(t) - 1 for t in prog.temps + prog.outs)
    assert shared == {(2, 0): 4, (2, 2): 4, (4, 0): 12, (4, 2): 10}[tile, which]
    assert shared <= plain and (tile == 2 or shared < plain)


# -- the C kernel ------------------------------------------------------------------------------------


def _graph(n: int, c: int, hw: tuple[int, int], m: int, pads: list[int], tile: int, bias: bool,
           residual: bool, act: str, rng: np.random.Generator) -> tuple[Graph, np.ndarray]:
    h, w = hw
    oh, ow = h + pads[0] + pads[2] - 2, w + pads[1] + pads[3] - 2
    weights = (rng.standard_normal((m, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    b = Builder()
    x = b.input("x", (n, h, w, c))
    u = b.const("u", pack_winograd_weights(winograd_weights(weights, tile)))
    bv = b.const("b", rng.standard_normal(m).astype(np.float32)) if bias else None
    z = b.input("z", (n, oh, ow, m)) if residual else None
    y = b.op("WinogradConvNhwc", x, u, bv, z, out_shape=(n, oh, ow, m), domain=AOT_DOMAIN,
             name="wino", **{**CONV_ATTRS, "pads": pads, **ACTIVATIONS[act]})
    return b.output(y), weights


def _feeds(graph: Graph, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {v.name: rng.standard_normal(v.shape).astype(np.float32) for v in graph.inputs}  # type: ignore[arg-type]


def _direct(graph: Graph, weights: np.ndarray, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """The float64 direct convolution in NHWC, bias, residual, activation."""
    (node,) = graph.nodes
    x = feeds["x"].transpose(TO_NCHW).astype(np.float64)
    y = conv(np, x, weights.astype(np.float64), None, {**CONV_ATTRS, "pads": node.attrs["pads"]})
    y = y.transpose(TO_NHWC)
    if node.input(2) is not None:
        y = y + node.input(2).const  # type: ignore[union-attr]
    if "z" in feeds:
        y = y + feeds["z"]
    return apply_activation(np, y, dict(node.attrs))


def _check(got: np.ndarray, graph: Graph, weights: np.ndarray, feeds: dict[str, np.ndarray],
           tile: int) -> None:
    expected = _direct(graph, weights, feeds)
    scale = float(np.abs(expected).max())
    tol = 1e-5 if tile == 4 else 1e-6  # of the output's scale (docs/ops.md: ~5e-6 and ~1e-7)
    assert got.dtype == np.float32 and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=0, atol=tol * scale)
    np.testing.assert_allclose(got, evaluate(graph, feeds)[0], rtol=0, atol=tol * scale)


def _compile(graph: Graph, path: Path, build: BuildOptions | None = None) -> Path:
    art = compile_graph(graph, path, build=build, golden_cases=0)
    plan = json.loads((art / "plan.json").read_text())
    assert [(s["op_type"], s["provider"]) for s in plan["steps"]] == [("WinogradConvNhwc", "c")]
    return art


# Modes: "serial" (too little work for threads); otherwise 1 and 2 threads take a share of the
# tiles each when there are at least MIN_SHARE = 24 per thread ("blocks"), else share the phases
# of each block ("shared"); 3 threads share them below 72 tiles.
CASES = [
    # n, c, (h, w), m, pads, tile, bias, residual, activation, mode
    (1, 16, (7, 7), 16, [1, 1, 1, 1], 4, True, False, "Relu", "shared"),
    (2, 17, (9, 6), 20, [0, 1, 2, 0], 4, True, True, "", "shared"),  # C, M: vector tails
    (1, 5, (8, 9), 3, [2, 1, 0, 2], 2, True, True, "Clip", "serial"),  # C, M below a vector
    # 50 tiles, at most 24 a block: 3 blocks (1 thread), 2 of 12-13 each (2), 3 shared blocks (3)
    (2, 40, (20, 18), 24, [1, 1, 1, 1], 4, True, True, "LeakyRelu", "blocks"),
    (1, 24, (3, 5), 40, [2, 2, 2, 1], 4, False, False, "", "shared"),  # 5 x 6 output, 2 x 2 tiles
    (1, 33, (15, 13), 35, [0, 2, 1, 0], 2, False, True, "Relu", "blocks"),  # 56 tiles
    (2, 16, (4, 4), 16, [0, 0, 0, 0], 2, True, False, "Relu", "serial"),  # one tile per image
    (1, 200, (9, 10), 200, [1, 1, 1, 1], 4, True, True, "Relu", "shared"),  # 6 MB of weights: spread
]


@pytest.mark.parametrize("n,c,hw,m,pads,tile,bias,residual,act,mode", CASES)
def test_c_kernel_matches_the_direct_convolution(n: int, c: int, hw: tuple[int, int], m: int, pads: list[int],
                                                 tile: int, bias: bool, residual: bool, act: str, mode: str,
                                                 tmp_path: Path) -> None:
    rng = np.random.default_rng(n * 1000 + c * 10 + m)
    graph, weights = _graph(n, c, hw, m, pads, tile, bias, residual, act, rng)
    art = _compile(graph, tmp_path / "a")
    source = (art / "kernels" / "cpu" / "model.c").read_text()
    assert ("onnx_aot_parallel(k_" in source) == (mode != "serial")  # runs on the worker pool
    feeds = _feeds(graph, rng)
    got = Session(art, threads=2).run(None, feeds)[0]
    _check(got, graph, weights, feeds, tile)
    if mode != "serial":  # every tile and product is computed alike whichever thread runs it
        for threads in (1, 3):
            np.testing.assert_array_equal(Session(art, threads=threads).run(None, feeds)[0], got)


def test_nan_stays_within_the_tiles_whose_patches_hold_it(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    n, c, hw, m, pads, tile = 2, 40, (20, 18), 24, [1, 1, 1, 1], 4  # 50 tiles: blocks, 2 threads
    graph, weights = _graph(n, c, hw, m, pads, tile, True, True, "Relu", rng)
    feeds = _feeds(graph, rng)
    feeds["x"][1, 9, 6, 7] = np.nan
    got = Session(_compile(graph, tmp_path / "a"), threads=2).run(None, feeds)[0]
    expected = _direct(graph, weights, feeds)
    nan = np.isnan(got)
    assert nan[np.isnan(expected)].all() and not nan[0].any()
    for _, oy, ox, _ in np.argwhere(nan):  # the tile's patch: rows ty * 4 - 1 .. ty * 4 + 4
        ty, tx = oy // tile, ox // tile
        assert ty * tile - pads[0] <= 9 < ty * tile - pads[0] + tile + 2
        assert tx * tile - pads[1] <= 6 < tx * tile - pads[1] + tile + 2
    ok = ~nan
    np.testing.assert_allclose(got[ok], expected[ok], rtol=0, atol=1e-5 * float(np.abs(expected[ok]).max()))


def test_blocks_are_sized_to_the_cache_and_the_weights() -> None:
    rng = np.random.default_rng(0)
    for c, m, hw in [(40, 24, (20, 18)), (16, 16, (58, 58)), (512, 512, (30, 30)), (64, 64, (6, 6))]:
        graph, _ = _graph(1, c, hw, m, [0, 0, 0, 0], 4, False, False, "", rng)
        g = _blocks(graph.nodes[0])
        assert g is not None
        per_tile = 4 * (g.vt + g.st)  # bytes of V and S
        if g.tiles <= K.MIN_BLOCK:
            assert g.block == g.tiles
        else:  # the most whole rounds of tiles that fit the budget, at least MIN_BLOCK
            assert g.block % K.BLOCK_ROUND == 0 and g.block >= K.MIN_BLOCK
            assert g.block == K.MIN_BLOCK or g.block * per_tile <= K.L2_BUDGET
            assert (g.block + K.BLOCK_ROUND) * per_tile > K.L2_BUDGET
        assert g.nblocks == -(-g.tiles // g.block)
        assert g.slots == max(1, min(K.MAX_SLOTS, g.tiles // K.MIN_SHARE))


def test_portable_build_of_a_v4_artifact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The x86-64-v4 source compiles (AVX-512: one vector per panel, 12 rows); the x86-64-v2
    build (SSE: half a panel per tile) runs and computes the same convolution."""
    rng = np.random.default_rng(7)
    graph, weights = _graph(2, 19, (11, 10), 21, [1, 0, 1, 2], 4, True, True, "Relu", rng)
    art = _compile(graph, tmp_path / "v4", BuildOptions(isa="x86-64-v4", portable_isa="x86-64-v2"))
    v4 = (art / "kernels" / "cpu" / "model.c").read_text()
    v2 = (art / "kernels" / "cpu" / "x86-64-v2" / "model.c").read_text()
    assert "vector_size(64)" in v4 and "vector_size(16)" in v2
    monkeypatch.setenv(TEST_FLAGS_ENV, " ".join(MARCH_FEATURES["x86-64-v2"]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CpuFallbackWarning)
        session = Session(art, threads=2)
    assert session.cpu_build is not None and session.cpu_build.march == "x86-64-v2"
    feeds = _feeds(graph, rng)
    _check(session.run(None, feeds)[0], graph, weights, feeds, 4)


def test_products_on_the_tile_and_epilogue_in_the_output_transform(tmp_path: Path) -> None:
    graph, _ = _graph(1, 24, (8, 8), 16, [1, 1, 1, 1], 2, True, True, "Relu", np.random.default_rng(0))
    source = (_compile(graph, tmp_path / "a") / "kernels" / "cpu" / "model.c").read_text()
    (name,) = set(re.findall(r"^void (k_[0-9a-f]{16})\(", source, re.M))
    products = source[source.index(f"void {name}_products(") :]
    products = products[: products.index("\n}\n")]
    assert "for (int k = 0; k < 24; ++k)" in products  # the tile's loop over the C = 24 channels
    assert "vbcast(a0[k])" in products and "vload(bk" in products  # V broadcast, U's panel loaded
    assert "Bp + 384;" in products and "__builtin_prefetch(pf + (long)k * 16)" in products  # next panel
    output = source[source.index(f"void {name}_output(") :]
    output = output[: output.index("\n}\n")]
    assert "vload(bias + m0)" in output and "vload(zt + " in output and "vselect(v < vbcast(0.0f)" in output
