"""The reference kernels (runtime/kernels) against onnxruntime, op by op.

Each case builds the single-node ONNX model in its ONNX form (shape-determining inputs as
initializers, ONNX attribute spellings), runs it with onnxruntime's CPU provider, and runs our
kernel on the same seeded inputs with the canonical attributes of docs/ops.md. Tolerances:
float32 rtol 1e-4 / atol 1e-5; integer and bool results must match exactly. Every case also
checks that the kernel left its inputs untouched. The fused onnx_aot ops are checked against
compositions of the plain kernels.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from dataclasses import field
from typing import Any

import numpy as np
import onnxruntime
import pytest
from onnx import helper
from onnx import numpy_helper

from runtime.errors import RuntimeKernelError
from runtime.errors import UnsupportedOpError
from runtime.kernels import REGISTRY
from runtime.kernels import get_kernel
from runtime.kernels import supported_kinds
from runtime.kernels.elementwise import ELEMENTWISE_BINARY
from runtime.kernels.elementwise import ELEMENTWISE_OPS
from runtime.kernels.elementwise import ELEMENTWISE_UNARY
from runtime.kernels.elementwise import apply_elementwise
from runtime.kernels.elementwise import erf

RTOL, ATOL = 1e-4, 1e-5
INF = float("inf")


class Const:
    """An input ONNX takes as a tensor but the canonical form holds as an attribute."""

    def __init__(self, value: Any, dtype: Any = np.int64) -> None:
        self.value = np.asarray(value, dtype=dtype)


@dataclass
class Case:
    op: str
    inputs: list[Any]  # arrays (fed to both sides), Const (ONNX only) or None (omitted)
    attrs: dict[str, Any]  # canonical attributes, for our kernel
    onnx_attrs: dict[str, Any] = field(default_factory=dict)
    opset: int = 17
    n_outputs: int = 1


def rng_for(name: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(name.encode()))


def rand(rng: np.random.Generator, *shape: int, low: float = -2.0, high: float = 2.0) -> Any:
    return rng.uniform(low, high, size=shape).astype(np.float32)


def run_onnxruntime(case: Case) -> list[np.ndarray]:
    names, feeds, inits, graph_inputs = [], {}, [], []
    for i, value in enumerate(case.inputs):
        name = "" if value is None else f"in{i}"
        names.append(name)
        if isinstance(value, Const):
            inits.append(numpy_helper.from_array(value.value, name))
        elif value is not None:
            feeds[name] = value
            elem = helper.np_dtype_to_tensor_dtype(value.dtype)
            graph_inputs.append(helper.make_tensor_value_info(name, elem, value.shape))
    outs = [f"out{k}" for k in range(case.n_outputs)]
    node = helper.make_node(case.op, names, outs, **case.onnx_attrs)
    graph = helper.make_graph(
        [node], "g", graph_inputs, [helper.make_empty_tensor_value_info(o) for o in outs], inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset)])
    model.ir_version = 10
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def kernel_inputs(case: Case) -> list[Any]:
    inputs = [v for v in case.inputs if not isinstance(v, Const)]
    while inputs and inputs[-1] is None:  # trailing omitted inputs are dropped
        inputs.pop()
    return inputs


def assert_matches(got: list[Any], expected: list[np.ndarray]) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == e.dtype and g.shape == e.shape, (g.dtype, g.shape, e.dtype, e.shape)
        if e.dtype.kind == "f":
            np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL)
        else:
            np.testing.assert_array_equal(g, e)


def run_kernel(op: str, inputs: list[Any], attrs: dict[str, Any], like: list[np.ndarray]) -> list:
    outputs = [(tuple(e.shape), e.dtype) for e in like]
    return get_kernel(op)(np, inputs, attrs, outputs)


def check(case: Case) -> None:
    expected = run_onnxruntime(case)
    inputs = kernel_inputs(case)
    before = [None if v is None else v.copy() for v in inputs]
    got = run_kernel(case.op, inputs, case.attrs, expected)
    assert_matches(got, expected)
    for b, v in zip(before, inputs, strict=True):
        assert b is None or np.array_equal(b, v), "the kernel modified an input"


SHAPES = [(3, 5), (2, 3, 7, 1)]
UNARY_RANGES = {
    "Log": (0.05, 5.0), "Sqrt": (0.0, 5.0), "Reciprocal": (0.5, 3.0), "Erf": (-4.0, 4.0),
    "Sigmoid": (-30.0, 30.0), "Softplus": (-30.0, 30.0), "Exp": (-5.0, 5.0),
}  # fmt: skip
UNARY_ATTRS: dict[str, tuple[dict[str, Any], dict[str, Any], int]] = {
    # op: (canonical attrs, ONNX attrs, opset)
    "LeakyRelu": ({"alpha": 0.1}, {"alpha": 0.1}, 17),
    "Elu": ({"alpha": 0.7}, {"alpha": 0.7}, 17),
    "HardSigmoid": ({"alpha": 0.3, "beta": 0.4}, {"alpha": 0.3, "beta": 0.4}, 17),
}


def unary_cases() -> list[Any]:
    cases = []
    for op in sorted(ELEMENTWISE_UNARY - {"Clip", "Gelu", "Not"}):
        attrs, onnx_attrs, opset = UNARY_ATTRS.get(op, ({}, {}, 17))
        for shape in SHAPES:
            low, high = UNARY_RANGES.get(op, (-3.0, 3.0))
            x = rand(rng_for(f"{op}{shape}"), *shape, low=low, high=high)
            cases.append(pytest.param(Case(op, [x], attrs, onnx_attrs, opset), id=f"{op}-{shape}"))
    for approximate in ("none", "tanh"):
        for shape in SHAPES:
            x = rand(rng_for(f"gelu{shape}"), *shape, low=-5, high=5)
            at = {"approximate": approximate}
            cases.append(pytest.param(Case("Gelu", [x], at, at, 20), id=f"Gelu-{approximate}-{shape}"))
    for shape in SHAPES:
        x = rng_for(f"not{shape}").random(shape) > 0.5
        cases.append(pytest.param(Case("Not", [x], {}), id=f"Not-{shape}"))
        x = rand(rng_for(f"clip{shape}"), *shape)
        bounds = [
            ([Const(-0.5, np.float32), Const(0.7, np.float32)], -0.5, 0.7),
            ([None, Const(0.3, np.float32)], -INF, 0.3),
            ([Const(0.1, np.float32)], 0.1, INF),
            ([], -INF, INF),
        ]
        for extra, lo, hi in bounds:
            case = Case("Clip", [x, *extra], {"min": lo, "max": hi}, opset=13)
            cases.append(pytest.param(case, id=f"Clip-{lo}-{hi}-{shape}"))
    return cases


BINARY_SHAPES = [((3, 5), (5,)), ((2, 1, 7), (4, 1))]


def binary_cases() -> list[Any]:
    cases = []
    for op in sorted(ELEMENTWISE_BINARY | {"Where"}):
        for shape_a, shape_b in BINARY_SHAPES:
            rng = rng_for(f"{op}{shape_a}")
            a, b = rand(rng, *shape_a), rand(rng, *shape_b)
            if op == "Pow":
                a = np.abs(a) + 0.1
            elif op == "Div":
                b = np.where(np.abs(b) < 0.1, 0.5, b).astype(np.float32)
            elif op in ("Equal", "Less", "Greater"):
                a, b = np.round(a), np.round(b)
            elif op in ("And", "Or"):
                a, b = a > 0, b > 0
            inputs = [a, b]
            if op in ("Sum", "Max", "Min", "Mean"):
                inputs.append(rand(rng, *shape_b[1:]))
            elif op == "Where":
                inputs = [rng.random(shape_a) > 0.5, a, b]
            cases.append(pytest.param(Case(op, inputs, {}), id=f"{op}-{shape_a}-{shape_b}"))
    rng = rng_for("intdiv")
    a = rng.integers(-20, 20, size=(4, 6)).astype(np.int32)
    b = rng.choice(np.array([-7, -3, -2, 2, 3, 5], dtype=np.int32), size=(6,))
    cases.append(pytest.param(Case("Div", [a, b], {}), id="Div-int32"))
    cases.append(pytest.param(Case("Equal", [a, b], {}), id="Equal-int32"))
    one = rand(rng, 3, 4)
    cases.append(pytest.param(Case("Sum", [one], {}), id="Sum-one-input"))
    return cases


def conv_case(
    name: str, x: tuple, w: tuple, *, bias: bool = True, strides=None, pads=None, dilations=None,
    group: int = 1,
) -> Any:  # fmt: skip
    rng = rng_for(name)
    nd = len(x) - 2
    attrs = {
        "kernel_shape": list(w[2:]),
        "strides": strides or [1] * nd,
        "pads": pads or [0] * (2 * nd),
        "dilations": dilations or [1] * nd,
        "group": group,
    }
    inputs = [rand(rng, *x), rand(rng, *w)] + ([rand(rng, w[0])] if bias else [])
    return pytest.param(Case("Conv", inputs, attrs, dict(attrs)), id=name)


CONV_CASES = [
    conv_case("basic", (1, 3, 7, 9), (4, 3, 3, 3), pads=[1, 1, 1, 1]),
    conv_case("group2-asym-stride2", (2, 4, 9, 8), (6, 2, 3, 2), strides=[2, 2],
              pads=[0, 1, 2, 1], group=2),
    conv_case("dilation2", (1, 3, 11, 10), (5, 3, 3, 3), dilations=[2, 2], pads=[2, 2, 2, 2]),
    conv_case("dilation-stride-mix", (1, 2, 13, 12), (3, 2, 3, 2), strides=[2, 3],
              dilations=[2, 1], pads=[1, 0, 0, 2]),
    conv_case("depthwise", (1, 6, 8, 8), (6, 1, 3, 3), strides=[2, 2], pads=[1, 1, 1, 1],
              group=6),
    conv_case("pointwise-nobias", (1, 8, 5, 5), (4, 8, 1, 1), bias=False),
    conv_case("stem-7x7", (1, 3, 23, 23), (8, 3, 7, 7), strides=[2, 2], pads=[3, 3, 3, 3]),
    conv_case("1d", (2, 3, 13), (4, 3, 3), strides=[2], pads=[1, 0]),
    conv_case("3d", (1, 2, 5, 6, 7), (3, 2, 3, 3, 3), pads=[1, 1, 1, 1, 1, 1]),
]  # fmt: skip


def pool_case(op: str, name: str, x: tuple, **attrs: Any) -> Any:
    nd = len(x) - 2
    attrs.setdefault("strides", [1] * nd)
    attrs.setdefault("pads", [0] * (2 * nd))
    attrs.setdefault("ceil_mode", 0)
    if op == "MaxPool":
        attrs.setdefault("dilations", [1] * nd)
    else:
        attrs.setdefault("count_include_pad", 0)
    x_value = rand(rng_for(name), *x)
    return pytest.param(Case(op, [x_value], attrs, dict(attrs), opset=19), id=f"{op}-{name}")


POOL_CASES = [
    pool_case("MaxPool", "k3s2p1", (1, 3, 9, 10), kernel_shape=[3, 3], strides=[2, 2],
              pads=[1, 1, 1, 1]),
    pool_case("MaxPool", "ceil", (1, 2, 8, 11), kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
    pool_case("MaxPool", "ceil-pads", (2, 2, 7, 6), kernel_shape=[2, 3], strides=[2, 2],
              pads=[1, 0, 1, 1], ceil_mode=1),
    pool_case("MaxPool", "dilation2", (1, 2, 9, 8), kernel_shape=[2, 2], dilations=[2, 2],
              strides=[1, 2], ceil_mode=1),
    pool_case("MaxPool", "1d", (2, 3, 11), kernel_shape=[3], strides=[2], pads=[1, 1]),
    pool_case("AveragePool", "exclude-pad", (1, 3, 9, 10), kernel_shape=[3, 3], strides=[2, 2],
              pads=[1, 1, 1, 1]),
    pool_case("AveragePool", "include-pad", (1, 3, 9, 10), kernel_shape=[3, 3], strides=[2, 2],
              pads=[1, 1, 1, 1], count_include_pad=1),
    pool_case("AveragePool", "ceil-exclude", (1, 2, 8, 11), kernel_shape=[3, 3],
              strides=[2, 2], ceil_mode=1),
    pool_case("AveragePool", "ceil-include", (2, 2, 8, 7), kernel_shape=[3, 2], strides=[2, 2],
              pads=[1, 0, 0, 1], ceil_mode=1, count_include_pad=1),
    pool_case("AveragePool", "1d", (2, 3, 11), kernel_shape=[4], strides=[3], pads=[2, 1]),
    pool_case("AveragePool", "3d", (1, 2, 5, 6, 7), kernel_shape=[2, 3, 2], strides=[2, 2, 2],
              pads=[0, 1, 1, 1, 0, 0], ceil_mode=1),
]  # fmt: skip


@pytest.mark.parametrize("case", unary_cases() + binary_cases())
def test_elementwise(case: Case) -> None:
    check(case)


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv(case: Case) -> None:
    check(case)


@pytest.mark.parametrize("case", POOL_CASES)
def test_pool(case: Case) -> None:
    check(case)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(1, 3, 7, 5), (2, 4, 3, 2, 5)])
def test_global_pool(op: str, shape: tuple) -> None:
    check(Case(op, [rand(rng_for(op), *shape)], {}))


def test_erf_accuracy() -> None:
    z = np.linspace(-6.0, 6.0, 24001)
    want = np.array([math.erf(v) for v in z])
    assert np.max(np.abs(erf(np, z) - want)) < 2e-8


def nn_cases() -> list[Any]:
    rng = rng_for("nn")
    cases = []
    for shape in [(2, 3, 5, 4), (1, 5, 7)]:
        c = shape[1]
        bn = [rand(rng, *shape), rand(rng, c), rand(rng, c), rand(rng, c), rand(rng, c, low=0.1)]
        attrs = {"epsilon": 1e-3}
        cases.append(pytest.param(Case("BatchNormalization", bn, attrs, attrs), id=f"BN-{shape}"))
    for size, shape in [(3, (1, 5, 4, 4)), (5, (2, 7, 3, 5)), (1, (1, 3, 2, 2))]:  # odd: ORT
        attrs = {"alpha": 1e-3 * size, "beta": 0.75, "bias": 1.5, "size": size}
        x = rand(rng, *shape, low=-4, high=4)
        cases.append(pytest.param(Case("LRN", [x], attrs, attrs), id=f"LRN-{size}"))
    for op in ("Softmax", "LogSoftmax"):
        for shape, axis in [((3, 7), 1), ((2, 3, 5, 4), 2), ((2, 9), 0)]:
            x = rand(rng, *shape) * 40  # large values: a naive exp would overflow
            onnx_axis = axis - len(shape) if axis else axis
            case = Case(op, [x], {"axis": axis}, {"axis": onnx_axis}, opset=13)
            cases.append(pytest.param(case, id=f"{op}-{shape}-{axis}"))
    ln = [((2, 3, 8), -1, 2, True, 1), ((2, 5, 3), 1, 1, False, 3)]
    for shape, onnx_axis, axis, bias, n_outputs in ln:
        norm = shape[axis:]
        inputs = [rand(rng, *shape), rand(rng, *norm)] + ([rand(rng, *norm)] if bias else [])
        case = Case(
            "LayerNormalization", inputs, {"axis": axis, "epsilon": 1e-5},
            {"axis": onnx_axis, "epsilon": 1e-5}, n_outputs=n_outputs,
        )  # fmt: skip
        cases.append(pytest.param(case, id=f"LayerNorm-{shape}-{n_outputs}"))
    gemm = [
        ((3, 5), (5, 4), (4,), 0, 0, 1.0, 1.0),
        ((5, 3), (5, 7), (3, 1), 1, 0, 0.5, 2.0),
        ((3, 5), (4, 5), (), 0, 1, 1.5, -1.0),
        ((6, 3), (7, 6), None, 1, 1, 1.0, 1.0),
    ]
    for a, b, c, ta, tb, alpha, beta in gemm:
        attrs = {"alpha": alpha, "beta": beta, "transA": ta, "transB": tb}
        inputs = [rand(rng, *a), rand(rng, *b)] + ([] if c is None else [rand(rng, *c)])
        case = Case("Gemm", inputs, attrs, attrs)
        cases.append(pytest.param(case, id=f"Gemm-tA{ta}-tB{tb}-{c}"))
    for a, b in [((3, 5), (5, 7)), ((2, 1, 3, 4), (3, 4, 5)), ((5,), (5, 3)), ((4, 3, 6), (6,))]:
        case = Case("MatMul", [rand(rng, *a), rand(rng, *b)], {})
        cases.append(pytest.param(case, id=f"MatMul-{a}-{b}"))
    return cases


@pytest.mark.parametrize("case", nn_cases())
def test_nn(case: Case) -> None:
    check(case)


def canonical_slice(shape: tuple, starts: list, ends: list, axes: list, steps: list) -> dict:
    """What the frontend does to Slice's inputs: normalize axes, clamp as ONNX defines it."""
    out: dict[str, list[int]] = {"starts": [], "ends": [], "axes": [], "steps": []}
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        axis %= len(shape)
        dim = shape[axis]
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        low, high = (0, dim) if step > 0 else (-1, dim - 1)
        out["starts"].append(min(max(start, 0), high))
        out["ends"].append(min(max(end, low), high))
        out["axes"].append(axis)
        out["steps"].append(step)
    return out


def tensor_cases() -> list[Any]:
    rng = rng_for("tensor")
    cases = []

    def add(name: str, case: Case) -> None:
        cases.append(pytest.param(case, id=name))

    x, x4 = rand(rng, 2, 3, 5), rand(rng, 3, 1, 4, 7)
    add("Reshape-neg", Case("Reshape", [x, Const([0, -1])], {"shape": [2, 15]}, opset=14))
    add("Reshape-4d", Case("Reshape", [x4, Const([7, 1, 3, 4])], {"shape": [7, 1, 3, 4]}))
    add("Identity-3d", Case("Identity", [x], {}))
    add("Identity-4d", Case("Identity", [x4], {}))
    parts = [rand(rng, 2, k, 3) for k in (1, 4, 2)]
    add("Concat-1", Case("Concat", parts, {"axis": 1}, {"axis": -2}))
    add("Concat-0", Case("Concat", [x, rand(rng, 1, 3, 5)], {"axis": 0}, {"axis": 0}))
    for value, perm in ((x, [2, 0, 1]), (x4, [0, 3, 1, 2])):
        add(f"Transpose-{perm}", Case("Transpose", [value], {"perm": perm}, {"perm": perm}))
    idx = np.array([[0, -1], [2, 1]], dtype=np.int64)
    add("Gather-0", Case("Gather", [rand(rng, 3, 4), idx], {"axis": 0}, {"axis": 0}))
    idx1 = np.array([4, -5, 0], dtype=np.int32)
    add("Gather-neg-axis", Case("Gather", [x, idx1], {"axis": 2}, {"axis": -1}))
    big = np.iinfo(np.int64).max
    slices = [
        ((5, 7), [1, -3], [big, -1], [0, 1], [1, 1]),
        ((5, 7), [-1, 5], [-big, 0], [0, -1], [-1, -2]),
        ((4, 6, 9), [1, 8], [3, 1], [-3, 2], [1, -3]),
        ((4, 6, 9), [0], [100], [1], [4]),
    ]
    for shape, starts, ends, axes, steps in slices:
        inputs = [rand(rng, *shape), Const(starts), Const(ends), Const(axes), Const(steps)]
        attrs = canonical_slice(shape, starts, ends, axes, steps)
        add(f"Slice-{shape}-{steps}", Case("Slice", inputs, attrs, opset=13))
    for shape, split in (((3, 5), [2, 3]), ((7, 2, 3), [1, 4, 2])):
        y = rand(rng, *shape)
        axis = 0 if len(shape) == 3 else 1
        case = Case("Split", [y, Const(split)], {"axis": axis, "split": split},
                    {"axis": axis - len(shape)}, opset=13, n_outputs=len(split))  # fmt: skip
        add(f"Split-{split}", case)
    for mode, pads, shape in [
        ("constant", [1, 0, 2, 2, 1, 0], (2, 3, 4)),
        ("constant", [0, -1, 1, 0, 2, -1], (3, 5, 4)),
        ("reflect", [1, 2, 2, 1], (4, 5)),
        ("edge", [0, 3, 2, 1], (3, 3)),
    ]:
        inputs = [rand(rng, *shape), Const(pads), Const(1.5, np.float32)]
        attrs = {"pads": pads, "mode": mode, "value": 1.5 if mode == "constant" else 0.0}
        add(f"Pad-{mode}-{pads}", Case("Pad", inputs, attrs, {"mode": mode}, opset=13))
    wrap = {"pads": [1, 2, 0, 2], "mode": "wrap", "value": 0.0}
    add("Pad-wrap", Case("Pad", [rand(rng, 3, 4), Const(wrap["pads"])], wrap, {"mode": "wrap"}, opset=19))
    xf = (rand(rng, 3, 7) * 5).astype(np.float32)
    for to, onnx_to in [("int32", 6), ("bool", 9), ("float64", 11)]:
        add(f"Cast-{to}", Case("Cast", [xf], {"to": to}, {"to": onnx_to}))
    xi = rng.integers(-9, 9, size=(2, 5)).astype(np.int64)
    add("Cast-int-float", Case("Cast", [xi], {"to": "float32"}, {"to": 1}))
    for shape, target, out in [((3, 1), [2, 3, 4], [2, 3, 4]), ((1, 5), [3, 1], [3, 5])]:
        case = Case("Expand", [rand(rng, *shape), Const(target)], {"shape": out})
        add(f"Expand-{shape}", case)
    for value, repeats in ((x, [2, 1, 3]), (x4, [1, 3, 1, 2])):
        add(f"Tile-{repeats}", Case("Tile", [value, Const(repeats)], {"repeats": repeats}))
    add("Shape-all", Case("Shape", [x], {"start": 0, "end": 3}, opset=15))
    add("Shape-slice", Case("Shape", [x], {"start": 1, "end": 2}, {"start": -2, "end": -1}, 15))
    for shape, value, onnx_type, dtype in [([2, 3], 0.5, 1, "float32"), ([4], 7, 7, "int64")]:
        tensor = helper.make_tensor("value", onnx_type, [1], [value])
        attrs = {"shape": shape, "value": value, "dtype": dtype}
        add(f"ConstantOfShape-{dtype}", Case(
            "ConstantOfShape", [Const(shape)], attrs, {"value": tensor}
        ))  # fmt: skip
    for start, limit, delta, dtype in [(1, 10, 3, np.int64), (0.5, -2.0, -0.7, np.float32)]:
        inputs = [np.array(v, dtype=dtype) for v in (start, limit, delta)]
        add(f"Range-{dtype.__name__}", Case("Range", inputs, {}, opset=11))
    return cases


@pytest.mark.parametrize("case", tensor_cases())
def test_tensor(case: Case) -> None:
    check(case)


REDUCE_OPS = ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2"]


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize(
    ("shape", "onnx_axes", "axes", "keepdims"),
    [((3, 5, 4), [-1], [2], 1), ((2, 3, 5, 7), [0, 2], [0, 2], 0), ((3, 5), None, [0, 1], 0)],
)
def test_reduce(op: str, shape: tuple, onnx_axes: Any, axes: list, keepdims: int) -> None:
    x = rand(rng_for(op), *shape, low=0.5, high=1.5)
    inputs = [x] if onnx_axes is None else [x, Const(onnx_axes)]
    attrs = {"axes": axes, "keepdims": keepdims}
    check(Case(op, inputs, attrs, {"keepdims": keepdims}, opset=18))


def test_reduce_empty_axes_is_noop() -> None:
    x = rand(rng_for("noop"), 3, 4)
    (y,) = get_kernel("ReduceSum")(np, [x], {"axes": [], "keepdims": 1}, [((3, 4), x.dtype)])
    np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize(("size", "shape"), [(4, (2, 7, 3, 5)), (2, (1, 4, 3, 3))])
def test_lrn_even_size_follows_the_onnx_formula(size: int, shape: tuple) -> None:
    # onnxruntime rejects even sizes; the ONNX definition, written out as a loop, is the oracle.
    x = rand(rng_for(f"lrn{size}"), *shape, low=-4, high=4)
    attrs = {"alpha": 0.01, "beta": 0.6, "bias": 2.0, "size": size}
    want = np.empty_like(x)
    for c in range(shape[1]):
        lo, hi = max(0, c - (size - 1) // 2), min(shape[1] - 1, c + math.ceil((size - 1) / 2))
        square_sum = np.sum(x[:, lo : hi + 1].astype(np.float64) ** 2, axis=1)
        want[:, c] = x[:, c] / (2.0 + 0.01 / size * square_sum) ** 0.6
    (got,) = get_kernel("LRN")(np, [x], attrs, [(shape, x.dtype)])
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


ACTIVATIONS = [
    ("", -INF, INF, 0.0, None),
    ("Relu", -INF, INF, 0.0, ("Relu", {})),
    ("Clip", 0.0, 6.0, 0.0, ("Clip", {"min": 0.0, "max": 6.0})),
    ("LeakyRelu", -INF, INF, 0.2, ("LeakyRelu", {"alpha": 0.2})),
]


def plain(op: str, inputs: list[Any], attrs: dict[str, Any], like: Any) -> Any:
    return get_kernel(op)(np, inputs, attrs, [(like.shape, like.dtype)])[0]


@pytest.mark.parametrize(("activation", "lo", "hi", "alpha", "plain_act"), ACTIVATIONS)
@pytest.mark.parametrize(("bias", "residual"), [(True, False), (True, True), (False, True)])
def test_fused_conv_is_conv_add_activation(
    activation: str, lo: float, hi: float, alpha: float, plain_act: Any, bias: bool, residual: bool
) -> None:
    rng = rng_for(f"fconv{activation}{residual}")
    x, w = rand(rng, 1, 4, 9, 7), rand(rng, 6, 2, 3, 3)
    b = rand(rng, 6) if bias else None  # FusedConv(X, W, None, Z): B omitted, Z present
    conv_attrs = {"kernel_shape": [3, 3], "strides": [2, 1], "pads": [1, 0, 1, 2],
                  "dilations": [1, 1], "group": 2}  # fmt: skip
    out = np.empty((1, 6, 5, 7), np.float32)
    want = plain("Conv", [x, w] + ([b] if bias else []), conv_attrs, out)
    inputs = [x, w, b]
    if residual:
        z = rand(rng, *out.shape) * 3
        want = plain("Add", [want, z], {}, out)
        inputs.append(z)
    if plain_act is not None:
        want = plain(plain_act[0], [want], plain_act[1], out)
    attrs = {**conv_attrs, "activation": activation, "act_min": lo, "act_max": hi,
             "act_alpha": alpha}  # fmt: skip
    got = plain("onnx_aot.FusedConv", inputs, attrs, out)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(("activation", "lo", "hi", "alpha", "plain_act"), ACTIVATIONS)
def test_fused_gemm_is_gemm_activation(
    activation: str, lo: float, hi: float, alpha: float, plain_act: Any
) -> None:
    rng = rng_for(f"fgemm{activation}")
    a, b, c = rand(rng, 3, 7), rand(rng, 5, 7), rand(rng, 5)
    gemm_attrs = {"alpha": 0.5, "beta": 1.0, "transA": 0, "transB": 1}
    out = np.empty((3, 5), np.float32)
    want = plain("Gemm", [a, b, c], gemm_attrs, out)
    if plain_act is not None:
        want = plain(plain_act[0], [want], plain_act[1], out)
    attrs = {**gemm_attrs, "activation": activation, "act_min": lo, "act_max": hi,
             "act_alpha": alpha}  # fmt: skip
    got = plain("onnx_aot.FusedGemm", [a, b, c], attrs, out)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_fused_elementwise_runs_its_program() -> None:
    rng = rng_for("program")
    x0, x1, x2 = rand(rng, 2, 3, 5), rand(rng, 5), rand(rng, 3, 1)
    program = [
        {"op": "Add", "args": ["i0", "i1"], "attrs": {}},
        {"op": "Mul", "args": ["t0", "i2"], "attrs": {}},
        {"op": "Clip", "args": ["t1"], "attrs": {"min": -1.0, "max": 1.5}},
        {"op": "Gelu", "args": ["t2"], "attrs": {"approximate": "none"}},
        {"op": "Max", "args": ["t3", "i1", "t0"], "attrs": {}},
        {"op": "Greater", "args": ["t4", "t3"], "attrs": {}},
        {"op": "Where", "args": ["t5", "t2", "i0"], "attrs": {}},
    ]
    out = np.empty((2, 3, 5), np.float32)
    t0 = plain("Add", [x0, x1], {}, out)
    t1 = plain("Mul", [t0, x2], {}, out)
    t2 = plain("Clip", [t1], {"min": -1.0, "max": 1.5}, out)
    t3 = plain("Gelu", [t2], {"approximate": "none"}, out)
    t4 = plain("Max", [t3, x1, t0], {}, out)
    t5 = plain("Greater", [t4, t3], {}, out.astype(bool))
    want = plain("Where", [t5, t2, x0], {}, out)
    got = plain("onnx_aot.FusedElementwise", [x0, x1, x2], {"program": program}, out)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("ref", ["i3", "t0", "x0", "t", 0])
def test_fused_elementwise_bad_reference(ref: Any) -> None:
    program = [{"op": "Neg", "args": [ref], "attrs": {}}]
    x = np.ones((2,), np.float32)
    with pytest.raises(RuntimeKernelError, match="reference"):
        plain("onnx_aot.FusedElementwise", [x], {"program": program}, x)


def test_elementwise_table_is_registered() -> None:
    assert ELEMENTWISE_OPS <= supported_kinds()
    assert "Where" in ELEMENTWISE_OPS and "Relu" in ELEMENTWISE_UNARY
    with pytest.raises(UnsupportedOpError, match="Frobnicate"):
        apply_elementwise(np, "Frobnicate", [np.ones(2)], {})
    with pytest.raises(RuntimeKernelError, match="Add"):
        apply_elementwise(np, "Add", [np.ones(2)], {})


def test_unknown_fused_activation_is_named() -> None:
    x = np.ones((1, 1), np.float32)
    attrs = {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0, "activation": "Swish",
             "act_min": -INF, "act_max": INF, "act_alpha": 0.0}  # fmt: skip
    with pytest.raises(UnsupportedOpError, match="Swish"):
        plain("onnx_aot.FusedGemm", [x, x], attrs, x)


DOCUMENTED_KINDS = """
Conv Gemm MatMul MaxPool AveragePool GlobalAveragePool GlobalMaxPool BatchNormalization LRN
Softmax LogSoftmax Concat Transpose Reshape Identity Relu Sigmoid Tanh Exp Log Neg Abs Sqrt
Reciprocal Erf Floor Ceil Softplus Sign Sin Cos Not Clip LeakyRelu Elu HardSigmoid Gelu Add Sub
Mul Div Pow Max Min Sum Mean Equal Less Greater And Or Where ConstantOfShape Cast Gather Slice
Split Pad ReduceMean ReduceSum ReduceMax ReduceMin ReduceProd ReduceL2 LayerNormalization Shape
Expand Tile Range onnx_aot.FusedConv onnx_aot.FusedGemm onnx_aot.FusedElementwise onnx_aot.Copy
""".split()


def test_registry_covers_docs_ops() -> None:
    assert set(DOCUMENTED_KINDS) <= supported_kinds()
    assert supported_kinds() == frozenset(REGISTRY)


def test_every_kernel_module_is_listed() -> None:
    # The registry is filled by importing the modules of KERNEL_MODULES (a list, not a scan): a
    # module left out of it would silently register nothing.
    import pathlib

    import runtime.kernels

    files = {p.stem for p in pathlib.Path(runtime.kernels.__file__).parent.glob("*.py")} - {"__init__"}
    listed = [m.__name__.rpartition(".")[2] for m in runtime.kernels.KERNEL_MODULES]
    support = set(runtime.kernels.SUPPORT_MODULES)
    assert len(listed) == len(set(listed))
    assert not set(listed) & support
    assert files == set(listed) | support, (
        "a module of runtime/kernels is in neither KERNEL_MODULES nor SUPPORT_MODULES "
        f"(or a listed one is missing): {sorted(files ^ (set(listed) | support))}"
    )
    owners = {kernel.__module__ for kernel in REGISTRY.values()}
    assert owners == {m.__name__ for m in runtime.kernels.KERNEL_MODULES}, "a kernel module registers nothing"


def test_get_kernel_names_the_unknown_kind() -> None:
    with pytest.raises(UnsupportedOpError, match="NonMaxSuppression"):
        get_kernel("NonMaxSuppression")
    with pytest.raises(UnsupportedOpError, match="onnx_aot.Bogus"):
        get_kernel("onnx_aot.Bogus")


def test_copy_returns_fresh_memory() -> None:
    x = rand(rng_for("copy"), 3, 4)
    y = plain("onnx_aot.Copy", [x], {}, x)
    assert not np.shares_memory(x, y)
    np.testing.assert_array_equal(x, y)


def test_result_shape_mismatch_is_loud() -> None:
    x = np.ones((2, 3), np.float32)
    with pytest.raises(RuntimeKernelError, match="Relu"):
        get_kernel("Relu")(np, [x], {}, [((3, 2), np.float32)])


def test_kernels_import_numpy_only() -> None:
    # runtime/ must load without the compiler-side packages (ARCHITECTURE.md).
    import ast
    import pathlib

    import runtime.kernels

    banned = {"onnx", "onnxruntime", "scipy", "networkx", "jinja2", "compiler"}
    for path in pathlib.Path(runtime.kernels.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            assert not {n.split(".")[0] for n in names} & banned, (path.name, names)
