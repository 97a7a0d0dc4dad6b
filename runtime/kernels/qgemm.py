"""The integer GEMM ``onnx_aot.QGemm`` (issue 32): its packed weights and its reference kernel.

QGemm multiplies A (rows..., K) by a constant B (K, N) stored packed for the C micro-kernel
(``templates/c/qgemm_tile.c.j2``): panels of ``QPANEL`` columns, groups of ``QGROUP`` along K,
``packed[p, g, c, j] = B(4g + j, 16p + c)`` as int8 (a uint8 B less 128), zero-padded; ``Bsum`` holds
the column sums of that int8 B. One layout for every target. The op's inputs and attributes
(docs/ops.md, "onnx-aot ops"):

- ``A``: int8 / uint8, or float32 with ``dynamic`` 1 (quantized inside the step exactly as
  DynamicQuantizeLinear does; a_scale / a_zero are then that quantization's);
- ``acc[m, n] = sum_k (A[m, k] - a_zero) (B[k, n] - b_zero[n])`` in int32, then by ``output``:
  "int32" (MatMulInteger; ``+ bias[n]`` with an int32 bias, wrapping as int32 does), "float"
  (``act(float(acc) * (a_scale * b_scale[n]) + bias[n])``: the
  MatMulInteger -> Cast -> Mul [-> Add] chain onnxruntime's quantize_dynamic writes) or "quantized"
  (QLinearMatMul: ``saturate(rint(acc * (a_scale * b_scale[n] / y_scale)) + y_zero)``, the factor
  formed in float32 and applied in float64, as runtime/kernels/quantize.py does);
- "quantized" with ``addend`` (int8 / uint8 of the output's dtype: one row of n, or the output's
  shape) then adds it to those codes exactly as QBinary's Add does (``binary_codes``: addend_scale /
  addend_zero its quantization, out_scale / out_zero the result's): the QLinearMatMul -> QBinary
  chain of a QDQ bias or residual Add in one step (compiler/passes/fuse_qgemm_add.py); ``lut``
  (256 entries of the output's dtype, then 4 bytes of padding) then maps each code by its byte, as
  a QLookup after the step would; ``addend2`` .. ``out2_zero`` a second Add after the first (before
  the lut), its input the first's output (out_scale, out_zero).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from runtime.contract import QGEMM
from runtime.errors import RuntimeKernelError
from runtime.kernels.common import fill_optional
from runtime.kernels.common import finish
from runtime.kernels.fused import apply_activation
from runtime.kernels.qoperator import binary_codes
from runtime.kernels.quantize import dynamic_quantize_kernel
from runtime.kernels.registry import OutputSpec
from runtime.kernels.registry import register

__all__ = ["QPANEL", "QGROUP", "pack_qb", "unpack_qb", "column_sums"]

QPANEL = 16  # columns per panel of packed B
QGROUP = 4  # K values per group (one vpdpbusd lane)


def pack_qb(b: np.ndarray) -> np.ndarray:
    """B (K, N) int8 / uint8 packed into (ceil(N / 16), ceil(K / 4), 16, 4) int8 panels."""
    k, n = b.shape
    signed = b.astype(np.int16) - (128 if b.dtype == np.uint8 else 0)
    np_, kg = -(-n // QPANEL), -(-k // QGROUP)
    full = np.zeros((kg * QGROUP, np_ * QPANEL), np.int8)
    full[:k, :n] = signed
    return np.ascontiguousarray(full.reshape(kg, QGROUP, np_, QPANEL).transpose(2, 0, 3, 1))


def unpack_qb(packed: Any, k: int, n: int, b_type: str) -> np.ndarray:
    """The B (K, N) of ``b_type`` that ``pack_qb`` packed."""
    np_, kg = packed.shape[:2]
    if packed.shape[2:] != (QPANEL, QGROUP) or np_ * QPANEL < n or kg * QGROUP < k:
        raise RuntimeKernelError(f"QGemm: packed B {tuple(packed.shape)} does not hold {k} x {n}")
    full = np.asarray(packed).transpose(1, 3, 0, 2).reshape(kg * QGROUP, np_ * QPANEL)[:k, :n]
    return (full.astype(np.int16) + (128 if b_type == "uint8" else 0)).astype(np.dtype(b_type))


def column_sums(b: np.ndarray) -> np.ndarray:
    """Bsum: the column sums (int32) of B as packed (a uint8 B less 128)."""
    signed = b.astype(np.int64) - (128 if b.dtype == np.uint8 else 0)
    return signed.sum(axis=0).astype(np.int32)


def _column(param: Any | None, n: int) -> Any:
    """A per-tensor or per-column parameter as a row of ``n`` (float64), 0 when absent."""
    if param is None:
        return np.zeros((1, n))
    return np.broadcast_to(np.asarray(param, np.float64).reshape(1, -1), (1, n))


@register(QGEMM)
def qgemm_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """The integer GEMM: A, Bp, Bsum, a_scale?, a_zero?, b_scale?, b_zero?, y_scale?, y_zero?, bias?,
    addend?, addend_scale?, addend_zero?, out_scale?, out_zero?, lut?, addend2? .. out2_zero?"""
    a, bp, _bsum, a_scale, a_zero, b_scale, b_zero, y_scale, y_zero, bias, *add = fill_optional(
        QGEMM, inputs, 21)
    k, n, mode = int(attrs["k"]), int(attrs["n"]), str(attrs["output"])
    if int(attrs["dynamic"]):
        a, a_scale, a_zero = dynamic_quantize_kernel(xp, [a], {}, _dq_specs(a))
    b = unpack_qb(bp, k, n, str(attrs["b_type"]))
    shift = float(np.asarray(a_zero).reshape(())) if a_zero is not None else 0.0
    rows = a.reshape(-1, k).astype(np.float64) - shift
    acc = (rows @ (b.astype(np.float64) - _column(b_zero, n))).astype(np.int64).astype(np.int32)
    acc = acc.reshape(*a.shape[:-1], n)
    if mode == "int32":
        if bias is not None:
            acc = (acc.astype(np.int64) + np.asarray(bias, np.int64).reshape(-1)).astype(np.int32)
        return finish(xp, QGEMM, [acc], outputs)
    scale = (np.asarray(a_scale, np.float32).reshape(()) * np.asarray(b_scale, np.float32).reshape(-1))
    if mode == "float":
        y = acc.astype(np.float32) * scale.astype(np.float32)
        if bias is not None:
            y = y + np.asarray(bias, np.float32).reshape(-1)
        return finish(xp, QGEMM, [apply_activation(xp, y, attrs)], outputs)
    if mode != "quantized" or y_scale is None or y_zero is None:
        raise RuntimeKernelError(f"QGemm: output {mode!r} (with y_scale and y_zero for 'quantized')")
    factor = (scale / np.asarray(y_scale, np.float32).reshape(())).astype(np.float32)
    info = np.iinfo(y_zero.dtype)
    y = np.rint(acc * factor.astype(np.float64)) + float(np.asarray(y_zero).reshape(()))
    codes = np.clip(y, info.min, info.max).astype(y_zero.dtype)
    for first, scale, zero in ((0, y_scale, y_zero), (6, add[3], add[4])):  # each addend: QBinary's Add
        if add[first] is not None:  # of the codes and it (a row of n or the output's shape)
            full = np.size(add[first]) == codes.size
            addend = np.asarray(add[first]).reshape(codes.shape if full else (n,))
            codes = binary_codes("Add", codes, addend, [scale, zero, *add[first + 1:first + 5]], y_zero.dtype)
    if add[5] is not None:  # a QLookup after the codes: the first 256 entries, by the codes' byte
        codes = np.asarray(add[5]).reshape(-1)[:256][codes.view(np.uint8)]
    return finish(xp, QGEMM, [codes], outputs)


def _dq_specs(a: Any) -> list[OutputSpec]:
    return [(tuple(a.shape), np.dtype(np.uint8)), ((), np.dtype(np.float32)), ((), np.dtype(np.uint8))]
