"""Canonical forms of convolution, pooling and LRN: explicit kernel_shape, strides, dilations and
begin/end pads (``auto_pad`` resolved against the input's spatial size), every attribute with its
default. ``resolve_pads`` and ``spatial_dims`` serve the other convolutions too (the quantized ones,
DeformConv), so they all agree. Pads and output sizes come from ``runtime/kernels/window.py``, as
in every kernel; a Conv or pool whose output shape is not the one its attributes give is a
ModelError. See docs/ops.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from compiler.frontend.canonical.context import CanonContext
from compiler.frontend.canonical.context import ints
from compiler.frontend.canonical.registry import register
from compiler.frontend.probing import may_be_equal
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from runtime.kernels.window import conv_out_size
from runtime.kernels.window import extent
from runtime.kernels.window import floor_mode_end
from runtime.kernels.window import pool_out_size
from runtime.kernels.window import same_pads
from runtime.kernels.window import split_pads
from runtime.symbolic import ceildiv
from runtime.symbolic import is_symbolic
from runtime.symbolic import max_
from runtime.symbolic import mod

__all__ = ["check_output", "conv_attrs", "resolve_pads", "spatial_dims", "window_attrs"]


def resolve_pads(ctx: CanonContext, spatial: tuple[int, ...], kernel: list[int],
                  strides: list[int], dilations: list[int], symbolic_ok: bool = False) -> list[Any]:
    n = len(spatial)
    auto_pad = str(ctx.attr("auto_pad", "NOTSET"))
    if auto_pad in ("NOTSET", ""):
        pads = ints(ctx.attr("pads", [0] * (2 * n)))
        if len(pads) != 2 * n:
            raise ctx.error(f"pads has {len(pads)} values, expected {2 * n}")
        if any(p < 0 for p in pads):
            raise ctx.error(f"negative pads {pads}")
        return pads
    if auto_pad == "VALID":
        return [0] * (2 * n)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        split = [_same_pads(size, k, s, d, auto_pad == "SAME_UPPER", symbolic_ok)
                 for size, k, s, d in zip(spatial, kernel, strides, dilations, strict=True)]
        return [b for b, _ in split] + [e for _, e in split]
    raise ctx.error(f"unknown auto_pad {auto_pad!r}")


def _same_pads(size: Any, kernel: int, stride: int, dilation: int, upper: bool,
               symbolic_ok: bool) -> tuple[Any, Any]:
    """``auto_pad`` SAME pads of one axis. Over a symbolic size at a stride over 1 the total is
    ``extent - stride + (-size mod stride)``: where every residue gives the same begin pad, the
    end pad is the largest one (``extent - 1 - begin``: the windows never reach past the real end
    pad, and the output is ``ceil(size / stride)`` as SAME's), static for every kernel; else
    (SAME_UPPER 3x3 at stride 2: begin 0 or 1) expressions of the symbols, where ``symbolic_ok``
    (a Pad node before the op takes them), a refusal otherwise."""
    if not is_symbolic(size) or stride == 1:
        return same_pads(size, kernel, stride, dilation, upper)
    span = extent(kernel, dilation)
    begins = {split_pads(max(0, span - stride + r), upper)[0] for r in range(stride)}
    if len(begins) == 1:
        (begin,) = begins
        return begin, span - 1 - begin
    if not symbolic_ok:
        raise TypeError(f"auto_pad SAME at stride {stride}: the begin pad depends on {size} mod {stride}")
    total = span - stride + mod(-size, stride)
    return split_pads(total if span >= stride else max_(0, total), upper)  # type: ignore[arg-type]


def check_output(ctx: CanonContext, want: list[int]) -> None:
    """ModelError unless the output's spatial sizes are ``want`` (runtime/kernels/window.py's)."""
    y, x = ctx.outputs[0].shape, ctx.inputs[0]
    assert y is not None and x is not None and x.shape is not None
    # (a symbolic size is checked where it is bound, at run time)
    if (any(not is_symbolic(size) and size < 1 for size in want)
            and all(is_symbolic(size) or size > 0 for size in x.shape[2:])):
        raise ctx.error(f"the window does not fit the input: spatial input {tuple(x.shape[2:])} gives "
                        f"output sizes {tuple(want)}; check the --shape sizes")
    if list(y[2:]) == want:
        return
    differ = [(got, size) for got, size in zip(y[2:], want, strict=True) if got != size]
    if all(may_be_equal(got, size, ctx.graph.symbols) for got, size in differ):
        # equal at some sizes in the ranges (onnx clamps a window that does not fit to 1 output,
        # say): those are the sizes the model takes, checked at the binding
        ctx.graph.assumptions.extend((ctx.name, got, size) for got, size in differ)
        return
    raise ctx.error(f"output shape {tuple(y)} does not match the attributes (spatial {tuple(want)})")


def spatial_dims(ctx: CanonContext) -> tuple[int, ...]:
    x = ctx.inputs[0]
    assert x is not None and x.shape is not None
    if len(x.shape) < 3:
        raise ctx.error(f"input needs rank >= 3 (N, C, spatial...), got shape {x.shape}")
    return x.shape[2:]


def window_attrs(ctx: CanonContext, n: int,
                 kernel: Sequence[Any] | None = None) -> tuple[list[int], list[int], list[int]]:
    """A windowed node's kernel_shape (default ``kernel``, the weights' spatial dims; required where
    None), strides and dilations (default 1s), each checked to have one value per spatial dim."""
    if kernel is None and "kernel_shape" not in ctx.attrs:
        raise ctx.error("kernel_shape is required")
    defaults = {"kernel_shape": kernel, "strides": [1] * n, "dilations": [1] * n}
    found = [ints(ctx.attr(key, default)) for key, default in defaults.items()]
    if any(len(values) != n for values in found):
        raise ctx.error("kernel_shape/strides/dilations do not match the input's spatial rank")
    return found[0], found[1], found[2]


def conv_attrs(kernel: list[int], strides: list[int], pads: list[Any], dilations: list[int], group: int,
               **extra: Any) -> dict[str, Any]:
    """The canonical attributes of a conv-like node (Conv, DeformConv, ConvTranspose), ``extra``
    (its own, e.g. output_padding) after them."""
    return {"kernel_shape": kernel, "strides": strides, "pads": pads, "dilations": dilations,
            "group": group, **extra}


@register("Conv")
def _conv(ctx: CanonContext) -> list[Node]:
    w = ctx.inputs[1]
    assert w is not None and w.shape is not None
    spatial = spatial_dims(ctx)
    n = len(spatial)
    kernel, strides, dilations = window_attrs(ctx, n, w.shape[2:])
    pads = resolve_pads(ctx, spatial, kernel, strides, dilations, symbolic_ok=True)
    padding, x, spatial, pads = _pad_node(ctx, pads, 0.0, _windows(kernel, strides, dilations))
    axes = list(zip(spatial, kernel, strides, dilations, pads[:n], pads[n:], strict=True))
    check_output(ctx, [conv_out_size(*axis) for axis in axes])
    attrs = conv_attrs(kernel, strides, pads, dilations, int(ctx.attr("group", 1)))
    return [*padding, ctx.node("Conv", [x, *ctx.inputs[1:3]], attrs)]


def _padded(size: Any, begin: Any, end: Any, span: int, stride: int) -> Any:
    """An axis's size after SAME pads: ``stride * ceil(size / stride) + span - stride`` (the form
    in which the op's output size comes out as ``ceil(size / stride)``, the output's expression)."""
    if is_symbolic(begin) and span >= stride:
        return stride * ceildiv(size, stride) + span - stride
    return size + begin + end


def _pad_node(ctx: CanonContext, pads: list[Any], value: float, windows: list[tuple[int, int]],
              force: bool = False) -> tuple[list[Node], Value, tuple[Any, ...], list[Any]]:
    """Pads that are expressions of the symbols (``auto_pad`` SAME at a stride over 1 where the
    begin pad depends on the size) as a Pad node of ``value`` before the op, whose own pads are
    then 0: the Pad's reference kernel takes them at each binding, the op's kernels (C included)
    need static pads; ``force``: static pads too. Returns (nodes, the op's input, its spatial
    dims, the op's pads)."""
    x = ctx.inputs[0]
    assert x is not None and x.shape is not None
    if not any(is_symbolic(p) for p in pads) and not (force and any(pads)):
        return [], x, tuple(x.shape[2:]), pads if not force else [0] * len(pads)
    n = len(pads) // 2
    axes = zip(x.shape[2:], pads[:n], pads[n:], windows, strict=True)
    shape = (*x.shape[:2], *(_padded(size, b, e, *window) for size, b, e, window in axes))
    padded = ctx.graph.make_value(ctx.name + "/same_pad", x.dtype, shape)
    attrs = {"pads": [0, 0, *pads[:n], 0, 0, *pads[n:]], "mode": "constant", "value": value}
    node = ctx.node("Pad", [x], attrs, outputs=[padded], name=ctx.graph.unique_name(ctx.name + "/same_pad"))
    return [node], padded, shape[2:], [0] * (2 * n)


@register("MaxPool", "AveragePool", "LpPool")
def _pool(ctx: CanonContext) -> list[Node]:
    spatial = spatial_dims(ctx)
    n = len(spatial)
    kernel, strides, dilations = window_attrs(ctx, n)
    ceil_mode = int(ctx.attr("ceil_mode", 0))
    if ceil_mode and _same_ceil_is_floor(ctx, spatial, _windows(kernel, strides, dilations)):
        ceil_mode = 0
    value = _pad_value(ctx, ceil_mode)
    pads = resolve_pads(ctx, spatial, kernel, strides, dilations, symbolic_ok=value is not None)
    windows = _windows(kernel, strides, dilations)
    padding, x, spatial, pads = _pad_node(ctx, pads, value or 0.0, windows)
    include = int(ctx.attr("count_include_pad", 0)) if ctx.op_type == "AveragePool" else 0
    if include and ceil_mode == 1 and _counted_pads_fit(spatial, pads, windows):
        # ceil mode counting the declared pads but not ceil mode's extra cells, over a run-time
        # size: the declared pads as a Pad node of zeros, the pool counting its padded input
        padding, x, spatial, pads = _pad_node(ctx, pads, 0.0, windows, force=True)
        include = 0
    if ceil_mode == 1 and any(is_symbolic(size) for size in spatial) and not include:
        # ceil mode over a run-time size: floor mode with the end pads that give the same windows
        # at every size (a pad that never counts changes nothing but the output size)
        ends = zip(kernel, strides, dilations, pads[n:], strict=True)
        pads = pads[:n] + [floor_mode_end(k, s, d, e) for k, s, d, e in ends]
        ceil_mode = 0
    axes = list(zip(spatial, kernel, strides, dilations, pads[:n], pads[n:], strict=True))
    check_output(ctx, [pool_out_size(size, k, s, d, b, e, ceil_mode) for size, k, s, d, b, e in axes])
    attrs: dict[str, Any] = {"kernel_shape": kernel, "strides": strides, "pads": pads, "ceil_mode": ceil_mode}
    if ctx.op_type == "MaxPool":
        attrs["dilations"] = dilations
        attrs["storage_order"] = int(ctx.attr("storage_order", 0))
    elif ctx.op_type == "AveragePool":
        attrs["count_include_pad"] = include
        attrs["dilations"] = dilations
    else:
        attrs["p"] = int(ctx.attr("p", 2))
        attrs["dilations"] = dilations
    # MaxPool's optional Indices output is kept only when the model uses it.
    keep = 2 if _indices_used(ctx) else 1
    return [*padding, ctx.node(ctx.op_type, [x], attrs, outputs=ctx.outputs[:keep])]


def _same_ceil_is_floor(ctx: CanonContext, spatial: tuple[Any, ...], windows: list[tuple[int, int]]) -> bool:
    """Whether ceil mode is floor mode for this pool over a run-time size: SAME pads of an extent
    at least the stride make ``size + pads - extent`` a multiple of the stride at every size."""
    same = str(ctx.attr("auto_pad", "NOTSET")) in ("SAME_UPPER", "SAME_LOWER")
    return same and any(is_symbolic(size) for size in spatial) and all(span >= s for span, s in windows)


def _windows(kernel: list[int], strides: list[int], dilations: list[int]) -> list[tuple[int, int]]:
    return [(extent(k, d), s) for k, s, d in zip(kernel, strides, dilations, strict=True)]


def _indices_used(ctx: CanonContext) -> bool:
    return ctx.op_type == "MaxPool" and any(v.name in ctx.used for v in ctx.outputs[1:2])


def _pad_value(ctx: CanonContext, ceil_mode: int) -> float | None:
    """The value a Pad node before the pool fills (``_pad_node``): one that gives the pool's
    result (-inf for MaxPool, 0 where the padding counts as zeros); None where none does
    (AveragePool without count_include_pad divides by the real taps; MaxPool's indices would
    count the padding; ceil mode)."""
    x = ctx.inputs[0]
    if ceil_mode or _indices_used(ctx) or x is None or x.dtype is None or x.dtype.kind != "f":
        return None
    if ctx.op_type == "MaxPool":
        return float("-inf")
    return None if ctx.op_type == "AveragePool" and not int(ctx.attr("count_include_pad", 0)) else 0.0


def _counted_pads_fit(spatial: tuple[Any, ...], pads: list[Any], windows: list[tuple[int, int]]) -> bool:
    """Whether a ceil-mode AveragePool counting its declared pads can take them as a Pad node
    over a run-time size: static pads, and no window can start in the end pad (``end <= extent -
    stride``), where ceil mode drops a window that the padded input would keep."""
    n = len(spatial)
    return (any(is_symbolic(size) for size in spatial) and not any(is_symbolic(p) for p in pads)
            and all(e <= span - stride for e, (span, stride) in zip(pads[n:], windows, strict=True)))


@register("LRN")
def _lrn(ctx: CanonContext) -> list[Node]:
    if "size" not in ctx.attrs:
        raise ctx.error("size is required")
    return [ctx.node("LRN", ctx.inputs, {"alpha": float(ctx.attr("alpha", 1e-4)),
                                         "beta": float(ctx.attr("beta", 0.75)),
                                         "bias": float(ctx.attr("bias", 1.0)),
                                         "size": int(ctx.attrs["size"])})]
