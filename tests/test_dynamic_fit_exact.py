"""Symbolic output dims are exact at every size in range, or the import refuses.

The dynamic import fits each node's output dims from sampled ("probe") sizes. Where several
expressions agree at the probes, a fit could be wrong at sizes no probe hit: a pad of W up to a
multiple of 32 (``Shape -> Gather -> Add 31 -> Div 32 -> Mul 32 -> Sub -> Pad``) was fitted as
``32*((W+30)//32)``, 32 columns short at W = 33 and 65. Shape arithmetic is now computed exactly
(``compiler/frontend/shape_arith.py``) and every remaining fit is checked at the sizes where a floor
boundary falls (``compiler/frontend/fit_check.py``). The models here are built as exporters write
them, compiled once over a range and run at every size of it (or at every boundary size of a larger
one) against onnxruntime: shapes and values.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

import compiler.frontend.folding as folding
from compiler.driver import compile_model
from compiler.frontend.fit_check import check_bindings
from compiler.frontend.fit_check import verify_fits
from compiler.frontend.importer import import_model
from compiler.frontend.probing import Probes
from runtime.errors import ShapeError
from runtime.session import Session
from runtime.symbolic import evaluate
from runtime.symbolic import sym

N = helper.make_node
CPU = "x86-64-v3"


def _ints(name: str, values: Any, dtype: Any = np.int64) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, dtype), name)


def _model(nodes: list[onnx.NodeProto], shape: list[Any], inits: list[onnx.TensorProto],
           rank: int | None = None) -> onnx.ModelProto:
    out = ["o0", "o1", "o2", "o3"][:rank or len(shape)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, out)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _dim(axis: int, out: str) -> list[onnx.NodeProto]:
    return [N("Shape", ["x"], [f"{out}_s"]), N("Gather", [f"{out}_s", f"i{axis}"], [out], axis=0)]


def pad_to_32() -> onnx.ModelProto:
    """``F.pad(x, (0, (W + 31) // 32 * 32 - W))`` as torch.onnx writes it."""
    nodes = [*_dim(3, "w"), N("Add", ["w", "c31"], ["w31"]), N("Div", ["w31", "c32"], ["q"]),
             N("Mul", ["q", "c32"], ["wp"]), N("Sub", ["wp", "w"], ["padw"]),
             N("Unsqueeze", ["padw", "ax0"], ["padw1"]), N("Concat", ["z7", "padw1"], ["pads"], axis=0),
             N("Pad", ["x", "pads"], ["out"])]
    inits = [_ints("i3", 3), _ints("c31", 31), _ints("c32", 32), _ints("ax0", [0]), _ints("z7", [0] * 7)]
    return _model(nodes, [1, 3, "H", "W"], inits)


def _run_all(model: onnx.ModelProto, out: Path, shapes: Iterable[tuple[int, ...]]) -> int:
    ort = pytest.importorskip("onnxruntime")
    session, reference = Session(out), ort.InferenceSession(model.SerializeToString())
    count = 0
    for shape in shapes:
        x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
        got, want = session.run(None, {"x": x})[0], reference.run(None, {"x": x})[0]
        assert got.shape == want.shape, shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"{shape}")
        count += 1
    return count


def test_pad_to_a_multiple_of_32_is_exact_at_every_width(tmp_path: Path) -> None:
    model, dims = pad_to_32(), {"H": (8, 11), "W": (8, 70)}
    (out,) = import_model(model, dims=dims).outputs
    assert out.shape[3] == 32 * ((sym("W") + 31) // 32)
    path = compile_model(model, tmp_path / "a", dims=dims, cpu=CPU)
    assert _run_all(model, path, [(1, 3, 8 + w % 4, w) for w in range(8, 71)]) == 63


def test_a_fit_the_probes_leave_ambiguous_is_settled_by_the_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the exact arithmetic the pad folds from probes, fitted as the smallest offset they
    allow, ``(W+30)//32``; the check at W = 33 finds it wrong and the refit is exact."""
    monkeypatch.setattr(folding, "fold_exact", lambda *args: None)
    for hi in (70, 3000):
        (out,) = import_model(pad_to_32(), dims={"H": (8, 11), "W": (8, hi)}).outputs
        assert out.shape[3] == 32 * ((sym("W") + 31) // 32)


def test_integer_division_truncates_toward_zero_over_negative_values(tmp_path: Path) -> None:
    """``(W - 100) / 8`` is negative over 8..70: ONNX's Div truncates (``-((100 - W) // 8)``), where
    a floor would be one less at most widths."""
    nodes = [*_dim(1, "w"), N("Sub", ["w", "c100"], ["d"]), N("Div", ["d", "c8"], ["q"]),
             N("Add", ["q", "c20"], ["n"]), N("Unsqueeze", ["n", "ax0"], ["ends"]),
             N("Slice", ["x", "zero", "ends", "ax1"], ["out"])]
    inits = [_ints("i1", 1), _ints("c100", 100), _ints("c8", 8), _ints("c20", 20), _ints("ax0", [0]),
             _ints("zero", [0]), _ints("ax1", [1])]
    model = _model(nodes, [1, "W"], inits)
    dims = {"W": (8, 70)}
    (out,) = import_model(model, dims=dims).outputs
    for w in range(8, 71):
        assert evaluate(out.shape[1], {"W": w}) == min(w, 20 + int((w - 100) / 8)), w
    path = compile_model(model, tmp_path / "a", dims=dims, cpu=CPU)
    assert _run_all(model, path, [(1, w) for w in range(8, 71)]) == 63


def test_a_slice_with_a_step_and_computed_end_at_every_size(tmp_path: Path) -> None:
    """``x[:, :, :, 1:W-1:5]``: the end from ``Shape``."""
    nodes = [*_dim(3, "w"), N("Sub", ["w", "one"], ["e"]), N("Unsqueeze", ["e", "ax0"], ["ends"]),
             N("Slice", ["x", "starts", "ends", "axes", "steps"], ["out"])]
    inits = [_ints("i3", 3), _ints("one", 1), _ints("ax0", [0]), _ints("starts", [1]), _ints("axes", [3]),
             _ints("steps", [5])]
    model, dims = _model(nodes, [1, 2, 3, "W"], inits), {"W": (3, 90)}
    path = compile_model(model, tmp_path / "a", dims=dims, cpu=CPU)
    assert _run_all(model, path, [(1, 2, 3, w) for w in range(3, 91)]) == 88


def test_a_strided_slice_by_3_over_a_range(tmp_path: Path) -> None:
    """``x[:, ::3]``: ``(L+2)//3`` at every L in 1..150."""
    nodes = [N("Slice", ["x", "starts", "ends", "axes", "steps"], ["out"])]
    inits = [_ints("starts", [0]), _ints("ends", [2**62]), _ints("axes", [1]), _ints("steps", [3])]
    model, dims = _model(nodes, [2, "L"], inits), {"L": (1, 150)}
    (out,) = import_model(model, dims=dims).outputs
    assert out.shape[1] == (sym("L") + 2) // 3
    path = compile_model(model, tmp_path / "a", dims=dims, cpu=CPU)
    assert _run_all(model, path, [(2, n) for n in range(1, 151)]) == 150


def test_a_slice_of_step_40_at_every_boundary_of_a_large_range(tmp_path: Path) -> None:
    """Step 40 over 8..3000: no probe set covers its 40 residues; the fit is checked where its
    floor steps (and at residues 0, 1, 39), and the artifact is run at each of those sizes."""
    nodes = [N("Slice", ["x", "starts", "ends", "axes", "steps"], ["out"])]
    inits = [_ints("starts", [3]), _ints("ends", [2**62]), _ints("axes", [1]), _ints("steps", [40])]
    model, dims = _model(nodes, [1, "L"], inits), {"L": (8, 3000)}
    (out,) = import_model(model, dims=dims).outputs
    assert out.shape[1] == (sym("L") + 36) // 40
    sizes = sorted({8, 9, 3000, *(n for n in range(8, 3001) if n % 40 in (0, 1, 3, 4, 39))})
    path = compile_model(model, tmp_path / "a", dims=dims, cpu=CPU)
    assert _run_all(model, path, [(1, n) for n in sizes]) == len(sizes)


def test_resize_by_sizes_computed_from_the_shape(tmp_path: Path) -> None:
    """``F.interpolate(x, size=(H * 3 // 2, (W + 1) // 2))`` of a dynamic input: the sizes from
    ``Shape`` through float arithmetic (Cast, Mul 3.0, Floor, Cast back) and integer Div."""
    nodes = [*_dim(2, "h"), *_dim(3, "w"), N("Cast", ["h"], ["hf"], to=TensorProto.FLOAT),
             N("Mul", ["hf", "f3"], ["hf2"]), N("Floor", ["hf2"], ["hf3"]),
             N("Cast", ["hf3"], ["h3x"], to=TensorProto.INT64), N("Div", ["h3x", "two"], ["h2"]),
             N("Add", ["w", "one"], ["w1"]),
             N("Div", ["w1", "two"], ["w2"]), N("Unsqueeze", ["h2", "ax0"], ["h3"]),
             N("Unsqueeze", ["w2", "ax0"], ["w3"]), N("Concat", ["nc", "h3", "w3"], ["sizes"], axis=0),
             N("Resize", ["x", "", "", "sizes"], ["out"], mode="nearest")]
    inits = [_ints("i2", 2), _ints("i3", 3), _ints("one", 1), _ints("two", 2), _ints("ax0", [0]),
             _ints("nc", [1, 2]), numpy_helper.from_array(np.array(3.0, np.float32), "f3")]
    model, dims = _model(nodes, [1, 2, "H", "W"], inits), {"H": (2, 9), "W": (2, 41)}
    (out,) = import_model(model, dims=dims).outputs
    assert out.shape[2:] == ((3 * sym("H")) // 2, (sym("W") + 1) // 2)
    path = compile_model(model, tmp_path / "a", dims=dims, cpu=CPU)
    shapes = [(1, 2, h, w) for h in (2, 3, 8, 9) for w in range(2, 42)]
    assert _run_all(model, path, shapes) == len(shapes)


def test_a_reshape_by_computed_dims_into_blocks_of_8(tmp_path: Path) -> None:
    """Pad L up to a multiple of 8, then ``reshape(n, (L + 7) // 8, 8)`` from the same arithmetic."""
    nodes = [N("Shape", ["x"], ["s"]), N("Gather", ["s", "i0"], ["n"]), N("Gather", ["s", "i1"], ["l"]),
             N("Add", ["l", "c7"], ["l7"]), N("Div", ["l7", "c8"], ["blocks"]),
             N("Mul", ["blocks", "c8"], ["lp"]),
             N("Sub", ["lp", "l"], ["pad"]), N("Unsqueeze", ["pad", "ax0"], ["pad1"]),
             N("Concat", ["z3", "pad1"], ["pads"], axis=0), N("Pad", ["x", "pads"], ["padded"]),
             N("Unsqueeze", ["n", "ax0"], ["n1"]), N("Unsqueeze", ["blocks", "ax0"], ["b1"]),
             N("Concat", ["n1", "b1", "c8v"], ["shape"], axis=0), N("Reshape", ["padded", "shape"], ["out"])]
    inits = [_ints("i0", 0), _ints("i1", 1), _ints("c7", 7), _ints("c8", 8), _ints("ax0", [0]),
             _ints("z3", [0, 0, 0]), _ints("c8v", [8])]
    model, dims = _model(nodes, ["n", "L"], inits, rank=3), {"n": (1, 3), "L": (1, 100)}
    (out,) = import_model(model, dims=dims).outputs
    assert out.shape == (sym("n"), (sym("L") + 7) // 8, 8)
    path = compile_model(model, tmp_path / "a", dims=dims, cpu=CPU)
    assert _run_all(model, path, [(1 + n % 3, n) for n in range(1, 101)]) == 100


def test_a_shape_value_the_probes_miss_is_refused_naming_the_node_and_size() -> None:
    """``W + (W == k)``: no probe lands on k, so at every probe ``W == k`` is False; the checks at
    every width find k, the comparison stays a node, and the ConstantOfShape that needs its value
    at compile time is refused naming it and the size (before, it folded to False: a silent
    wrong shape at W = k)."""
    lo, hi = 8, 70
    probes = Probes({"W": (lo, hi)})
    k = next(w for w in range(lo + 5, hi) if all(b["W"] != w for b in [*probes.varied, *probes.aligned]))
    nodes = [*_dim(1, "w"), N("Equal", ["w", "k"], ["eq"], name="is_k"),
             N("Cast", ["eq"], ["eqi"], to=TensorProto.INT64), N("Add", ["w", "eqi"], ["n"]),
             N("Unsqueeze", ["n", "ax0"], ["n1"]), N("Concat", ["one", "n1"], ["shape"], axis=0),
             N("ConstantOfShape", ["shape"], ["z"]), N("Add", ["z", "x0"], ["out"])]
    inits = [_ints("i1", 1), _ints("k", k), _ints("ax0", [0]), _ints("one", [1]),
             numpy_helper.from_array(np.zeros((1, 1), np.float32), "x0")]
    with pytest.raises(ShapeError) as info:
        import_model(_model(nodes, [1, "W"], inits), dims={"W": (lo, hi)})
    text = str(info.value)
    assert "node 'is_k' (Equal)" in text and f"W={k}" in text, text


def test_verify_fits_refuses_a_wrong_fit_naming_the_node_dim_and_size() -> None:
    """The checker itself: a fit ``W`` of a dim that is ``W + 1`` at one size (next to the range's
    end, a size every check holds) is refused."""
    ranges = {"W": (8, 300)}
    W = sym("W")

    def truth(bindings: list[dict[str, int]]) -> list[list[int] | None]:
        return [[b["W"] + (b["W"] == 299)] for b in bindings]

    with pytest.raises(ShapeError, match=r"node 'n' \(Slice\): output 'y' dim 1 .*300 at W=299"):
        verify_fits("node 'n' (Slice)", ["output 'y' dim 1"], [W], [({"W": 8}, [8]), ({"W": 300}, [300])],
                    [W], truth, ranges)


def test_the_checked_sizes_hold_every_floor_boundary_of_the_fit() -> None:
    """Over 32..2048 the check sizes of ``(W+31)//32`` include the sizes where it steps (W % 32 ==
    1) and the size before, the range ends, and the residues 0, 1, d-1 of the tried divisors."""
    W = sym("W")
    sizes = {b["W"] for b in check_bindings({"W": (32, 2048)}, ["W"], {"W": 32}, [(W + 31) // 32], new=False)}
    assert {32, 33, 2047, 2048} <= sizes
    assert any(s % 32 == 1 and s > 33 for s in sizes) and any(s % 32 == 0 and s > 64 for s in sizes)
    assert all(any(s % d == r for s in sizes) for d in (3, 5, 7, 64) for r in (0, 1, d - 1))
    # a new expression over a range of at most EXHAUSTIVE_NEW sizes is checked at every size
    every = check_bindings({"W": (32, 2048)}, ["W"], {"W": 32}, [(W + 31) // 32], new=True)
    assert len(every) == 2048 - 32 + 1
