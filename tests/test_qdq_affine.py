"""Per-channel affine chains between DequantizeLinear and QuantizeLinear (the float
BatchNormalization onnxruntime's quantizer leaves after each conv, Mul / Add by per-channel
constants): fold_qdq makes each a QChannelLookup (compiler/passes/fold_qdq_channel.py), bit for bit
the reference kernels' float graph; fuse_qconv_lookup puts the lookups into the integer conv's store
(and a QOperator file's QBinary by a per-channel constant with them), the same bits again. Checked
on hand-built QDQ graphs and on onnxruntime's quantizer's output for a small CNN with
BatchNormalization, against the reference kernels and onnxruntime's int8 run of the same file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler.driver import compile_model
from compiler.driver import import_model
from compiler.ir.evaluate import evaluate
from compiler.passes import PassManager
from compiler.passes import optimize
from compiler.passes.eliminate_dead_code import EliminateDeadCode
from compiler.passes.fold_qdq import FoldQdq
from runtime.session import Session
from tests.support.qdq_models import QdqBuilder
from tests.support.qdq_models import quantize_file
from tests.support.qdq_models import stray

SHAPE = (1, 6, 5, 7)


def _bn(b: QdqBuilder, x: str, c: int) -> str:
    rng = b.rng
    params = [rng.uniform(0.5, 1.5, c), rng.normal(0, 0.2, c), rng.normal(0, 0.2, c), rng.uniform(0.5, 2, c)]
    return b.node("BatchNormalization", [x, *(b.const(p.astype(np.float32), "bn") for p in params)])


def _affine(kind: str) -> onnx.ModelProto:
    b = QdqBuilder(seed=3)
    x = b.qdq("x", 0.05, 4)
    c = SHAPE[1]
    if kind == "bn":
        y = _bn(b, x, c)
    elif kind == "mul_add_relu":
        y = b.node("Mul", [x, b.const(b.rng.uniform(0.3, 2, (c, 1, 1)).astype(np.float32), "k")])
        y = b.node(
            "Relu", [b.node("Add", [y, b.const(b.rng.normal(0, 0.5, (c, 1, 1)).astype(np.float32), "k")])]
        )
    else:  # a constant along the last axis: no per-channel function
        y = b.node("Add", [x, b.const(b.rng.normal(0, 0.5, (SHAPE[-1],)).astype(np.float32), "k")])
    return b.model({"x": SHAPE}, [b.qdq(y, 0.04, -3)])


@pytest.mark.parametrize("kind", ["bn", "mul_add_relu"])
def test_per_channel_chain_becomes_one_exact_channel_lookup(kind: str) -> None:
    model = _affine(kind)
    before = optimize(import_model(model), 1)
    after = PassManager([FoldQdq(), EliminateDeadCode()]).run(optimize(import_model(model), 1)).graph
    kinds = [node.kind for node in after]
    assert kinds.count("onnx_aot.QChannelLookup") == 1
    assert not {"BatchNormalization", "Mul", "Add", "Relu"} & set(kinds)
    rng = np.random.default_rng(1)
    feeds = {"x": (rng.standard_normal(SHAPE) * 3).astype(np.float32)}
    (ours,), (ref,) = evaluate(after, feeds), evaluate(before, feeds)
    assert ours.tobytes() == ref.tobytes()
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )[0]
    assert np.max(np.abs(ours - theirs)) <= 0.04 * 1.001  # onnxruntime's float BN: within a step


def test_a_constant_along_another_axis_is_no_channel_lookup() -> None:
    after = (
        PassManager([FoldQdq(), EliminateDeadCode()]).run(optimize(import_model(_affine("last")), 1)).graph
    )
    assert "onnx_aot.QChannelLookup" not in [node.kind for node in after]


def _cnn(path: Path, channels: int) -> Path:
    """Conv -> BN -> Relu twice, Conv -> BN -> Mul -> Add (DenseNet-style per-channel constants),
    a residual Add and a Relu: the float model the quantizer gets."""
    rng = np.random.default_rng(0)
    inits, nodes = [], []

    def const(name: str, a: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.asarray(a, np.float32), name))
        return name

    def block(x: str, cin: int, i: int, tail: str) -> str:
        nodes.append(
            helper.make_node(
                "Conv",
                [
                    x,
                    const(f"w{i}", rng.normal(0, 0.3, (channels, cin, 3, 3))),
                    const(f"b{i}", rng.normal(0, 0.1, channels)),
                ],
                [f"c{i}"],
                pads=[1] * 4,
            )
        )
        bn = [
            const(f"bn{i}_{k}", p)
            for k, p in enumerate(
                [
                    rng.uniform(0.5, 1.5, channels),
                    rng.normal(0, 0.1, channels),
                    rng.normal(0, 0.1, channels),
                    rng.uniform(0.5, 2, channels),
                ]
            )
        ]
        nodes.append(helper.make_node("BatchNormalization", [f"c{i}", *bn], [f"n{i}"]))
        if tail == "relu":
            nodes.append(helper.make_node("Relu", [f"n{i}"], [f"y{i}"]))
        else:
            shape = (channels, 1, 1)
            nodes.append(
                helper.make_node("Mul", [f"n{i}", const(f"k{i}", rng.uniform(0.5, 2, shape))], [f"m{i}"])
            )
            nodes.append(
                helper.make_node("Add", [f"m{i}", const(f"a{i}", rng.normal(0, 0.2, shape))], [f"y{i}"])
            )
        return f"y{i}"

    a = block("x", 3, 0, "relu")
    c = block(block(a, channels, 1, "relu"), channels, 2, "mul_add")
    nodes += [helper.make_node("Add", [a, c], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, 12, 12])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    return path


def _feeds(seed: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).normal(0, 1, (1, 3, 12, 12)).astype(np.float32)}


@pytest.mark.parametrize("form", ["qdq", "qoperator"])
@pytest.mark.parametrize("channels", [16, 64])
def test_quantized_cnn_runs_its_bn_chains_in_the_conv_store(
    tmp_path: Path, form: str, channels: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """onnxruntime's quantizer's file: every BN (and the Mul / Add after it) goes into its conv's
    store; the artifact equals the unfused integer steps on the reference kernels (QLinearConv,
    QChannelLookup, QBinary: fold_qdq alone) bit for bit, with and without the AMX tiles, and
    strays from the float model within issue 32's bound of onnxruntime's int8 run's stray."""
    path = quantize_file(_cnn(tmp_path / "cnn.onnx", channels), tmp_path / f"cnn.{form}.onnx", form, _feeds)
    artifact = compile_model(str(path), tmp_path / "art")
    steps = [s["op_type"] for s in json.loads((artifact / "plan.json").read_text())["steps"]]
    assert steps.count("PackedQConv") == 3
    assert not {"BatchNormalization", "QChannelLookup", "QLookup", "Mul"} & set(steps)
    unfused = PassManager([FoldQdq(), EliminateDeadCode()]).run(optimize(import_model(str(path)), 1)).graph
    feeds = _feeds(7)
    (want,) = evaluate(unfused, feeds)
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    for no_amx in ("", "1"):
        if no_amx:
            monkeypatch.setenv("ONNX_AOT_NO_AMX", no_amx)
        else:
            monkeypatch.delenv("ONNX_AOT_NO_AMX", raising=False)
        (ours,) = Session(artifact).run(None, feeds)
        assert ours.tobytes() == want.tobytes()
    float_run = ort.InferenceSession(str(tmp_path / "cnn.onnx"), providers=["CPUExecutionProvider"])
    (fp32,) = float_run.run(None, feeds)
    assert stray([ours], [fp32]) <= 1.25 * stray([theirs], [fp32]) + 0.005  # issue 32's bound


@pytest.mark.parametrize("shape", [(2, 5, 7, 9), (1, 40, 13, 13), (1, 3, 33)])
def test_a_lone_channel_lookup_runs_in_c_as_the_reference(tmp_path: Path, shape: tuple[int, ...]) -> None:
    """A BatchNormalization after no conv: the C QChannelLookup step (16 codes a gather, the last
    channel and the tails scalar) equals the float graph on the reference kernels bit for bit."""
    b = QdqBuilder(seed=4)
    y = _bn(b, b.qdq("x", 0.05, 4), shape[1])
    model = b.model({"x": shape}, [b.qdq(y, 0.04, -3)])
    artifact = compile_model(model, tmp_path / "art")
    steps = [s["op_type"] for s in json.loads((artifact / "plan.json").read_text())["steps"]]
    assert steps.count("QChannelLookup") == 1 and "BatchNormalization" not in steps
    feeds = {"x": (np.random.default_rng(1).standard_normal(shape) * 3).astype(np.float32)}
    ((ours,), (ref,)) = Session(artifact).run(None, feeds), evaluate(optimize(import_model(model), 1), feeds)
    assert ours.tobytes() == ref.tobytes()


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("shape", [(1, 8, 9, 11), (2, 64, 32, 33)])
def test_a_residual_add_runs_in_float64_lanes_as_the_reference(tmp_path: Path, dtype: type,
                                                               shape: tuple[int, ...]) -> None:
    """QBinary Add of two operands of the output's shape (a residual Add + Relu): the C step's
    AVX-512 lanes and its scalar tail equal the reference kernels bit for bit."""
    b = QdqBuilder(seed=4, dtype=dtype)
    z = 4 if dtype == np.int8 else 130
    y = b.node("Relu", [b.node("Add", [b.qdq("x", 0.05, z), b.qdq("w", 0.031, z - 7)])])
    model = b.model({"x": shape, "w": shape}, [b.qdq(y, 0.04, z - 3)])
    artifact = compile_model(model, tmp_path / "art")
    assert "QBinary" in [s["op_type"] for s in json.loads((artifact / "plan.json").read_text())["steps"]]
    rng = np.random.default_rng(1)
    feeds = {k: (rng.standard_normal(shape) * 3).astype(np.float32) for k in ("x", "w")}
    (want,) = evaluate(PassManager([FoldQdq()]).run(optimize(import_model(model), 1)).graph, feeds)
    assert Session(artifact).run(None, feeds)[0].tobytes() == want.tobytes()
