"""Tests of the graph optimization passes and the PassManager (STYLE.md #3).

Each test builds a tiny graph with the IR API, runs a pass, checks the structure it expects,
verifies the graph, and runs the graph before and after through the reference kernels to show
that the numbers did not change.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from compiler.ir.graph import AOT_DOMAIN
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.passes import EliminateCommonSubexpressions
from compiler.passes import EliminateDeadCode
from compiler.passes import EliminateIdentity
from compiler.passes import FoldConstants
from compiler.passes import FuseConvActivation
from compiler.passes import FuseConvBatchNorm
from compiler.passes import FuseElementwise
from compiler.passes import FuseMatMulAdd
from compiler.passes import Pass
from compiler.passes import PassManager
from compiler.passes import PassResult
from compiler.passes import fold_constants as fold_module
from compiler.passes import optimize
from compiler.passes import passes_for_level
from compiler.passes.fuse_attention import FuseAttention
from compiler.passes.pack_gemm_weights import PackGemmWeights
from runtime.errors import CompileError
from runtime.errors import InternalError
from tests.support.graphs import CONV_ATTRS
from tests.support.graphs import Builder
from tests.support.graphs import check
from tests.support.graphs import kinds

F32 = np.float32
GEMM_ATTRS = {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0}


# -- eliminate_identity ------------------------------------------------------------------------
def test_identity_between_nodes_is_removed() -> None:
    b = Builder()
    x = b.input("x", (2, 3))
    r = b.op("Relu", x, name="relu")
    i = b.op("Identity", r, name="dropout")
    g = b.output(b.op("Neg", i, name="neg"))
    assert check(g, EliminateIdentity()).modified
    assert kinds(g) == ["Relu", "Neg"]
    assert g.nodes[1].inputs[0] is r
    assert g.eliminated == {"dropout": "eliminate_identity"}


def test_identity_into_graph_output_keeps_the_output_name() -> None:
    b = Builder()
    x = b.input("x", (2, 3))
    r = b.op("Relu", x, name="relu")
    out = b.op("Identity", r, name="ident")
    g = b.output(out, b.op("Neg", r, name="neg"))
    assert check(g, EliminateIdentity()).modified
    assert kinds(g) == ["Relu", "Neg"]
    relu, neg = g.nodes
    assert relu.name == "relu" and relu.outputs[0] is out and g.outputs[0] is out
    assert neg.inputs[0] is out  # the other reader of r now reads the output directly
    assert [v.name for v in g.outputs] == ["ident_out", "neg_out"]


@pytest.mark.parametrize("source", ["input", "constant", "output"])
def test_identity_from_input_constant_or_output_becomes_a_copy(source: str) -> None:
    b = Builder()
    x = b.input("x", (2, 3))
    outputs = []
    if source == "input":
        src = x
    elif source == "constant":
        src = b.rand("c", 2, 3)
    else:
        src = b.op("Relu", x)
        outputs.append(src)
    out = b.op("Identity", src, name="ident")
    g = b.output(*outputs, out)
    assert check(g, EliminateIdentity()).modified
    copy = g.nodes[-1]
    assert copy.kind == "onnx_aot.Copy" and copy.inputs == (src,) and copy.outputs[0] is out
    assert copy.origin == ["ident"] and not g.eliminated
    assert not EliminateIdentity().run(g).modified


# -- fold_constants ----------------------------------------------------------------------------
def test_shape_gather_unsqueeze_concat_chain_folds_away() -> None:
    b = Builder()
    x = b.input("x", (2, 3, 4))
    y = b.input("y", (2,))
    shape = b.op("Shape", x, out_shape=(3,), out_dtype=np.int64, name="shape", start=0, end=3)
    dim0 = b.op("Gather", shape, b.const("idx", np.array(0, np.int64)), out_shape=(), name="gather", axis=0)
    dim0_1d = b.op("Reshape", dim0, out_shape=(1,), name="unsqueeze", shape=[1])
    target = b.op(
        "Concat", dim0_1d, b.const("minus1", np.array([-1], np.int64)), out_shape=(2,), name="concat", axis=0
    )
    as_float = b.op("Cast", target, out_dtype=F32, name="cast", to="float32")
    g = b.output(b.op("Add", as_float, y, name="add"))
    assert check(g, FoldConstants()).modified
    assert kinds(g) == ["Add"]
    folded = g.nodes[0].inputs[0]
    assert folded is not None and folded.is_const
    np.testing.assert_array_equal(folded.const, np.array([2.0, -1.0], F32))
    assert folded.const.dtype == F32
    assert g.eliminated == dict.fromkeys(["shape", "gather", "unsqueeze", "concat", "cast"], "fold_constants")
    assert list(g.constants) == [folded.name]  # the inputs of the folded nodes were pruned


def test_folding_into_a_graph_output_becomes_a_copy() -> None:
    b = Builder()
    x = b.input("x", (2, 3))
    ones = b.op(
        "ConstantOfShape",
        out_shape=(2, 3),
        out_dtype=F32,
        name="ones",
        shape=[2, 3],
        value=1.0,
        dtype="float32",
    )
    g = b.output(ones, b.op("Relu", x))
    assert check(g, FoldConstants()).modified
    assert kinds(g) == ["onnx_aot.Copy", "Relu"]
    copy = g.nodes[0]
    assert copy.outputs[0] is ones and g.outputs[0] is ones and copy.origin == ["ones"]
    assert not g.eliminated
    assert not FoldConstants().run(g).modified  # a Copy of a constant is as folded as it gets


def test_fold_skips_non_constant_unknown_and_oversized_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    b = Builder()
    x = b.input("x", (4,))
    c = b.rand("c", 4)
    mystery = b.op("Mystery", c, name="mystery")  # no reference kernel
    big = b.op("Neg", c, name="neg")
    g = b.output(b.op("Add", b.op("Add", x, mystery), big))
    monkeypatch.setattr(fold_module, "MAX_FOLD_NBYTES", 16)  # 4 float32 = 16 bytes: too big now
    assert not FoldConstants().run(g).modified
    monkeypatch.setattr(fold_module, "MAX_FOLD_NBYTES", 64 << 20)
    assert FoldConstants().run(g).modified
    g.verify()
    assert kinds(g) == ["Mystery", "Add", "Add"]


# -- eliminate_dead_code -----------------------------------------------------------------------
def test_dead_branch_and_its_constants_are_removed() -> None:
    b = Builder()
    x = b.input("x", (2, 3))
    dead = b.op("Mul", b.op("Relu", x, name="dead_relu"), b.rand("dead_w", 2, 3), name="dead_mul")
    b.op("Neg", dead, name="dead_neg")
    g = b.output(b.op("Sigmoid", x, name="live"))
    assert check(g, EliminateDeadCode()).modified
    assert kinds(g) == ["Sigmoid"]
    assert not g.constants
    assert g.eliminated == dict.fromkeys(["dead_neg", "dead_mul", "dead_relu"], "eliminate_dead_code")
    assert not EliminateDeadCode().run(g).modified


def test_eliminated_only_when_no_node_still_stands_for_the_onnx_node() -> None:
    b = Builder()
    x = b.input("x", (2,))
    g = b.output(b.op("Neg", x, name="drop"))
    # Dropout with a mask output: one ONNX node "drop", two IR nodes; only the mask is dead.
    mask_attrs = {"shape": [2], "value": 1, "dtype": "bool"}
    mask = Value("mask", np.bool_, (2,))
    g.add_node(Node("ConstantOfShape", [], [mask], mask_attrs, name="drop_mask", origin=["drop"]))
    assert EliminateDeadCode().run(g).modified
    assert kinds(g) == ["Neg"] and not g.eliminated


# -- eliminate_common_subexpressions -----------------------------------------------------------
def test_cse_merges_duplicate_constants_and_nodes() -> None:
    b = Builder()
    x = b.input("x", (2, 3))
    w1 = b.const("w1", np.full((3,), 0.5, F32))
    w2 = b.const("w2", np.full((3,), 0.5, F32))  # same bytes: merged into w1
    w3 = b.const("w3", np.full((3,), 0.25, F32))
    a = b.op("Relu", b.op("Mul", x, w1, name="mul1"), name="relu1")
    c = b.op("Relu", b.op("Mul", x, w2, name="mul2"), name="relu2")
    d = b.op("Mul", x, w3, name="mul3")  # different constant: stays
    g = b.output(b.op("Add", b.op("Add", a, c), d))
    assert check(g, EliminateCommonSubexpressions()).modified
    assert kinds(g) == ["Mul", "Relu", "Mul", "Add", "Add"]
    assert sorted(g.constants) == ["w1", "w3"]
    assert g.eliminated == {
        "mul2": "eliminate_common_subexpressions",
        "relu2": "eliminate_common_subexpressions",
    }
    first_add = g.nodes[3]
    assert first_add.inputs[0] is first_add.inputs[1] is a


def test_cse_respects_attributes_and_keeps_duplicate_graph_outputs() -> None:
    b = Builder()
    x = b.input("x", (2, 3))
    lo = b.op("Clip", x, min=0.0, max=1.0)
    hi = b.op("Clip", x, min=0.0, max=2.0)
    out1 = b.op("Neg", x)
    out2 = b.op("Neg", x)  # a duplicate, but a graph output: its name must survive
    g = b.output(b.op("Add", lo, hi), out1, out2)
    assert not EliminateCommonSubexpressions().run(g).modified
    assert len(g) == 5


# -- fuse_conv_batchnorm -----------------------------------------------------------------------
def _conv_bn(b: Builder, x: Value, channels: int, bias: bool = True, name: str = "conv") -> Value:
    w = b.rand(f"{name}_w", channels, x.shape[1], 3, 3)
    bvec = b.rand(f"{name}_b", channels) if bias else None
    y = b.op("Conv", x, w, bvec, out_shape=(x.shape[0], channels, *x.shape[2:]), name=name, **CONV_ATTRS)
    bn = [
        b.rand(f"{name}_{p}", channels, low=lo, high=hi)
        for p, lo, hi in [("gamma", 0.5, 1.5), ("beta", -1, 1), ("mean", -1, 1), ("var", 0.1, 2.0)]
    ]
    return b.op("BatchNormalization", y, *bn, out_shape=y.shape, name=f"{name}_bn", epsilon=1e-5)


@pytest.mark.parametrize("bias", [True, False])
def test_conv_batchnorm_folds_into_the_conv(bias: bool) -> None:
    b = Builder()
    x = b.input("x", (1, 3, 6, 6))
    g = b.output(b.op("Relu", _conv_bn(b, x, 4, bias=bias), name="relu"))
    assert check(g, FuseConvBatchNorm(), rtol=1e-4).modified
    assert kinds(g) == ["Conv", "Relu"]
    conv = g.nodes[0]
    assert conv.name == "conv" and conv.origin == ["conv", "conv_bn"]
    assert all(v is not None and v.is_const and v.dtype == F32 for v in conv.inputs[1:3])
    assert not g.eliminated
    assert len(g.constants) == 2  # the old weights and BN parameters were pruned


def test_batchnorm_then_channelwise_mul_and_add_fold_too() -> None:
    b = Builder()
    x = b.input("x", (2, 3, 5, 5))
    y = _conv_bn(b, x, 4)
    y = b.op("Mul", b.rand("scale", 4, 1, 1), y, name="mul")  # constant first, [C,1,1]
    y = b.op("Add", y, b.rand("shift", 1, 4, 1, 1), name="add")
    y = b.op("Sub", y, b.rand("sub", 4, 1, 1), name="sub")
    g = b.output(b.op("Add", y, b.rand("not_per_channel", 1, 4, 5, 5), name="add_full"))
    assert check(g, FuseConvBatchNorm(), rtol=1e-4).modified
    assert kinds(g) == ["Conv", "Add"]
    assert g.nodes[0].origin == ["conv", "conv_bn", "mul", "add", "sub"]


def test_conv_with_a_second_use_is_not_folded() -> None:
    b = Builder()
    x = b.input("x", (1, 3, 4, 4))
    g = b.output(_conv_bn(b, x, 2))
    conv_out = g.nodes[0].outputs[0]
    g.add_output(conv_out)  # the conv output is a graph output too
    assert not FuseConvBatchNorm().run(g).modified


# -- fuse_conv_activation ----------------------------------------------------------------------
def test_conv_batchnorm_relu_becomes_one_fused_conv() -> None:
    b = Builder()
    x = b.input("x", (1, 3, 8, 8))
    g = b.output(b.op("Relu", _conv_bn(b, x, 4), name="relu"))
    check(g, lambda graph: optimize(graph, 2), rtol=1e-4)
    assert kinds(g) == ["onnx_aot.FusedConv"]
    fused = g.nodes[0]
    assert fused.domain == AOT_DOMAIN and fused.origin == ["conv", "conv_bn", "relu"]
    assert fused.attrs["activation"] == "Relu"
    assert {"act_min", "act_max", "act_alpha"} <= set(fused.attrs)
    assert {k: fused.attrs[k] for k in CONV_ATTRS} == CONV_ATTRS


@pytest.mark.parametrize("add_kind", ["Add", "Sum"])
def test_residual_add_and_relu_fuse_into_the_conv(add_kind: str) -> None:
    b = Builder()
    x = b.input("x", (1, 4, 6, 6))
    w = b.rand("w", 4, 4, 3, 3)
    y = b.op("Conv", x, w, out_shape=(1, 4, 6, 6), name="conv", **CONV_ATTRS)  # no bias
    skip = b.op("Sigmoid", x, name="skip")
    s = b.op(add_kind, skip, y, name="add")  # the conv output second
    g = b.output(b.op("Relu", s, name="relu"))
    assert check(g, FuseConvActivation()).modified
    assert kinds(g) == ["Sigmoid", "onnx_aot.FusedConv"]
    fused = g.nodes[1]
    assert fused.inputs == (x, w, None, skip)
    assert fused.attrs["activation"] == "Relu" and fused.origin == ["conv", "add", "relu"]


def test_clip_and_leaky_relu_attributes() -> None:
    for act, attrs, expect in [
        ("Clip", {"min": 0.0, "max": 6.0}, (0.0, 6.0, 0.0)),
        ("LeakyRelu", {"alpha": 0.1}, (-math.inf, math.inf, 0.1)),
    ]:
        b = Builder()
        x = b.input("x", (1, 2, 4, 4))
        y = b.op("Conv", x, b.rand("w", 3, 2, 3, 3), b.rand("b", 3), out_shape=(1, 3, 4, 4), **CONV_ATTRS)
        g = b.output(b.op(act, y, **attrs))
        assert check(g, FuseConvActivation()).modified
        (fused,) = g.nodes
        assert fused.attrs["activation"] == act
        assert (fused.attrs["act_min"], fused.attrs["act_max"], fused.attrs["act_alpha"]) == expect


def test_residual_with_broadcasting_operand_is_not_fused() -> None:
    b = Builder()
    x = b.input("x", (1, 2, 4, 4))
    y = b.op("Conv", x, b.rand("w", 2, 2, 3, 3), out_shape=(1, 2, 4, 4), **CONV_ATTRS)
    g = b.output(b.op("Add", y, b.input("bias", (1, 2, 1, 1))))
    assert not FuseConvActivation().run(g).modified


def test_nothing_fused_when_an_intermediate_is_a_graph_output() -> None:
    b = Builder()
    x = b.input("x", (1, 2, 4, 4))
    y = b.op("Conv", x, b.rand("w", 2, 2, 3, 3), out_shape=(1, 2, 4, 4), **CONV_ATTRS)
    m = b.op("Mul", x, b.input("s", (1, 2, 4, 4)))
    g = b.output(y, b.op("Relu", y), m, b.op("Sigmoid", m))
    names = [v.name for v in g.outputs]
    assert not PassManager(passes_for_level(2)).run(g).modified
    assert kinds(g) == ["Conv", "Mul", "Relu", "Sigmoid"]
    assert [v.name for v in g.outputs] == names


# -- fuse_matmul_add ---------------------------------------------------------------------------
def test_matmul_add_becomes_gemm_then_fused_gemm() -> None:
    b = Builder()
    a = b.input("a", (3, 5))
    y = b.op("MatMul", a, b.rand("w", 5, 4), out_shape=(3, 4), name="matmul")
    y = b.op("Add", b.rand("bias", 1, 4), y, name="add")
    g = b.output(b.op("Relu", y, name="relu"))
    assert check(g, FuseMatMulAdd()).modified
    assert kinds(g) == ["Gemm", "Relu"]
    gemm = g.nodes[0]
    assert gemm.attrs == GEMM_ATTRS and gemm.origin == ["matmul", "add"]
    c = gemm.inputs[2]
    assert c is not None and c.const is not None and c.const.shape == (4,)
    assert check(g, FuseConvActivation()).modified
    assert kinds(g) == ["onnx_aot.FusedGemm"]
    assert g.nodes[0].attrs["activation"] == "Relu"


def test_gemm_bias_add_folds_and_non_column_bias_does_not() -> None:
    b = Builder()
    a = b.input("a", (3, 5))
    y = b.op(
        "Gemm",
        a,
        b.rand("w", 4, 5),
        b.rand("c", 4),
        out_shape=(3, 4),
        **{**GEMM_ATTRS, "transB": 1, "beta": 0.5},
    )
    y = b.op("Add", y, b.rand("bias", 4))
    y2 = b.op("MatMul", a, b.rand("w2", 5, 4), out_shape=(3, 4))
    g = b.output(y, b.op("Add", y2, b.rand("rows", 3, 1)))
    assert check(g, FuseMatMulAdd()).modified
    assert kinds(g) == ["Gemm", "MatMul", "Add"]
    assert g.nodes[0].attrs["beta"] == 1.0 and g.nodes[0].attrs["transB"] == 1


def test_batched_linear_layer_becomes_reshape_gemm_reshape() -> None:
    """A transformer's [batch, seq, K] x [K, N] + bias (PyTorch's form: the bias first) is one
    Gemm over the rows of every batch, between two Reshapes; without a per-column bias Add it
    stays a MatMul."""
    b = Builder()
    x = b.input("x", (2, 3, 5))
    y = b.op("MatMul", x, b.rand("w", 5, 4), out_shape=(2, 3, 4), name="linear")
    y = b.op("Add", b.rand("bias", 4), y, name="bias_add")
    plain = b.op("MatMul", x, b.rand("w2", 5, 4), out_shape=(2, 3, 4), name="no_bias")
    g = b.output(b.op("Relu", y), b.op("Add", plain, b.rand("rows", 3, 1), name="row_add"))
    assert check(g, FuseMatMulAdd()).modified
    assert kinds(g) == ["Reshape", "Gemm", "Reshape", "MatMul", "Relu", "Add"]
    flat, gemm, unflat = g.nodes[:3]
    assert flat.attrs["shape"] == [6, 5] and unflat.attrs["shape"] == [2, 3, 4]
    assert gemm.attrs == GEMM_ATTRS and gemm.origin == ["linear", "bias_add"]
    assert gemm.outputs[0].shape == (6, 4) and unflat.outputs[0].shape == (2, 3, 4)


# -- fuse_attention ----------------------------------------------------------------------------
def _attention_graph(fused_prologue: bool, extra_use: bool = False, sdpa: bool = False) -> Graph:
    """PyTorch's attention over heads split to (1, 6, 2, 4): transposes, scores, Div + mask Add
    (fused into one FusedElementwise when asked), Softmax, context, transpose back; ``sdpa``: K^T as
    two Transposes, and Q and K^T each scaled by 0.5 first (torch's scaled_dot_product_attention)."""
    b = Builder()
    q, k, v = (b.input(n, (1, 6, 2, 4)) for n in "qkv")
    mask = b.input("mask", (1, 1, 1, 6))
    qt = b.op("Transpose", q, out_shape=(1, 2, 6, 4), perm=[0, 2, 1, 3], name="qt")
    if sdpa:
        kh = b.op("Transpose", k, out_shape=(1, 2, 6, 4), perm=[0, 2, 1, 3])
        kt = b.op("Transpose", kh, out_shape=(1, 2, 4, 6), perm=[0, 1, 3, 2], name="kt")
        half = b.const("half", np.array(0.5, np.float32))
        qt, kt = b.op("Mul", qt, half, out_shape=(1, 2, 6, 4)), b.op("Mul", half, kt, out_shape=(1, 2, 4, 6))
    else:
        kt = b.op("Transpose", k, out_shape=(1, 2, 4, 6), perm=[0, 2, 3, 1], name="kt")
    vt = b.op("Transpose", v, out_shape=(1, 2, 6, 4), perm=[0, 2, 1, 3], name="vt")
    scores = b.op("MatMul", qt, kt, out_shape=(1, 2, 6, 6), name="scores")
    if fused_prologue:
        program = [{"op": "Div", "args": ["i0", "i1"], "attrs": {}},
                   {"op": "Add", "args": ["i2", "t0"], "attrs": {}}]
        masked = b.op("onnx_aot.FusedElementwise", scores, b.const("c", np.array(2.0, np.float32)), mask,
                      out_shape=(1, 2, 6, 6), program=program)
    else:
        scaled = b.op("Div", scores, b.const("c", np.array(2.0, np.float32)), out_shape=(1, 2, 6, 6))
        masked = b.op("Add", mask, scaled, out_shape=(1, 2, 6, 6))
    probs = b.op("Softmax", masked, out_shape=(1, 2, 6, 6), axis=-1)
    context = b.op("MatMul", probs, vt, out_shape=(1, 2, 6, 4))
    y = b.op("Transpose", context, out_shape=(1, 6, 2, 4), perm=[0, 2, 1, 3], name="y")
    return b.output(y, b.op("Neg", kt)) if extra_use else b.output(y)


@pytest.mark.parametrize(("fused_prologue", "sdpa"), [(False, False), (True, False), (True, True)])
def test_attention_becomes_one_multi_head_attention(fused_prologue: bool, sdpa: bool) -> None:
    g = _attention_graph(fused_prologue, sdpa=sdpa)
    assert check(g, FuseAttention()).modified
    (node,) = g.nodes
    assert node.kind == "onnx_aot.MultiHeadAttention" and node.attrs == {"scale": 0.125 if sdpa else 0.5}
    assert [v.name for v in node.inputs if v is not None] == ["q", "k", "v", "mask"]
    assert node.outputs[0] is g.outputs[0] and node.outputs[0].shape == (1, 6, 2, 4)


def test_attention_with_a_shared_transpose_is_left_alone() -> None:
    g = _attention_graph(False, extra_use=True)
    assert not FuseAttention().run(g).modified


# -- pack_gemm_weights -------------------------------------------------------------------------
def test_gemm_with_many_rows_gets_its_constant_b_packed_in_panels() -> None:
    b = Builder()
    wide, few = b.input("wide", (16, 5)), b.input("few", (8, 5))
    w, shared = b.rand("w", 120, 5), b.rand("shared", 120, 5)
    trans = {**GEMM_ATTRS, "transB": 1}
    y1 = b.op("Gemm", wide, w, b.rand("c", 120), out_shape=(16, 120), name="many_rows", **trans)
    y2 = b.op("Gemm", wide, w, out_shape=(16, 120), name="same_b", **trans)
    y3 = b.op("Gemm", few, b.rand("w_few", 120, 5), out_shape=(8, 120), name="dot_rows", **trans)
    y4 = b.op("Gemm", wide, shared, out_shape=(16, 120), name="b_also_read_elsewhere", **trans)
    y5 = b.op("Gemm", wide, b.rand("narrow", 5, 20), out_shape=(16, 20), name="narrow_b", **GEMM_ATTRS)
    y6 = b.op("Gemm", wide, b.rand("kn", 5, 128), out_shape=(16, 128), name="kn", **GEMM_ATTRS)
    g = b.output(y1, y2, y3, y4, y5, y6, b.op("Neg", shared, name="neg"))
    assert check(g, PackGemmWeights()).modified
    many, same, dot, elsewhere, narrow, kn = g.nodes[:6]
    assert many.kind == same.kind == kn.kind == "onnx_aot.PackedGemm"
    assert many.inputs[1] is same.inputs[1]  # one packed B for one B
    panels = many.inputs[1]
    assert panels is not None and panels.const is not None and panels.const.shape == (2, 5, 64)
    assert many.attrs["n"] == 120 and "transB" not in many.attrs and many.attrs["activation"] == ""
    assert "w" not in g.constants  # the original B is dropped: the weights are stored once
    assert dot.kind == elsewhere.kind == narrow.kind == "Gemm"  # few rows, shared B, 20 -> 64 columns
    assert not PackGemmWeights().run(g).modified


# -- fuse_elementwise --------------------------------------------------------------------------
def test_mul_add_relu_chain_becomes_one_fused_elementwise() -> None:
    b = Builder()
    x = b.input("x", (2, 3, 4))
    scale = b.rand("scale", 3, 1)
    m = b.op("Mul", x, scale, name="mul")
    a = b.op("Add", m, x, name="add")
    out = b.op("Relu", a, name="relu")
    g = b.output(out)
    assert check(g, FuseElementwise()).modified
    (fused,) = g.nodes
    assert fused.kind == "onnx_aot.FusedElementwise" and fused.outputs[0] is out
    assert fused.inputs == (x, scale) and fused.origin == ["mul", "add", "relu"]
    assert fused.attrs["program"] == [
        {"op": "Mul", "args": ["i0", "i1"], "attrs": {}},
        {"op": "Add", "args": ["t0", "i0"], "attrs": {}},
        {"op": "Relu", "args": ["t1"], "attrs": {}},
    ]


def test_elementwise_tree_with_shared_operand_and_attrs() -> None:
    b = Builder()
    x = b.input("x", (4, 5))
    t = b.op("Sigmoid", x)
    sq = b.op("Mul", t, t)  # t read twice by one member: still fusable
    c = b.op("Clip", b.op("Neg", x), min=-0.5, max=0.5)
    g = b.output(b.op("Sub", sq, c))
    assert check(g, FuseElementwise()).modified
    (fused,) = g.nodes
    program = fused.attrs["program"]
    assert [i["op"] for i in program] == ["Sigmoid", "Mul", "Neg", "Clip", "Sub"]
    assert program[1]["args"] == ["t0", "t0"] and program[3]["attrs"] == {"min": -0.5, "max": 0.5}
    assert fused.inputs == (x,)


def test_elementwise_not_fused_across_smaller_intermediates_or_other_dtypes() -> None:
    b = Builder()
    x = b.input("x", (3, 4))
    small = b.op("Mul", b.input("u", (1, 4)), b.input("v", (1, 4)))  # [1,4] < output [3,4]
    grown = b.op("Add", small, x)
    ints = b.op("Neg", b.op("Abs", b.input("k", (3, 4), np.int32)))
    g = b.output(grown, ints)
    assert not FuseElementwise().run(g).modified
    assert kinds(g) == ["Mul", "Add", "Abs", "Neg"]


# -- random graphs ----------------------------------------------------------------------------
_RANDOM_OPS = ["Relu", "Neg", "Sigmoid", "Identity", "Clip", "LeakyRelu", "Add", "Mul", "Sub", "Sum"]
_RANDOM_OPS += ["ConstOp", "Conv", "ConvBias", "BatchNormalization"]


def _random_graph(seed: int) -> Graph:
    """Convs, BatchNorms, Identities and elementwise ops wired at random; random extra outputs."""
    rng = np.random.default_rng(seed)
    b = Builder(f"random{seed}")
    values = [b.input("x", (1, 4, 5, 5)), b.input("y", (1, 4, 5, 5))]
    consts = [b.rand("c0", 4, 1, 1), b.rand("c1", 1, 4, 5, 5), b.const("half", np.array(0.5, F32))]
    for i in range(int(rng.integers(3, 14))):
        kind = _RANDOM_OPS[int(rng.integers(len(_RANDOM_OPS)))]
        a, c = (values[int(rng.integers(len(values)))] for _ in range(2))
        if kind in ("Relu", "Neg", "Sigmoid", "Identity"):
            v = b.op(kind, a)
        elif kind == "Clip":
            v = b.op(kind, a, min=-0.5, max=[0.5, math.inf][int(rng.integers(2))])
        elif kind == "LeakyRelu":
            v = b.op(kind, a, alpha=0.1)
        elif kind in ("Add", "Mul", "Sub", "Sum"):
            v = b.op(kind, a, c)
        elif kind == "ConstOp":
            v = b.op(["Mul", "Add", "Sub"][int(rng.integers(3))], a, consts[int(rng.integers(3))])
        elif kind.startswith("Conv"):
            bias = b.rand(f"b{i}", 4) if kind == "ConvBias" else None
            v = b.op("Conv", a, b.rand(f"w{i}", 4, 4, 3, 3), bias, out_shape=a.shape, **CONV_ATTRS)
        else:
            params = [b.rand(f"bn{i}_{k}", 4, low=0.5, high=1.5) for k in range(4)]
            v = b.op(kind, a, *params, out_shape=a.shape, epsilon=1e-5)
        values.append(v)
    extra = [v for v in values[2:-1] if rng.random() < 0.2] + ([values[0]] if rng.random() < 0.1 else [])
    return b.output(*dict.fromkeys([values[-1], *extra]))


@pytest.mark.parametrize("seed", range(24))
def test_random_graphs_keep_their_numbers_and_output_names(seed: int) -> None:
    for level in (1, 2):
        check(_random_graph(seed), lambda graph, level=level: optimize(graph, level), rtol=1e-4)


# -- PassManager and levels --------------------------------------------------------------------
class _BreakGraph(Pass):
    name = "break_graph"

    def run(self, graph: Graph) -> PassResult:
        first = graph.nodes[0]
        # A node reading a value nothing defines: the verifier must catch it.
        graph.add_node(Node("Relu", [Value("ghost", F32, (2,))], [Value("boo", F32, (2,))]), before=first)
        return PassResult(graph, True)


class _Crash(Pass):
    name = "crash"

    def run(self, graph: Graph) -> PassResult:
        graph.remove_node(graph.nodes[0])  # its output is still used: the IR refuses
        return PassResult(graph, True)


class _AlwaysModified(Pass):
    name = "always_modified"

    def __init__(self) -> None:
        self.calls = 0

    def run(self, graph: Graph) -> PassResult:
        self.calls += 1
        return PassResult(graph, True)


def test_pass_manager_names_the_pass_that_broke_the_graph() -> None:
    b = Builder()
    g = b.output(b.op("Relu", b.input("x", (2,))))
    with pytest.raises(InternalError, match="break_graph"):
        PassManager([EliminateDeadCode(), _BreakGraph()]).run(g)
    b = Builder()
    g = b.output(b.op("Neg", b.op("Relu", b.input("x", (2,)))))
    with pytest.raises(CompileError, match="pass 'crash' failed"):
        PassManager([_Crash()], verify=False).run(g)


def test_pass_manager_repeats_until_nothing_changes_and_caps_the_rounds() -> None:
    b = Builder()
    g = b.output(b.op("Relu", b.input("x", (2,))))
    spinner = _AlwaysModified()
    result = PassManager([spinner], max_iterations=10).run(g)
    assert result.modified and spinner.calls == 10
    assert not PassManager(passes_for_level(2)).run(g).modified


def test_levels() -> None:
    names = [[p.name for p in passes_for_level(level)] for level in range(4)]
    basic = ["eliminate_identity", "fold_constants", "eliminate_common_subexpressions", "eliminate_dead_code",
             "flush_denormal_weights"]
    fusions = ["fuse_conv_batchnorm", "fuse_matmul_add", "fuse_conv_activation", "fuse_elementwise"]
    assert names == [[], basic, basic + fusions, basic + fusions]
    with pytest.raises(CompileError, match="optimization level"):
        passes_for_level(4)


def _small_net(b: Builder) -> Graph:
    """Conv+BN+Relu, Conv+BN, residual Add, Relu, Dropout, a Shape-driven flatten, FC, Softmax."""
    x = b.input("x", (1, 4, 6, 6))
    h = b.op("Relu", _conv_bn(b, x, 4, name="c1"), name="r1")
    h = _conv_bn(b, h, 4, name="c2")
    h = b.op("Relu", b.op("Add", h, x, name="res"), name="r2")
    h = b.op("Identity", h, name="dropout")
    pooled = b.op("GlobalAveragePool", h, out_shape=(1, 4, 1, 1), name="gap")
    n = b.op("Shape", pooled, out_shape=(1,), out_dtype=np.int64, name="shape", start=0, end=1)
    b.op("Cast", n, out_dtype=F32, name="dead_cast", to="float32")  # dead once nothing reads it
    flat = b.op("Reshape", pooled, out_shape=(1, 4), name="flatten", shape=[1, 4])
    logits = b.op(
        "Add",
        b.op("MatMul", flat, b.rand("fc_w", 4, 3), out_shape=(1, 3), name="fc"),
        b.rand("fc_b", 3),
        name="fc_add",
    )
    scaled = b.op("Mul", logits, b.const("two", np.array(2.0, F32)), name="scale")
    return b.output(b.op("Sigmoid", b.op("Neg", scaled, name="neg"), name="sig"))


def test_level_two_end_to_end_and_deterministic() -> None:
    g = _small_net(Builder())
    check(g, lambda graph: optimize(graph, 2), rtol=1e-4)
    assert kinds(g) == [
        "onnx_aot.FusedConv",
        "onnx_aot.FusedConv",
        "GlobalAveragePool",
        "Reshape",
        "Gemm",
        "onnx_aot.FusedElementwise",
    ]
    assert g.nodes[1].attrs["activation"] == "Relu" and g.nodes[1].inputs[3] is g.inputs[0]
    assert g.eliminated == {
        "dropout": "eliminate_identity",
        "shape": "fold_constants",
        "dead_cast": "fold_constants",
    }
    again = _small_net(Builder())
    optimize(again, 2)
    assert [(n.name, n.kind, n.attrs == m.attrs) for n, m in zip(g.nodes, again.nodes, strict=True)] == [
        (n.name, n.kind, True) for n in g.nodes
    ]
    assert list(g.constants) == list(again.constants)


def test_level_one_and_zero() -> None:
    g = _small_net(Builder())
    check(g, lambda graph: optimize(graph, 1))
    assert "Identity" not in kinds(g) and "Shape" not in kinds(g)
    assert "BatchNormalization" in kinds(g)
    g0 = _small_net(Builder())
    before = kinds(g0)
    assert optimize(g0, 0) is g0 and kinds(g0) == before
