"""The fp32 ONNX graph rewritten into the QDQ form of its placement (``qdq_plan.py``) and ranges.

The scheme is onnxruntime's S8S8 QDQ: activations int8 per tensor, asymmetric (``scale = (hi -
lo) / 255`` over a range that holds 0, ``zero = round(-128 - lo / scale)``); weights int8 per output
channel, symmetric (``scale = max |w| / 127``, codes in [-127, 127], zero point 0); biases int32 at
``x_scale * w_scale`` (float32 products, so ``fold_qdq`` finds them exact). Each quantized tensor
gets one QuantizeLinear -> DequantizeLinear pair after its producer and every consumer reads the
DequantizeLinear's output; a quantized graph output keeps its name on the DequantizeLinear (its
producer then writes ``T_QuantizeLinear_Input``). Names follow onnxruntime's (``T_quantized``,
``T_scale``, ``T_zero_point``, ``T_DequantizeLinear_Output``).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import helper
from onnx import numpy_helper

from compiler.quantize.qdq_plan import QdqPlan

__all__ = ["activation_params", "write_qdq"]

Params = tuple[str, str, np.ndarray]  # scale name, zero point name, scale value


def activation_params(lo: float, hi: float) -> tuple[np.float32, np.int8]:
    """The int8 scale and zero point of the range [lo, hi] (widened to hold 0)."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    scale = np.float32((hi - lo) / 255.0)
    if not scale > 0 or not np.isfinite(scale):
        return np.float32(1.0), np.int8(0)
    zero = np.clip(np.round(-128.0 - lo / float(scale)), -128, 127)
    return scale, np.int8(zero)


class _Writer:
    def __init__(self, model: onnx.ModelProto, plan: QdqPlan,
                 ranges: Mapping[str, tuple[float, float]]) -> None:
        self.graph, self.plan = model.graph, plan
        self.consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        self.inits: list[onnx.TensorProto] = []
        self.head: list[onnx.NodeProto] = []  # the weights' DequantizeLinears
        self.params: dict[str, Params] = {}
        self.outputs = {o.name for o in model.graph.output}
        self.used: set[str] = {n for node in model.graph.node for n in [*node.input, *node.output]}
        self.used |= set(self.consts) | {i.name for i in model.graph.input}
        for name in plan.own:
            scale, zero = activation_params(*ranges[name])
            self.params[name] = (self.init(scale, f"{name}_scale"), self.init(zero, f"{name}_zero_point"),
                                 np.asarray(scale))

    def fresh(self, base: str) -> str:
        name, k = base, 0
        while name in self.used:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        return name

    def init(self, array: np.ndarray | np.generic, base: str) -> str:
        name = self.fresh(base)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def of(self, name: str) -> Params:
        return self.params[self.plan.same.get(name, name)]

    def dq(self, name: str) -> str:
        """The DequantizeLinear output the consumers of the quantized tensor ``name`` read."""
        return name if name in self.outputs else f"{name}_DequantizeLinear_Output"

    def source(self, name: str) -> str:
        """The name the producer of the quantized tensor ``name`` writes."""
        return f"{name}_QuantizeLinear_Input" if name in self.outputs else name

    def pair(self, name: str) -> list[onnx.NodeProto]:
        """QuantizeLinear -> DequantizeLinear of the quantized tensor ``name``."""
        scale, zero, _ = self.of(name)
        codes, dq = self.fresh(f"{name}_QuantizeLinear_Output"), self.dq(name)
        return [helper.make_node("QuantizeLinear", [self.source(name), scale, zero], [codes],
                                 name=self.fresh(f"{name}_QuantizeLinear")),
                helper.make_node("DequantizeLinear", [codes, scale, zero], [dq],
                                 name=self.fresh(f"{name}_DequantizeLinear"))]

    def weight(self, name: str, axis: int | None) -> tuple[str, np.ndarray]:
        """The constant ``name`` as int8 codes behind a DequantizeLinear: its output and scale."""
        w = self.consts[name].astype(np.float32)
        if axis is None:
            top = np.asarray(np.max(np.abs(w)), np.float32)
        else:
            top = np.max(np.abs(np.moveaxis(w, axis, 0)).reshape(w.shape[axis], -1), axis=1)
        scale = np.where(top > 0, top / np.float32(127.0), np.float32(1.0)).astype(np.float32)
        shaped = scale if axis is None else scale.reshape([-1 if d == axis else 1 for d in range(w.ndim)])
        codes = np.clip(np.round(w / shaped), -127, 127).astype(np.int8)
        inputs = [self.init(codes, f"{name}_quantized"), self.init(scale, f"{name}_scale"),
                  self.init(np.zeros(scale.shape, np.int8), f"{name}_zero_point")]
        out = self.fresh(f"{name}_DequantizeLinear_Output")
        node = helper.make_node("DequantizeLinear", inputs, [out],
                                name=self.fresh(f"{name}_DequantizeLinear"))
        if axis is not None:
            node.attribute.append(helper.make_attribute("axis", axis))
        self.head.append(node)
        return out, scale

    def bias(self, name: str, x_scale: np.ndarray, w_scale: np.ndarray) -> str:
        """The 1-D constant ``name`` as int32 codes at ``x_scale * w_scale`` behind a DequantizeLinear."""
        scale = (np.float32(x_scale) * w_scale).astype(np.float32).reshape(-1)
        b = self.consts[name].astype(np.float32)
        scale = np.broadcast_to(scale, b.shape).copy()
        codes = np.clip(np.round(b / scale), -(2**31) + 1, 2**31 - 1).astype(np.int32)
        inputs = [self.init(codes, f"{name}_quantized"), self.init(scale, f"{name}_scale"),
                  self.init(np.zeros(b.shape, np.int32), f"{name}_zero_point")]
        out = self.fresh(f"{name}_DequantizeLinear_Output")
        self.head.append(helper.make_node("DequantizeLinear", inputs, [out], axis=0,
                                          name=self.fresh(f"{name}_DequantizeLinear")))
        return out


def write_qdq(model: onnx.ModelProto, plan: QdqPlan,
              ranges: Mapping[str, tuple[float, float]]) -> onnx.ModelProto:
    """``model`` with the QuantizeLinear / DequantizeLinear pairs, int8 weights and int32 biases of
    ``plan`` (activation ranges from ``ranges``, one per ``plan.own`` tensor)."""
    w = _Writer(model, plan, ranges)
    quantized = [*plan.own, *plan.same]
    body: list[onnx.NodeProto] = [n for i in model.graph.input if i.name in quantized for n in w.pair(i.name)]
    for k, node in enumerate(model.graph.node):
        new = onnx.NodeProto()
        new.CopyFrom(node)
        for j, name in enumerate(node.input):
            if name in quantized:
                new.input[j] = w.dq(name)
        for j, name in enumerate(node.output):
            if name in quantized:
                new.output[j] = w.source(name)
        _weights_of(w, k, node, new)
        body.append(new)
        body += [n for out in node.output if out in quantized for n in w.pair(out)]
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend([*w.head, *body])
    replaced = {node.input[j] for (k, j) in [*plan.weights, *plan.biases] for node in [model.graph.node[k]]}
    kept = [t for t in model.graph.initializer if t.name not in replaced or _still_read(t.name, out.graph)]
    del out.graph.initializer[:]
    out.graph.initializer.extend([*kept, *w.inits])
    # an IR-3 model lists its initializers as graph inputs too: a replaced one must not stay an input
    dropped = replaced - {t.name for t in kept}
    inputs = [i for i in out.graph.input if i.name not in dropped]
    del out.graph.input[:]
    out.graph.input.extend(inputs)
    return out


def _weights_of(w: _Writer, k: int, node: onnx.NodeProto, new: onnx.NodeProto) -> None:
    """Point ``new`` (node ``k``'s copy) at its quantized weights and bias."""
    scales: dict[int, np.ndarray] = {}
    for (at, j), axis in w.plan.weights.items():
        if at == k:
            new.input[j], scales[j] = w.weight(node.input[j], axis)
    for (at, j), (x, wj) in w.plan.biases.items():
        if at == k:
            new.input[j] = w.bias(node.input[j], w.of(x)[2], scales[wj])


def _still_read(name: str, graph: onnx.GraphProto) -> bool:
    return any(name in node.input for node in graph.node)
