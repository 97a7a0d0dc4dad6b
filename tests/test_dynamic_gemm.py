"""Matrix products with run-time dims (issue 17 step 3): Gemm / FusedGemm / PackedGemm and MatMul
whose rows (M, e.g. batch * seq) are known at run time only run on the C tile, K and N static.

Models with dim_params compiled once, run at row counts that hit every tail (fewer rows than a
tile, each tail length, whole tiles, the range ends) against onnxruntime; every product step on
C; x86-64-v2 and v3. The lowerings that make these steps (MatMul + Add -> Reshape + Gemm + Reshape,
the weights packed ahead of time) run on the symbolic graph.
"""

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
from compiler.frontend.importer import import_model
from compiler.passes import optimize
from runtime.session import Session
from runtime.symbolic import Expr
from tests.support.encoder_model import encoder_feeds
from tests.support.encoder_model import encoder_model
from tests.support.models import ort_run

RTOL, ATOL = 1e-3, 1e-4
F = TensorProto.FLOAT


def _close(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


def _providers(out: Path) -> dict[str, set[str]]:
    """Op type -> the providers its steps run on."""
    found: dict[str, set[str]] = {}
    for step in json.loads((out / "plan.json").read_text())["steps"]:
        found.setdefault(step["op_type"], set()).add(step["provider"])
    return found


def _products_model(k: int, n: int) -> onnx.ModelProto:
    """x [b, s, k] through: MatMul + Add by constants (-> PackedGemm, FusedGemm with Relu), MatMul
    by a constant without bias, MatMul by an input B [k, n] (read in place), Gemm with an input
    B^T [n, k] (packed at each run), MatMul by a constant [1, k, n] (broadcast over b)."""
    rng = np.random.default_rng(k * n)

    def const(name: str, *shape: int) -> onnx.TensorProto:
        array = rng.standard_normal(shape) / np.sqrt(shape[0])
        return numpy_helper.from_array(array.astype(np.float32), name)

    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["p1"]), helper.make_node("Add", ["p1", "b1"], ["q1"]),
        helper.make_node("Relu", ["q1"], ["y1"]),
        helper.make_node("MatMul", ["x", "w2"], ["y2"]),
        helper.make_node("MatMul", ["x", "bin"], ["y3"]),
        helper.make_node("MatMul", ["x", "w3"], ["y5"]),
        helper.make_node("Reshape", ["x", "flat"], ["x2"]),
        helper.make_node("Gemm", ["x2", "bt"], ["y4"], transB=1, alpha=0.5),
    ]
    graph = helper.make_graph(
        nodes, "products",
        [helper.make_tensor_value_info("x", F, ["b", "s", k]),
         helper.make_tensor_value_info("bin", F, [k, n]), helper.make_tensor_value_info("bt", F, [n, k])],
        [helper.make_tensor_value_info(y, F, shape) for y, shape in
         (("y1", ["b", "s", n]), ("y2", ["b", "s", n]), ("y3", ["b", "s", n]), ("y4", ["b * s", n]),
          ("y5", ["b", "s", n]))],
        initializer=[const("w1", k, n), const("b1", n), const("w2", k, n), const("w3", 1, k, n),
                     numpy_helper.from_array(np.array([-1, k], np.int64), "flat")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("cpu", ["x86-64-v2", "x86-64-v3"])
@pytest.mark.parametrize(("k", "n"), [(24, 456), (1024, 20)])
def test_products_with_run_time_rows(tmp_path: Path, cpu: str, k: int, n: int) -> None:
    """Rows 1 .. 200 (b * s): fewer than a tile, every tail length, whole tiles, threads. N 456: the
    weights packed ahead of time, a tail panel (AVX2); N 20 (too narrow to pack ahead) only a tail
    panel, and K 1024 (rows 4 KB apart) also copies A into k-major blocks (scratch sized by the
    rows)."""
    model = _products_model(k, n)
    out = compile_model(model, tmp_path / "p", dims={"b": (1, 4), "s": (1, 50)}, cpu=cpu)
    found = _providers(out)
    products = {"PackedGemm", "FusedGemm", "Gemm", "MatMul"} & set(found)
    assert {"MatMul", "Gemm"} <= products and ("PackedGemm" in products) == (n == 456), found
    assert all(found[op] == {"c"} for op in products), found
    session = Session(out)
    for b, s in ((1, 1), (1, 5), (1, 7), (2, 6), (3, 11), (1, 12), (4, 50), (2, 37)):
        rng = np.random.default_rng(b * 100 + s)
        feeds = {"x": rng.standard_normal((b, s, k)).astype(np.float32),
                 "bin": rng.standard_normal((k, n)).astype(np.float32),
                 "bt": rng.standard_normal((n, k)).astype(np.float32)}
        _close(session.run(None, feeds), ort_run(model, feeds))


def test_static_products_keep_their_code(tmp_path: Path) -> None:
    """The same model at one shape: no run-time dims in its products' C (nothing reads ``dyn``)."""
    model = _products_model(24, 456)
    for vi in model.graph.input:
        for d, size in zip(vi.type.tensor_type.shape.dim, (2, 6), strict=False):
            if d.dim_param:
                d.dim_value = size
    out = compile_model(model, tmp_path / "s")
    assert not list(out.glob("**/*dyn*"))
    sources = "".join(p.read_text() for p in out.glob("**/*.c"))
    assert "dyn[" not in sources and "switch" not in sources


@pytest.fixture(scope="module", params=["x86-64-v2", "x86-64-v3"])
def encoder(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> tuple[onnx.ModelProto, Path]:
    model = encoder_model(layers=1, hidden=64, heads=4, ffn=128, dynamic=True)
    return model, compile_model(model, tmp_path_factory.mktemp("enc") / "enc", cpu=request.param,
                                dims={"batch": (1, 8), "seq": (1, 512)})


@pytest.mark.parametrize(("batch", "seq"), [(1, 1), (1, 128), (3, 17), (8, 5), (2, 512), (1, 67)])
def test_encoder_projections_and_attention_on_c(encoder: tuple[onnx.ModelProto, Path], batch: int,
                                                seq: int) -> None:
    """The BERT-style encoder (``--dim batch=1..8 --dim seq=1..512``): its six projections run as
    PackedGemm, its attention as one MultiHeadAttention, on C at every (batch, seq): fewer keys
    than a vector, a tail block of query rows, keys not a multiple of the panel, the range ends."""
    model, out = encoder
    found = _providers(out)
    assert found.get("PackedGemm") == {"c"} and found.get("MultiHeadAttention") == {"c"}, found
    assert "MatMul" not in found and "Softmax" not in found, found
    feeds = encoder_feeds(model, batch=batch, seq=seq)
    _close(Session(out).run(None, feeds), ort_run(model, feeds))


def _batched_model() -> onnx.ModelProto:
    """Batched MatMuls with run-time batch, rows and columns: Q (b, 3, s, 8) x K^T (b, 3, 8, t),
    then (b, 3, s, t) x V (b, 3, t, 20): attention's products as one MatMul each."""
    nodes = [helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("MatMul", ["s", "v"], ["y"])]
    graph = helper.make_graph(
        nodes, "batched",
        [helper.make_tensor_value_info("q", F, ["b", 3, "s", 8]),
         helper.make_tensor_value_info("kt", F, ["b", 3, 8, "t"]),
         helper.make_tensor_value_info("v", F, ["b", 3, "t", 20])],
        [helper.make_tensor_value_info("y", F, ["b", 3, "s", 20])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("cpu", ["x86-64-v2", "x86-64-v3"])
def test_batched_matmul_with_run_time_batch_rows_and_columns(tmp_path: Path, cpu: str) -> None:
    """Each batch's A and B at run-time offsets, B read in place with a run-time row stride, the
    tail panel's run-time columns (t 1 .. 130: fewer than a vector, a panel's width and one more),
    the tail block's rows, and a run-time K (the second product's t)."""
    model = _batched_model()
    out = compile_model(model, tmp_path / "b", dims={"b": (1, 3), "s": (1, 40), "t": (1, 130)}, cpu=cpu)
    assert _providers(out) == {"MatMul": {"c"}}
    session = Session(out)
    for b, s, t in ((1, 1, 1), (2, 7, 15), (3, 13, 16), (1, 40, 17), (2, 6, 64), (1, 5, 65), (3, 40, 130)):
        rng = np.random.default_rng(b * 10000 + s * 100 + t)
        feeds = {"q": rng.standard_normal((b, 3, s, 8)).astype(np.float32),
                 "kt": rng.standard_normal((b, 3, 8, t)).astype(np.float32),
                 "v": rng.standard_normal((b, 3, t, 20)).astype(np.float32)}
        _close(session.run(None, feeds), ort_run(model, feeds))


def test_lowerings_run_on_the_symbolic_graph() -> None:
    """The passes a dynamic graph runs (level 3 with the C target's lowerings for run-time dims)
    never convert a symbolic dim with int(): they leave every projection a PackedGemm over rows
    batch * seq and the attention one step, its dims still expressions."""
    graph = import_model(encoder_model(layers=2, hidden=64, heads=4, ffn=128, dynamic=True), None, None,
                         {"batch": (1, 8), "seq": (1, 512)})
    graph = optimize(graph, 3, target="cpu")
    kinds = [node.kind for node in graph]
    assert kinds.count("onnx_aot.PackedGemm") == 12 and kinds.count("onnx_aot.MultiHeadAttention") == 2
    assert "MatMul" not in kinds and "Softmax" not in kinds and "onnx_aot.WinogradConv" not in kinds
    for node in graph:
        if node.kind in ("onnx_aot.PackedGemm", "onnx_aot.MultiHeadAttention"):
            assert isinstance(node.outputs[0].shape[0], Expr), node.describe()


def _broadcast_model() -> onnx.ModelProto:
    """Batched MatMuls whose batch dims broadcast: x (b, 3, s, 8) by a per-head constant
    (3, 8, 12), then by y (b, 1, 12, t) (one B per b over the heads), then a 2-D A (5, s) by that
    (b, 3, s, t)."""
    rng = np.random.default_rng(7)
    nodes = [helper.make_node("MatMul", ["x", "wh"], ["p"]), helper.make_node("MatMul", ["p", "y"], ["q"]),
             helper.make_node("MatMul", ["a", "q"], ["r"])]
    graph = helper.make_graph(
        nodes, "broadcast",
        [helper.make_tensor_value_info("x", F, ["b", 3, "s", 8]),
         helper.make_tensor_value_info("y", F, ["b", 1, 12, "t"]),
         helper.make_tensor_value_info("a", F, [5, "s"])],
        [helper.make_tensor_value_info("r", F, ["b", 3, 5, "t"])],
        initializer=[numpy_helper.from_array(rng.standard_normal((3, 8, 12)).astype(np.float32), "wh")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("cpu", ["x86-64-v2", "x86-64-v3"])
def test_batched_matmul_broadcasting_batches(tmp_path: Path, cpu: str) -> None:
    """Each batch's A and B offsets from its index along every batch axis, 0 along a broadcast one
    (B per head only, B per batch only, A shared by every batch); run-time K (s) in the last."""
    model = _broadcast_model()
    out = compile_model(model, tmp_path / "b", dims={"b": (1, 4), "s": (1, 30), "t": (1, 70)}, cpu=cpu)
    assert _providers(out) == {"MatMul": {"c"}}
    session = Session(out)
    for b, s, t in ((1, 1, 1), (2, 7, 17), (4, 30, 70), (3, 13, 64)):
        rng = np.random.default_rng(b * 10000 + s * 100 + t)
        feeds = {"x": rng.standard_normal((b, 3, s, 8)).astype(np.float32),
                 "y": rng.standard_normal((b, 1, 12, t)).astype(np.float32),
                 "a": rng.standard_normal((5, s)).astype(np.float32)}
        _close(session.run(None, feeds), ort_run(model, feeds))
