"""Small models with named dynamic dims, in the form exporters write them, for the dynamic-shape
tests (issue 17): a BERT-style encoder layer (``batch``, ``seq``) and a YOLOv8n-style fragment
(``b``, ``h``, ``w``), seeded weights."""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

__all__ = ["bert_model", "yolo_model"]

F = TensorProto.FLOAT
I64 = TensorProto.INT64


def _init(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(array, name)


def bert_model(decomposed_norm: bool = True) -> onnx.ModelProto:
    """One encoder layer as torch.onnx exports BERT: dims ``batch`` and ``seq``, the heads split by a
    Reshape whose target is Shape -> Gather -> Unsqueeze -> Concat, the attention mask turned into
    an additive bias, Erf-GELU, one LayerNormalization and one decomposed (ReduceMean ... Sqrt)."""
    rng = np.random.default_rng(3)
    hidden, heads = 32, 4
    head = hidden // heads

    def w(name: str, *shape: int) -> onnx.TensorProto:
        return _init(name, (rng.standard_normal(shape) * 0.1).astype(np.float32))

    inits = [w("wq", hidden, hidden), w("wk", hidden, hidden), w("wv", hidden, hidden),
             w("wo", hidden, hidden), w("w1", hidden, 4 * hidden), w("w2", 4 * hidden, hidden),
             w("bq", hidden), w("b1", 4 * hidden), w("gamma", hidden), w("beta", hidden),
             _init("heads", np.array([heads, head], np.int64)), _init("hid", np.array([hidden], np.int64)),
             _init("i0", np.array(0, np.int64)), _init("i1", np.array(1, np.int64)),
             _init("ax0", np.array([0], np.int64)), _init("ax12", np.array([1, 2], np.int64)),
             _init("one", np.array(1.0, np.float32)), _init("neg", np.array(-10000.0, np.float32)),
             _init("scale", np.array(math.sqrt(head), np.float32)), _init("half", np.array(0.5, np.float32)),
             _init("sqrt2", np.array(math.sqrt(2.0), np.float32)), _init("eps", np.array(1e-12, np.float32)),
             _init("two", np.array(2.0, np.float32))]
    n = helper.make_node
    nodes = [
        n("Unsqueeze", ["mask", "ax12"], ["m4"]), n("Cast", ["m4"], ["mf"], to=F),
        n("Sub", ["one", "mf"], ["minv"]), n("Mul", ["minv", "neg"], ["bias"]),
        n("Shape", ["x"], ["xs"]), n("Gather", ["xs", "i0"], ["b"], axis=0),
        n("Gather", ["xs", "i1"], ["s"], axis=0),
        n("Unsqueeze", ["b", "ax0"], ["b1d"]), n("Unsqueeze", ["s", "ax0"], ["s1d"]),
        n("Concat", ["b1d", "s1d", "heads"], ["split"], axis=0),
        n("Concat", ["b1d", "s1d", "hid"], ["merge"], axis=0),
    ]
    for t in ("q", "k", "v"):
        nodes += [n("MatMul", ["x", f"w{t}"], [f"{t}0"])]
        src = f"{t}0"
        if t == "q":
            nodes += [n("Add", ["q0", "bq"], ["q1"])]
            src = "q1"
        perm = [0, 2, 3, 1] if t == "k" else [0, 2, 1, 3]
        nodes += [n("Reshape", [src, "split"], [f"{t}4"]), n("Transpose", [f"{t}4"], [f"{t}h"], perm=perm)]
    nodes += [
        n("MatMul", ["qh", "kh"], ["sc0"]), n("Div", ["sc0", "scale"], ["sc1"]),
        n("Add", ["sc1", "bias"], ["sc2"]),
        n("Softmax", ["sc2"], ["p"], axis=-1), n("MatMul", ["p", "vh"], ["ctx"]),
        n("Transpose", ["ctx"], ["ctxt"], perm=[0, 2, 1, 3]), n("Reshape", ["ctxt", "merge"], ["ctx2"]),
        n("MatMul", ["ctx2", "wo"], ["o"]), n("Add", ["o", "x"], ["r1"]),
        n("LayerNormalization", ["r1", "gamma", "beta"], ["h1"], axis=-1, epsilon=1e-12),
        n("MatMul", ["h1", "w1"], ["f0"]), n("Add", ["f0", "b1"], ["f1"]),
        n("Div", ["f1", "sqrt2"], ["g0"]), n("Erf", ["g0"], ["g1"]), n("Add", ["g1", "one"], ["g2"]),
        n("Mul", ["f1", "g2"], ["g3"]), n("Mul", ["g3", "half"], ["g4"]),
        n("MatMul", ["g4", "w2"], ["f2"]), n("Add", ["f2", "h1"], ["r2"]),
    ]
    nodes += [n("ReduceMean", ["r2"], ["mu"], axes=[-1]), n("Sub", ["r2", "mu"], ["d"]),
              n("Pow", ["d", "two"], ["d2"]), n("ReduceMean", ["d2"], ["var"], axes=[-1]),
              n("Add", ["var", "eps"], ["ve"]), n("Sqrt", ["ve"], ["sd"]), n("Div", ["d", "sd"], ["nz"]),
              n("Mul", ["nz", "gamma"], ["ny"]), n("Add", ["ny", "beta"], ["y"])]
    graph = helper.make_graph(
        nodes, "bert", [helper.make_tensor_value_info("x", F, ["batch", "seq", hidden]),
                        helper.make_tensor_value_info("mask", I64, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", F, ["batch", "seq", hidden])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def yolo_model() -> onnx.ModelProto:
    """A YOLOv8n-style fragment: stride-2 Conv + SiLU, a C2f-like Split / Conv / Concat, an
    upsample by 2 (Resize, nearest) concatenated with the stride-8 map, and the head's Reshape to
    (batch, channels, H/8 * W/8) with its target from Shape -> Gather -> Unsqueeze -> Concat."""
    rng = np.random.default_rng(5)
    inits: list[onnx.TensorProto] = []
    n = helper.make_node
    nodes: list[onnx.NodeProto] = []

    def conv(src: str, dst: str, cin: int, cout: int, k: int, s: int) -> None:
        inits.append(_init(f"{dst}_w", (rng.standard_normal((cout, cin, k, k)) * 0.2).astype(np.float32)))
        inits.append(_init(f"{dst}_b", (rng.standard_normal(cout) * 0.1).astype(np.float32)))
        nodes.extend([n("Conv", [src, f"{dst}_w", f"{dst}_b"], [f"{dst}_c"], kernel_shape=[k, k],
                        strides=[s, s], pads=[k // 2] * 4),
                      n("Sigmoid", [f"{dst}_c"], [f"{dst}_s"]), n("Mul", [f"{dst}_c", f"{dst}_s"], [dst])])

    conv("images", "p1", 3, 8, 3, 2)
    conv("p1", "p2", 8, 16, 3, 2)
    inits.append(_init("split", np.array([8, 8], np.int64)))
    nodes.append(n("Split", ["p2", "split"], ["c1", "c2"], axis=1))
    conv("c2", "c3", 8, 8, 3, 1)
    nodes.append(n("Concat", ["c1", "c2", "c3"], ["c4"], axis=1))
    conv("c4", "p3", 24, 16, 3, 2)
    conv("p3", "p4", 16, 16, 3, 2)
    inits += [_init("scales", np.array([1, 1, 2, 2], np.float32)), _init("ax0", np.array([0], np.int64)),
              _init("i0", np.array(0, np.int64)), _init("tail", np.array([32, -1], np.int64))]
    nodes += [n("Resize", ["p4", "", "scales"], ["up"], mode="nearest"),
              n("Concat", ["up", "p3"], ["cat"], axis=1)]
    conv("cat", "head", 32, 32, 1, 1)
    nodes += [n("Shape", ["head"], ["hs"]), n("Gather", ["hs", "i0"], ["hb"], axis=0),
              n("Unsqueeze", ["hb", "ax0"], ["hb1"]), n("Concat", ["hb1", "tail"], ["target"], axis=0),
              n("Reshape", ["head", "target"], ["out"])]
    graph = helper.make_graph(nodes, "yolo", [helper.make_tensor_value_info("images", F, ["b", 3, "h", "w"])],
                              [helper.make_tensor_value_info("out", F, [None, None, None])],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
