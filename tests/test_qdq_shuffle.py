"""ShuffleNet's quantized forms (issue 32): a QOperator file leaves DequantizeLinear ->
BatchNormalization -> Relu -> Reshape -> Transpose -> Reshape (the channel shuffle) -> QuantizeLinear
and DequantizeLinear -> BatchNormalization -> Relu -> MaxPool -> QuantizeLinear in float; fold_qdq
sinks the QuantizeLinear through the movement (compiler/passes/fold_qdq.py ``_sink``), so that the
per-channel chain becomes a lookup in the conv's store and the shuffle / pool move 8-bit codes.
Checked on onnxruntime's quantizer's output of a small ShuffleNet-like CNN (grouped 1x1 convs, a
depthwise 3x3, a shuffle, a pool), against the float graph on the reference kernels (bit for bit)
and onnxruntime's int8 run of the same file (issue 32's stray bound), with and without AMX, on 1
and 2 threads. Also the residual Adds that a QOperator file keeps float after a BN (ResNet blocks,
ShuffleNet units): ``onnx_aot.QTableAdd`` (compiler/passes/fold_qdq_residual.py)."""

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
from tests.cpu_targets import host_runs
from tests.support.qdq_models import QdqBuilder
from tests.support.qdq_models import quantize_file
from tests.support.qdq_models import stray

C, HW, GROUPS = 24, 14, 3


class _Net:
    """A float CNN in the making: convs with BatchNormalization, as the quantizer gets them."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)
        self.inits: list[onnx.TensorProto] = []
        self.nodes: list[onnx.NodeProto] = []

    def const(self, name: str, a: np.ndarray | list[int], dtype: type = np.float32) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(a, dtype), name))
        return name

    def conv_bn(self, x: str, i: int, cin: int, k: int, group: int, relu: bool) -> str:
        rng, const = self.rng, self.const
        w = const(f"w{i}", rng.normal(0, 0.4, (C, cin // group, k, k)))
        self.nodes.append(helper.make_node("Conv", [x, w], [f"c{i}"], pads=[k // 2] * 4, group=group))
        bn = [const(f"bn{i}_{j}", p) for j, p in enumerate([rng.uniform(0.5, 1.5, C), rng.normal(0, 0.1, C),
                                                            rng.normal(0, 0.1, C), rng.uniform(0.5, 2, C)])]
        self.nodes.append(helper.make_node("BatchNormalization", [f"c{i}", *bn], [f"n{i}"]))
        return self.relu(f"n{i}") if relu else f"n{i}"

    def relu(self, x: str) -> str:
        self.nodes.append(helper.make_node("Relu", [x], [f"{x}_relu"]))
        return f"{x}_relu"

    def save(self, path: Path, x: str, hw: int) -> Path:
        w = self.const("w_out", self.rng.normal(0, 0.3, (C, C, 1, 1)))
        self.nodes.append(helper.make_node("Conv", [x, w], ["y"]))
        x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 28, 28])
        y_info = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, hw, hw])
        graph = helper.make_graph(self.nodes, "net", [x_info], [y_info], self.inits)
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
        return path


def _shuffle_cnn(path: Path) -> Path:
    """Conv -> BN -> Relu -> MaxPool, then a ShuffleNet unit: grouped 1x1 conv -> BN -> Relu ->
    channel shuffle -> depthwise 3x3 -> BN -> grouped 1x1 conv -> BN -> Relu, and a 1x1 conv."""
    net = _Net()
    nodes, const, conv_bn = net.nodes, net.const, net.conv_bn
    x = conv_bn("x", 0, 3, 3, 1, True)
    nodes.append(helper.make_node("MaxPool", [x], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4))
    x = conv_bn("p", 1, C, 1, GROUPS, True)
    split = const("s5", [1, GROUPS, C // GROUPS, HW, HW], np.int64)
    nodes.append(helper.make_node("Reshape", [x, split], ["t1"]))
    nodes.append(helper.make_node("Transpose", ["t1"], ["t2"], perm=[0, 2, 1, 3, 4]))
    nodes.append(helper.make_node("Reshape", ["t2", const("s4", [1, C, HW, HW], np.int64)], ["t3"]))
    return net.save(path, conv_bn(conv_bn("t3", 2, C, 3, C, False), 3, C, 1, GROUPS, True), HW)


def _residual_cnn(path: Path) -> Path:
    """Conv -> BN -> Relu, two residual units (1x1 -> BN -> Relu, depthwise 3x3 -> BN, 1x1 -> BN,
    Add of the unit's input, Relu), a projection block (1x1 -> BN and 1x1 -> BN -> Relu added, Relu), a
    1x1 conv; the adds are Sums, as in the zoo's ResNet-50 and ShuffleNet, which onnxruntime's
    quantizer leaves float: a QOperator file keeps each one's BN and its float shortcut."""
    net = _Net()
    x = net.conv_bn("x", 0, 3, 3, 1, True)
    for unit in (1, 2):
        i = 10 * unit
        branch = net.conv_bn(net.conv_bn(net.conv_bn(x, i, C, 1, GROUPS, True), i + 1, C, 3, C, False),
                             i + 2, C, 1, GROUPS, False)
        net.nodes.append(helper.make_node("Sum", [branch, x], [f"s{unit}"]))
        x = net.relu(f"s{unit}")
    a, b = net.conv_bn(x, 30, C, 1, 1, False), net.conv_bn(x, 31, C, 1, 1, True)  # BN -> Relu: no form
    net.nodes.append(helper.make_node("Sum", [a, b], ["s3"]))
    return net.save(path, net.relu("s3"), 28)


def _runs_as(artifact: Path, want: np.ndarray, feeds: dict[str, np.ndarray],
             monkeypatch: pytest.MonkeyPatch) -> np.ndarray:
    """The artifact's output, the same bits as ``want`` with and without AMX, on 1 and 2 threads."""
    for no_amx, threads in (("", 1), ("", 2), ("1", 2)):
        if no_amx:
            monkeypatch.setenv("ONNX_AOT_NO_AMX", no_amx)
        else:
            monkeypatch.delenv("ONNX_AOT_NO_AMX", raising=False)
        (ours,) = Session(artifact, threads=threads).run(None, feeds)
        assert ours.tobytes() == want.tobytes()
    return ours


def _feeds(seed: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).normal(0, 1, (1, 3, 28, 28)).astype(np.float32)}


@pytest.mark.parametrize("channels", [24, 21])
@pytest.mark.parametrize("form", ["qdq", "qoperator"])
def test_shuffle_and_pool_move_codes(tmp_path: Path, form: str, channels: int,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """24 channels, and 21 (7 a group: odd rows, odd depthwise planes count); 14 x 14 planes (196
    codes: the table stores' 64-code runs end on a tail of 4)."""
    monkeypatch.setitem(globals(), "C", channels)
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
    ours = _runs_as(artifact, want, feeds, monkeypatch)
    fp32 = ort.InferenceSession(str(tmp_path / "s.onnx"), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert stray([ours], fp32) <= 1.25 * stray([theirs], fp32) + 0.005  # issue 32's bound


def test_residual_adds_of_bn_chains_become_table_adds(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The QOperator file's three residual Adds (BN chain + float shortcut twice, BN + BN once) and
    their BN / Relu go into QTableAdd steps; the artifact equals fold_qdq's integer steps on the
    reference kernels bit for bit; where both operands are BN chains of codes (the projection
    block) those steps equal the float graph too; the whole strays within issue 32's bound."""
    path = quantize_file(_residual_cnn(tmp_path / "r.onnx"), tmp_path / "r.qop.onnx", "qoperator", _feeds)
    artifact = compile_model(str(path), tmp_path / "art")
    kinds = [s["op_type"] for s in json.loads((artifact / "plan.json").read_text())["steps"]]
    assert kinds.count("QTableAdd") == 3
    assert not {"BatchNormalization", "Relu", "FusedElementwise", "Sum", "QBinary"} & set(kinds), kinds
    folded = PassManager([FoldQdq(), EliminateDeadCode()]).run(optimize(import_model(str(path)), 1)).graph
    feeds = _feeds(3)
    (want,) = evaluate(folded, feeds)
    ours = _runs_as(artifact, want, feeds, monkeypatch)
    if host_runs("x86-64-v3"):  # the AVX2 build: the portable loops of QTableAdd, depthwise, store
        (avx2,) = Session(compile_model(str(path), tmp_path / "v3", cpu="x86-64-v3")).run(None, feeds)
        assert avx2.tobytes() == want.tobytes()
    # the x86-64-v4 text: a BN's form and a shortcut's dequantization computed, BN -> Relu's row gathered
    v4 = compile_model(str(path), tmp_path / "v4", cpu="x86-64-v4")
    source = (v4 / "kernels" / "cpu" / "model.c").read_text()
    for text in ("_mm512_i32gather_ps", "_mm512_sub_round_ps", "_mm512_mul_round_ps"):
        assert text in source, text
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    fp32 = ort.InferenceSession(str(tmp_path / "r.onnx"), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert stray([ours], fp32) <= 1.25 * stray([theirs], fp32) + 0.005  # issue 32's bound


def test_table_add_of_two_bn_chains_is_the_float_graph() -> None:
    """Add(BN(DQ(a)), BN(DQ(b))) -> Relu -> Q: one QTableAdd, bit for bit the float graph on the
    reference kernels (every operand a function of its own codes)."""
    b = QdqBuilder(seed=4)
    shape = (2, 6, 5, 7)
    x, z = b.qdq("x", 0.05, 4), b.qdq("z", 0.03, -7)
    c = shape[1]
    bn = [[b.const(p.astype(np.float32), "bn") for p in (b.rng.uniform(0.5, 1.5, c), b.rng.normal(0, 0.2, c),
                                                         b.rng.normal(0, 0.2, c), b.rng.uniform(0.5, 2, c))]
          for _ in range(2)]
    s = b.node("Add", [b.node("BatchNormalization", [x, *bn[0]]), b.node("BatchNormalization", [z, *bn[1]])])
    model = b.model({"x": shape, "z": shape}, [b.qdq(b.node("Relu", [s]), 0.04, -3)])
    before = optimize(import_model(model), 1)
    after = PassManager([FoldQdq(), EliminateDeadCode()]).run(optimize(import_model(model), 1)).graph
    kinds = [node.kind for node in after]
    assert kinds.count("onnx_aot.QTableAdd") == 1 and "BatchNormalization" not in kinds
    rng = np.random.default_rng(2)
    feeds = {k: (rng.standard_normal(shape) * 3).astype(np.float32) for k in ("x", "z")}
    assert evaluate(after, feeds)[0].tobytes() == evaluate(before, feeds)[0].tobytes()
