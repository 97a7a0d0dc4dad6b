"""C kernels with run-time dims for the recurrent ops, Pad and ConvTranspose (issue 29, item 4).

Each model is a small graph in the form exporters write it (PyTorch's LSTM / GRU / RNN export:
weights as initializers, sequence_lens and initial states absent, Y transposed and reshaped after
the node; Pad by constant pads and by pads computed from the input's shape; ConvTranspose
upsamplers with stride 2, output_padding, groups), compiled once with ranges, then run at both
range ends and an odd size against onnxruntime (rtol 1e-3, atol 1e-4). plan.json must show the
step on the C provider, not the reference.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler.driver import compile_model
from runtime import Session
from tests.support.models import ort_run

RTOL, ATOL = 1e-3, 1e-4
RNG = np.random.default_rng(20261207)
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def _rand(*shape: int, scale: float = 0.5) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _init(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(array, name)


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[str],
    inits: list[onnx.TensorProto],
    opset: int = 17,
) -> onnx.ModelProto:
    """The graph with its outputs typed as onnx's shape inference finds them (symbolic dims)."""
    graph = helper.make_graph(nodes, "dynamic", inputs, [], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
    model.graph.output.extend(inferred[o] for o in outputs)
    return model


def _providers(path: Path, op_type: str) -> list[str]:
    plan = json.loads((path / "plan.json").read_text())
    return [s["provider"] for s in plan["steps"] if s["op_type"] == op_type]


def _oracle(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime, or onnx's reference evaluator where onnxruntime has no kernel (a recurrent
    node in layout 1: "Batchwise recurrent operations (layout == 1) are not supported")."""
    if any(a.name == "layout" and a.i == 1 for n in model.graph.node for a in n.attribute):
        from onnx.reference import ReferenceEvaluator

        return list(ReferenceEvaluator(model).run(None, feeds))
    return ort_run(model, feeds)


def _check_runs(model: onnx.ModelProto, path: Path, feeds_at: list[dict[str, np.ndarray]]) -> None:
    session = Session(path)
    for feeds in feeds_at:
        got = session.run(None, feeds)
        want = _oracle(model, feeds)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape, {k: v.shape for k, v in feeds.items()}
            np.testing.assert_allclose(
                g, w, rtol=RTOL, atol=ATOL, err_msg=str({k: v.shape for k, v in feeds.items()})
            )


# -- recurrent ----------------------------------------------------------------------------------


def recurrent_export(
    op: str, size: int, hidden: int, direction: str, layout: int = 0, initial: bool = False, **attrs: Any
) -> onnx.ModelProto:
    """One recurrent node as torch.onnx exports ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN``: W, R, B
    initializers, no sequence_lens, initial states absent (or, with ``initial``, zeros of
    [dirs, batch, hidden] built from the input's shape), then Y -> [seq, batch, dirs * hidden]."""
    dirs = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    seq_dim, batch_dim = ("seq", "batch") if layout == 0 else ("batch", "seq")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq_dim, batch_dim, size])
    inits = [
        _init("W", _rand(dirs, g * hidden, size)),
        _init("R", _rand(dirs, g * hidden, hidden)),
        _init("B", _rand(dirs, 2 * g * hidden, scale=0.1)),
    ]
    nodes = []
    names = ["x", "W", "R", "B", ""]
    if initial:  # h0 = zeros(dirs, batch, hidden) from Shape(x)[1], as a traced torch.zeros
        inits += [
            _init("i_b", np.array([1 - layout], np.int64)),
            _init("dh", np.array([dirs], np.int64)),
            _init("hh", np.array([hidden], np.int64)),
        ]
        nodes += [
            helper.make_node("Shape", ["x"], ["xs"]),
            helper.make_node("Gather", ["xs", "i_b"], ["nb"], axis=0),
            helper.make_node("Concat", ["dh", "nb", "hh"], ["hs"], axis=0),
            helper.make_node(
                "ConstantOfShape", ["hs"], ["h0"], value=numpy_helper.from_array(np.zeros(1, np.float32))
            ),
        ]
        names += ["h0"] + (["h0"] if op == "LSTM" else [])
    outs = ["y", "yh"] + (["yc"] if op == "LSTM" else [])
    nodes.append(
        helper.make_node(op, names, outs, hidden_size=hidden, direction=direction, layout=layout, **attrs)
    )
    if layout == 0:
        inits.append(_init("shape", np.array([0, 0, -1], np.int64)))
        nodes += [
            helper.make_node("Transpose", ["y"], ["yt"], perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", ["yt", "shape"], ["out"]),
        ]
    else:
        nodes.append(helper.make_node("Identity", ["y"], ["out"]))
    return _model(nodes, [x], ["out", "yh"], inits, 14)


RECURRENT = [
    # op, input size, hidden, direction, layout, initial states, extra attributes
    ("LSTM", 21, 24, "bidirectional", 0, False, {}),
    ("LSTM", 13, 17, "forward", 0, True, {}),
    ("LSTM", 8, 9, "reverse", 1, True, {}),
    ("GRU", 11, 16, "bidirectional", 0, False, {"linear_before_reset": 1}),
    ("GRU", 6, 10, "forward", 0, True, {}),
    ("RNN", 5, 12, "bidirectional", 0, True, {}),
]


@pytest.mark.parametrize("case", RECURRENT, ids=lambda c: f"{c[0]}-{c[3]}-l{c[4]}{'-h0' if c[5] else ''}")
def test_recurrent_over_run_time_seq_and_batch(case: tuple[Any, ...], tmp_path: Path) -> None:
    op, size, hidden, direction, layout, initial, attrs = case
    model = recurrent_export(op, size, hidden, direction, layout, initial, **attrs)
    path = compile_model(model, tmp_path / "a", dims={"seq": (1, 40), "batch": (1, 8)})
    assert _providers(path, op) == ["c"]
    shape = (lambda s, b: (s, b, size)) if layout == 0 else (lambda s, b: (b, s, size))
    _check_runs(
        model, path, [{"x": _rand(*shape(s, b), scale=1.0)} for s, b in ((1, 1), (40, 8), (17, 3), (5, 1))]
    )


# -- Pad ----------------------------------------------------------------------------------------


def pad_model(
    dims: list[Any], pads: list[int], mode: str, dtype: Any = np.float32, value: float | None = None
) -> onnx.ModelProto:
    """Pad (opset 19) of an input of ``dims`` (names: run-time) by constant ``pads``."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    x = helper.make_tensor_value_info("x", elem, dims)
    inits = [_init("pads", np.array(pads, np.int64))]
    names = ["x", "pads"]
    if value is not None:
        inits.append(_init("value", np.array(value, dtype)))
        names.append("value")
    return _model([helper.make_node("Pad", names, ["y"], mode=mode)], [x], ["y"], inits, 19)


def pad_to_multiple_model(multiple: int) -> onnx.ModelProto:
    """torch ``F.pad(x, (0, (w + m - 1) // m * m - w))`` as traced: pads from Shape(x)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, "h", "w"])
    inits = [
        _init("i3", np.array([3], np.int64)),
        _init("m", np.array([multiple], np.int64)),
        _init("m1", np.array([multiple - 1], np.int64)),
        _init("zeros", np.zeros(7, np.int64)),
    ]
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i3"], ["w"], axis=0),
        helper.make_node("Add", ["w", "m1"], ["a"]),
        helper.make_node("Div", ["a", "m"], ["q"]),
        helper.make_node("Mul", ["q", "m"], ["r"]),
        helper.make_node("Sub", ["r", "w"], ["p"]),
        helper.make_node("Concat", ["zeros", "p"], ["pads"], axis=0),
        helper.make_node("Pad", ["x", "pads"], ["y"], mode="constant"),
    ]
    return _model(nodes, [x], ["y"], inits)


PADS = [
    # id, input dims, ranges, pads, mode, dtype
    ("oskut", [12, "n", 5], {"n": (1, 256)}, [0, 0, 0, 9, 0, 0], "constant", np.float32),
    (
        "constant",
        ["n", 3, "h", "w"],
        {"n": (1, 2), "h": (1, 20), "w": (1, 33)},
        [0, 0, 2, 1, 0, 0, 1, 3],
        "constant",
        np.float32,
    ),
    ("crop", ["n", "w"], {"n": (1, 5), "w": (4, 30)}, [1, -2, 2, 3], "constant", np.int64),
    (
        "reflect",
        ["n", 3, "h", "w"],
        {"n": (1, 2), "h": (4, 20), "w": (5, 33)},
        [0, 0, 3, 2, 0, 0, 1, 4],
        "reflect",
        np.float32,
    ),
    (
        "edge",
        ["n", 2, "h", "w"],
        {"n": (1, 2), "h": (1, 20), "w": (1, 33)},
        [0, 1, 2, 5, 0, 0, 3, 1],
        "edge",
        np.float32,
    ),
    (
        "wrap",
        ["n", "h", "w"],
        {"n": (1, 3), "h": (3, 17), "w": (4, 31)},
        [1, 2, 3, 0, 1, 2],
        "wrap",
        np.float32,
    ),
    ("wrap_crop", ["h", "w"], {"h": (6, 17), "w": (5, 31)}, [-1, 3, 2, -2], "wrap", np.float32),
]


def _sizes_at(ranges: dict[str, tuple[int, int]]) -> list[dict[str, int]]:
    """Each symbol at its low end, its high end, and an odd size between."""
    lo = {n: a for n, (a, b) in ranges.items()}
    hi = {n: b for n, (a, b) in ranges.items()}
    odd = {n: (a + b) // 2 | 1 if ((a + b) // 2 | 1) <= b else a for n, (a, b) in ranges.items()}
    return [lo, hi, odd]


def _feed(dims: list[Any], sizes: dict[str, int], dtype: Any) -> np.ndarray:
    shape = tuple(sizes[d] if isinstance(d, str) else d for d in dims)
    if np.dtype(dtype).kind == "f":
        return RNG.standard_normal(shape).astype(dtype)
    return RNG.integers(-100, 100, shape).astype(dtype)


@pytest.mark.parametrize("case", PADS, ids=[c[0] for c in PADS])
def test_pad_over_run_time_sizes(case: tuple[Any, ...], tmp_path: Path) -> None:
    _, dims, ranges, pads, mode, dtype = case
    model = pad_model(
        dims, pads, mode, dtype, value=-2.5 if mode == "constant" and dtype == np.float32 else None
    )
    path = compile_model(model, tmp_path / "a", dims=ranges)
    assert _providers(path, "Pad") == ["c"]
    _check_runs(model, path, [{"x": _feed(dims, sizes, dtype)} for sizes in _sizes_at(ranges)])


def test_pad_by_pads_computed_from_the_shape(tmp_path: Path) -> None:
    model = pad_to_multiple_model(4)
    ranges = {"n": (1, 2), "h": (1, 9), "w": (5, 70)}
    path = compile_model(model, tmp_path / "a", dims=ranges)
    assert _providers(path, "Pad") == ["c"]
    feeds = [
        {"x": _feed(["n", 3, "h", "w"], {"n": n, "h": h, "w": w}, np.float32)}
        for n, h, w in ((1, 1, 5), (2, 9, 70), (1, 3, 33), (2, 4, 64), (1, 2, 66))
    ]
    _check_runs(model, path, feeds)


# -- ConvTranspose ------------------------------------------------------------------------------


CONV_T = [
    # id, X dims, W shape, bias, attributes
    ("upsample2x", ["n", 16, "h", "w"], (16, 8, 2, 2), True, {"strides": [2, 2]}),
    ("db_head", ["n", 16, "h", "w"], (16, 1, 2, 2), False, {"strides": [2, 2]}),
    (
        "output_padding",
        ["n", 6, "h", "w"],
        (6, 3, 3, 3),
        True,
        {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]},
    ),
    ("groups", ["n", 8, "h", "w"], (8, 3, 4, 4), True, {"strides": [2, 2], "pads": [1, 1, 1, 1], "group": 4}),
    (
        "dilated_1d",
        ["n", 5, "w"],
        (5, 7, 3),
        True,
        {"strides": [3], "dilations": [2], "pads": [2, 1], "output_padding": [1]},
    ),
]


def conv_t_model(
    dims: list[Any], w_shape: tuple[int, ...], bias: bool, attrs: dict[str, Any]
) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)
    inits = [_init("w", _rand(*w_shape))]
    names = ["x", "w"]
    if bias:
        inits.append(_init("b", _rand(w_shape[1] * int(attrs.get("group", 1)))))
        names.append("b")
    return _model([helper.make_node("ConvTranspose", names, ["y"], **attrs)], [x], ["y"], inits)


@pytest.mark.parametrize("case", CONV_T, ids=[c[0] for c in CONV_T])
def test_conv_transpose_over_run_time_batch_and_sizes(case: tuple[Any, ...], tmp_path: Path) -> None:
    _, dims, w_shape, bias, attrs = case
    model = conv_t_model(dims, w_shape, bias, attrs)
    ranges = {"n": (1, 2), "h": (1, 24), "w": (1, 40)}
    ranges = {k: v for k, v in ranges.items() if k in dims}
    path = compile_model(model, tmp_path / "a", dims=ranges)
    assert _providers(path, "ConvTranspose") == ["c"]
    _check_runs(model, path, [{"x": _feed(dims, sizes, np.float32)} for sizes in _sizes_at(ranges)])


# -- elementwise over dims equal by an import assumption ------------------------------------------


def fpn_add_model() -> onnx.ModelProto:
    """A detector's FPN merge (PP-OCR det, YOLO): a stride-4 map plus a 2x-upsampled stride-8
    map, times a per-channel gate: the Add's dims are (h+3)//4 and 2*((h+7)//8), equal only at
    the sizes the model takes (multiples of 8), which the import records as an assumption."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, "h", "w"])
    conv = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    inits = [_init(f"w{k}", _rand(4, 4, 3, 3)) for k in range(3)]
    inits += [_init("scales", np.array([1, 1, 2, 2], np.float32)), _init("gate", _rand(1, 4, 1, 1))]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c2"], **conv),
             helper.make_node("Conv", ["c2", "w1"], ["c4"], **conv),
             helper.make_node("Conv", ["c4", "w2"], ["c8"], **conv),
             helper.make_node("Resize", ["c8", "", "scales"], ["up"], mode="nearest"),
             helper.make_node("Mul", ["c4", "gate"], ["g"]),
             helper.make_node("Add", ["g", "up"], ["s"]),
             helper.make_node("Add", ["s", "c4"], ["y"])]  # fmt: skip
    return _model(nodes, [x], ["y"], inits)


def test_elementwise_over_dims_equal_by_an_assumption(tmp_path: Path) -> None:
    model = fpn_add_model()
    path = compile_model(model, tmp_path / "a", dims={"h": (32, 96), "w": (32, 96)}, opt_level=2)
    plan = json.loads((path / "plan.json").read_text())
    assert plan["assumptions"], "the import records the FPN Add's dims as an assumption"
    steps = [s for s in plan["steps"] if s["op_type"] in ("Add", "Mul", "FusedElementwise")]
    assert steps and {s["provider"] for s in steps} == {"c"}, [(s["op_type"], s["provider"]) for s in steps]
    _check_runs(model, path, [{"x": _rand(1, 4, h, w, scale=1.0)} for h, w in ((32, 32), (96, 96), (40, 88))])


# -- Slice of a whole run-time axis, QuantizeLinear / DequantizeLinear, window sizes ----------------


def test_slice_of_a_whole_run_time_axis_and_quantize_pairs_run_on_c(tmp_path: Path) -> None:
    """jax2tf's ``x[:n]`` with n = Shape(x)[0] next to a static-axis slice (Magika, Silero's STFT),
    then a per-tensor QuantizeLinear / DequantizeLinear pair (a statically quantized export)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 12, "w"])
    inits = [_init("zero", np.array([0], np.int64)), _init("one", np.array([1], np.int64)),
             _init("two", np.array([2], np.int64)), _init("ten", np.array([10], np.int64)),
             _init("scale", np.array(0.05, np.float32)), _init("zp", np.array(128, np.uint8))]  # fmt: skip
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Gather", ["s", "two"], ["w"], axis=0),
             helper.make_node("Concat", ["n", "ten", "w"], ["ends"], axis=0),
             helper.make_node("Concat", ["zero", "one", "zero"], ["starts"], axis=0),
             helper.make_node("Slice", ["x", "starts", "ends"], ["sl"]),
             helper.make_node("QuantizeLinear", ["sl", "scale", "zp"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "scale", "zp"], ["y"])]  # fmt: skip
    model = _model(nodes, [x], ["y"], inits)
    path = compile_model(model, tmp_path / "a", dims={"n": (1, 16), "w": (1, 40)})
    for op in ("Slice", "QuantizeLinear", "DequantizeLinear"):
        assert _providers(path, op) == ["c"], op
    _check_runs(model, path, [{"x": _rand(n, 12, w, scale=3.0)} for n, w in ((1, 1), (16, 40), (7, 23))])


def test_window_sizes_equal_over_the_ranges() -> None:
    """A conv's output size the import fitted in another form than the conv rule, equal at every
    size in range (Silero VAD's STFT: ``sequence//64-5`` for ``(sequence-192)//128+1``), or a
    size the ranges make constant, is the rule's; a form equal only over part of a range is not."""
    from compiler.ir.graph import Graph
    from compiler.ir.graph import Node as IrNode
    from compiler.providers.geometry import same_over_ranges
    from runtime.symbolic import floordiv
    from runtime.symbolic import sym

    graph = Graph("g")
    s = sym("sequence")
    node = IrNode("Conv", [], [], {}, name="c")
    node.graph = graph
    graph.symbols = {"sequence": (512, 576)}
    assert same_over_ranges(floordiv(s, 64) - 5, floordiv(s - 192, 128) + 1, node)
    assert same_over_ranges(floordiv(floordiv(s, 64) - 6, 2) + 1, 2, node)
    graph.symbols = {"sequence": (512, 700)}
    assert not same_over_ranges(floordiv(s, 64) - 5, floordiv(s - 192, 128) + 1, node)
