"""Pool output shapes in the frontend: ONNX's ceil-mode rule where onnx's shape inference differs.

In ceil mode a pool's last window is dropped when it would start in the end padding: ONNX's
operator definitions say so, and onnxruntime, the ONNX reference evaluator, PyTorch and onnx's
own shape inference from opset 22 on agree (``runtime/kernels/window.py: pool_out_size``, which
every kernel and claim here uses). onnx's shape inference for MaxPool / AveragePool / LpPool of
the opsets before 22 keeps that window: one output row and column too many, wrong for the pool
and for everything after it, and an error where the model declares the right shape.

So onnx infers shapes from a copy of the model in which each such pool is stated in floor mode
with the end pad that gives the same output size for every input size
(:func:`runtime.kernels.window.floor_mode_end`), and without the shapes the model records for its
intermediate values and outputs (a tool that ran an older onnx's inference recorded its error
there; onnxruntime, too, keeps what it infers over them). The nodes the frontend imports keep
their own attributes.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx
from onnx import helper

from runtime.kernels.window import floor_mode_end

__all__ = ["infer_with_pool_sizes"]

POOLS = frozenset({"MaxPool", "AveragePool", "LpPool"})


def infer_with_pool_sizes(
    proto: onnx.ModelProto, infer: Callable[[onnx.ModelProto], onnx.ModelProto]
) -> onnx.ModelProto:
    """``infer(proto)`` run on a copy whose ceil-mode pools state their output size in floor mode
    (recorded shapes of intermediates and outputs cleared); the model it returns holds ``proto``'s
    own nodes."""
    restated = [_floor_mode(node) for node in proto.graph.node]
    if all(node is None for node in restated):
        return infer(proto)
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    for i, node in enumerate(restated):
        if node is not None:
            copy.graph.node[i].CopyFrom(node)
    for info in [*copy.graph.value_info, *copy.graph.output]:
        if info.type.HasField("tensor_type"):
            info.type.tensor_type.ClearField("shape")
    inferred = infer(copy)
    del inferred.graph.node[:]
    inferred.graph.node.extend(proto.graph.node)
    return inferred


def _floor_mode(node: onnx.NodeProto) -> onnx.NodeProto | None:
    """The pool ``node`` in floor mode with the same output size, or None when it is not a
    ceil-mode pool with explicit pads (malformed attributes are left for onnx to report)."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in POOLS:
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if attrs.get("ceil_mode", 0) != 1 or attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", b""):
        return None
    kernel = list(attrs.get("kernel_shape", []))
    n = len(kernel)
    strides = list(attrs.get("strides", [1] * n))
    dilations = list(attrs.get("dilations", [1] * n))
    pads = list(attrs.get("pads", [0] * (2 * n)))
    if not n or len(strides) != n or len(dilations) != n or len(pads) != 2 * n:
        return None
    ends = [
        floor_mode_end(k, s, d, e) for k, s, d, e in zip(kernel, strides, dilations, pads[n:], strict=True)
    ]
    restated = onnx.NodeProto()
    restated.CopyFrom(node)
    del restated.attribute[:]
    restated.attribute.extend(a for a in node.attribute if a.name not in ("ceil_mode", "pads"))
    restated.attribute.append(helper.make_attribute("ceil_mode", 0))
    restated.attribute.append(helper.make_attribute("pads", pads[:n] + ends))
    return restated
