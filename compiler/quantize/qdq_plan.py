"""Which tensors of an fp32 ONNX graph the int8 rewrite quantizes, and how (the QDQ placement).

The placement follows what onnxruntime's ``quantize_static`` (QDQ, S8S8, per channel) writes, in
the forms ``compiler/passes/fold_qdq.py`` and ``fold_qdq_integer.py`` turn into integer steps:

- **Conv, MatMul, Gemm**: the activation inputs and the output quantized per tensor; a constant
  weight per output channel (Conv axis 0, MatMul axis 1, Gemm 0 with ``transB`` else 1), a constant
  1-D bias as int32 at ``x_scale * w_scale``. A Relu / Clip that is the output's one consumer is
  kept after the op and its output quantized instead (the clamp folds into the requantization).
- **Add, Mul, Sum of two, Concat, AveragePool, GlobalAveragePool, Softmax**: the inputs and the
  output (a non-scalar constant operand of Add / Mul per tensor, a scalar one left float: a lookup).
  An average gets its own range, narrower than its input's (onnxruntime leaves ResNet-50's last
  pool float and quantizes the Gemm's input at its own range, the finer scale).
- **MaxPool, Reshape, Transpose, Flatten, Squeeze, Unsqueeze**: the output at its input's
  quantization, when the input is quantized (values only move).

A quantized graph output is the DequantizeLinear of its codes (as onnxruntime writes it: the
integer op requantizes, the output dequantizes). Every other op (LayerNormalization, Erf, Div,
...) runs in float between a DequantizeLinear and the next QuantizeLinear.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from dataclasses import field

import numpy as np
import onnx
from onnx import numpy_helper

__all__ = ["QdqPlan", "plan_qdq"]

_WEIGHTED = ("Conv", "MatMul", "Gemm")
_OWN = ("Add", "Mul", "Sum", "Concat", "AveragePool", "GlobalAveragePool", "Softmax")
_SAME = ("MaxPool", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze")
_CLAMPS = ("Relu", "Clip")


@dataclass
class QdqPlan:
    """``own``: tensors quantized at their own calibrated range; ``same``: tensor -> the tensor whose
    quantization it reuses; ``weights``: (node index, input index) -> channel axis (None: per
    tensor); ``biases``: (node index, input index) -> (activation, weight input index)."""

    own: list[str] = field(default_factory=list)
    same: dict[str, str] = field(default_factory=dict)
    weights: dict[tuple[int, int], int | None] = field(default_factory=dict)
    biases: dict[tuple[int, int], tuple[str, int]] = field(default_factory=dict)
    steps: list[int] = field(default_factory=list)  # the nodes computed on quantized operands

    def quantized(self, name: str) -> bool:
        return name in self.same or name in self.own

    def mark(self, name: str) -> None:
        if not self.quantized(name):
            self.own.append(name)


class _Facts:
    """What the placement asks of the graph: constants, float tensors, consumers, graph outputs."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.consts = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        typed = [*graph.input, *graph.value_info, *graph.output]
        self.floats = {v.name for v in typed if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}
        self.consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for node in graph.node:
            for name in node.input:
                self.consumers[name].append(node)
        self.outputs = {o.name for o in graph.output}

    def activation(self, name: str) -> bool:
        return bool(name) and name not in self.consts and name in self.floats

    def clamp_after(self, name: str) -> onnx.NodeProto | None:
        """The Relu / Clip (constant bounds) that is ``name``'s one consumer, if any."""
        users = self.consumers[name]
        if name in self.outputs or len(users) != 1 or users[0].op_type not in _CLAMPS:
            return None
        clamp = users[0]
        return clamp if all(not b or b in self.consts for b in clamp.input[1:]) else None


def plan_qdq(model: onnx.ModelProto, skip: frozenset[int] = frozenset()) -> QdqPlan:
    """The placement for ``model`` (shape-inferred: the float tensors are read off value_info); the
    Conv / MatMul / Gemm and Add / Mul / Concat / pool / Softmax nodes of index in ``skip`` stay
    float (``--max-error``; the ops that only move values follow their input)."""
    facts, plan = _Facts(model.graph), QdqPlan()
    for k, node in enumerate(model.graph.node):
        if k in skip:
            continue
        if node.op_type in _WEIGHTED and _weighted(k, node, facts, plan):
            plan.steps.append(k)
            _output(node.output[0], facts, plan)
        elif node.op_type in _OWN and _own_inputs(k, node, facts, plan):
            plan.steps.append(k)
            _output(node.output[0], facts, plan)
        elif node.op_type in _SAME and plan.quantized(node.input[0]) and facts.activation(node.output[0]):
            plan.same[node.output[0]] = _root(plan, node.input[0])
    return plan


def _root(plan: QdqPlan, name: str) -> str:
    return plan.same.get(name, name)


def _output(name: str, facts: _Facts, plan: QdqPlan) -> None:
    """Quantize the output ``name`` (or the output of the clamp kept after it)."""
    clamp = facts.clamp_after(name)
    if clamp is not None:
        plan.mark(clamp.output[0])
    elif facts.activation(name):
        plan.mark(name)


def _weighted(k: int, node: onnx.NodeProto, facts: _Facts, plan: QdqPlan) -> bool:
    """Plan a Conv / MatMul / Gemm's operands; False (nothing planned) for a form left float."""
    x, w = node.input[0], node.input[1]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if not facts.activation(x):
        return False
    if node.op_type == "Gemm" and (attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0
                                   or attrs.get("beta", 1.0) != 1.0):
        return False
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if bias is not None and (bias not in facts.consts or facts.consts[bias].ndim != 1):
        return False
    if w in facts.consts:
        plan.weights[(k, 1)] = _channel_axis(node, facts.consts[w], attrs)
        if bias is not None:
            plan.biases[(k, 2)] = (x, 1)
    elif node.op_type == "MatMul" and facts.activation(w) and bias is None:
        plan.mark(w)
    else:
        return False
    plan.mark(x)
    return True


def _channel_axis(node: onnx.NodeProto, weight: np.ndarray, attrs: dict[str, object]) -> int | None:
    if node.op_type == "Conv":
        return 0
    if weight.ndim != 2:
        return None
    return 0 if node.op_type == "Gemm" and attrs.get("transB", 0) else 1


def _own_inputs(k: int, node: onnx.NodeProto, facts: _Facts, plan: QdqPlan) -> bool:
    """Plan an Add / Mul / Sum / Concat / pool / Softmax's inputs; False for a form left float."""
    names = [n for n in node.input if n]
    if node.op_type == "Sum" and len(names) != 2:
        return False
    acts = [n for n in names if facts.activation(n)]
    if not acts or not facts.activation(node.output[0]):
        return False
    for j, name in enumerate(node.input):
        if name in facts.consts:
            if node.op_type not in ("Add", "Mul") or facts.consts[name].dtype != np.float32:
                return False
            if facts.consts[name].size > 1:
                plan.weights[(k, j)] = None
        elif name not in facts.floats:
            return False
    for name in acts:
        plan.mark(name)
    return True
