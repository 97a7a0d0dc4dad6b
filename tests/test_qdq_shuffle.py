"""ShuffleNet's quantized forms (issue 32): a QOperator file leaves DequantizeLinear ->
BatchNormalization -> Relu -> Reshape -> Transpose -> Reshape (the channel shuffle) -> QuantizeLinear
and DequantizeLinear -> BatchNormalization -> Relu -> MaxPool -> QuantizeLinear in float; fold_qdq
sinks the QuantizeLinear through the movement (compiler/passes/fold_qdq.py ``_sink``), so that the
per-channel chain becomes a lookup in the conv's store and the shuffle / pool move 8-bit codes.
Checked on onnxruntime's quantizer's output of a small ShuffleNet-like CNN (grouped 1x1 convs, a
depthwise 3x3, a shuffle, a pool), against the float graph on the reference kernels (bit for bit)
and onnxruntime's int8 run of the same file (issue 32's stray bound), with and without AMX, on 1
and 2 threads."""

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
from tests.support.qdq_models import quantize_file
from tests.support.qdq_models import stray

C, HW, GROUPS = 24, 14, 3


def _shuffle_cnn(path: Path) -> Path:
    """Conv -> BN -> Relu -> MaxPool, then a ShuffleNet unit: grouped 1x1 conv -> BN -> Relu ->
    channel shuffle -> depthwise 3x3 -> BN -> grouped 1x1 conv -> BN -> Relu, and a 1x1 conv."""
    rng = np.random.default_rng(0)
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def const(name: str, a: np.ndarray, dtype: type = np.float32) -> str:
        inits.append(numpy_helper.from_array(np.asarray(a, dtype), name))
        return name

    def conv_bn(x: str, i: int, cin: int, k: int, group: int, relu: bool) -> str:
        w = const(f"w{i}", rng.normal(0, 0.4, (C, cin // group, k, k)))
        nodes.append(helper.make_node("Conv", [x, w], [f"c{i}"], pads=[k // 2] * 4, group=group))
        bn = [const(f"bn{i}_{j}", p) for j, p in enumerate([rng.uniform(0.5, 1.5, C), rng.normal(0, 0.1, C),
                                                            rng.normal(0, 0.1, C), rng.uniform(0.5, 2, C)])]
        nodes.append(helper.make_node("BatchNormalization", [f"c{i}", *bn], [f"n{i}"]))
        if not relu:
            return f"n{i}"
        nodes.append(helper.make_node("Relu", [f"n{i}"], [f"r{i}"]))
        return f"r{i}"

    x = conv_bn("x", 0, 3, 3, 1, True)
    nodes.append(helper.make_node("MaxPool", [x], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4))
    x = conv_bn("p", 1, C, 1, GROUPS, True)
    nodes.append(helper.make_node("Reshape", [x, const("s5", [1, GROUPS, C // GROUPS, HW, HW], np.int64)], ["t1"]))
    nodes.append(helper.make_node("Transpose", ["t1"], ["t2"], perm=[0, 2, 1, 3, 4]))
    nodes.append(helper.make_node("Reshape", ["t2", const("s4", [1, C, HW, HW], np.int64)], ["t3"]))
    x = conv_bn(conv_bn("t3", 2, C, 3, C, False), 3, C, 1, GROUPS, True)
    nodes.append(helper.make_node("Conv", [x, const("w4", rng.normal(0, 0.3, (C, C, 1, 1)))], ["y"]))
    x = "y"
    graph = helper.make_graph(nodes, "shuffle", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 28, 28])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, C, HW, HW])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    return path


def _feeds(seed: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).normal(0, 1, (1, 3, 28, 28)).astype(np.float32)}


@pytest.mark.parametrize("form", ["qdq", "qoperator"])
def test_shuffle_and_pool_move_codes(tmp_path: Path, form: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = quantize_file(_shuffle_cnn(tmp_path / "s.onnx"), tmp_path / f"s.{form}.onnx", form, _feeds)
    artifact = compile_model(str(path), tmp_path / "art")
    plan = json.loads((artifact / "plan.json").read_text())
    kinds = [s["op_type"] for s in plan["steps"]]
    assert not {"BatchNormalization", "Relu", "QChannelLookup"} & set(kinds), kinds
    assert kinds.count("DequantizeLinear") == kinds.count("QuantizeLinear") == 1  # the output's, the input's
    dtypes = {plan["values"][s["outputs"][0]]["dtype"] for s in plan["steps"] if s["op_type"] in
              ("Transpose", "Reshape", "MaxPool")}
    assert dtypes <= {"int8", "uint8"}
    float_graph = optimize(import_model(str(path)), 1)
    folded = PassManager([FoldQdq(), EliminateDeadCode()]).run(optimize(import_model(str(path)), 1)).graph
    assert "QuantizeLinear" in [n.kind for n in folded]  # the input's
    feeds = _feeds(7)
    (want,) = evaluate(float_graph, feeds)
    (unfused,) = evaluate(folded, feeds)
    assert unfused.tobytes() == want.tobytes()
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    for no_amx, threads in (("", 1), ("", 2), ("1", 2)):
        if no_amx:
            monkeypatch.setenv("ONNX_AOT_NO_AMX", no_amx)
        else:
            monkeypatch.delenv("ONNX_AOT_NO_AMX", raising=False)
        (ours,) = Session(artifact, threads=threads).run(None, feeds)
        assert ours.tobytes() == want.tobytes()
    fp32 = ort.InferenceSession(str(tmp_path / "s.onnx"), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert stray([ours], fp32) <= 1.25 * stray([theirs], fp32) + 0.005  # issue 32's bound
