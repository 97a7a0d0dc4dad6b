"""The worker pool (issue 31) under the kernels that are not convolutions, GEMMs or elementwise:
pools (NCHW and channels-last), reductions with LayerNorm / ArgMax / TopK, Softmax, the channel
kernels (BatchNormalization, LRN, global pools), Einsum, and the movement kernels (Gather, Pad,
Resize, Split, Slice, Tile, the typed maps of Cast / Where / comparisons). Each group is one graph
sized so that every one of its steps takes the pool: the step's kernel in model.c (built for an
explicit --cpu level) calls onnx_aot_parallel and holds no OpenMP region (only ``omp simd``, a
vectorizing hint for the float sums), the outputs are bit for bit the same at threads 1, 2 and 3
and while a spinning process takes a core, and they match onnxruntime."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler.driver import compile_model
from runtime.session import Session
from tests.cpu_targets import host_runs
from tests.support.load import busy_core
from tests.support.models import ort_run

CPU = "x86-64-v3"  # the C text checked is this level's; the suite's hosts all run it
RTOL, ATOL = 1e-4, 1e-5

Build = Callable[[], tuple[onnx.ModelProto, dict[str, np.ndarray], set[str]]]


def _model(nodes: list[onnx.NodeProto], x: tuple[int, ...], outputs: list[str],
           inits: dict[str, np.ndarray]) -> onnx.ModelProto:  # fmt: skip
    """The graph of ``nodes`` on input x of shape ``x``, its outputs typed by shape inference."""
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x))], [],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
    model.graph.output.extend(inferred[name] for name in outputs)
    return model


def _feeds(shape: tuple[int, ...], seed: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}


def _pools() -> tuple[onnx.ModelProto, dict[str, np.ndarray], set[str]]:
    """NCHW MaxPool / AveragePool, LRN, BatchNormalization and both global pools."""
    rng = np.random.default_rng(3)
    c = 32
    bn = {f"bn.{k}": v.astype(np.float32) for k, v in
          (("s", rng.uniform(0.5, 2, c)), ("b", rng.standard_normal(c)), ("m", rng.standard_normal(c)),
           ("v", rng.uniform(0.5, 2, c)))}
    nodes = [
        helper.make_node("MaxPool", ["x"], ["mp"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("AveragePool", ["mp"], ["ap"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("LRN", ["ap"], ["lrn"], size=5, alpha=1e-3, beta=0.75, bias=1.0),
        helper.make_node("BatchNormalization", ["lrn", *bn], ["bn"], epsilon=1e-5),
        helper.make_node("GlobalAveragePool", ["bn"], ["gap"]),
        helper.make_node("GlobalMaxPool", ["bn"], ["gmp"]),
    ]
    ops = {"MaxPool", "AveragePool", "LRN", "BatchNormalization", "GlobalAveragePool", "GlobalMaxPool"}
    return _model(nodes, (2, c, 64, 64), ["bn", "gap", "gmp"], bn), _feeds((2, c, 64, 64), 1), ops


def _pools_nhwc() -> tuple[onnx.ModelProto, dict[str, np.ndarray], set[str]]:
    """A convolution in front puts the pools channels-last (the onnx_aot.*Nhwc kinds)."""
    rng = np.random.default_rng(4)
    w = (rng.standard_normal((48, 16, 3, 3)) / 12).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("MaxPool", ["c"], ["mp"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("AveragePool", ["mp"], ["ap"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("LRN", ["ap"], ["lrn"], size=5, alpha=1e-3, beta=0.75, bias=1.0),
        helper.make_node("GlobalAveragePool", ["lrn"], ["gap"]),
    ]
    ops = {"MaxPoolNhwc", "AveragePoolNhwc", "LRNNhwc", "GlobalAveragePoolNhwc"}
    return _model(nodes, (2, 16, 64, 64), ["lrn", "gap"], {"w": w}), _feeds((2, 16, 64, 64), 2), ops


def _reductions() -> tuple[onnx.ModelProto, dict[str, np.ndarray], set[str]]:
    """Rows and columns of ReduceSum / Mean / Max / LogSumExp, LayerNormalization, ArgMax, TopK."""
    rng = np.random.default_rng(5)
    n = 40
    inits = {"ax2": np.array([2], np.int64), "ax1": np.array([1], np.int64), "k": np.array([5], np.int64),
             "ln.s": rng.uniform(0.5, 2, n).astype(np.float32),
             "ln.b": rng.standard_normal(n).astype(np.float32)}
    nodes = [
        helper.make_node("ReduceSum", ["x", "ax2"], ["sum_rows"], keepdims=0),
        helper.make_node("ReduceMean", ["x", "ax1"], ["mean_cols"], keepdims=0),
        helper.make_node("ReduceMax", ["x", "ax2"], ["max_rows"], keepdims=0),
        helper.make_node("ReduceLogSumExp", ["x", "ax1"], ["lse_cols"], keepdims=1),
        helper.make_node("LayerNormalization", ["x", "ln.s", "ln.b"], ["ln"], axis=-1, epsilon=1e-5),
        helper.make_node("ArgMax", ["x"], ["argmax"], axis=1, keepdims=0),
        helper.make_node("TopK", ["x", "k"], ["top_v", "top_i"], axis=-1),
    ]
    outs = ["sum_rows", "mean_cols", "max_rows", "lse_cols", "ln", "argmax", "top_v", "top_i"]
    ops = {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceLogSumExp", "LayerNormalization", "ArgMax", "TopK"}
    return _model(nodes, (64, 48, n), outs, inits), _feeds((64, 48, n), 3), ops


def _softmax() -> tuple[onnx.ModelProto, dict[str, np.ndarray], set[str]]:
    """Softmax along contiguous rows and along elements apart (columns), LogSoftmax."""
    nodes = [
        helper.make_node("Softmax", ["x"], ["rows"], axis=-1),
        helper.make_node("Softmax", ["x"], ["cols"], axis=1),
        helper.make_node("LogSoftmax", ["x"], ["log_rows"], axis=-1),
    ]
    return (_model(nodes, (8, 64, 100), ["rows", "cols", "log_rows"], {}), _feeds((8, 64, 100), 4),
            {"Softmax", "LogSoftmax"})


def _einsum() -> tuple[onnx.ModelProto, dict[str, np.ndarray], set[str]]:
    """A batched contraction with a reduced label (dot) and an outer product (axpy)."""
    rng = np.random.default_rng(6)
    inits = {"w": rng.standard_normal((16, 64)).astype(np.float32),
             "v": rng.standard_normal((16, 48)).astype(np.float32)}
    nodes = [
        helper.make_node("Einsum", ["x", "w"], ["dot"], equation="bij,bj->bi"),
        helper.make_node("Einsum", ["x", "v"], ["axpy"], equation="bij,bk->bikj"),
    ]
    return _model(nodes, (16, 96, 64), ["dot", "axpy"], inits), _feeds((16, 96, 64), 5), {"Einsum"}


def _movement() -> tuple[onnx.ModelProto, dict[str, np.ndarray], set[str]]:
    """Gather, Pad (reflect, constant), Resize (linear, nearest by 2), Split, Slice, Tile and the typed
    maps (a comparison, Where, Cast)."""
    rng = np.random.default_rng(7)
    inits = {"idx": rng.permutation(64)[:40].astype(np.int64),
             "pads": np.array([0, 0, 2, 3, 0, 0, 2, 1], np.int64),
             "scales": np.array([1, 1, 2, 2], np.float32), "split": np.array([16, 48], np.int64),
             "st": np.array([1, -1], np.int64), "en": np.array([39, -(1 << 62)], np.int64),
             "ax": np.array([2, 3], np.int64), "sp": np.array([2, -1], np.int64),
             "reps": np.array([1, 1, 2, 2], np.int64), "zero": np.array(0, np.float32)}
    nodes = [
        helper.make_node("Gather", ["x", "idx"], ["gather"], axis=1),
        helper.make_node("Pad", ["x", "pads"], ["reflect"], mode="reflect"),
        helper.make_node("Pad", ["x", "pads"], ["constant"], mode="constant"),
        helper.make_node("Resize", ["x", "", "scales"], ["linear"], mode="linear"),
        helper.make_node("Resize", ["x", "", "scales"], ["nearest"], mode="nearest",
                         coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
        helper.make_node("Split", ["x", "split"], ["s16", "s48"], axis=1),
        helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["slice"]),
        helper.make_node("Tile", ["x", "reps"], ["tile"]),
        helper.make_node("Greater", ["x", "zero"], ["positive"]),
        helper.make_node("Where", ["positive", "x", "zero"], ["where"]),
        helper.make_node("Cast", ["x"], ["int"], to=TensorProto.INT32),
    ]
    outs = ["gather", "reflect", "constant", "linear", "nearest", "s16", "s48", "slice", "tile", "positive",
            "where", "int"]
    ops = {"Gather", "Pad", "Resize", "Split", "Slice", "Tile", "Greater", "Where", "Cast"}
    return _model(nodes, (4, 64, 40, 40), outs, inits), _feeds((4, 64, 40, 40), 6), ops


GROUPS: dict[str, Build] = {"pools": _pools, "pools_nhwc": _pools_nhwc, "reductions": _reductions,
                            "softmax": _softmax, "einsum": _einsum, "movement": _movement}


_PART = r"static __attribute__\(\(noinline\)\) "  # a pool part's definition (common.c.j2)


def _kernels(art: Path, ops: set[str]) -> dict[str, str]:
    """Per step of one of ``ops``: its kernel's C text, its pool parts (``<fn>_<name>``) included."""
    source = (art / "kernels" / "cpu" / "model.c").read_text()
    plan = json.loads((art / "plan.json").read_text())
    texts = {}
    for step in plan["steps"]:
        if step["op_type"] not in ops:
            continue
        assert step["provider"] == "c", step
        call = re.search(rf"/\* step {step['index']}: .*?\*/\s*(?:if \()?(k_[0-9a-f]{{16}})\(", source, re.S)
        assert call is not None, step
        fn = call.group(1)
        start = re.search(rf"\n(?:{_PART})?(?:void|int) {fn}(?:_\w+)?\(", source)
        kernel = re.search(rf"\n(?:void|int) {fn}\(", source)
        assert start is not None and kernel is not None, fn
        end = source.index("\n}\n", kernel.end())
        texts[f"{step['op_type']} {step['name']}"] = source[start.start() : end]
    return texts


@pytest.mark.parametrize("group", list(GROUPS))
def test_steps_take_the_pool_bit_identically_at_any_thread_count_and_load(group: str, tmp_path: Path) -> None:
    if not host_runs(CPU):
        pytest.skip(f"this host does not run {CPU} builds")
    model, feeds, ops = GROUPS[group]()
    art = compile_model(model, tmp_path / group, cpu=CPU, golden_cases=0)
    kernels = _kernels(art, ops)
    assert {name.split()[0] for name in kernels} == ops  # every op of the group became a C step
    for name, text in kernels.items():
        assert "onnx_aot_parallel(" in text, name  # large enough for the pool
        assert not re.search(r"#pragma omp (?!simd)", text), name  # and no OpenMP region left
    one = Session(art, threads=1).run(None, feeds)
    for want, got in zip(ort_run(model, feeds), one, strict=True):
        if want.dtype.kind == "f":
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
        else:
            np.testing.assert_array_equal(got, want)
    sessions = {threads: Session(art, threads=threads) for threads in (2, 3)}
    for load in ("idle", "spinning"):
        with busy_core() if load == "spinning" else nullcontext():
            for threads, session in sessions.items():
                for _ in range(3):
                    for a, b in zip(one, session.run(None, feeds), strict=True):
                        assert np.array_equal(a, b, equal_nan=True), (threads, load)
