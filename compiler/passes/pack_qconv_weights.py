"""Lower QLinearConv / ConvInteger with constant weights and quantization parameters to
``onnx_aot.PackedQConv``: the weights packed once, ahead of time, for the C integer kernels, the
zero-point corrections (weight sums per output channel) and the bias folded into one int32 per
output channel, and QLinearConv's rescale factor ``x_scale * w_scale / y_scale`` formed in float32
as the ONNX reference forms it (``runtime/kernels/qconv.py`` states the op; the results equal the
reference kernels' bit for bit).

Left alone (the reference kernels run them): run-time weights, scales or zero points, a per-channel
x or y zero point, non-float32 scales, 16-bit types, other than 1-D / 2-D convolutions and dynamic
shapes. A lowering for the C target (``compiler.passes.lowerings_for``), from level 2.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from compiler.ir.graph import AOT_DOMAIN
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.passes.base import Pass
from compiler.passes.base import PassResult
from compiler.passes.base import add_constant
from compiler.passes.base import replace_nodes
from runtime.contract import PACKED_QCONV
from runtime.contract import op_name
from runtime.kernels.qconv import pack_qconv

__all__ = ["PackQConvWeights", "qconv_method"]

_BYTES = (np.dtype(np.int8), np.dtype(np.uint8))


def _const(value: Value | None) -> np.ndarray | None:
    return None if value is None else value.const


def _scalar(value: Value | None) -> bool:
    """Absent, or a constant of one element."""
    return value is None or (value.const is not None and value.const.size == 1)


def qconv_method(x_shape: tuple[int, ...], w_shape: tuple[int, ...], group: int) -> str:
    """ "depthwise" (one input channel per group) or "gemm"."""
    return "depthwise" if group > 1 and int(x_shape[1]) // group == 1 else "gemm"


def _operands(node: Node) -> dict[str, Value | None] | None:
    """The node's operands by role, or None when it is not a conv this lowering takes."""
    if node.domain not in ("", "ai.onnx") or node.kind not in ("QLinearConv", "ConvInteger"):
        return None
    names: tuple[str, ...] = ("x", "w", "x_zero", "w_zero")
    if node.kind == "QLinearConv":
        names = ("x", "x_scale", "x_zero", "w", "w_scale", "w_zero", "y_scale", "y_zero", "bias")
    ops = {n: node.input(i) for i, n in enumerate(names)}
    x, w, y = ops["x"], ops["w"], node.outputs[0]
    if x is None or w is None or w.const is None or x.shape is None or y.shape is None:
        return None
    if x.is_symbolic or y.is_symbolic or len(x.shape) not in (3, 4) or x.dtype not in _BYTES:
        return None
    if w.dtype not in _BYTES or not _scalar(ops["x_zero"]):
        return None
    if any(v is not None and v.const is None for k, v in ops.items() if k not in ("x", "w")):
        return None
    if node.kind == "QLinearConv":
        if y.dtype not in _BYTES or not (_scalar(ops["x_scale"]) and _scalar(ops["y_scale"])):
            return None
        if ops["y_zero"] is not None and not _scalar(ops["y_zero"]):
            return None
        scales = [ops[k] for k in ("x_scale", "w_scale", "y_scale")]
        if any(v is None or v.dtype != np.float32 for v in scales):
            return None
    elif y.dtype != np.int32:
        return None
    return ops


def _factor(ops: dict[str, Value | None], m: int) -> np.ndarray:
    """x_scale * w_scale / y_scale in float32 (the ONNX reference's order), one per output channel."""
    xs, ws, ys = (np.asarray(_const(ops[k])) for k in ("x_scale", "w_scale", "y_scale"))
    w_scale = ws.reshape(()) if ws.size == 1 else ws.reshape(-1)
    factor = xs.reshape(()) * w_scale / ys.reshape(())
    return np.ascontiguousarray(np.broadcast_to(np.asarray(factor, np.float32), (m,)))


def _attrs(node: Node, ops: dict[str, Value | None], method: str) -> dict[str, Any]:
    y = node.outputs[0]
    assert y.dtype is not None
    info = np.iinfo(y.dtype)
    x_zero, y_zero = _const(ops["x_zero"]), _const(ops.get("y_zero"))
    conv = {k: node.attrs[k] for k in ("kernel_shape", "strides", "pads", "dilations", "group")}
    return {**conv, "method": method, "x_zero": int(x_zero.reshape(-1)[0]) if x_zero is not None else 0,
            "y_zero": int(y_zero.reshape(-1)[0]) if y_zero is not None else 0,
            "qmin": int(info.min), "qmax": int(info.max)}


def _lower(graph: Graph, node: Node, ops: dict[str, Value | None]) -> Node:
    x, w = ops["x"], ops["w"]
    assert x is not None and x.shape is not None and w is not None and w.const is not None
    m, group = int(w.const.shape[0]), int(node.attrs["group"])
    method = qconv_method(tuple(int(d) for d in x.shape), tuple(w.const.shape), group)
    attrs = _attrs(node, ops, method)
    pack = pack_qconv(method, w.const, _const(ops["w_zero"]), attrs["x_zero"], x.dtype,
                      _const(ops.get("bias")), group)
    base = w.name
    inputs: list[Value | None] = [x, add_constant(graph, f"{base}_qpacked", pack.wp),
                                  add_constant(graph, f"{base}_qcorr", pack.corr)]
    inputs.append(None if pack.wz is None else add_constant(graph, f"{base}_qzero", pack.wz))
    if node.kind == "QLinearConv":
        inputs.append(add_constant(graph, f"{base}_qscale", _factor(ops, m)))
    while inputs[-1] is None:
        inputs.pop()
    return Node(op_name(PACKED_QCONV), inputs, list(node.outputs), attrs, name=node.name,
                domain=AOT_DOMAIN, origin=node.origin)


class PackQConvWeights(Pass):
    name = "pack_qconv_weights"

    def run(self, graph: Graph) -> PassResult:
        modified = False
        for node in list(graph):
            ops = _operands(node)
            if ops is None:
                continue
            replace_nodes(graph, [node], _lower(graph, node, ops))
            modified = True
        if modified:
            graph.prune_constants()
        return PassResult(graph, modified)
