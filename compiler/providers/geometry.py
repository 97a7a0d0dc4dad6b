"""Op geometry, computed once for every provider: convolution, pooling and matrix-product sizes.

A kernel's claim (``supports``), its scratch size and its template context all start from the
same record, read from the node here: :class:`ConvGeometry` (Conv, FusedConv, ConvNhwc),
:class:`WinogradGeometry` (WinogradConv, WinogradConvNhwc), :class:`ConvTransposeGeometry`,
:class:`PoolGeometry` (MaxPool / AveragePool and their NHWC forms) and :class:`MatmulProduct`
(Gemm, FusedGemm, MatMul). ``from_node(node, layout)`` returns None when the node is not one the
record describes (a missing or malformed attribute, an output shape other than the one the
attributes give, weights of another layout): a kernel then declines it, and the reference
provider runs it. Once a kernel has claimed the node, :func:`claimed` reads it back.

Windowed ops are described in 2-D, a 1-D op with a unit H axis (:meth:`Axis.unit`); ``rank``
keeps the node's own spatial rank. ``layout`` is "NCHW" (X is (N, C, *spatial), ONNX weights) or
"NHWC" (X is (N, H, W, C), weights packed by ``runtime/kernels/nhwc.py``). Every size comes from
``runtime/kernels/window.py``, the functions the reference kernels and the frontend use, so all
of them agree on every output size. Spatial sizes are typed ``Dim`` (an ``int`` today, a symbol
once shapes may be dynamic): the arithmetic on them is in that module's functions and in the few
properties here, nowhere in a provider.
"""

from __future__ import annotations

import itertools
import math
import operator
from dataclasses import dataclass
from typing import Literal
from typing import TypeVar

import numpy as np

from compiler.codegen.elementwise import broadcast_strides
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from runtime.errors import CompileError
from runtime.kernels.nhwc import PANEL
from runtime.kernels.window import Dim
from runtime.kernels.window import conv_out_size
from runtime.kernels.window import conv_transpose_out_size
from runtime.kernels.window import extent
from runtime.kernels.window import inside
from runtime.kernels.window import pool_out_size
from runtime.kernels.window import reach
from runtime.kernels.window import window_counts
from runtime.kernels.winograd import MATRICES
from runtime.symbolic import Expr
from runtime.symbolic import evaluate
from runtime.symbolic import free_symbols
from runtime.symbolic import simplify

__all__ = [
    "Axis",
    "ConvGeometry",
    "ConvTransposeGeometry",
    "Layout",
    "MatmulProduct",
    "PoolGeometry",
    "Spatial",
    "WinogradGeometry",
    "same_over_ranges",
    "claimed",
]

Layout = Literal["NCHW", "NHWC"]
G = TypeVar("G")


def claimed(geometry: G | None, node: Node) -> G:
    """The ``from_node`` result for a node its kernel has claimed (scratch size, code generation):
    a CompileError naming the node when the node no longer fits."""
    if geometry is None:
        raise CompileError(f"{node.describe()}: shapes or attributes no longer fit the kernel claiming it")
    return geometry


@dataclass(frozen=True)
class Axis:
    """One spatial axis of a windowed op: input ``size``, output ``out``, the window's taps and
    the pads (``begin`` before the input, ``end`` after it)."""

    size: Dim
    out: Dim
    kernel: int
    stride: int
    dilation: int
    begin: int
    end: int

    @classmethod
    def unit(cls) -> Axis:
        """The H axis of a 1-D op: one row, one tap."""
        return cls(1, 1, 1, 1, 1, 0, 0)

    @property
    def extent(self) -> int:
        """Elements one window covers."""
        return extent(self.kernel, self.dilation)

    @property
    def reach(self) -> Dim:
        """Length of the padded axis the windows address, from the first window's start."""
        return reach(self.out, self.kernel, self.stride, self.dilation)

    @property
    def padded(self) -> bool:
        """Whether some tap of some output falls outside the input."""
        return self.begin > 0 or self.reach > self.begin + self.size

    def inside(self) -> tuple[Dim, Dim]:
        """The outputs ``[lo, hi)`` whose windows lie wholly inside the input."""
        return inside(self.size, self.kernel, self.stride, self.dilation, self.begin, self.out)

    def counts(self, include_pad: bool) -> tuple[int, ...]:
        """AveragePool's divisor along this axis, per output (see ``window_counts``)."""
        return tuple(window_counts(self.size, self.kernel, self.stride, self.dilation, self.begin, self.end,
                                   self.out, include_pad))  # fmt: skip


class _Of:
    """A read-only name for one field of one axis: ``Spatial.kh`` is ``rows.kernel``."""

    def __init__(self, axis: str, field: str) -> None:
        self.axis, self.field = axis, field

    def __get__(self, obj: object, owner: type | None = None) -> Dim:
        value: Dim = getattr(getattr(obj, self.axis), self.field)
        return value


@dataclass(frozen=True)
class Spatial:
    """What every windowed op has: the layout, N and C of its input, and its two axes. The flat
    names (``h``, ``oh``, ``kh``, ``sh``, ``dh``, ``pt``, ``pb`` and the same for W) are what
    templates read."""

    layout: Layout
    rank: int  # spatial axes of the node (1: ``rows`` is a unit axis)
    batch: Dim
    c: Dim
    rows: Axis
    cols: Axis

    h = _Of("rows", "size")
    w = _Of("cols", "size")
    oh = _Of("rows", "out")
    ow = _Of("cols", "out")
    kh = _Of("rows", "kernel")
    kw = _Of("cols", "kernel")
    sh = _Of("rows", "stride")
    sw = _Of("cols", "stride")
    dh = _Of("rows", "dilation")
    dw = _Of("cols", "dilation")
    pt = _Of("rows", "begin")
    pl = _Of("cols", "begin")
    pb = _Of("rows", "end")
    pr = _Of("cols", "end")

    @property
    def kernel_shape(self) -> tuple[int, ...]:
        """The window as the node's attribute has it (one entry for a 1-D op)."""
        return (self.kh, self.kw)[2 - self.rank :]


def _shape(value: Value | None, symbolic: bool = False) -> tuple[int, ...] | None:
    """The value's dims; with ``symbolic`` a dynamic graph's dims stay expressions (``Expr``)."""
    if value is None or value.shape is None:
        return None
    if symbolic:
        return tuple(d if isinstance(d, Expr) else int(d) for d in value.shape)  # type: ignore[misc]
    return tuple(int(d) for d in value.shape)


def _ints(value: object, length: int) -> list[int] | None:
    if not isinstance(value, (list, tuple)) or len(value) != length:
        return None
    try:
        return [operator.index(v) for v in value]
    except TypeError:
        return None


@dataclass(frozen=True)
class _Window:
    """A windowed node's X and Y dims in NCHW order and its attributes, checked for shape."""

    rank: int
    x: tuple[int, ...]  # (N, C, *spatial)
    y: tuple[int, ...]
    kernel: list[int]
    strides: list[int]
    dilations: list[int]
    pads: list[int]

    @staticmethod
    def read(node: Node, layout: Layout, ranks: tuple[int, ...], symbolic: bool = False) -> _Window | None:
        """X / Y / attributes of a one-output node with a spatial rank in ``ranks``; with
        ``symbolic``, N and the spatial dims may be expressions (channels stay static)."""
        xs = _shape(node.input(0), symbolic)
        ys = _shape(node.outputs[0], symbolic) if len(node.outputs) == 1 else None
        if xs is None or ys is None or len(xs) != len(ys) or len(xs) - 2 not in ranks:
            return None
        ch = 1 if layout == "NCHW" else -1  # channels stay static
        if symbolic and (isinstance(xs[ch], Expr) or isinstance(ys[ch], Expr)):
            return None
        if layout == "NHWC":
            if len(xs) != 4:
                return None
            xs, ys = (xs[0], xs[3], *xs[1:3]), (ys[0], ys[3], *ys[1:3])
        rank = len(xs) - 2
        a = node.attrs
        kernel, strides = _ints(a.get("kernel_shape"), rank), _ints(a.get("strides"), rank)
        dilations = _ints(a["dilations"], rank) if "dilations" in a else [1] * rank
        pads = _ints(a.get("pads"), 2 * rank)
        if kernel is None or strides is None or dilations is None or pads is None:
            return None
        sizes = [d for d in xs[2:] + ys[2:] if not isinstance(d, Expr)]
        if min(kernel) < 1 or min(strides) < 1 or min(dilations) < 1 or min(sizes, default=1) < 1:
            return None
        return _Window(rank, xs, ys, kernel, strides, dilations, pads)

    def axes(self, outs: list[int] | None = None) -> tuple[Axis, Axis]:
        """(rows, cols), with ``outs`` as the output sizes (default: Y's)."""
        outs = list(self.y[2:]) if outs is None else outs
        made = [Axis(self.x[2 + d], outs[d], self.kernel[d], self.strides[d], self.dilations[d],
                     self.pads[d], self.pads[self.rank + d]) for d in range(self.rank)]  # fmt: skip
        return (Axis.unit(), made[0]) if self.rank == 1 else (made[0], made[1])


@dataclass(frozen=True)
class PoolGeometry(Spatial):
    """MaxPool / AveragePool (and MaxPoolNhwc / AveragePoolNhwc): output sizes by ONNX's pool
    rule (:func:`runtime.kernels.window.pool_out_size`, ceil mode included)."""

    ceil_mode: int

    @classmethod
    def from_node(cls, node: Node, layout: Layout, symbolic: bool = False) -> PoolGeometry | None:
        win = _Window.read(node, layout, (1, 2), symbolic)
        ceil_mode = node.attrs.get("ceil_mode")
        if win is None or ceil_mode not in (0, 1) or min(win.pads) < 0 or win.y[:2] != win.x[:2]:
            return None
        if ceil_mode and any(isinstance(d, Expr) for d in win.x[2:]):
            return None  # ceil mode's last-window rule compares sizes: static ones only
        rows, cols = win.axes()
        for axis in (rows, cols):
            want = pool_out_size(axis.size, axis.kernel, axis.stride, axis.dilation, axis.begin, axis.end,
                                 int(ceil_mode))  # fmt: skip
            if axis.out != want:
                return None
        return cls(layout, win.rank, win.x[0], win.x[1], rows, cols, int(ceil_mode))


@dataclass(frozen=True)
class ConvGeometry(Spatial):
    """A convolution: ``m`` output channels in ``groups`` groups, output sizes by
    :func:`runtime.kernels.window.conv_out_size`. The weights (input 1) must have the layout's
    shape: ONNX (M, C/g, *kernel) for NCHW, ``pack_conv_weights``' panels (or depthwise (KH, KW, M))
    for NHWC."""

    m: Dim
    groups: int

    @property
    def cg(self) -> Dim:
        """Input channels per group."""
        return self.c // self.groups

    @property
    def mg(self) -> Dim:
        """Output channels per group."""
        return self.m // self.groups

    @property
    def k(self) -> Dim:
        """Products summed per output: a group's input channels times the window's taps."""
        return self.cg * self.kh * self.kw

    @property
    def one_channel_groups(self) -> bool:
        """Every group reads one input channel: depthwise, or with a channel multiplier (mg > 1)."""
        return self.groups > 1 and self.cg == 1

    @property
    def depthwise(self) -> bool:
        """One input and one output channel per group (M = C = groups)."""
        return self.one_channel_groups and self.mg == 1

    @property
    def weight_shape(self) -> tuple[int, ...]:
        """The weights' shape in this layout (see the class docstring)."""
        if self.layout == "NCHW":
            return (self.m, self.cg, *self.kernel_shape)
        if self.depthwise:
            return (self.kh, self.kw, self.m)
        return (self.groups, -(-self.mg // PANEL), self.kh, self.kw, self.cg, PANEL)

    @classmethod
    def from_node(cls, node: Node, layout: Layout) -> ConvGeometry | None:
        g = _conv(node, layout, (1, 2) if layout == "NCHW" else (2,))
        if g is None or _shape(node.input(1)) != g.weight_shape:
            return None
        return g

    @classmethod
    def from_symbolic_node(cls, node: Node, layout: Layout = "NCHW") -> ConvGeometry | None:
        """``from_node`` of a dynamic graph's node: N and the spatial sizes may be expressions
        (``Expr``), channels and weights are static."""
        g = _conv(node, layout, (1, 2) if layout == "NCHW" else (2,), symbolic=True)
        if g is None or _shape(node.input(1)) != g.weight_shape:
            return None
        return g


def _conv(node: Node, layout: Layout, ranks: tuple[int, ...], symbolic: bool = False) -> ConvGeometry | None:
    """The conv's geometry, its weights not yet checked."""
    win = _Window.read(node, layout, ranks, symbolic)
    group = node.attrs.get("group")
    if win is None or not isinstance(group, int) or group < 1 or min(win.pads) < 0:
        return None
    (n, c, *_), (ny, m, *_) = win.x, win.y
    if ny != n or c % group or m % group or min(c, m) < 1:
        return None
    rows, cols = win.axes()
    for axis in (rows, cols):
        want = conv_out_size(axis.size, axis.kernel, axis.stride, axis.dilation, axis.begin, axis.end)
        if axis.out != want and not same_over_ranges(axis.out, want, node):
            return None
    return ConvGeometry(layout, win.rank, n, c, rows, cols, m, group)


# Most bindings ``same_over_ranges`` evaluates two expressions at to compare them.
_MAX_EQUALITY_BINDINGS = 1 << 12


def same_over_ranges(a: Dim, b: Dim, node: Node) -> bool:
    """Whether dims ``a`` and ``b`` (expressions of a dynamic graph's symbols) are equal at every
    binding of the ranges: equal once what the ranges decide is folded (an output size that is 2
    for every input size in range), or, over few enough bindings, equal at each of them (the
    import's fit of a strided size, ``sequence//64-5``, against the rule's ``(sequence-192)//128+1``
    for ``sequence`` in 512..576)."""
    graph = node.graph
    if graph is None or not (isinstance(a, Expr) or isinstance(b, Expr)):
        return False
    ranges = graph.symbols
    if simplify(a, ranges) == simplify(b, ranges):
        return True
    names = sorted(free_symbols(a) | free_symbols(b))
    if any(n not in ranges for n in names):
        return False
    spans = [range(ranges[n][0], ranges[n][1] + 1) for n in names]
    if math.prod(len(r) for r in spans) > _MAX_EQUALITY_BINDINGS:
        return False
    bindings = (dict(zip(names, point, strict=True)) for point in itertools.product(*spans))
    return all(evaluate(a, binding) == evaluate(b, binding) for binding in bindings)


@dataclass(frozen=True)
class WinogradGeometry(ConvGeometry):
    """A 3x3, stride-1 conv run as Winograd F(tile x tile, 3x3): weights transformed ahead of time
    (``U``: (a^2, M, C) for NCHW, ``pack_winograd_weights``' (a^2, P, C, PANEL) for NHWC, a = tile
    + 2); pads of at most 2, so every tile's input patch overlaps the input."""

    tile: int

    @property
    def th(self) -> Dim:
        """Rows of tiles per image."""
        return -(-self.oh // self.tile)

    @property
    def tw(self) -> Dim:
        """Tiles per row."""
        return -(-self.ow // self.tile)

    @staticmethod
    def fits(g: ConvGeometry) -> bool:
        """Whether Winograd F(m x m, 3x3) computes the conv ``g``: 2-D, 3x3, stride 1, dilation 1,
        one group, pads of at most 2 (what ``passes/use_winograd.py`` lowers, what the kernels run)."""
        return (g.rank == 2 and g.groups == 1 and max(g.pt, g.pl, g.pb, g.pr) <= 2
                and (g.kh, g.kw, g.sh, g.sw, g.dh, g.dw) == (3, 3, 1, 1, 1, 1))  # fmt: skip

    @classmethod
    def from_node(cls, node: Node, layout: Layout, symbolic: bool = False) -> WinogradGeometry | None:  # type: ignore[override]
        """The Winograd conv; with ``symbolic``, N and the spatial sizes may be expressions."""
        g, us = _conv(node, layout, (2,), symbolic), _shape(node.input(1))
        if g is None or us is None or (isinstance(g.batch, int) and g.batch < 1) or not cls.fits(g):
            return None
        tile = next((t for t in MATRICES if (t + 2) ** 2 == us[0]), None) if us else None
        if tile is None:
            return None
        want = (g.m, g.c) if layout == "NCHW" else (-(-g.m // PANEL), g.c, PANEL)
        if us[1:] != want:
            return None
        return cls(g.layout, g.rank, g.batch, g.c, g.rows, g.cols, g.m, g.groups, tile)


@dataclass(frozen=True)
class ConvTransposeGeometry(ConvGeometry):
    """A ConvTranspose (NCHW): input ``i`` feeds output ``i * stride + j * dilation - begin``;
    weights (C, M/g, *kernel); output sizes by :func:`runtime.kernels.window.conv_transpose_out_size`
    with the node's ``output_padding``. Here ``rows.size`` / ``cols.size`` are the input's sizes and
    ``out`` the output's, as for a conv."""

    @property
    def weight_shape(self) -> tuple[int, ...]:
        """(C, M/g, *kernel), as ONNX has them."""
        return (self.c, self.mg, *self.kernel_shape)

    @classmethod
    def from_node(cls, node: Node, layout: Layout, symbolic: bool = False) -> ConvTransposeGeometry | None:
        """The geometry; with ``symbolic`` (a dynamic graph's node) N and the spatial sizes may be
        expressions, channels and weights static."""
        win = _Window.read(node, layout, (1, 2) if layout == "NCHW" else (), symbolic)
        group = node.attrs.get("group")
        padding = _ints(node.attrs.get("output_padding", [0] * win.rank), win.rank) if win else None
        if win is None or padding is None or not isinstance(group, int) or group < 1:
            return None
        (n, c, *_), (ny, m, *_) = win.x, win.y
        if ny != n or c % group or m % group or min(c, m) < 1 or (not isinstance(n, Expr) and n < 1):
            return None
        rows, cols = win.axes()
        for axis, op in zip((rows, cols)[2 - win.rank :], padding, strict=True):
            want = conv_transpose_out_size(axis.size, axis.kernel, axis.stride, axis.dilation, axis.begin,
                                           axis.end, op)  # fmt: skip
            if axis.out != want and not same_over_ranges(axis.out, want, node):
                return None
        g = cls(layout, win.rank, n, c, rows, cols, m, group)
        return g if _shape(node.input(1)) == g.weight_shape else None


@dataclass(frozen=True)
class MatmulProduct:
    """Gemm / FusedGemm / MatMul as one (batched) product Y[b] = A[b] (m x k) times B[b] (k x n).

    ``sam``, ``sak`` / ``sbk``, ``sbn``: strides of A's rows and columns and of B's, in elements
    (a transpose is a stride). MatMul's batches broadcast: ``batch`` is Y's batch shape,
    ``a_batch`` / ``b_batch`` the strides (in whole matrices, 0 along a broadcast axis) of A's and
    B's batch axes over it. A 1-D A is one row, a 1-D B one column.
    """

    m: Dim
    n: Dim
    k: Dim
    sam: int
    sak: int
    sbk: int
    sbn: int
    batch: tuple[Dim, ...]
    a_batch: tuple[int, ...]
    b_batch: tuple[int, ...]

    @classmethod
    def from_node(cls, node: Node, symbolic: bool = False) -> MatmulProduct | None:
        """The product, or None when the shapes (and Gemm's attributes) do not make one; with
        ``symbolic`` a Gemm's dims may be expressions (a dynamic graph's)."""
        a, b = _shape(node.input(0), symbolic), _shape(node.input(1), symbolic)
        y = _shape(node.outputs[0], symbolic)
        if a is None or b is None or y is None:
            return None
        return _matmul(a, b, y) if node.op_type == "MatMul" else _gemm(node, a, b, y)


def _gemm(node: Node, a: tuple[int, ...], b: tuple[int, ...], y: tuple[int, ...]) -> MatmulProduct | None:
    if len(a) != 2 or len(b) != 2:
        return None
    ta, tb = node.attrs.get("transA"), node.attrs.get("transB")
    if ta not in (0, 1) or tb not in (0, 1):
        return None
    m, k = (a[1], a[0]) if ta else a
    kb, n = (b[1], b[0]) if tb else b
    if k != kb or y != (m, n):
        return None
    sam, sak = (1, m) if ta else (k, 1)
    sbk, sbn = (1, k) if tb else (n, 1)
    return MatmulProduct(m, n, k, sam, sak, sbk, sbn, (), (), ())


def _matmul(a: tuple[int, ...], b: tuple[int, ...], y: tuple[int, ...]) -> MatmulProduct | None:
    if not a or not b:
        return None
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    (m, k), (kb, n) = a2[-2:], b2[-2:]
    if k != kb:
        return None
    try:
        batch = tuple(int(d) for d in np.broadcast_shapes(a2[:-2], b2[:-2]))
    except ValueError:
        return None
    if y != batch + ((m,) if len(a) > 1 else ()) + ((n,) if len(b) > 1 else ()):
        return None
    return MatmulProduct(m, n, k, k, 1, n, 1, batch, broadcast_strides(a2[:-2], batch),
                         broadcast_strides(b2[:-2], batch))  # fmt: skip
