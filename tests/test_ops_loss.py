"""Losses, normalizations and pooling extras beyond the ONNX node suite.

NegativeLogLikelihoodLoss / SoftmaxCrossEntropyLoss, BatchNormalization in training mode,
Group / Instance / LayerNormalization statistics, MaxPool's Indices, LpPool and MaxUnpool: each
model is run through ``compiler.backend`` and checked against numpy loops written from the ONNX
spec; canonical forms are checked on the imported IR, and the C provider's claims on the plan.
"""

from __future__ import annotations

import itertools
import json
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from compiler.driver import compile_model
from compiler.frontend.importer import import_model
from runtime.errors import RuntimeKernelError
from runtime.errors import UnsupportedOpError
from runtime.kernels import get_kernel
from tests.support.models import onnx_model
from tests.support.models import run_backend

_model = partial(onnx_model, opset=22)
_run = run_backend

RNG = np.random.default_rng(7)


def _kinds(model: onnx.ModelProto) -> list[str]:
    return [node.kind for node in import_model(model).nodes]


# -- losses ----------------------------------------------------------------------------------
def _nll_loop(x: np.ndarray, target: np.ndarray, weight: np.ndarray | None, reduction: str,
              ignore: int | None) -> np.ndarray:
    losses = np.zeros(target.shape)
    weights = np.zeros(target.shape)
    for pos in itertools.product(*(range(d) for d in target.shape)):
        t = int(target[pos])
        if t == ignore:
            continue
        w = 1.0 if weight is None else float(weight[t])
        losses[pos] = -w * float(x[(pos[0], t) + pos[1:]])
        weights[pos] = w
    if reduction == "none":
        return losses
    return losses.sum() if reduction == "sum" else losses.sum() / weights.sum()


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_loss_with_ignore_index_and_weights_matches_the_spec(reduction: str, weighted: bool) -> None:
    x = RNG.standard_normal((3, 4, 2, 2)).astype(np.float32)
    target = RNG.integers(0, 4, (3, 2, 2)).astype(np.int64)
    target[0, 0, 0] = target[2, 1, 1] = -3  # ignored
    weight = RNG.random(4).astype(np.float32)
    names = ["x", "t", "w"] if weighted else ["x", "t"]
    node = helper.make_node("NegativeLogLikelihoodLoss", names, ["loss"], reduction=reduction,
                            ignore_index=-3)
    inputs = [("x", T.FLOAT, [3, 4, 2, 2]), ("t", T.INT64, [3, 2, 2])]
    inputs += [("w", T.FLOAT, [4])] if weighted else []
    out_shape = [3, 2, 2] if reduction == "none" else []
    model = _model([node], inputs, [("loss", T.FLOAT, out_shape)])
    feeds: list[Any] = [x, target, weight] if weighted else [x, target]
    (loss,) = _run(model, *feeds)
    want = _nll_loop(x, target, weight if weighted else None, reduction, -3)
    np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-6)


def test_nll_loss_rejects_a_target_outside_the_classes() -> None:
    kernel = get_kernel("NegativeLogLikelihoodLoss")
    x = np.zeros((2, 3), np.float32)
    attrs = {"reduction": "mean", "ignore_index": None}
    with pytest.raises(RuntimeKernelError, match="outside"):
        kernel(np, [x, np.array([0, 3])], attrs, [((), np.float32)])
    # The ignored class may be out of range.
    (loss,) = kernel(np, [x, np.array([0, 5])], {**attrs, "ignore_index": 5}, [((), np.float32)])
    assert loss == 0.0


def test_softmax_cross_entropy_is_log_softmax_then_nll() -> None:
    x = RNG.standard_normal((4, 5, 3)).astype(np.float32)
    labels = RNG.integers(0, 5, (4, 3)).astype(np.int32)
    node = helper.make_node("SoftmaxCrossEntropyLoss", ["x", "y"], ["loss", "log_prob"], reduction="sum")
    model = _model([node], [("x", T.FLOAT, [4, 5, 3]), ("y", T.INT32, [4, 3])],
                   [("loss", T.FLOAT, []), ("log_prob", T.FLOAT, [4, 5, 3])], opset=13)
    assert _kinds(model) == ["LogSoftmax", "NegativeLogLikelihoodLoss"]
    loss, log_prob = _run(model, x, labels)
    shifted = x - x.max(axis=1, keepdims=True)
    want_log_prob = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(log_prob, want_log_prob, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(loss, _nll_loop(want_log_prob, labels, None, "sum", None), rtol=1e-5)


# -- normalizations --------------------------------------------------------------------------
def _bn_training(model_outputs: list[str], opset: int = 15) -> onnx.ModelProto:
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], model_outputs,
                            training_mode=1, momentum=0.8, epsilon=1e-3)
    outs = [(n, T.FLOAT, [2, 3, 4] if k == 0 else [3]) for k, n in enumerate(model_outputs) if n]
    inputs = [("x", T.FLOAT, [2, 3, 4])] + [(n, T.FLOAT, [3]) for n in "sbmv"]
    return _model([node], inputs, outs, opset=opset)


def test_batchnorm_training_uses_batch_statistics_and_updates_running_ones() -> None:
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    s, b, m, v = (RNG.random(3).astype(np.float32) + 0.5 for _ in range(4))
    model = _bn_training(["y", "", "running_var"])  # the running mean left unnamed
    assert _kinds(model) == ["onnx_aot.BatchNormTraining"]
    y, running_var = _run(model, x, s, b, m, v)
    mean, var = x.mean(axis=(0, 2)), x.var(axis=(0, 2))
    want = (x - mean[:, None]) / np.sqrt(var[:, None] + 1e-3) * s[:, None] + b[:, None]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(running_var, v * 0.8 + var * 0.2, rtol=1e-6)


def test_batchnorm_training_after_conv_is_not_folded_into_it() -> None:
    x = RNG.standard_normal((2, 1, 5)).astype(np.float32)
    w = helper.make_tensor("w", T.FLOAT, [3, 1, 1], [1.0, 2.0, -1.0])
    params = [helper.make_tensor(n, T.FLOAT, [3], [1.0, 1.0, 1.0]) for n in "sbv"]
    mean = helper.make_tensor("m", T.FLOAT, [3], [0.0, 0.0, 0.0])
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y", "rm", "rv"],
                              training_mode=1)]
    model = _model(nodes, [("x", T.FLOAT, [2, 1, 5])], [("y", T.FLOAT, [2, 3, 5])],
                   initializers=(w, mean, *params))
    (y,) = _run(model, x)
    c = np.concatenate([x * k for k in (1.0, 2.0, -1.0)], axis=1)
    want = (c - c.mean(axis=(0, 2), keepdims=True)) / np.sqrt(c.var(axis=(0, 2), keepdims=True) + 1e-5) + 1
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


def test_batchnorm_training_outputs_before_opset_14_are_unsupported() -> None:
    outputs = ["y", "running_mean", "running_var", "saved_mean", "saved_var"]
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], outputs)
    model = _model([node], [("x", T.FLOAT, [2, 3, 4])] + [(n, T.FLOAT, [3]) for n in "sbmv"],
                   [("y", T.FLOAT, [2, 3, 4]), ("running_mean", T.FLOAT, [3])], opset=9)
    with pytest.raises(UnsupportedOpError, match="training_mode=1"):
        import_model(model)


def test_layer_normalization_returns_inv_std_without_mean() -> None:
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    scale = RNG.standard_normal((3, 4)).astype(np.float32)
    node = helper.make_node("LayerNormalization", ["x", "s"], ["y", "", "inv"], axis=1, epsilon=1e-4)
    model = _model([node], [("x", T.FLOAT, [2, 3, 4]), ("s", T.FLOAT, [3, 4])],
                   [("y", T.FLOAT, [2, 3, 4]), ("inv", T.FLOAT, [2, 1, 1])], opset=17)
    y, inv = _run(model, x, scale)
    mean = x.mean(axis=(1, 2), keepdims=True)
    want_inv = 1 / np.sqrt(x.var(axis=(1, 2), keepdims=True) + 1e-4)
    np.testing.assert_allclose(inv, want_inv, rtol=1e-5)
    np.testing.assert_allclose(y, (x - mean) * want_inv * scale, rtol=1e-5, atol=1e-5)


def _group_norm_numpy(x: np.ndarray, groups: int, scale: np.ndarray, bias: np.ndarray,
                      eps: float) -> np.ndarray:
    g = x.reshape(x.shape[0], groups, -1)
    norm = (g - g.mean(axis=2, keepdims=True)) / np.sqrt(g.var(axis=2, keepdims=True) + eps)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return norm.reshape(x.shape) * scale.reshape(shape) + bias.reshape(shape)


def test_group_normalization_normalizes_each_group_of_channels() -> None:
    x = RNG.standard_normal((2, 6, 3)).astype(np.float32)
    scale, bias = RNG.standard_normal(6).astype(np.float32), RNG.standard_normal(6).astype(np.float32)
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=3, epsilon=1e-3)
    model = _model([node], [("x", T.FLOAT, [2, 6, 3]), ("s", T.FLOAT, [6]), ("b", T.FLOAT, [6])],
                   [("y", T.FLOAT, [2, 6, 3])], opset=21)
    (y,) = _run(model, x, scale, bias)
    np.testing.assert_allclose(y, _group_norm_numpy(x, 3, scale, bias, 1e-3), rtol=1e-5, atol=1e-5)


def test_instance_normalization_is_group_normalization_with_a_group_per_channel() -> None:
    x = RNG.standard_normal((2, 3, 2, 5)).astype(np.float16)
    scale, bias = RNG.random(3).astype(np.float16), RNG.random(3).astype(np.float16)
    node = helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"])
    model = _model([node], [("x", T.FLOAT16, [2, 3, 2, 5]), ("s", T.FLOAT16, [3]), ("b", T.FLOAT16, [3])],
                   [("y", T.FLOAT16, [2, 3, 2, 5])])
    graph = import_model(model)
    assert [(n.kind, n.attrs["num_groups"]) for n in graph.nodes] == [("GroupNormalization", 3)]
    (y,) = _run(model, x, scale, bias)
    assert y.dtype == np.float16
    want = _group_norm_numpy(x.astype(np.float64), 3, scale, bias, 1e-5)
    np.testing.assert_allclose(y, want, rtol=1e-2, atol=1e-2)


# -- pooling ---------------------------------------------------------------------------------
def _max_pool_loop(x: np.ndarray, kernel: list[int], strides: list[int], pads: list[int],
                   dilations: list[int], out: tuple[int, ...], storage_order: int) -> tuple[Any, Any]:
    n = len(kernel)
    sizes = x.shape[2:]
    y = np.zeros(x.shape[:2] + out, x.dtype)
    idx = np.zeros(x.shape[:2] + out, np.int64)
    for b, c, *o in itertools.product(range(x.shape[0]), range(x.shape[1]), *(range(d) for d in out)):
        best, where = None, None
        for k in itertools.product(*(range(d) for d in kernel)):
            pos = [o[i] * strides[i] - pads[i] + k[i] * dilations[i] for i in range(n)]
            if any(p < 0 or p >= s for p, s in zip(pos, sizes, strict=True)):
                continue
            value = x[(b, c) + tuple(pos)]
            if best is None or value > best:
                best, where = value, pos
        assert where is not None
        order = range(n - 1, -1, -1) if storage_order == 0 else range(n)
        flat, step = 0, 1
        for i in order:
            flat += where[i] * step
            step *= sizes[i]
        y[(b, c) + tuple(o)] = best
        idx[(b, c) + tuple(o)] = (b * x.shape[1] + c) * int(np.prod(sizes)) + flat
    return y, idx


@pytest.mark.parametrize("storage_order", [0, 1])
def test_max_pool_indices_with_pads_dilations_and_ceil_mode(storage_order: int) -> None:
    x = RNG.permutation(2 * 2 * 5 * 6).astype(np.float32).reshape(2, 2, 5, 6)
    attrs: dict[str, Any] = {"kernel_shape": [2, 3], "strides": [2, 2], "pads": [1, 0, 1, 0],
                             "dilations": [1, 2]}
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], ceil_mode=1, storage_order=storage_order, **attrs)
    out = [2, 2, 3, 2]  # ceil mode adds the second column
    model = _model([node], [("x", T.FLOAT, [2, 2, 5, 6])], [("y", T.FLOAT, out), ("i", T.INT64, out)])
    y, indices = _run(model, x)
    want_y, want_i = _max_pool_loop(x, attrs["kernel_shape"], attrs["strides"], attrs["pads"],
                                    attrs["dilations"], y.shape[2:], storage_order)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(indices, want_i)


def test_the_c_provider_leaves_max_pool_with_indices_to_the_reference(tmp_path: Path) -> None:
    nodes = [helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2]),
             helper.make_node("MaxPool", ["x"], ["z"], kernel_shape=[2, 2], name="plain")]
    model = _model(nodes, [("x", T.FLOAT, [1, 2, 4, 4])],
                   [("y", T.FLOAT, [1, 2, 3, 3]), ("i", T.INT64, [1, 2, 3, 3]), ("z", T.FLOAT, [1, 2, 3, 3])])
    out = compile_model(model, tmp_path / "artifact", opt_level=0)
    plan = json.loads((out / "plan.json").read_text())
    pools = [step for step in plan["steps"] if step["op_type"] == "MaxPool"]
    providers = {len(step["outputs"]): step["provider"] for step in pools}
    assert providers == {2: "reference", 1: "c"}


@pytest.mark.parametrize("p", [1, 3])
def test_lp_pool_with_pads_matches_the_spec(p: int) -> None:
    x = RNG.standard_normal((1, 2, 5, 4)).astype(np.float32)
    node = helper.make_node("LpPool", ["x"], ["y"], kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1],
                            p=p)
    model = _model([node], [("x", T.FLOAT, [1, 2, 5, 4])], [("y", T.FLOAT, [1, 2, 3, 4])])
    (y,) = _run(model, x)
    padded = np.pad(np.abs(x.astype(np.float64)) ** p, [(0, 0), (0, 0), (1, 1), (0, 1)])
    want = np.zeros((1, 2, 3, 4))
    for i, j in itertools.product(range(3), range(4)):
        want[:, :, i, j] = padded[:, :, 2 * i : 2 * i + 3, j : j + 2].sum(axis=(2, 3)) ** (1 / p)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def test_max_unpool_inverts_max_pool_into_a_larger_output_shape() -> None:
    x = RNG.standard_normal((1, 2, 4, 4)).astype(np.float32)
    shape = helper.make_tensor("shape", T.INT64, [4], [1, 2, 5, 5])
    nodes = [helper.make_node("MaxPool", ["x"], ["p", "i"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("MaxUnpool", ["p", "i", "shape"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    model = _model(nodes, [("x", T.FLOAT, [1, 2, 4, 4])], [("y", T.FLOAT, [1, 2, 5, 5])],
                   initializers=(shape,))
    (y,) = _run(model, x)
    pooled = x.reshape(1, 2, 2, 2, 2, 2).max(axis=(3, 5))
    kept = np.where(x == np.repeat(np.repeat(pooled, 2, axis=2), 2, axis=3), x, 0)
    want = np.zeros((1, 2, 5, 5), np.float32)
    want[:, :, :4, :4] = kept
    np.testing.assert_array_equal(y, want)


def test_max_unpool_rejects_an_index_outside_the_unpooled_tensor() -> None:
    kernel = get_kernel("MaxUnpool")
    x, indices = np.ones((1, 1, 1, 1), np.float32), np.array([[[[4]]]])
    with pytest.raises(RuntimeKernelError, match="outside"):
        kernel(np, [x, indices], {"unpooled_shape": [1, 1, 2, 2]}, [((1, 1, 2, 2), np.float32)])
