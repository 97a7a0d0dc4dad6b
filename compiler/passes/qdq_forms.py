"""What ``fold_qdq`` reads off a QDQ graph: quantization parameters, integer weights, integer biases.

A QDQ file (onnxruntime's quantizer, ``quant_format=QDQ``) writes every quantized tensor as a
QuantizeLinear / DequantizeLinear pair and runs the float op between them. The helpers here
recognize the parts of such a pattern exactly, or answer None:

- :func:`dq_params` / :func:`q_params`: the constant float32 scale (all > 0, finite) and zero point
  of a DequantizeLinear / QuantizeLinear of int8 / uint8, per tensor or per axis;
- :func:`weight_codes`: the integer codes behind a float constant the import folded from a
  DequantizeLinear (the narrow-weight record, ``compiler/ir/narrow.py``), with its scale and zero
  point reduced to one axis (or a scalar), checked to give the constant back bit for bit;
- :func:`integer_bias`: a float bias as int32 codes at a given scale, when that bias is exactly
  what DequantizeLinear of those codes gives (``float32(q) * scale`` in float32, the bits of it);
- :func:`quantize_bound`: a float activation bound (Relu's 0, a Clip's min / max) in the output's
  quantized domain, which QuantizeLinear maps monotonically, so clamping commutes with it.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value

__all__ = ["QParams", "dq_params", "q_params", "weight_codes", "integer_bias", "quantize_bound",
           "CODE_DTYPES"]

CODE_DTYPES = (np.dtype(np.int8), np.dtype(np.uint8))


@dataclass(frozen=True)
class QParams:
    """A quantization: ``real = (code - zero) * scale``. ``scale`` float32 and ``zero`` (of the
    codes' dtype) are 0-d (per tensor) or 1-D along ``axis`` of the quantized tensor."""

    scale: np.ndarray
    zero: np.ndarray
    axis: int
    dtype: np.dtype

    @property
    def per_tensor(self) -> bool:
        return self.scale.ndim == 0

    def same(self, other: QParams) -> bool:
        """The same quantization, bit for bit (the same codes mean the same reals)."""
        return (self.dtype == other.dtype and self.scale.shape == other.scale.shape
                and (self.per_tensor or self.axis == other.axis)
                and self.scale.tobytes() == other.scale.tobytes() and np.array_equal(self.zero, other.zero))


def _scale_ok(scale: np.ndarray) -> bool:
    return scale.dtype == np.float32 and bool(np.all(np.isfinite(scale))) and bool(np.all(scale > 0))


def _params(scale: Value | None, zero: Value | None, node: Node, dtype: np.dtype) -> QParams | None:
    if scale is None or scale.const is None or int(node.attrs.get("block_size", 0)):
        return None
    s = np.asarray(scale.const)
    if zero is None:
        z = np.zeros(s.shape, dtype)
    elif zero.const is None or zero.const.dtype != dtype or zero.const.shape != s.shape:
        return None
    else:
        z = np.asarray(zero.const)
    if not _scale_ok(s) or s.ndim > 1:
        return None
    if s.size == 1:  # per tensor: a scalar or a one-element vector
        s, z = s.reshape(()), z.reshape(())
    return QParams(s, z, int(node.attrs.get("axis", 0)), dtype)


def dq_params(node: Node | None) -> QParams | None:
    """The parameters of a DequantizeLinear of int8 / uint8 codes to float32, or None."""
    if node is None or node.kind != "DequantizeLinear" or str(node.attrs.get("to")) != "float32":
        return None
    x = node.input(0)
    if x is None or x.dtype not in CODE_DTYPES:
        return None
    return _params(node.input(1), node.input(2), node, np.dtype(x.dtype))


def q_params(node: Node | None) -> QParams | None:
    """The parameters of a QuantizeLinear of float32 to int8 / uint8 (float32 division), or None."""
    if node is None or node.kind != "QuantizeLinear" or str(node.attrs.get("precision")) != "float32":
        return None
    x, to = node.input(0), np.dtype(str(node.attrs.get("to")))
    if x is None or x.dtype != np.float32 or to not in CODE_DTYPES or node.outputs[0].dtype != to:
        return None
    return _params(node.input(1), node.input(2), node, to)


def _along(table: np.ndarray | None, axis: int, dtype: np.dtype) -> np.ndarray | None:
    """A full-size table that varies along ``axis`` only, as a 0-d or 1-D array (None if not)."""
    if table is None:
        return np.zeros((), dtype)
    index = tuple(slice(None) if k == axis else 0 for k in range(table.ndim))
    vector = np.ascontiguousarray(table[index]).astype(dtype)
    shape = [1] * table.ndim
    shape[axis] = vector.size
    if not np.array_equal(np.broadcast_to(vector.reshape(shape), table.shape), table):
        return None
    if vector.size == 1 or np.all(vector == vector.reshape(-1)[0]):
        return vector.reshape(-1)[:1].reshape(())
    return vector


# weight_codes' answers by (id of the constant's array, axis), while the array lives: the pass
# manager's rounds ask again about every weight a provider did not take (ResNet-50: 0.5 s a round)
_ANSWERS: dict[tuple[int, int], tuple[weakref.ref[np.ndarray], tuple[np.ndarray, QParams] | None]] = {}


def weight_codes(graph: Graph, value: Value | None, axis: int) -> tuple[np.ndarray, QParams] | None:
    """The int8 / uint8 codes and parameters (per tensor or along ``axis``) of a float32 constant
    folded from a DequantizeLinear, or None for any other constant."""
    if value is None or value.const is None or value.const.dtype != np.float32:
        return None
    array, key = value.const, (id(value.const), axis)
    known = _ANSWERS.get(key)
    if known is not None and known[0]() is array:
        return known[1]
    answer = _weight_codes(graph, value, axis)
    _ANSWERS[key] = (weakref.ref(array, lambda _, key=key: _ANSWERS.pop(key, None)), answer)  # type: ignore[misc]
    return answer


def _weight_codes(graph: Graph, value: Value, axis: int) -> tuple[np.ndarray, QParams] | None:
    assert value.const is not None
    form = graph.narrowing.affine_of(value.const)
    if form is None or form.codes.dtype not in CODE_DTYPES or form.scale is None:
        return None
    codes = np.ascontiguousarray(form.codes)
    scale = _along(np.asarray(form.scale, np.float32), axis, np.dtype(np.float32))
    zero = _along(None if form.zero is None else np.asarray(form.zero), axis, codes.dtype)
    if scale is None or zero is None or not _scale_ok(scale) or (scale.ndim != zero.ndim and zero.ndim):
        return None
    if scale.ndim and not zero.ndim:
        zero = np.full(scale.shape, zero, codes.dtype)
    elif zero.ndim and not scale.ndim:
        scale = np.full(zero.shape, scale, np.float32)
    shape = [1] * codes.ndim
    if scale.ndim:
        shape[axis] = scale.size
    back = ((codes.astype(np.int64) - zero.reshape(shape)).astype(np.float32)
            * scale.reshape(shape)).astype(np.float32)
    if back.tobytes() != np.ascontiguousarray(value.const).tobytes():
        return None
    return codes, QParams(scale, zero, axis, np.dtype(codes.dtype))


def integer_bias(bias: np.ndarray, scale: np.ndarray) -> np.ndarray | None:
    """``bias`` (float32, broadcast to ``scale``'s [N]) as int32 codes q with
    ``float32(float32(q) * scale) == bias`` bit for bit, or None when it is no such value."""
    if bias.dtype != np.float32:
        return None
    b = np.broadcast_to(bias.reshape(-1) if bias.size != 1 else bias.reshape(()), scale.shape)
    q = np.rint(b.astype(np.float64) / scale.astype(np.float64))
    if not np.all(np.isfinite(q)) or np.any(np.abs(q) > 2**31 - 1):
        return None
    back = (q.astype(np.float32) * scale).astype(np.float32)
    if np.ascontiguousarray(back).tobytes() != np.ascontiguousarray(b, np.float32).tobytes():
        return None
    return q.astype(np.int32).reshape(scale.shape)


def quantize_bound(bound: float, params: QParams) -> int:
    """QuantizeLinear of one real value (per-tensor ``params``): rint(bound / scale) + zero, saturated."""
    info = np.iinfo(params.dtype)
    if np.isnan(bound):
        return int(params.zero)
    if np.isinf(bound):
        return int(info.max if bound > 0 else info.min)
    q = float(np.rint(np.float32(bound) / params.scale)) + float(params.zero)
    return int(min(max(q, info.min), info.max))
