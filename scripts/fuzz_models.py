"""Fuzz the frontend and the compiler with mutated ONNX models.

    python -m scripts.fuzz_models --cases 10000 --seed 0 --workers 2
    python -m scripts.fuzz_models --case 1234 --seed 0        # rerun one case here, with traceback

Every case takes one of a few tiny seed models (built with onnx.helper), applies one mutation
(truncated or flipped bytes, wrong attributes, dangling inputs, cycles, huge or negative dims,
wrong initializer sizes, wrong element types, bad opsets, dropped or duplicated names) chosen by
a generator seeded with ``(seed, case)``, and compiles the result. Cases run in worker processes
with a per-case time limit (default 10 s): a hang or a crash (a signal, an out-of-memory kill) is
charged to its case and the worker is restarted. The only acceptable outcomes are a compiled
artifact or one of the project's own exceptions (``runtime.errors.OnnxAotError``); anything else
is *unexpected* and the script exits 1.

By default the C provider claims nodes and renders its source but does not run the C compiler
(the toolchain is not what is fuzzed, and 10,000 gcc runs would take hours); ``--build`` builds
too, and the compile then runs each artifact's golden self-test before writing it: the C kernels
against the reference kernels on the mutated model (an ``ArtifactCheckError``: a *mismatch*,
counted as unexpected).
The report gives counts per mutation kind and outcome and per exception type.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import queue
import random
import select
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

KINDS = ("truncate", "flip", "attribute", "dangling", "cycle", "huge_dim", "negative_dim",
         "zero_dim", "small_values", "initializer_size", "dtype", "opset", "drop_or_duplicate", "subgraph")
# what "subgraph" does inside a branch or loop body: the structural mutations, or a graph input
# of the body / an outer-scope name it reads renamed away
SUBGRAPH_KINDS = ("attribute", "dangling", "cycle", "dtype", "drop_or_duplicate", "outer_scope")
MEMORY_LIMIT = 4 << 30  # address space per worker: a huge allocation fails, never the machine


# -- seed models ---------------------------------------------------------------------------------
def seed_models() -> list[Any]:
    """Tiny valid models covering the common op families (each compiles as it is)."""
    import numpy as np
    from onnx import TensorProto
    from onnx import helper
    from onnx import numpy_helper

    rng = np.random.default_rng(0)

    def init(name: str, *shape: int, dtype: Any = np.float32) -> Any:
        if np.dtype(dtype).kind == "f":
            return numpy_helper.from_array(rng.standard_normal(shape).astype(dtype), name)
        return numpy_helper.from_array(np.asarray(rng.integers(0, 3, shape), dtype=dtype), name)

    def model(name: str, nodes: list[Any], inputs: list[Any], outputs: list[Any], inits: list[Any],
              opset: int = 18) -> Any:
        graph = helper.make_graph(nodes, name, inputs, outputs, initializer=inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)

    f32 = TensorProto.FLOAT
    vi = helper.make_tensor_value_info
    mk = helper.make_node
    seeds = [
        model("conv", [
            mk("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1], name="conv"),
            mk("Relu", ["c"], ["r"], name="relu"),
            mk("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
            mk("Flatten", ["p"], ["f"], axis=1, name="flatten"),
            mk("Gemm", ["f", "fc", "fcb"], ["y"], transB=1, name="fc"),
        ], [vi("x", f32, [1, 2, 4, 4])], [vi("y", f32, [1, 3])],
            [init("w", 4, 2, 3, 3), init("b", 4), init("fc", 3, 16), init("fcb", 3)]),
        model("mlp", [
            mk("MatMul", ["x", "w1"], ["h"], name="mm1"),
            mk("Add", ["h", "b1"], ["hb"], name="add1"),
            mk("Sigmoid", ["hb"], ["s"], name="sig"),
            mk("MatMul", ["s", "w2"], ["o"], name="mm2"),
            mk("Softmax", ["o"], ["y"], axis=-1, name="softmax"),
        ], [vi("x", f32, [2, 5])], [vi("y", f32, [2, 3])],
            [init("w1", 5, 6), init("b1", 6), init("w2", 6, 3)]),
        model("shapes", [
            mk("Shape", ["x"], ["s"], name="shape"),
            mk("Gather", ["s", "i0"], ["d0"], axis=0, name="gather"),
            mk("Unsqueeze", ["d0", "ax0"], ["d0u"], name="unsq"),
            mk("Concat", ["d0u", "minus1"], ["target"], axis=0, name="concat"),
            mk("Reshape", ["x", "target"], ["r"], name="reshape"),
            mk("Transpose", ["r"], ["t"], perm=[1, 0], name="transpose"),
            mk("Slice", ["t", "starts", "ends", "axes"], ["sl"], name="slice"),
            mk("Tanh", ["sl"], ["y"], name="tanh"),
        ], [vi("x", f32, [2, 3, 4])], [vi("y", f32, [6, 2])],
            [numpy_helper.from_array(np.array(0, np.int64), "i0"),
             numpy_helper.from_array(np.array([0], np.int64), "ax0"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1"),
             numpy_helper.from_array(np.array([0], np.int64), "starts"),
             numpy_helper.from_array(np.array([6], np.int64), "ends"),
             numpy_helper.from_array(np.array([0], np.int64), "axes")]),
        model("eltwise", [
            mk("Mul", ["a", "b"], ["m"], name="mul"),
            mk("Greater", ["m", "zero"], ["g"], name="greater"),
            mk("Where", ["g", "m", "b"], ["w"], name="where"),
            mk("Cast", ["w"], ["c"], to=TensorProto.DOUBLE, name="cast"),
            mk("Cast", ["c"], ["c2"], to=TensorProto.FLOAT, name="cast2"),
            mk("Clip", ["c2", "lo", "hi"], ["y"], name="clip"),
        ], [vi("a", f32, [3, 4]), vi("b", f32, [1, 4])], [vi("y", f32, [3, 4])],
            [numpy_helper.from_array(np.array(0, np.float32), "zero"),
             numpy_helper.from_array(np.array(-1, np.float32), "lo"),
             numpy_helper.from_array(np.array(1, np.float32), "hi")]),
        model("norm", [
            mk("BatchNormalization", ["x", "sc", "bi", "mu", "var"], ["bn"], epsilon=1e-5, name="bn"),
            mk("Pad", ["bn", "pads"], ["pd"], mode="constant", name="pad"),
            mk("AveragePool", ["pd"], ["ap"], kernel_shape=[2, 2], name="avgpool"),
            mk("ReduceMean", ["ap", "raxes"], ["rm"], keepdims=1, name="reduce"),
            mk("Split", ["rm", "split"], ["s1", "s2"], axis=1, name="split"),
            mk("Concat", ["s2", "s1"], ["y"], axis=1, name="concat"),
        ], [vi("x", f32, [1, 4, 3, 3])], [vi("y", f32, [1, 4, 1, 1])],
            [init("sc", 4), init("bi", 4), init("mu", 4),
             numpy_helper.from_array(np.abs(rng.standard_normal(4)).astype(np.float32) + 0.5, "var"),
             numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"),
             numpy_helper.from_array(np.array([2, 3], np.int64), "raxes"),
             numpy_helper.from_array(np.array([1, 3], np.int64), "split")]),
        model("index", [
            mk("Gather", ["table", "ids"], ["e"], axis=0, name="embed"),
            mk("ReduceSum", ["e", "one"], ["s"], keepdims=0, name="sum"),
            mk("TopK", ["s", "k"], ["vals", "idx"], axis=-1, name="topk"),
            mk("Cast", ["idx"], ["y2"], to=TensorProto.FLOAT, name="cast"),
            mk("Add", ["vals", "y2"], ["y"], name="add"),
        ], [vi("ids", TensorProto.INT64, [2, 3])], [vi("y", f32, [2, 2])],
            [init("table", 5, 4), numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.array([2], np.int64), "k")]),
        model("spatial", [
            mk("ConvTranspose", ["x", "w"], ["ct"], strides=[2, 2], name="deconv"),
            mk("Resize", ["ct", "", "scales"], ["rs"], mode="nearest", name="resize"),
            mk("GlobalAveragePool", ["rs"], ["gp"], name="gap"),
            mk("LeakyRelu", ["gp"], ["y"], alpha=0.1, name="leaky"),
        ], [vi("x", f32, [1, 2, 3, 3])], [vi("y", f32, [1, 3, 1, 1])],
            [init("w", 2, 3, 2, 2), numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]),
        *_control_flow_seeds(model, init),
    ]
    return seeds


def _control_flow_seeds(model: Any, init: Any) -> list[Any]:
    """If (a data-dependent condition; both branches read an outer-scope value), Loop (a constant
    trip count, a carried value and a scan output) and Scan (a running row sum)."""
    import numpy as np
    from onnx import TensorProto
    from onnx import helper
    from onnx import numpy_helper

    f32 = TensorProto.FLOAT
    vi = helper.make_tensor_value_info
    mk = helper.make_node
    then_branch = helper.make_graph([mk("Mul", ["h", "w"], ["t_out"], name="then_mul")], "then", [],
                                    [vi("t_out", f32, [2, 3])])
    else_branch = helper.make_graph([mk("Sub", ["h", "w"], ["e_out"], name="else_sub")], "else", [],
                                    [vi("e_out", f32, [2, 3])])
    body = helper.make_graph([
        mk("Add", ["acc_in", "step"], ["acc_out"], name="body_add"),
        mk("Identity", ["cond_in"], ["cond_out"], name="body_cond"),
        mk("Relu", ["acc_out"], ["row"], name="body_relu"),
    ], "body", [vi("i", TensorProto.INT64, []), vi("cond_in", TensorProto.BOOL, []), vi("acc_in", f32, [3])],
        [vi("cond_out", TensorProto.BOOL, []), vi("acc_out", f32, [3]), vi("row", f32, [3])])
    scan_body = helper.make_graph([
        mk("Add", ["sum_in", "next"], ["sum_out"], name="scan_add"),
        mk("Identity", ["sum_out"], ["scan_out"], name="scan_copy"),
    ], "scan_body", [vi("sum_in", f32, [3]), vi("next", f32, [3])],
        [vi("sum_out", f32, [3]), vi("scan_out", f32, [3])])
    scalar = numpy_helper.from_array
    return [
        model("if", [
            mk("Tanh", ["x"], ["h"], name="tanh"),
            mk("ReduceSum", ["x"], ["total"], keepdims=0, name="sum"),
            mk("Greater", ["total", "zero"], ["positive"], name="greater"),
            mk("If", ["positive"], ["chosen"], then_branch=then_branch, else_branch=else_branch, name="if"),
            mk("Add", ["chosen", "x"], ["y"], name="add"),
        ], [vi("x", f32, [2, 3])], [vi("y", f32, [2, 3])],
            [init("w", 2, 3), scalar(np.array(0, np.float32), "zero")]),
        model("loop", [
            mk("Loop", ["trips", "go", "x"], ["final", "rows"], body=body, name="loop"),
            mk("ReduceSum", ["rows", "axis0"], ["summed"], keepdims=0, name="sum"),
            mk("Add", ["final", "summed"], ["y"], name="add"),
        ], [vi("x", f32, [3])], [vi("y", f32, [3])],
            [scalar(np.array(3, np.int64), "trips"), scalar(np.array(True), "go"), init("step", 3),
             scalar(np.array([0], np.int64), "axis0")]),
        model("scan", [
            mk("Scan", ["zeros", "x"], ["total", "partial"], body=scan_body, num_scan_inputs=1, name="scan"),
            mk("Mul", ["partial", "total"], ["y"], name="mul"),
        ], [vi("x", f32, [4, 3])], [vi("y", f32, [4, 3])],
            [scalar(np.zeros(3, np.float32), "zeros")]),
    ]


# -- mutations -----------------------------------------------------------------------------------
WEIRD_INTS = (-(2 ** 63), -(2 ** 31), -7, -2, -1, 0, 1, 2, 3, 7, 64, 2 ** 31 - 1, 2 ** 31, 2 ** 40, 2 ** 62)
SMALL_INTS = (-3, -2, -1, 0, 1, 2, 3, 4, 5, 8)


def _weird(rng: random.Random) -> int:
    """Mostly small values a checker lets through (out-of-range axes, zero strides), some huge."""
    return rng.choice(SMALL_INTS) if rng.random() < 0.7 else rng.choice(WEIRD_INTS)


def _pick_node(rng: random.Random, m: Any) -> Any:
    return rng.choice(list(m.graph.node))


def _subgraphs(g: Any) -> list[Any]:
    """Every graph attribute of every node of ``g``, nested ones included."""
    from onnx import AttributeProto

    found = []
    for node in g.node:
        for attr in node.attribute:
            inner = [attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs)
            for sub in inner:
                found += [sub, *_subgraphs(sub)]
    return found


def _mutate_subgraph(m: Any, rng: random.Random) -> bytes:
    """One mutation inside a branch or loop body of ``m`` (a model without one is left as it is)."""
    subs = _subgraphs(m.graph)
    if not subs:
        return m.SerializeToString()
    sub = rng.choice(subs)
    kind = rng.choice(SUBGRAPH_KINDS)
    if kind == "outer_scope":  # a body input renamed, or a name the body reads from outside lost
        names = [i for i in sub.input] if sub.input and rng.random() < 0.5 else []
        if names:
            rng.choice(names).name = f"renamed_{rng.randrange(100)}"
        elif sub.node:
            node = rng.choice(list(sub.node))
            if node.input:
                node.input[rng.randrange(len(node.input))] = f"outer_{rng.randrange(100)}"
        return m.SerializeToString()
    if not sub.node:
        return m.SerializeToString()
    wrapper = type(m)()
    wrapper.graph.CopyFrom(sub)
    mutated = type(m)()
    mutated.ParseFromString(mutate(wrapper, kind, rng))
    sub.CopyFrom(mutated.graph)
    return m.SerializeToString()


def mutate(seed_model: Any, kind: str, rng: random.Random) -> bytes:
    """Serialized bytes of ``seed_model`` after one mutation of ``kind``."""
    from onnx import AttributeProto
    from onnx import TensorProto
    from onnx import helper

    m = type(seed_model)()
    m.CopyFrom(seed_model)
    g = m.graph
    if kind == "subgraph":
        return _mutate_subgraph(m, rng)
    if kind == "truncate":
        data = m.SerializeToString()
        return data[:rng.randrange(0, len(data))]
    if kind == "flip":
        data = bytearray(m.SerializeToString())
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] ^= rng.randint(1, 255)
        return bytes(data)
    if kind == "attribute":
        node = _pick_node(rng, m)
        choice = rng.choice([0, 0, 0, 1, 2, 3, 4])
        if choice == 0 and node.attribute:  # an int / ints attribute gets a weird value
            attr = rng.choice(list(node.attribute))
            if attr.type == AttributeProto.INTS and attr.ints:
                for _ in range(rng.randint(1, 2)):
                    attr.ints[rng.randrange(len(attr.ints))] = _weird(rng)
                if rng.random() < 0.2:
                    attr.ints.append(_weird(rng))
            elif attr.type == AttributeProto.INT:
                attr.i = _weird(rng)
            elif attr.type == AttributeProto.FLOAT:
                attr.f = rng.choice([float("nan"), float("inf"), -1e38, 0.0, -1.0])
            else:
                attr.type = rng.choice([AttributeProto.INT, AttributeProto.STRING, AttributeProto.FLOATS])
        elif choice == 1 and node.attribute:  # drop one
            del node.attribute[rng.randrange(len(node.attribute))]
        elif choice == 2 and node.attribute:  # the same name, another type
            attr = rng.choice(list(node.attribute))
            new = rng.choice([helper.make_attribute(attr.name, "text"),
                              helper.make_attribute(attr.name, [1.5, -2.0]),
                              helper.make_attribute(attr.name, _weird(rng)),
                              helper.make_attribute(attr.name, [_weird(rng)] * rng.randint(0, 6),
                                                    attr_type=AttributeProto.INTS)])
            attr.CopyFrom(new)
        elif choice == 3:  # a well-known attribute this op may not have, with a random value
            name = rng.choice(["axis", "axes", "perm", "pads", "strides", "kernel_shape", "dilations",
                               "group", "keepdims", "to", "k", "mode", "transA", "epsilon"])
            value = rng.choice([_weird(rng), [_weird(rng) for _ in range(rng.randint(0, 5))], "bogus", 0.5])
            node.attribute.append(helper.make_attribute(
                name, value, attr_type=AttributeProto.INTS if value == [] else None))
        else:  # a duplicate attribute
            if node.attribute:
                node.attribute.append(node.attribute[0])
            else:
                node.attribute.append(helper.make_attribute("axis", 1))
        return m.SerializeToString()
    if kind == "dangling":
        node = _pick_node(rng, m)
        if node.input and rng.random() < 0.8:
            node.input[rng.randrange(len(node.input))] = f"missing_{rng.randrange(100)}"
        elif rng.random() < 0.5:
            g.output[0].name = "nowhere"
        else:
            node.input.append(f"missing_{rng.randrange(100)}")
        return m.SerializeToString()
    if kind == "cycle":
        nodes = list(g.node)
        i = rng.randrange(len(nodes))
        j = rng.randrange(i, len(nodes))  # a later (or the same) node's output feeds node i
        if nodes[i].input:
            nodes[i].input[rng.randrange(len(nodes[i].input))] = rng.choice(list(nodes[j].output))
        if rng.random() < 0.3:  # and shuffle the node order
            order = list(g.node)
            rng.shuffle(order)
            del g.node[:]
            g.node.extend(order)
        return m.SerializeToString()
    if kind in ("huge_dim", "negative_dim"):
        bad = (lambda: rng.choice([2 ** 31, 2 ** 33, 2 ** 40, 2 ** 62, 10 ** 6])) if kind == "huge_dim" \
            else (lambda: rng.choice([-1, -2, -7, -(2 ** 31)]))
        where = rng.randrange(4)
        if where == 0:  # a graph input's declared dim
            vi = rng.choice(list(g.input))
            dims = vi.type.tensor_type.shape.dim
            if dims:
                dims[rng.randrange(len(dims))].dim_value = bad()
        elif where == 1 and g.initializer:  # an initializer's dims (data unchanged)
            t = rng.choice(list(g.initializer))
            if t.dims:
                t.dims[rng.randrange(len(t.dims))] = bad()
            else:
                t.dims.append(bad())
        elif where == 2:  # an int64 initializer's values (shapes, pads, axes, k...)
            ints = [t for t in g.initializer if t.data_type == TensorProto.INT64]
            if ints:
                import numpy as np
                from onnx import numpy_helper

                t = rng.choice(ints)
                arr = numpy_helper.to_array(t).copy()
                if arr.size:
                    arr.reshape(-1)[rng.randrange(arr.size)] = bad()
                    t.CopyFrom(numpy_helper.from_array(np.asarray(arr, np.int64), t.name))
        else:  # an output's declared dim
            dims = g.output[0].type.tensor_type.shape.dim
            if dims:
                dims[rng.randrange(len(dims))].dim_value = bad()
        return m.SerializeToString()
    if kind == "zero_dim":  # empty tensors: a graph input's dim (or an initializer's) becomes 0 or 1
        if rng.random() < 0.75 or not g.initializer:
            vi = rng.choice(list(g.input))
            dims = vi.type.tensor_type.shape.dim
            for _ in range(rng.randint(1, 2)):
                if dims:
                    dims[rng.randrange(len(dims))].dim_value = rng.choice([0, 0, 1])
        else:
            import numpy as np
            from onnx import numpy_helper

            t = rng.choice(list(g.initializer))
            arr = numpy_helper.to_array(t)
            shape = list(arr.shape) or [1]
            shape[rng.randrange(len(shape))] = 0
            t.CopyFrom(numpy_helper.from_array(np.zeros(shape, arr.dtype), t.name))
        return m.SerializeToString()
    if kind == "small_values":  # int64 constants (shapes, axes, pads, k, starts...) get small values
        ints = [t for t in g.initializer if t.data_type == TensorProto.INT64]
        if ints:
            import numpy as np
            from onnx import numpy_helper

            t = rng.choice(ints)
            arr = numpy_helper.to_array(t).copy()
            if arr.size:
                for _ in range(rng.randint(1, 2)):
                    arr.reshape(-1)[rng.randrange(arr.size)] = rng.choice(SMALL_INTS)
            elif rng.random() < 0.5:
                arr = np.array([rng.choice(SMALL_INTS)], np.int64)
            t.CopyFrom(numpy_helper.from_array(np.asarray(arr, np.int64), t.name))
        else:
            node = _pick_node(rng, m)
            for attr in node.attribute:
                if attr.type == AttributeProto.INT:
                    attr.i = rng.choice(SMALL_INTS)
                elif attr.type == AttributeProto.INTS and attr.ints:
                    attr.ints[rng.randrange(len(attr.ints))] = rng.choice(SMALL_INTS)
        return m.SerializeToString()
    if kind == "initializer_size":
        if not g.initializer:
            return m.SerializeToString()
        import numpy as np
        from onnx import numpy_helper

        t = rng.choice(list(g.initializer))
        arr = numpy_helper.to_array(t)
        choice = rng.randrange(4)
        if choice == 0:  # raw bytes cut short
            raw = arr.tobytes()
            t.ClearField("float_data")
            t.ClearField("int64_data")
            t.raw_data = raw[:rng.randrange(0, max(len(raw), 1))]
        elif choice == 1:  # raw bytes too long
            t.raw_data = arr.tobytes() + bytes(rng.randint(1, 64))
        elif choice == 2:  # typed field of the wrong length
            t.ClearField("raw_data")
            if t.data_type == TensorProto.FLOAT:
                t.float_data[:] = [1.0] * rng.randint(0, max(arr.size * 2, 1))
            else:
                t.int64_data[:] = [1] * rng.randint(0, max(arr.size * 2, 1))
        else:  # dims changed, data kept
            t.dims[:] = [int(d) + rng.choice([-1, 1, 2]) for d in t.dims] or [rng.randint(0, 5)]
            del np
        return m.SerializeToString()
    if kind == "dtype":
        types = [TensorProto.UNDEFINED, TensorProto.INT8, TensorProto.INT64, TensorProto.STRING,
                 TensorProto.BOOL, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.COMPLEX64,
                 TensorProto.BFLOAT16, TensorProto.UINT64, 99]
        target = rng.randrange(3)
        if target == 0 and g.input:
            rng.choice(list(g.input)).type.tensor_type.elem_type = rng.choice(types)
        elif target == 1 and g.initializer:
            rng.choice(list(g.initializer)).data_type = rng.choice(types)
        else:
            g.output[0].type.tensor_type.elem_type = rng.choice(types)
        return m.SerializeToString()
    if kind == "opset":
        choice = rng.randrange(4)
        if choice == 0:
            m.opset_import[0].version = rng.choice([0, 1, 5, 6, 30, 99, -1, 2 ** 40])
        elif choice == 1:
            m.opset_import[0].domain = rng.choice(["ai.onnx.ml", "com.example", "bogus"])
        elif choice == 2:
            _pick_node(rng, m).domain = rng.choice(["com.microsoft", "onnx_aot", "x.y"])
        else:
            m.ir_version = rng.choice([0, 1, 3, 99, -1])
        return m.SerializeToString()
    if kind == "drop_or_duplicate":
        choice = rng.randrange(5)
        nodes = list(g.node)
        if choice == 0:
            del g.node[rng.randrange(len(nodes))]
        elif choice == 1 and len(nodes) > 1:  # two nodes write the same value
            a, b = rng.sample(range(len(nodes)), 2)
            g.node[b].output[0] = g.node[a].output[0]
        elif choice == 2:
            del g.output[:]
        elif choice == 3:
            g.output.append(g.output[0])
        else:
            n = _pick_node(rng, m)
            n.op_type = rng.choice(["Conv", "Relu", "NotAnOp", "Gemm", "Reshape", ""])
        return m.SerializeToString()
    raise ValueError(f"unknown mutation kind {kind!r}")


def make_case(seed: int, case: int) -> tuple[str, str, bytes]:
    """(mutation kind, seed model name, model bytes) for case number ``case`` of run ``seed``."""
    rng = random.Random(seed * 1_000_003 + case)
    kind = KINDS[case % len(KINDS)]  # every kind equally often, in a fixed rotation
    seeds = _seeds()
    if kind == "subgraph":
        seeds = [m for m in seeds if _subgraphs(m.graph)]
    base = seeds[rng.randrange(len(seeds))]
    return kind, base.graph.name, mutate(base, kind, rng)


_SEEDS: list[Any] = []


def _seeds() -> list[Any]:
    if not _SEEDS:
        _SEEDS.extend(seed_models())
    return _SEEDS


# -- running one case (in a worker) --------------------------------------------------------------
def _providers(build: bool) -> list[Any] | None:
    if build:
        return None
    from compiler.codegen.toolchain import target_info
    from compiler.providers.c.provider import SOURCE_NAME
    from compiler.providers.c.provider import CProvider
    from compiler.providers.reference import ReferenceProvider

    class SourceOnlyCProvider(CProvider):  # claims and renders like the C provider, builds nothing
        def generate(self, partitions: Any, kernels_dir: Path, options: Any) -> None:
            source = self.render_source(list(partitions), target_info(options))
            kernels_dir.mkdir(parents=True, exist_ok=True)
            (kernels_dir / SOURCE_NAME).write_text(source.model)

    return [SourceOnlyCProvider(), ReferenceProvider()]


def run_case(seed: int, case: int, build: bool, work: Path) -> dict[str, Any]:
    """Compile case ``case``; classify the result (never raises)."""
    from compiler import compile_model
    from runtime.errors import ArtifactCheckError
    from runtime.errors import OnnxAotError

    start = time.perf_counter()
    kind, base, data = make_case(seed, case)
    record: dict[str, Any] = {"case": case, "kind": kind, "seed_model": base}
    path = work / f"case{case}.onnx"
    path.write_bytes(data)
    out = work / f"out{case}"
    try:
        # built: the compile runs the golden cases through the built kernels, C against the
        # reference (compiler/artifact/check.py); source only: there is nothing to run
        compile_model(path, out, providers=_providers(build), run_check=build)
        record["outcome"] = "compiled"
    except ArtifactCheckError as exc:  # the artifact failed or disagreed: a finding, not a rejection
        record["outcome"] = "mismatch"
        record["error"] = "mismatch"
        record["message"] = str(exc)[-300:]
    except OnnxAotError as exc:
        record["outcome"] = "rejected"
        record["error"] = type(exc).__name__
        record["message"] = str(exc)[:300]
    except Exception as exc:  # noqa: BLE001 - the point: anything else is a finding
        record["outcome"] = "unexpected"
        record["error"] = type(exc).__name__
        record["message"] = str(exc)[:300]
        record["where"] = traceback.format_exc().strip().splitlines()[-3:]
    finally:
        import shutil

        shutil.rmtree(out, ignore_errors=True)
        path.unlink(missing_ok=True)
    record["seconds"] = round(time.perf_counter() - start, 4)
    return record


def worker_main(seed: int, build: bool) -> None:
    """Read case numbers from stdin, answer one JSON line each on stdout."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    except (ImportError, ValueError, OSError):
        pass
    import warnings

    warnings.simplefilter("ignore")
    real_stdout = sys.stdout
    sys.stdout = sys.stderr  # nothing the compiler prints may corrupt the protocol
    with tempfile.TemporaryDirectory(prefix="onnx-aot-fuzz-") as tmp:
        for line in sys.stdin:
            line = line.strip()
            if not line:
                continue
            record = run_case(seed, int(line), build, Path(tmp))
            real_stdout.write(json.dumps(record) + "\n")
            real_stdout.flush()


# -- the driver ----------------------------------------------------------------------------------
class Worker:
    def __init__(self, seed: int, build: bool) -> None:
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
                   PYTHONHASHSEED="0")
        argv = [sys.executable, "-m", "scripts.fuzz_models", "--worker", "--seed", str(seed)]
        if build:
            argv.append("--build")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=env, text=True, bufsize=1, cwd=ROOT)

    def ask(self, case: int, timeout: float) -> dict[str, Any] | None:
        """The case's record; None when the worker died or ran out of time (then it is killed)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(f"{case}\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.kill()
            return None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            return None
        return json.loads(line)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()


@dataclass
class Report:
    cases: int = 0
    records: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def bad(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r["outcome"] in ("unexpected", "mismatch", "crash", "hang")]

    def table(self) -> str:
        outcomes = ("compiled", "rejected", "unexpected", "mismatch", "crash", "hang")
        by_kind: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        errors: collections.Counter[str] = collections.Counter()
        for r in self.records:
            by_kind[r["kind"]][r["outcome"]] += 1
            if r["outcome"] in ("rejected", "unexpected"):
                errors[f"{r['outcome']}: {r['error']}"] += 1
            elif r["outcome"] in ("mismatch", "crash", "hang"):
                errors[r["outcome"]] += 1
        lines = [f"{'mutation':<20}" + "".join(f"{o:>11}" for o in outcomes) + f"{'total':>8}"]
        for kind in KINDS:
            c = by_kind.get(kind, collections.Counter())
            lines.append(f"{kind:<20}" + "".join(f"{c[o]:>11}" for o in outcomes) + f"{sum(c.values()):>8}")
        total = collections.Counter(r["outcome"] for r in self.records)
        lines.append(f"{'all':<20}" + "".join(f"{total[o]:>11}" for o in outcomes)
                     + f"{len(self.records):>8}")
        lines.append("")
        lines.append("exception types:")
        for name, n in sorted(errors.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"  {n:>6}  {name}")
        slowest = max(self.records, key=lambda r: r.get("seconds", 0.0), default=None)
        if slowest is not None:
            lines.append(f"slowest case: {slowest['case']} ({slowest['kind']}) "
                         f"{slowest.get('seconds', 0):.2f} s")
        lines.append(f"{len(self.records)} cases in {self.seconds:.1f} s; "
                     f"{len(self.bad())} unexpected (exceptions of other types, wrong results, crashes, "
                     "hangs)")
        return "\n".join(lines)


def run(cases: int, seed: int = 0, workers: int = 2, timeout: float = 10.0, build: bool = False,
        first: int = 0, progress: bool = False) -> Report:
    """Run cases ``first .. first + cases - 1`` in ``workers`` worker processes."""
    todo: queue.Queue[int] = queue.Queue()
    for case in range(first, first + cases):
        todo.put(case)
    report = Report(cases)
    lock = threading.Lock()
    start = time.perf_counter()

    def drive() -> None:
        worker = Worker(seed, build)
        try:
            while True:
                try:
                    case = todo.get_nowait()
                except queue.Empty:
                    return
                t0 = time.perf_counter()
                record = worker.ask(case, timeout)
                if record is None:  # charged to the case; a fresh worker for the next one
                    kind, base, _ = make_case(seed, case)
                    died = worker.proc.returncode
                    outcome = "hang" if time.perf_counter() - t0 >= timeout else "crash"
                    record = {"case": case, "kind": kind, "seed_model": base, "outcome": outcome,
                              "error": outcome, "message": f"worker exit status {died}",
                              "seconds": round(time.perf_counter() - t0, 3)}
                    worker = Worker(seed, build)
                with lock:
                    report.records.append(record)
                    if progress and len(report.records) % 500 == 0:
                        print(f"... {len(report.records)} cases, {len(report.bad())} unexpected",
                              file=sys.stderr, flush=True)
        finally:
            worker.close()

    threads = [threading.Thread(target=drive) for _ in range(max(1, workers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report.records.sort(key=lambda r: r["case"])
    report.seconds = time.perf_counter() - start
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--first", type=int, default=0, help="number of the first case (default 0)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per case (default 10)")
    parser.add_argument("--build", action="store_true", help="also run the C compiler")
    parser.add_argument("--case", type=int, default=None, help="run one case in this process")
    parser.add_argument("--json", metavar="FILE", help="write every case's record to FILE")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker_main(args.seed, args.build)
        return 0
    if args.case is not None:
        with tempfile.TemporaryDirectory() as tmp:
            record = run_case(args.seed, args.case, args.build, Path(tmp))
        print(json.dumps(record, indent=1))
        return 1 if record["outcome"] == "unexpected" else 0
    report = run(args.cases, args.seed, args.workers, args.timeout, args.build, args.first, progress=True)
    print(report.table())
    for r in report.bad()[:50]:
        print(f"UNEXPECTED case {r['case']} ({r['kind']} of {r['seed_model']}): {r['error']}: "
              f"{r.get('message', '')}" + (f"\n    {' | '.join(r['where'])}" if r.get("where") else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(report.records, indent=0) + "\n")
    return 1 if report.bad() else 0


if __name__ == "__main__":
    sys.exit(main())
