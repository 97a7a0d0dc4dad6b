"""Output shapes of Conv and the pools over symbolic spatial dims, and a range no window fits.

A window op's output size along an axis is ``(size + pads - dilation*(k-1) - 1) // stride + 1``
(``runtime/kernels/window.py``, the one size rule every kernel and claim uses). Over a range the
import computes that expression of the symbol directly, rather than fitting it from probes: a
large stride (an STFT written as a Conv1d of kernel 512, stride 160) has more residues than the
probes can cover, and a fit would be ambiguous. The importer still checks the expression against
onnx's inference at every probe size (``importer._infer_symbolic``).

A range whose low end is too short for the window (an output size below 1) is refused with a
``ShapeError`` naming the graph input, its dim, and the smallest size that works.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

from compiler.frontend.canonical import onnx_attrs
from compiler.ir.evaluate import concrete_shape
from compiler.ir.graph import Value
from runtime.errors import ShapeError
from runtime.kernels.window import conv_out_size
from runtime.kernels.window import floor_mode_end
from runtime.symbolic import Dim
from runtime.symbolic import Expr
from runtime.symbolic import evaluate
from runtime.symbolic import free_symbols

__all__ = ["WINDOW_OPS", "RangeTooShortError", "check_low_end", "window_output_types", "window_rule"]

WINDOW_OPS = frozenset({"Conv", "ConvInteger", "MaxPool", "AveragePool", "LpPool"})
_POOLS = frozenset({"MaxPool", "AveragePool", "LpPool"})
OutputType = tuple[np.dtype, tuple[Dim, ...]]


def window_rule(proto: onnx.NodeProto, inputs: Sequence[Value | None],
                found: Sequence[tuple[Mapping[str, int], Mapping[str, tuple[np.dtype, tuple[int, ...]]]]],
                where: str, ranges: Mapping[str, tuple[int, int]],
                input_shapes: Mapping[str, Sequence[Dim]]) -> dict[str, OutputType] | None:
    """The output types of window op ``proto`` by name from its size rule, when its spatial dims
    are symbolic and the rule gives what onnx inferred at every probe ``found`` (binding, types by
    output name); else None. A range whose low end no window fits is a ShapeError."""
    rule = window_output_types(proto, inputs)
    if rule is None:
        return None
    check_low_end(where, proto, inputs, rule[0][1], ranges, input_shapes)
    names = [n for n in proto.output if n]
    for binding, types in found:
        for name, (dtype, shape) in zip(names, rule, strict=False):
            if name in types and types[name] != (dtype, concrete_shape(shape, binding)):
                return None
    return dict(zip(names, rule, strict=False)) if found else None


def window_output_types(proto: onnx.NodeProto, inputs: Sequence[Value | None]) -> list[OutputType] | None:
    """The dtype and symbolic shape of each output of window op ``proto`` whose input has
    symbolic spatial dims (explicit or VALID pads; SAME pads and anything malformed: None, left to
    the probes and to onnx's messages)."""
    if proto.domain not in ("", "ai.onnx") or proto.op_type not in WINDOW_OPS or not inputs:
        return None
    x = inputs[0]
    if x is None or x.shape is None or x.dtype is None or x.const is not None or len(x.shape) < 3:
        return None
    spatial = x.shape[2:]
    if not any(isinstance(d, Expr) for d in spatial):
        return None
    geometry = _geometry(proto, inputs, len(spatial))
    if geometry is None:
        return None
    channels, kernel, strides, dilations, pads = geometry
    n = len(spatial)
    sizes = tuple(conv_out_size(size, k, s, d, pads[i], pads[i + n])  # type: ignore[arg-type]
                  for i, (size, k, s, d) in enumerate(zip(spatial, kernel, strides, dilations, strict=True)))
    shape = (x.shape[0], channels, *sizes)
    if proto.op_type == "ConvInteger":
        return [(np.dtype(np.int32), shape)]
    types = [(x.dtype, shape)]
    if proto.op_type == "MaxPool" and len([o for o in proto.output if o]) > 1:
        types.append((np.dtype(np.int64), shape))  # the Indices
    return types


def _geometry(proto: onnx.NodeProto, inputs: Sequence[Value | None],
              n: int) -> tuple[Dim, list[int], list[int], list[int], list[int]] | None:
    """(output channels, kernel, strides, dilations, pads in floor mode) or None."""
    attrs = onnx_attrs(proto)
    if str(attrs.get("auto_pad", "NOTSET")) not in ("NOTSET", "VALID", ""):
        return None
    x = inputs[0]
    assert x is not None and x.shape is not None
    if proto.op_type in _POOLS:
        kernel, channels = _ints(attrs.get("kernel_shape")), x.shape[1]
    else:
        w = inputs[1] if len(inputs) > 1 else None
        if w is None or w.shape is None or len(w.shape) != n + 2:
            return None
        if not all(isinstance(d, int) for d in w.shape):
            return None
        kernel, channels = _ints(attrs.get("kernel_shape", w.shape[2:])), w.shape[0]
    strides = _ints(attrs.get("strides", [1] * n))
    dilations = _ints(attrs.get("dilations", [1] * n))
    pads = _ints(attrs.get("pads", [0] * (2 * n)))
    if str(attrs.get("auto_pad", "")) == "VALID":
        pads = [0] * (2 * n)
    if kernel is None or strides is None or dilations is None or pads is None:
        return None
    if not (len(kernel) == len(strides) == len(dilations) == n and len(pads) == 2 * n):
        return None
    if min(kernel + strides + dilations) < 1:
        return None
    if proto.op_type in _POOLS and int(attrs.get("ceil_mode", 0)):  # floor mode with longer end pads
        pads = pads[:n] + [floor_mode_end(k, s, d, e)
                           for k, s, d, e in zip(kernel, strides, dilations, pads[n:], strict=True)]
    return channels, kernel, strides, dilations, pads


def _ints(values: Any) -> list[int] | None:
    try:
        return [int(v) for v in values]
    except (TypeError, ValueError):
        return None


def check_low_end(where: str, proto: onnx.NodeProto, inputs: Sequence[Value | None], shape: Sequence[Dim],
                  ranges: Mapping[str, tuple[int, int]], input_shapes: Mapping[str, Sequence[Dim]]) -> None:
    """A ShapeError where an output size of window op ``proto`` is below 1 with its symbols at their
    ranges' low ends: the window does not fit the input there (the size rule never grows as a dim
    shrinks, so the low end is the one to check)."""
    x = inputs[0]
    assert x is not None and x.shape is not None
    for axis, dim in enumerate(shape[2:], start=2):
        if not isinstance(dim, Expr):
            continue
        low = {s: ranges[s][0] for s in free_symbols(dim)}
        size = evaluate(dim, low)
        if size >= 1:
            continue
        symbol = sorted(low)[0] if len(low) == 1 else None
        at = ", ".join(f"{s}={v}" for s, v in sorted(low.items()))
        message = (f"{where}: input {x.name!r} dim {axis} ({x.shape[axis]}) is too short for the window "
                   f"at the low end of the range: {_window_text(proto, axis - 2)} gives an output size "
                   f"of {size} at {at}")
        error = RangeTooShortError(message)
        if symbol is not None:
            text, error.at = _smallest_text(symbol, dim, ranges, input_shapes)
            error.args = (message + text + "; dynamic shapes: docs/dynamic-shapes.md",)
        raise error


def _window_text(proto: onnx.NodeProto, i: int) -> str:
    attrs = onnx_attrs(proto)
    kernel = list(attrs.get("kernel_shape", []))
    parts = [f"kernel {kernel[i]}" if i < len(kernel) else "its kernel"]
    for key in ("strides", "dilations"):
        values = list(attrs.get(key, []))
        if i < len(values):
            parts.append(f"{key[:-1]} {values[i]}")
    pads = list(attrs.get("pads", []))
    if len(pads) > i + len(pads) // 2:
        parts.append(f"pads {pads[i]}+{pads[i + len(pads) // 2]}")
    return "its window (" + ", ".join(parts) + ")"


class RangeTooShortError(ShapeError):
    """A window op's output is empty at the low end of a range. ``at``: (graph input, dim, the
    smallest size that works) when one graph input dim carries the symbol, else None."""

    at: tuple[str, int, int] | None = None


def _smallest_text(symbol: str, dim: Expr, ranges: Mapping[str, tuple[int, int]],
                   input_shapes: Mapping[str, Sequence[Dim]]) -> tuple[str, tuple[str, int, int] | None]:
    """Where the graph input dim of ``symbol`` must start for ``dim`` to be at least 1: the text,
    and (input, dim, smallest size) when a graph input dim is that symbol alone."""
    lo, hi = ranges[symbol]
    if evaluate(dim, {symbol: hi}) < 1:
        return f"; no size of {symbol} in {lo}..{hi} gives an output: check the model's input sizes", None
    while lo < hi:  # the smallest value that works (the size rule is nondecreasing in the symbol)
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if evaluate(dim, {symbol: mid}) < 1 else (lo, mid)
    where = [(name, k) for name, shape in input_shapes.items() for k, d in enumerate(shape)
             if isinstance(d, Expr) and free_symbols(d) == {symbol}]
    text = f"; the smallest {symbol} that works is {lo}"
    if not where:
        return text, None
    name, k = where[0]
    dims = [_range_text(d, ranges, symbol, lo) for d in input_shapes[name]]
    text += f" (graph input {name!r} dim {k}: e.g. --shape {name}={'x'.join(dims)})"
    plain = input_shapes[name][k]
    return text, ((name, k, lo) if isinstance(plain, Expr) and str(plain) == symbol else None)


def _range_text(d: Dim, ranges: Mapping[str, tuple[int, int]], symbol: str, start: int) -> str:
    """A graph input's dim as ``--shape`` text, ``symbol``'s range starting at ``start``."""
    names = sorted(free_symbols(d))
    if len(names) != 1 or names[0] not in ranges:
        return str(d)
    lo, hi = ranges[names[0]]
    lo = start if names[0] == symbol else lo
    return str(lo) if lo == hi else f"{lo}..{hi}"
