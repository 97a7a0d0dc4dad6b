"""The C provider's reduction kernels: Reduce*, ArgMax / ArgMin, TopK, LayerNormalization, Einsum.

Each case compiles a small ONNX model (several nodes on the same inputs, to keep the number of C
builds down), checks in plan.json that the C provider ran every node of interest, runs the
artifact and compares each output with the reference kernel of runtime.kernels applied to the
step's canonical attributes (plan.json). Shapes and axes are deliberately unlike the ONNX node
suite's: odd sizes, kept and reduced groups interleaved, rows longer than a column block, and
sizes large enough to take the OpenMP paths.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper
from onnx import numpy_helper

from compiler.driver import compile_model
from compiler.providers.c.einsum import contraction
from runtime import Session
from runtime.kernels import get_kernel

RNG = np.random.default_rng(20261123)
REDUCE_OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"]  # fmt: skip


def onnx_model(nodes: list[onnx.NodeProto], feeds: dict[str, np.ndarray], outputs: list[str],
               inits: dict[str, np.ndarray] | None = None, opset: int = 18) -> onnx.ModelProto:  # fmt: skip
    """A model of ``nodes`` with output types from ONNX shape inference."""
    ins = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for n, a in feeds.items()
    ]
    graph = helper.make_graph(
        nodes,
        "case",
        ins,
        [helper.make_empty_tensor_value_info(o) for o in outputs],
        [numpy_helper.from_array(a, n) for n, a in (inits or {}).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return onnx.shape_inference.infer_shapes(model, strict_mode=True)


def run_case(model: onnx.ModelProto, feeds: dict[str, np.ndarray], kinds: set[str], tmp_path: Path,
             rtol: float = 1e-4, atol: float = 1e-5) -> list[dict[str, Any]]:  # fmt: skip
    """Compile, check that C runs every step of ``kinds``, and compare with the reference kernels."""
    path = compile_model(model, tmp_path / "artifact")
    plan = json.loads((path / "plan.json").read_text())
    steps = [s for s in plan["steps"] if s["op_type"] in kinds]
    assert steps, "no step of interest in the plan"
    assert {s["name"]: s["provider"] for s in steps} == {s["name"]: "c" for s in steps}
    session = Session(path)
    got = dict(zip([o.name for o in session.outputs], session.run(None, feeds), strict=True))
    for step in steps:
        specs = [(got[o].shape, got[o].dtype) for o in step["outputs"]]
        want = get_kernel(step["op_type"])(np, [feeds[i] for i in step["inputs"]], step["attrs"], specs)
        for name, w in zip(step["outputs"], want, strict=True):
            np.testing.assert_allclose(got[name], w, rtol=rtol, atol=atol, err_msg=f"{step['name']} {name}")
    return steps


# -- Reduce* ----------------------------------------------------------------------------------


def reduce_model(ops: list[str], x: np.ndarray, axes: list[int], keepdims: int) -> onnx.ModelProto:
    """One node per op of ``ops``, all reducing ``x`` (opset 20: ReduceMax / ReduceMin take bool)."""
    nodes = [helper.make_node(op, ["x", "axes"], [f"y_{op}"], keepdims=keepdims) for op in ops]
    outs = [f"y_{op}" for op in ops]
    return onnx_model(nodes, {"x": x}, outs, {"axes": np.array(axes, np.int64)}, opset=20)


@pytest.mark.parametrize(
    ("shape", "axes", "keepdims"),
    [
        ((7, 13), [1], 0),  # rows: contiguous runs
        ((7, 13), [0], 1),  # cols
        ((3, 5, 6, 7), [0, 2], 0),  # kept and reduced groups interleaved, cols
        ((3, 5, 6, 7), [-3, -1], 1),  # interleaved, rows
        ((2, 301, 3), [0, 2], 0),  # cols rows longer than one block... and rows of 3
        ((5, 600), [0], 0),  # cols: several blocks per output row
        ((96, 1031), [1], 0),  # rows, large enough to run in parallel
        ((4, 1, 9), [1], 1),  # reducing a size-1 dimension only
        ((6, 11), [0, 1], 0),  # everything
    ],
)
def test_reductions(shape: tuple[int, ...], axes: list[int], keepdims: int, tmp_path: Path) -> None:
    x = RNG.uniform(0.6, 1.4, shape).astype(np.float32)  # positive (LogSum), products stay finite
    x *= RNG.choice(np.array([-1, 1], np.float32), shape) if len(axes) == 1 else 1
    ops = [op for op in REDUCE_OPS if op != "ReduceLogSum" or len(axes) != 1]
    run_case(reduce_model(ops, x, axes, keepdims), {"x": x}, set(ops), tmp_path, rtol=2e-4)


@pytest.mark.parametrize("axes", [[1], [0]])
def test_reductions_special_values(axes: list[int], tmp_path: Path) -> None:
    x = RNG.standard_normal((6, 9)).astype(np.float32)
    x[1, 2] = np.nan
    x[2, :] = -np.inf
    x[3, 4] = np.inf
    x[:, 5] = -np.inf
    x[4, 7] = np.nan
    ops = ["ReduceMax", "ReduceMin", "ReduceSum", "ReduceLogSumExp"]
    path = compile_model(reduce_model(ops, x, axes, 0), tmp_path / "a")
    got = Session(path).run(None, {"x": x})
    with np.errstate(all="ignore"):
        want = [np.max(x, axis=axes[0]), np.min(x, axis=axes[0]), np.sum(x, axis=axes[0]),
                np.log(np.sum(np.exp(x.astype(np.float64)), axis=axes[0]))]  # fmt: skip
    for op, g, w in zip(ops, got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, err_msg=op)


def test_reductions_of_an_empty_set(tmp_path: Path) -> None:
    x = np.zeros((3, 0, 4), np.float32)
    ops = ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ReduceLogSumExp"]
    path = compile_model(reduce_model(ops, x, [1], 1), tmp_path / "a")
    plan = json.loads((path / "plan.json").read_text())
    assert {s["provider"] for s in plan["steps"]} == {"c"}
    got = Session(path).run(None, {"x": x})
    for g, value in zip(got, [0.0, -np.inf, np.inf, 1.0, 0.0, -np.inf], strict=True):
        np.testing.assert_array_equal(g, np.full((3, 1, 4), value, np.float32))


@pytest.mark.parametrize(
    ("dtype", "ops"),
    [
        (np.float64, REDUCE_OPS),
        (np.int32, ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceSumSquare"]),
        (np.int64, ["ReduceSum", "ReduceMax", "ReduceMin"]),
        (np.uint8, ["ReduceMax", "ReduceMin"]),
        (np.bool_, ["ReduceMax", "ReduceMin"]),
    ],
)
def test_reductions_of_other_dtypes(dtype: type, ops: list[str], tmp_path: Path) -> None:
    x: np.ndarray
    if np.dtype(dtype).kind == "f":
        x = RNG.uniform(0.5, 1.5, (5, 4, 7)).astype(dtype)
    else:
        x = RNG.integers(0, 2 if dtype is np.bool_ else 5, (5, 4, 7)).astype(dtype)
    for axes in ([1], [0, 2]):
        run_case(reduce_model(ops, x, axes, 0), {"x": x}, set(ops), tmp_path / str(axes[0]))


# -- ArgMax / ArgMin ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_argmax_argmin(dtype: type, tmp_path: Path) -> None:
    x: np.ndarray = RNG.integers(-3, 4, (4, 9, 6)).astype(dtype)  # many ties
    nodes, outs = [], []
    for op in ("ArgMax", "ArgMin"):
        for axis in (0, 1, -1):
            for last in (0, 1):
                outs.append(f"{op}_{axis}_{last}")
                nodes.append(helper.make_node(op, ["x"], [outs[-1]], axis=axis, keepdims=axis % 2,
                                              select_last_index=last))  # fmt: skip
    run_case(onnx_model(nodes, {"x": x}, outs), {"x": x}, {"ArgMax", "ArgMin"}, tmp_path)


def test_argmax_nan_is_the_extreme(tmp_path: Path) -> None:
    x = np.array([[1, np.nan, 5, np.nan, 2], [3, 3, 1, 1, 3]], np.float32)
    nodes = [helper.make_node(op, ["x"], [f"{op}{last}"], axis=1, keepdims=0, select_last_index=last)
             for op in ("ArgMax", "ArgMin") for last in (0, 1)]  # fmt: skip
    model = onnx_model(nodes, {"x": x}, [n.output[0] for n in nodes])
    got = Session(compile_model(model, tmp_path / "a")).run(None, {"x": x})
    assert [g.tolist() for g in got] == [[1, 0], [3, 4], [1, 2], [3, 3]]


# -- TopK -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "shape", "axis", "k"),
    [
        (np.float32, (5, 37), 1, 7),
        (np.float32, (9, 6, 4), 1, 6),  # k = the whole axis, strided rows
        (np.float64, (3, 11, 2), -2, 1),
        (np.int64, (64, 700), 1, 33),  # parallel, many ties
    ],
)
def test_topk(dtype: type, shape: tuple[int, ...], axis: int, k: int, tmp_path: Path) -> None:
    x: np.ndarray
    if np.dtype(dtype).kind == "f":
        x = RNG.standard_normal(shape).astype(dtype)
        x.flat[::5] = 0.5  # ties
    else:
        x = RNG.integers(-20, 20, shape).astype(dtype)
    nodes, outs = [], []
    for largest in (0, 1):
        outs += [f"v{largest}", f"i{largest}"]
        nodes.append(helper.make_node("TopK", ["x", "k"], outs[-2:], axis=axis, largest=largest, sorted=1))
    model = onnx_model(nodes, {"x": x}, outs, {"k": np.array([k], np.int64)})
    run_case(model, {"x": x}, {"TopK"}, tmp_path, rtol=0, atol=0)


def test_topk_nan_ranks_as_the_largest(tmp_path: Path) -> None:
    x = np.array([[2, np.nan, 7, np.nan, -1, 7]], np.float32)
    nodes = [helper.make_node("TopK", ["x", "k"], [f"v{b}", f"i{b}"], axis=1, largest=b) for b in (0, 1)]
    model = onnx_model(nodes, {"x": x}, ["v0", "i0", "v1", "i1"], {"k": np.array([4], np.int64)})
    _, i0, _, i1 = Session(compile_model(model, tmp_path / "a")).run(None, {"x": x})
    assert i0.tolist() == [[4, 0, 2, 5]]
    assert i1.tolist() == [[1, 3, 2, 5]]


# -- LayerNormalization -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "axis", "scale_shape", "bias", "stats"),
    [
        ((3, 5, 37), -1, (37,), True, 0),
        ((3, 5, 37), 1, (5, 37), False, 2),
        ((2, 3, 4, 5), 2, (1,), True, 1),  # one scale for every element
        ((64, 768), -1, (768,), True, 2),  # parallel
    ],
)
def test_layer_normalization(shape: tuple[int, ...], axis: int, scale_shape: tuple[int, ...], bias: bool,
                             stats: int, tmp_path: Path) -> None:  # fmt: skip
    x = (RNG.standard_normal(shape) * 3 + 1).astype(np.float32)
    feeds = {"x": x, "scale": RNG.standard_normal(scale_shape).astype(np.float32)}
    if bias:
        feeds["bias"] = RNG.standard_normal(shape[axis:]).astype(np.float32)
    outs = ["y", "mean", "inv_std"][: 1 + stats]
    node = helper.make_node("LayerNormalization", list(feeds), outs, axis=axis, epsilon=1e-3)
    run_case(onnx_model([node], feeds, outs), feeds, {"LayerNormalization"}, tmp_path)


# -- Einsum -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("equation", "shapes"),
    [
        ("bij,bjk->bik", [(3, 5, 7), (3, 7, 9)]),
        ("bhid,bhjd->bhij", [(2, 3, 5, 16), (2, 3, 6, 16)]),  # attention scores
        ("bhij,bhjd->bhid", [(2, 3, 5, 6), (2, 3, 6, 16)]),  # attention context
        ("...ij,...jk->...ik", [(2, 1, 3, 4), (1, 5, 4, 6)]),  # broadcast batch dims
        ("ij,j->i", [(9, 17), (17,)]),
        ("ij->ji", [(5, 7)]),
        ("ii->i", [(6, 6)]),
        ("abc->", [(3, 4, 5)]),
        ("ij,jk", [(4, 5), (5, 3)]),  # implicit output
        ("i,i", [(11,)]),  # one input used twice
        ("bsh,hd->bsd", [(4, 64, 96), (96, 80)]),  # parallel
    ],
)
def test_einsum(equation: str, shapes: list[tuple[int, ...]], tmp_path: Path) -> None:
    feeds = {f"x{k}": RNG.standard_normal(s).astype(np.float32) for k, s in enumerate(shapes)}
    names = list(feeds) * (2 if equation == "i,i" else 1)
    node = helper.make_node("Einsum", names, ["y"], equation=equation)
    run_case(onnx_model([node], feeds, ["y"], opset=12), feeds, {"Einsum"}, tmp_path, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float64, np.int64])
def test_einsum_other_dtypes(dtype: type, tmp_path: Path) -> None:
    feeds: dict[str, np.ndarray] = {
        n: RNG.integers(-5, 5, s).astype(dtype) for n, s in [("a", (2, 4, 3)), ("b", (2, 3, 5))]
    }
    node = helper.make_node("Einsum", ["a", "b"], ["y"], equation="bij,bjk->bik")
    run_case(onnx_model([node], feeds, ["y"], opset=12), feeds, {"Einsum"}, tmp_path)


def test_einsum_equations_resolve_like_numpy() -> None:
    c = contraction("...ij,jk", [(2, 1, 3, 4), (4, 6)])
    assert c.output == ("0", "1", "i", "k")
    assert c.size("0") == 2 and c.stride(0, "i", (2, 1, 3, 4)) == 4
    assert contraction("iJ,Jk", [(2, 3), (3, 4)]).output == ("i", "k")  # "J" is repeated: summed
    assert contraction("ba", [(2, 3)]).output == ("a", "b")
    assert contraction("ii", [(3, 3)]).stride(0, "i", (3, 3)) == 4
    for equation, shapes in [("ij,jk->ik", [(2, 3), (4, 5)]), ("ij->ii", [(2, 2)]), ("ijk->i", [(2, 3)])]:
        with pytest.raises(ValueError):
            contraction(equation, shapes)


def test_einsum_picks_the_contiguous_loop_order(tmp_path: Path) -> None:
    """Attention scores sum dot products along d; a batched matmul accumulates output rows."""
    cases: list[tuple[str, list[tuple[int, ...]], str]] = [
        ("bhid,bhjd->bhij", [(1, 2, 3, 8), (1, 2, 5, 8)], "dot"),
        ("bij,bjk->bik", [(2, 3, 4), (2, 4, 9)], "axpy"),
    ]
    for equation, shapes, mode in cases:
        feeds = {f"x{k}": np.ones(s, np.float32) for k, s in enumerate(shapes)}
        node = helper.make_node("Einsum", list(feeds), ["y"], equation=equation)
        path = compile_model(onnx_model([node], feeds, ["y"], opset=12), tmp_path / mode)
        source = (path / "kernels" / "cpu" / "model.c").read_text()
        assert ("yo[n] +=" in source) == (mode == "axpy"), equation
