"""Transformer ops beyond the ONNX node suite: optional outputs, cache and padding combinations,
canonical forms and errors of Attention, LinearAttention, CausalConvWithState and RotaryEmbedding.

Each model runs through ``compiler.backend`` and is compared with onnx's reference evaluator on the
same model; canonical forms are checked on the imported IR.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper
from onnx.reference import ReferenceEvaluator

import compiler.backend as backend
from compiler.frontend.importer import import_model
from runtime.errors import ModelError
from runtime.errors import RuntimeKernelError

_RNG = np.random.default_rng(7)


def _reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    results = ReferenceEvaluator(model).run(None, feeds)
    assert isinstance(results, list)
    return results


def _model(node: onnx.NodeProto, feeds: dict[str, np.ndarray], opset: int = 24) -> onnx.ModelProto:
    """A one-node model; its outputs are typed from the reference evaluator's results."""
    def info(name: str, array: np.ndarray) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape)

    names = [name for name in node.output if name]
    untyped = helper.make_graph([node], "g", [info(n, a) for n, a in feeds.items()],
                                [helper.make_empty_tensor_value_info(n) for n in names])
    opsets = [helper.make_opsetid("", opset)]
    results = _reference(helper.make_model(untyped, opset_imports=opsets), feeds)
    graph = helper.make_graph([node], "g", [info(n, a) for n, a in feeds.items()],
                              [info(n, r) for n, r in zip(names, results, strict=True)])
    return helper.make_model(graph, opset_imports=opsets)


def _check(node: onnx.NodeProto, feeds: dict[str, np.ndarray], opset: int = 24, rtol: float = 1e-5,
           graph_outputs: int | None = None) -> None:
    """Run through the backend and compare; only the first ``graph_outputs`` outputs are used."""
    model = _model(node, feeds, opset)
    if graph_outputs is not None:
        del model.graph.output[graph_outputs:]
    got = backend.prepare(model).run(list(feeds.values()))
    want = _reference(model, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-6)


def _rand(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    return _RNG.standard_normal(shape).astype(dtype)


def test_attention_3d_gqa_causal_external_cache() -> None:
    node = helper.make_node("Attention", ["Q", "K", "V", "", "", "", "nonpad"], ["Y"],
                            q_num_heads=4, kv_num_heads=2, is_causal=1)
    _check(node, {"Q": _rand(2, 3, 32), "K": _rand(2, 5, 16), "V": _rand(2, 5, 12),
                  "nonpad": np.array([5, 2], np.int64)})


def test_attention_external_cache_with_window_and_float64() -> None:
    node = helper.make_node("Attention", ["Q", "K", "V", "", "", "", "nonpad"], ["Y", "", "", "qk"],
                            left_window_size=2, qk_matmul_output_mode=2)
    feeds = {"Q": _rand(2, 2, 3, 8, dtype=np.float64), "K": _rand(2, 2, 6, 8, dtype=np.float64),
             "V": _rand(2, 2, 6, 8, dtype=np.float64), "nonpad": np.array([4, 6], np.int64)}
    _check(node, feeds, opset=25)


def test_attention_short_float_mask_with_past_cache_and_softcap() -> None:
    node = helper.make_node("Attention", ["Q", "K", "V", "mask", "pk", "pv"], ["Y", "pk_out"],
                            softcap=1.5, scale=0.3)
    feeds = {"Q": _rand(1, 2, 2, 4), "K": _rand(1, 2, 2, 4), "V": _rand(1, 2, 2, 4),
             "mask": _rand(2, 3), "pk": _rand(1, 2, 3, 4), "pv": _rand(1, 2, 3, 4)}
    _check(node, feeds)


def test_attention_canonical_form_drops_unused_outputs_and_resolves_attributes() -> None:
    node = helper.make_node("Attention", ["Q", "K", "V", "", "pk", "pv"], ["Y", "pk_out", "pv_out"],
                            q_num_heads=2, kv_num_heads=1)
    feeds = {"Q": _rand(1, 3, 8), "K": _rand(1, 3, 4), "V": _rand(1, 3, 4),
             "pk": _rand(1, 1, 5, 4), "pv": _rand(1, 1, 5, 4)}
    model = _model(node, feeds)
    del model.graph.output[1:]  # only Y is used: present_key / present_value become internal values
    graph = import_model(model)
    (core,) = [n for n in graph.nodes if n.op_type == "Attention"]
    assert len(core.outputs) == 1 and core.outputs[0].shape == (1, 2, 3, 4)
    assert core.attrs == {"scale": 0.5, "is_causal": 0, "softcap": 0.0,
                          "qk_matmul_output_mode": 0, "past_length": 5, "left_window_size": -1,
                          "right_window_size": -1, "compute_dtype": "float32"}
    assert [n.op_type for n in graph.nodes].count("Concat") == 2
    got = backend.prepare(model).run(list(feeds.values()))[0]
    (want,) = _reference(model, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("node", "message"), [
    (helper.make_node("Attention", ["Q", "K", "V"], ["Y"]), "3-D or all 4-D"),
    (helper.make_node("Attention", ["Q3", "K3", "V3"], ["Y"], q_num_heads=3, kv_num_heads=2), "heads"),
    (helper.make_node("Attention", ["Q3", "K3", "V3", "", "pk"], ["Y"], q_num_heads=2, kv_num_heads=2),
     "together"),
])
def test_attention_rejects_inconsistent_models(node: onnx.NodeProto, message: str) -> None:
    shapes = {"Q": [1, 2, 3, 4], "K": [1, 2, 3], "V": [1, 2, 3, 4], "Q3": [1, 3, 6], "K3": [1, 3, 4],
              "V3": [1, 3, 4], "pk": [1, 2, 1, 2]}
    inputs = [helper.make_tensor_value_info(n, T.FLOAT, shapes[n]) for n in node.input if n]
    rank = len(shapes[node.input[0]])
    y = helper.make_tensor_value_info("Y", T.FLOAT, [f"d{i}" for i in range(rank)])
    graph = helper.make_graph([node], "g", inputs, [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)])
    with pytest.raises(ModelError, match=message):
        import_model(model)


def test_linear_attention_without_present_state_output() -> None:
    node = helper.make_node("LinearAttention", ["q", "k", "v", "", "decay", "beta"], ["y", "state"],
                            q_num_heads=4, kv_num_heads=2)
    feeds = {"q": _rand(1, 3, 16), "k": _rand(1, 3, 8), "v": _rand(1, 3, 6),
             "decay": -np.abs(_rand(1, 3, 8)), "beta": np.abs(_rand(1, 3, 1))}
    _check(node, feeds, opset=27, graph_outputs=1)


def test_causal_conv_with_state_output_only_and_bias() -> None:
    node = helper.make_node("CausalConvWithState", ["x", "w", "b"], ["y", "state"], activation="swish")
    _check(node, {"x": _rand(2, 3, 5), "w": _rand(3, 1, 4), "b": _rand(3)}, opset=27, graph_outputs=1)


def test_rotary_embedding_rejects_position_ids_outside_the_cache() -> None:
    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "pos"], ["y"])
    feeds = {"x": _rand(1, 2, 3, 4), "cos": _rand(5, 2), "sin": _rand(5, 2),
             "pos": np.array([[0, 1, 4]], np.int64)}
    rep = backend.prepare(_model(node, feeds, opset=23))
    feeds["pos"] = np.array([[0, 1, 5]], np.int64)
    with pytest.raises(RuntimeKernelError, match="position_ids"):
        rep.run(list(feeds.values()))
