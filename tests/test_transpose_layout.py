"""The C Transpose on the layout pass's NCHW <-> NHWC permutations and on everything else.

Permutations (0, 2, 3, 1) and (0, 3, 1, 2) are batches of 2-D transposes: with at least a vector
of rows and columns (4-byte elements) they run as register-transposed blocks
(``TransposeBlocks``), with fewer (C = 3 images) as two plain loops (``TransposePlanes``); the
rest stays a loop nest. Checked against numpy, exactly, on odd sizes, batch 2, sizes that fill no
block, several dtypes, on the host build and the x86-64-v2 one (4-float vectors); the shuffles of
the register transpose are checked by running them in numpy for every vector width.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from compiler.codegen.options import BuildOptions
from compiler.driver import compile_graph
from compiler.providers.c.movement import batched_2d
from compiler.providers.c.movement import register_transpose
from compiler.providers.c.movement import transpose_blocks
from runtime import Session
from tests.cpu_targets import level_params
from tests.support.graphs import Builder

LAYOUT = (0, 2, 3, 1)
BACK = (0, 3, 1, 2)
# (shape, perm, dtype, path the kernel takes on 8-float vectors)
CASES: list[tuple[tuple[int, ...], tuple[int, ...], Any, str]] = [
    ((1, 3, 20, 21), LAYOUT, np.float32, "planes"),  # an image: 3 rows of 420
    ((1, 3, 50, 50), LAYOUT, np.float32, "planes"),  # two pieces of columns
    ((1, 50, 50, 3), BACK, np.float32, "planes"),
    ((1, 3, 128, 352), LAYOUT, np.float32, "planes"),  # big enough for threads
    ((1, 64, 48, 48), LAYOUT, np.float32, "blocks"),
    ((2, 3, 9, 7), LAYOUT, np.float32, "planes"),
    ((1, 20, 21, 3), BACK, np.float32, "planes"),
    ((2, 13, 7, 9), LAYOUT, np.float32, "blocks"),  # 13 x 63: partial steps both ways
    ((2, 7, 9, 13), BACK, np.float32, "blocks"),
    ((1, 40, 7, 7), LAYOUT, np.float32, "blocks"),  # the 2048 x 7 x 7 kind, smaller
    ((1, 7, 7, 40), BACK, np.float32, "blocks"),
    ((1, 16, 16, 16), LAYOUT, np.float32, "blocks"),  # exact steps
    ((3, 19, 5, 23), BACK, np.int32, "blocks"),
    ((1, 300, 1, 150), LAYOUT, np.float32, "blocks"),  # two pieces of rows and of columns
    ((1, 9, 1, 1), LAYOUT, np.float32, "copy"),  # nothing moves
    ((2, 5, 6, 7), LAYOUT, np.int64, "planes"),  # 8-byte elements: plain loops
    ((2, 5, 6, 7), BACK, np.float16, "planes"),
    ((2, 3, 4, 5), (3, 1, 0, 2), np.float32, "nest"),  # not a batch of 2-D transposes
    ((37, 300), (1, 0), np.uint8, "planes"),
    ((37, 300), (1, 0), np.float32, "blocks"),
    ((3, 17, 40), (0, 2, 1), np.float32, "blocks"),
    ((4, 5, 6), (1, 0, 2), np.float32, "nest"),
    ((6, 2, 3, 4), (0, 2, 3, 1), bool, "planes"),
]


def _compile(path: Path, isa: str | None) -> tuple[Path, dict[str, np.ndarray], list[np.ndarray]]:
    b = Builder("layout_transposes")
    rng = np.random.default_rng(0)
    feeds, expected, outs = {}, [], []
    for k, (shape, perm, dtype, _) in enumerate(CASES):
        x = b.input(f"x{k}", shape, dtype)
        out_shape = tuple(shape[p] for p in perm)
        outs.append(b.op("Transpose", x, out_shape=out_shape, name=f"t{k}", perm=list(perm)))
        feeds[f"x{k}"] = (rng.standard_normal(shape) * 100).astype(dtype)
        expected.append(feeds[f"x{k}"].transpose(perm))
    graph = b.output(*outs)
    art = compile_graph(graph, path, build=BuildOptions(isa=isa) if isa else None)
    plan = json.loads((art / "plan.json").read_text())
    assert {s["provider"] for s in plan["steps"]} == {"c"}
    return art, feeds, expected


@pytest.mark.parametrize("isa", [None, "x86-64-v2"])
def test_transposes_match_numpy(isa: str | None, tmp_path: Path) -> None:
    art, feeds, expected = _compile(tmp_path / "a", isa)
    got = Session(art).run(None, feeds)
    for case, g, e in zip(CASES, got, expected, strict=True):
        assert g.dtype == e.dtype and g.shape == e.shape, case
        np.testing.assert_array_equal(g, e, err_msg=str(case))


def _path_at(vw: int, shape: tuple[int, ...], perm: tuple[int, ...], dtype: Any, path: str) -> str:
    """The path a case takes with ``vw``-float vectors: blocks need a vector of rows and columns."""
    if path not in ("blocks", "planes"):
        return path
    b2 = batched_2d(shape, list(perm))
    assert b2 is not None
    return "blocks" if np.dtype(dtype).itemsize == 4 and min(b2[1:]) >= vw else "planes"


@pytest.mark.parametrize("isa", level_params())
def test_transpose_paths_for_each_vector_width(isa: str, tmp_path: Path) -> None:
    """Which cases run as register blocks, as planes, with threads: the generated text at each
    x86-64 level (compiled on any host; the values are checked above)."""
    vw = {"x86-64-v2": 4, "x86-64-v3": 8, "x86-64-v4": 16}[isa]
    art, _, _ = _compile(tmp_path / "a", isa)
    source = (art / "kernels" / "cpu" / "model.c").read_text()
    bodies = source.split("\nstatic __attribute__((noinline)) void k_")[1:]  # each kernel's loop
    for path, marker in (("blocks", "_shuffle(r0, r1, "), ("planes", "const long begin = job % ")):
        wanted = {(shape, perm, np.dtype(dtype).itemsize) for shape, perm, dtype, p in CASES
                  if _path_at(vw, shape, perm, dtype, p) == path}
        assert sum(marker in body for body in bodies) == len(wanted), path
    # threads from 32768 elements in two pieces or more: 3 x 128 x 352, 64 x 48 x 48, 300 x 150
    assert source.count("onnx_aot_parallel(k_") == 3  # on the worker pool


@pytest.mark.parametrize("vw", [4, 8, 16])
def test_register_transpose_runs_in_numpy(vw: int) -> None:
    rows = {f"r{i}": np.arange(vw) + 100 * i for i in range(vw)}
    shuffles, outputs = register_transpose(vw)
    assert len(shuffles) == vw * int(np.log2(vw))
    for dst, a, b, idx in shuffles:
        rows[dst] = np.concatenate([rows[a], rows[b]])[list(idx)]
    block = np.stack([rows[f"r{i}"] for i in range(vw)])
    np.testing.assert_array_equal(np.stack([rows[name] for name in outputs]), block.T)
    with pytest.raises(ValueError):
        register_transpose(6)


def test_batched_2d_and_the_walk() -> None:
    assert batched_2d((1, 3, 224, 224), [0, 2, 3, 1]) == (1, 3, 50176)
    assert batched_2d((2, 7, 7, 2048), [0, 3, 1, 2]) == (2, 49, 2048)
    assert batched_2d((2, 1, 7, 7), [0, 2, 3, 1]) is None  # a copy: nothing to transpose
    assert batched_2d((2, 3, 4, 5), [3, 1, 0, 2]) is None
    assert batched_2d((5, 1, 3), [2, 1, 0]) == (1, 5, 3)
    # column strips go where the row stride spreads over more L1 sets: y's rows 4 KiB apart
    # (1024 channels) are written along; x's rows 4 KiB apart are read along
    assert transpose_blocks(1, 1024, 196, 8).rows_inner
    assert not transpose_blocks(1, 196, 1024, 8).rows_inner
    assert not transpose_blocks(1, 3136, 256, 8).rows_inner
    assert transpose_blocks(1, 256, 3136, 8).rows_inner
    walk = transpose_blocks(2, 300, 150, 8)
    assert (walk.rstep, walk.sstep, walk.chunks, walk.tiles, walk.chunk) == (16, 16, 2, 1, 128)
    assert walk.rows_inner and walk.offsets == ((0, 0), (8, 0), (0, 8), (8, 8))  # y's lines first
    assert transpose_blocks(1, 196, 1024, 8).offsets == ((0, 0), (0, 8), (8, 0), (8, 8))
