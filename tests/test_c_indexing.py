"""The C provider's data-movement kernels (c/indexing.py, c/pad.py, c/elementwise_typed.py)
against the reference kernels.

Each case builds a one-node IR graph with canonical attributes (docs/ops.md), checks that the C
provider claims it, builds and runs it through ``runtime.providers.c`` (the hand-made plan of
``test_c_provider``) and compares every output bit for bit with ``runtime.kernels``' kernel for
the same node. Shapes and attributes are random (seeded) and unlike the ONNX node suite's; large
cases take the OpenMP paths. The last test compiles a small ONNX model end to end and checks in
plan.json that the C provider ran these ops.
"""

from __future__ import annotations

import ctypes
import json
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler.codegen.options import BuildOptions
from compiler.driver import compile_model
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.providers.base import GenLocation
from compiler.providers.base import GenPartition
from compiler.providers.base import GenStep
from compiler.providers.c.pad import pad_tables
from runtime.errors import IndexRangeError
from runtime.kernels import get_kernel
from runtime.providers.c import CLibrary
from runtime.session import Session
from tests.test_c_provider import PROVIDER
from tests.test_c_provider import aligned_buffer
from tests.test_c_provider import build

RNG = np.random.default_rng(20261123)

Spec = tuple[str, np.ndarray, bool]  # (name, data, is_constant)


def random_array(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """Random data of ``dtype``: the full range of small ints, normals for floats."""
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return RNG.integers(0, 2, shape).astype(bool)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return RNG.integers(max(info.min, -(2**40)), min(info.max, 2**40), shape, endpoint=True).astype(dt)
    return (RNG.standard_normal(shape) * 3).astype(dt)


def graph_of(
    op: str, inputs: list[Spec], attrs: dict[str, Any], outputs: list[tuple[tuple[int, ...], Any]]
) -> Graph:
    graph = Graph("case")
    values: list[Value | None] = []
    for name, data, const in inputs:
        values.append(
            graph.add_constant(name, data) if const else graph.add_input(Value(name, data.dtype, data.shape))
        )
    outs = [graph.make_value(f"y{k}", np.dtype(dt), shape) for k, (shape, dt) in enumerate(outputs)]
    graph.add_node(Node(op, values, outs, attrs, name="n0"))
    graph.outputs.extend(outs)
    graph.verify()
    return graph


def reference(op: str, inputs: list[Spec], attrs: dict[str, Any], outputs: list[Any]) -> list[np.ndarray]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return get_kernel(op)(np, [d for _, d, _ in inputs], attrs, outputs)


def check(
    op: str,
    inputs: list[Spec],
    attrs: dict[str, Any],
    outputs: list[tuple[tuple[int, ...], Any]],
    tmp_path: Path,
) -> list[np.ndarray]:
    """Run the node through the C provider and compare with the reference kernel, exactly."""
    want = reference(op, inputs, attrs, outputs)
    graph = graph_of(op, inputs, attrs, outputs)
    assert PROVIDER.claims(graph) == set(graph.nodes), f"{op} {attrs} not claimed"
    got = build(graph, tmp_path).run({name: data for name, data, const in inputs if not const})
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g.view(f"u{g.dtype.itemsize}"), w.view(f"u{w.dtype.itemsize}"))
    return got


def claimed(op: str, inputs: list[Spec], attrs: dict[str, Any], outputs: list[Any]) -> bool:
    return PROVIDER.supports(graph_of(op, inputs, attrs, outputs).nodes[0])


# -- Slice / Expand / Tile ----------------------------------------------------------------------


def random_slice(shape: tuple[int, ...], axes: list[int]) -> tuple[dict[str, Any], tuple[int, ...]]:
    """Canonical (clamped) Slice attributes over ``axes`` and the output shape."""
    out = list(shape)
    starts, ends, steps = [], [], []
    for a in axes:
        dim = shape[a]
        step = int(RNG.choice([-3, -2, -1, 1, 2, 3]))
        if step > 0:
            start, end = (int(v) for v in RNG.integers(0, dim, 2, endpoint=True))
        else:
            start, end = int(RNG.integers(0, dim)), int(RNG.integers(-1, dim))
        starts.append(start)
        ends.append(end)
        steps.append(step)
        out[a] = len(range(start, end, step))
    return {"starts": starts, "ends": ends, "axes": axes, "steps": steps}, tuple(out)


@pytest.mark.parametrize(
    "shape,axes,dtype",
    [
        ((9, 7, 6), [0, 2], np.float32),
        ((5, 11), [1], np.int64),
        ((4, 3, 5, 6), [3, 1, 0], np.uint8),
        ((13,), [0], np.float16),
        ((3, 8, 7), [2, 1], np.bool_),
        ((6, 5, 4, 3, 2), [4, 0, 2], np.int16),
    ],
)
def test_slice(shape: tuple[int, ...], axes: list[int], dtype: Any, tmp_path: Path) -> None:
    for trial in range(3):
        attrs, out = random_slice(shape, axes)
        check(
            "Slice", [("x", random_array(shape, dtype), False)], attrs, [(out, dtype)], tmp_path / str(trial)
        )


def test_slice_reversed_whole_and_large_parallel(tmp_path: Path) -> None:
    attrs = {"starts": [63, 1, 69], "ends": [-1, 129, 0], "axes": [0, 1, 2], "steps": [-1, 1, -1]}
    x = random_array((64, 130, 70), np.float32)
    check("Slice", [("x", x, False)], attrs, [((64, 128, 69), np.float32)], tmp_path)


@pytest.mark.parametrize(
    "x_shape,out_shape,dtype",
    [
        ((3, 1, 5), (2, 3, 4, 5), np.float32),
        ((1,), (6, 7), np.int32),
        ((4, 1), (4, 9), np.float64),
        ((2, 1, 3), (2, 5, 3), np.bool_),
        ((1, 257, 1), (3, 257, 200), np.uint16),
    ],
)
def test_expand(x_shape: tuple[int, ...], out_shape: tuple[int, ...], dtype: Any, tmp_path: Path) -> None:
    x = random_array(x_shape, dtype)
    check("Expand", [("x", x, False)], {"shape": list(out_shape)}, [(out_shape, dtype)], tmp_path)


@pytest.mark.parametrize(
    "shape,repeats,dtype",
    [
        ((2, 3, 4), [2, 1, 3], np.float32),
        ((5,), [4], np.int64),
        ((3, 1, 2), [1, 5, 2], np.bool_),
        ((2, 3), [3, 0], np.int8),
        ((40, 33, 17), [2, 3, 2], np.float32),
    ],
)
def test_tile(shape: tuple[int, ...], repeats: list[int], dtype: Any, tmp_path: Path) -> None:
    out = tuple(n * r for n, r in zip(shape, repeats, strict=True))
    check("Tile", [("x", random_array(shape, dtype), False)], {"repeats": repeats}, [(out, dtype)], tmp_path)


# -- Gather -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape,axis,ind_shape,ind_dtype,dtype",
    [
        ((7, 5), 0, (4,), np.int64, np.float32),
        ((3, 9, 4), 1, (2, 3), np.int32, np.int64),
        ((3, 4, 6), 2, (), np.int64, np.float16),
        ((11,), 0, (3, 2, 2), np.int32, np.int8),
        ((2, 6, 3, 5), 3, (7,), np.int64, np.bool_),
        ((1000, 64), 0, (50, 30), np.int64, np.float32),
        ((40, 300, 3), 1, (200,), np.int32, np.float64),
    ],
)
def test_gather(
    shape: tuple[int, ...], axis: int, ind_shape: tuple[int, ...], ind_dtype: Any, dtype: Any, tmp_path: Path
) -> None:
    n = shape[axis]
    indices = RNG.integers(-n, n, ind_shape).astype(ind_dtype)  # negatives count from the end
    out = shape[:axis] + ind_shape + shape[axis + 1 :]
    inputs = [("x", random_array(shape, dtype), False), ("i", np.asarray(indices), False)]
    check("Gather", inputs, {"axis": axis}, [(out, dtype)], tmp_path)


def test_gather_constant_indices(tmp_path: Path) -> None:
    inputs = [("x", random_array((6, 10), np.float32), False), ("i", np.array([[9, -10], [0, 3]]), True)]
    check("Gather", inputs, {"axis": 1}, [((6, 2, 2), np.float32)], tmp_path)


def test_gather_out_of_range_is_an_input_error(tmp_path: Path) -> None:
    """An index outside [-n, n) (huge ones too) is an IndexRangeError naming the first one, as the
    reference raises; the C kernel checks them all before it copies, so it never reads past the
    data; in-range negative indices still work."""
    x = random_array((5, 3), np.float32) + np.float32(100)
    indices = np.array([0, -5, 4, -1, 1 << 40, 5, -(1 << 40)], np.int64)
    graph = graph_of("Gather", [("x", x, False), ("i", indices, False)], {"axis": 0}, [((7, 3), np.float32)])
    session = build(graph, tmp_path)
    with pytest.raises(IndexRangeError, match=rf"index {1 << 40} is out of range for axis 0 of size 5"):
        session.run({"x": x, "i": indices})
    fine = indices[:4]
    (y,) = session.run({"x": x, "i": np.concatenate([fine, fine[:3]])})
    np.testing.assert_array_equal(y, x[np.concatenate([fine, fine[:3]])])


# -- Split --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape,axis,sizes,dtype",
    [
        ((4, 6, 3), 1, [2, 0, 3, 1], np.float32),
        ((7, 5), 0, [1, 6], np.int64),
        ((3, 2, 9), 2, [4, 4, 1], np.float16),
        ((2, 3), 1, [3], np.bool_),
        ((64, 90, 30), 1, [30, 45, 15], np.float32),
    ],
)
def test_split(shape: tuple[int, ...], axis: int, sizes: list[int], dtype: Any, tmp_path: Path) -> None:
    outs = [(shape[:axis] + (s,) + shape[axis + 1 :], dtype) for s in sizes]
    check("Split", [("x", random_array(shape, dtype), False)], {"axis": axis, "split": sizes}, outs, tmp_path)


def run_in_arena(
    graph: Graph, feeds: dict[str, np.ndarray], offsets: dict[str, int], tmp_path: Path
) -> np.ndarray:
    """Build and run a one-node graph whose values all live in the arena at ``offsets``."""
    node = graph.nodes[0]
    where = {name: GenLocation("arena", off) for name, off in offsets.items()}
    ins = tuple(where[v.name] if v is not None else None for v in node.inputs)
    step = GenStep(0, 0, node, ins, tuple(where[v.name] for v in node.outputs), None, 0)
    PROVIDER.generate([GenPartition(0, "c", "part0", (step,), ())], tmp_path, BuildOptions())
    arena = aligned_buffer(4096)
    for v in graph.inputs:
        data = np.ascontiguousarray(feeds[v.name]).view(np.uint8).reshape(-1)
        arena[offsets[v.name] : offsets[v.name] + data.size] = data
    no_ext = (ctypes.c_void_p * 1)()
    weights = aligned_buffer(64)
    CLibrary(tmp_path / "model.so").entry("part0")(no_ext, arena.ctypes.data, weights.ctypes.data, 0)
    y = node.outputs[0]
    off = offsets[y.name]
    return arena[off : off + y.nbytes].view(y.dtype).reshape(y.shape).copy()


def test_empty_values_may_share_an_address(tmp_path: Path) -> None:
    """The plan may put an empty value anywhere, even on another operand (restrict must not lie)."""
    x = random_array((3, 4), np.float32)
    empty = random_array((3, 0), np.float32)
    ind = np.array([0, -1], np.int64)
    feeds = {"x": x, "empty": empty, "i": ind}
    split = graph_of(
        "Split", [("x", x, False)], {"axis": 1, "split": [4, 0]}, [((3, 4), "f4"), ((3, 0), "f4")]
    )
    y0 = run_in_arena(split, feeds, {"x": 0, "y0": 1024, "y1": 0}, tmp_path / "split")
    np.testing.assert_array_equal(y0, x)
    attrs = {"pads": [0, 1, 0, 2], "mode": "constant", "value": 1.5}
    pad = graph_of("Pad", [("empty", empty, False)], attrs, [((3, 3), "f4")])
    y = run_in_arena(pad, feeds, {"empty": 0, "y0": 0}, tmp_path / "pad")
    np.testing.assert_array_equal(y, np.full((3, 3), 1.5, np.float32))
    rows = random_array((0, 4), np.float32)  # gathered along its 4 columns: an empty result
    gather = graph_of("Gather", [("rows", rows, False), ("i", ind, False)], {"axis": 1}, [((0, 2), "f4")])
    y = run_in_arena(gather, {**feeds, "rows": rows}, {"rows": 0, "i": 1024, "y0": 0}, tmp_path / "gather")
    assert y.shape == (0, 2)


# -- Pad ----------------------------------------------------------------------------------------


def pad_out(shape: tuple[int, ...], pads: list[int], mode: str) -> tuple[int, ...]:
    return tuple(len(t) for t in pad_tables(shape, pads, mode))


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize(
    "shape,pads,dtype",
    [
        ((2, 3, 5, 6), [0, 0, 1, 2, 0, 0, 3, 1], np.float32),
        ((4, 7), [2, -1, 0, 3], np.int64),
        ((9,), [4, 5], np.uint8),
        ((3, 4, 5), [1, 0, -2, 0, 2, 1], np.float16),
        ((2, 3, 4), [0, 0, 0, 0, 0, 0], np.int32),
        ((3, 2, 4), [2, 5, 0, 0, 3, 9], np.float64),
        ((8, 64, 66, 30), [0, 0, 2, 1, 0, 0, 1, 2], np.float32),
    ],
)
def test_pad(mode: str, shape: tuple[int, ...], pads: list[int], dtype: Any, tmp_path: Path) -> None:
    attrs = {"pads": pads, "mode": mode, "value": -2.5 if np.dtype(dtype).kind == "f" else 7.0}
    out = pad_out(shape, pads, mode)
    check("Pad", [("x", random_array(shape, dtype), False)], attrs, [(out, dtype)], tmp_path)


def test_pad_constant_outside_and_nan_value(tmp_path: Path) -> None:
    attrs = {"pads": [1, 0, 0, 1, 2, 0], "mode": "constant", "value": math.nan}
    shape = (2, 3, 4)
    out = pad_out(shape, attrs["pads"], "constant")
    check("Pad", [("x", random_array(shape, np.float32), False)], attrs, [(out, np.float32)], tmp_path)


def test_pad_reflect_of_an_empty_axis_is_not_claimed() -> None:
    attrs = {"pads": [0, 2, 0, 1], "mode": "reflect", "value": 0.0}
    x = random_array((3, 0), np.float32)
    assert not claimed("Pad", [("x", x, False)], attrs, [((3, 3), np.float32)])
    attrs["mode"] = "constant"
    assert claimed("Pad", [("x", x, False)], attrs, [((3, 3), np.float32)])


# -- Range --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "start,limit,delta,dtype",
    [
        (0.1, 7.3, 0.3, np.float32),
        (10, -7, -3, np.int32),
        (-2.5, 1000.0, 0.7, np.float64),
        (3, 2 * 10**6, 7, np.int64),
        (1.0, 9.0, 0.25, np.float16),
        (5, 5, 1, np.int16),
    ],
)
def test_range(start: float, limit: float, delta: float, dtype: Any, tmp_path: Path) -> None:
    args = [np.array(v, dtype) for v in (start, limit, delta)]
    count = max(math.ceil((args[1].item() - args[0].item()) / args[2].item()), 0)
    inputs = [(n, a, False) for n, a in zip(("s", "l", "d"), args, strict=True)]
    check("Range", inputs, {}, [((count,), dtype)], tmp_path)


# -- Cast ---------------------------------------------------------------------------------------

CAST_TYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
CAST_TYPES += ["float16", "float32", "float64"]


def cast_source(src: str, dst: str, n: int) -> np.ndarray:
    """Values of ``src`` whose conversion to ``dst`` is defined (floats into integers: in range)."""
    s, d = np.dtype(src), np.dtype(dst)
    if s.kind == "f" and d.kind in "iu":
        info = np.iinfo(d)
        lo, hi = max(float(info.min), -6e4), min(float(info.max), 6e4)
        return RNG.uniform(lo, hi, n).astype(s).clip(lo, hi).astype(s)
    if s.kind == "f":
        specials = np.array([0, -0.0, np.nan, np.inf, -np.inf, 1e30 if s.itemsize > 2 else 6e4])
        return np.concatenate([random_array((n - 6,), s), specials]).astype(s)
    return random_array((n,), s)


@pytest.mark.parametrize("src", CAST_TYPES)
def test_cast(src: str, tmp_path: Path) -> None:
    for dst in CAST_TYPES:
        x = cast_source(src, dst, 301)
        graph = graph_of("Cast", [("x", x, False)], {"to": dst}, [(x.shape, dst)])
        half_from_wide = dst == "float16" and src in ("int32", "int64", "uint32", "uint64")
        if half_from_wide:
            assert not PROVIDER.supports(graph.nodes[0])
            continue
        check("Cast", [("x", x, False)], {"to": dst}, [(x.shape, dst)], tmp_path / dst)


def test_cast_float_to_int_out_of_range_matches_numpy_where_it_is_x86(tmp_path: Path) -> None:
    specials = np.array([np.nan, np.inf, -np.inf, 3e9, -3e9, 1e20, -1e20, 300.7, -300.7, 70000.5, -129.9])
    for src in ("float32", "float64"):
        for dst in ("int8", "int16", "int32", "int64", "uint8", "uint16"):
            check(
                "Cast",
                [("x", specials.astype(src), False)],
                {"to": dst},
                [((11,), dst)],
                tmp_path / src / dst,
            )


def test_cast_double_to_half_rounds_once(tmp_path: Path) -> None:
    """float64 -> float16 directly (not through float32): values near float16 ties."""
    halves = RNG.standard_normal(4000).astype(np.float16).astype(np.float64)
    ulp = np.spacing(halves.astype(np.float16)).astype(np.float64)
    x = halves + ulp * (0.5 + RNG.choice([-1, 1], 4000) * 2.0**-30)
    check("Cast", [("x", x, False)], {"to": "float16"}, [((4000,), "float16")], tmp_path)


def test_cast_large_parallel(tmp_path: Path) -> None:
    x = random_array((300_001,), np.float32)
    check("Cast", [("x", x, False)], {"to": "float16"}, [((300_001,), "float16")], tmp_path)


# -- Where and the comparison / logic ops ------------------------------------------------------


@pytest.mark.parametrize(
    "shapes,dtype",
    [
        (((3, 1, 5), (1, 4, 5), (5,)), np.float32),
        (((6,), (2, 6), ()), np.int64),
        (((2, 3), (2, 3), (2, 3)), np.bool_),
        (((1, 1), (4, 1), (1, 7)), np.float16),
        (((256, 1), (256, 300), (300,)), np.float32),
    ],
)
def test_where(shapes: tuple[tuple[int, ...], ...], dtype: Any, tmp_path: Path) -> None:
    out = np.broadcast_shapes(*shapes)
    inputs = [("c", random_array(shapes[0], bool), False)]
    inputs += [(n, random_array(s, dtype), False) for n, s in zip("xy", shapes[1:], strict=True)]
    check("Where", inputs, {}, [(out, dtype)], tmp_path)


def with_specials(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "f" and a.size > 4:
        flat = a.reshape(-1)
        flat[:4] = [np.nan, np.inf, -np.inf, 0.0]
    return a


@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
@pytest.mark.parametrize(
    "shapes,dtype",
    [
        (((3, 4, 5), (4, 1)), np.float32),
        (((7,), (2, 7)), np.int64),
        (((5, 6), (5, 6)), np.float16),
        (((4, 3), (3,)), np.uint8),
        (((9,), ()), np.float64),
        (((128, 300), (300,)), np.int32),
    ],
)
def test_compare(op: str, shapes: tuple[tuple[int, ...], ...], dtype: Any, tmp_path: Path) -> None:
    a, b = (with_specials(random_array(s, dtype)) for s in shapes)
    if np.dtype(dtype).kind in "iu":
        b = (b % 3).astype(dtype)  # plenty of equal pairs
        a = (a % 3).astype(dtype)
    out = np.broadcast_shapes(*shapes)
    check(op, [("a", a, False), ("b", b, False)], {}, [(out, bool)], tmp_path)


def test_equal_bool(tmp_path: Path) -> None:
    inputs = [("a", random_array((4, 5), bool), False), ("b", random_array((5,), bool), False)]
    check("Equal", inputs, {}, [((4, 5), bool)], tmp_path)


@pytest.mark.parametrize("op", ["And", "Or", "Xor", "Not"])
def test_logic(op: str, tmp_path: Path) -> None:
    shapes = [(3, 1, 6), (4, 6)] if op != "Not" else [(5, 7)]
    inputs = [(f"a{k}", random_array(s, bool), False) for k, s in enumerate(shapes)]
    out = np.broadcast_shapes(*shapes)
    check(op, inputs, {}, [(out, bool)], tmp_path)


def test_logic_of_non_bool_is_not_claimed() -> None:
    a = random_array((3,), np.int32)
    assert not claimed("And", [("a", a, False), ("b", a, False)], {}, [((3,), bool)])
    assert not claimed("Equal", [("a", a, False), ("b", a.astype(np.int64), False)], {}, [((3,), bool)])


# -- claims and the whole pipeline -------------------------------------------------------------


def test_non_canonical_or_inconsistent_nodes_are_not_claimed() -> None:
    x = random_array((5, 4), np.float32)
    slice_attrs = {"starts": [7], "ends": [2], "axes": [0], "steps": [1]}  # start not clamped
    assert not claimed("Slice", [("x", x, False)], slice_attrs, [((0, 4), np.float32)])
    good = {"starts": [1], "ends": [4], "axes": [0], "steps": [1]}
    assert not claimed("Slice", [("x", x, False)], good, [((2, 4), np.float32)])  # wrong output shape
    assert not claimed("Split", [("x", x, False)], {"axis": 0, "split": [2, 2]}, [((2, 4), np.float32)] * 2)
    fi = [("x", x, False), ("i", np.array([0.0]), False)]
    assert not claimed("Gather", fi, {"axis": 0}, [((1, 4), np.float32)])  # float indices
    assert not claimed(
        "Pad", [("x", x, False)], {"pads": [1, 1], "mode": "edge", "value": 0.0}, [((7, 4), "f4")]
    )


def test_compiled_model_runs_these_ops_in_c(tmp_path: Path) -> None:
    """Through compile_model: every data-movement step is a C step, and the numbers are right."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6, 5])
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, 5])
    inits = [
        numpy_helper.from_array(np.array([0, 1, 0], np.int64), "starts"),
        numpy_helper.from_array(np.array([2, 6, 4], np.int64), "ends"),
        numpy_helper.from_array(np.array([0, 1, 2], np.int64), "axes"),
        numpy_helper.from_array(np.array([1, 2, 1], np.int64), "steps"),
        numpy_helper.from_array(np.array([0, 0, 0, 0, 1, 1], np.int64), "pads"),
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
    ]
    nodes = [
        helper.make_node("Gather", ["x", "ids"], ["g"], axis=1),
        helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["s"]),
        helper.make_node("Pad", ["s", "pads"], ["p"], mode="reflect"),
        helper.make_node("Greater", ["g", "zero"], ["m"]),
        helper.make_node("Cast", ["m"], ["mf"], to=TensorProto.FLOAT),
        helper.make_node("Where", ["m", "g", "mf"], ["w"]),
        helper.make_node("Split", ["w"], ["w0", "w1"], axis=1, num_outputs=2),
        helper.make_node("Concat", ["w1", "p"], ["y"], axis=1),
    ]
    # g, w: (2, 3, 5); w0, w1: (2, 2, 5), (2, 1, 5); s: (2, 3, 4); p: (2, 4, 5); y: (2, 5, 5)
    graph = helper.make_graph(nodes, "data", [x, ids], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    out = compile_model(model, tmp_path / "art", opt_level=0)
    plan = json.loads((out / "plan.json").read_text())
    kinds = {s["op_type"]: s["provider"] for s in plan["steps"]}
    for op in ("Gather", "Slice", "Pad", "Greater", "Cast", "Where", "Split"):
        assert kinds.get(op) == "c", (op, kinds)
    xv = random_array((2, 6, 5), np.float32)
    idv = np.array([5, -2, 0], np.int64)
    (got,) = Session(out).run(None, {"x": xv, "ids": idv})
    g = xv[:, [5, 4, 0]]
    w = np.where(g > 0, g, (g > 0).astype(np.float32))
    p = np.pad(xv[:2, 1:6:2, 0:4], [(0, 0), (0, 1), (0, 1)], mode="reflect")
    np.testing.assert_array_equal(got, np.concatenate([w[:, 2:], p], axis=1))
