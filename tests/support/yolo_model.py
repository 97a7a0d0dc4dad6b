"""A YOLOv8n-style detector in the form Ultralytics exports it (torch.onnx, opset 17), built with
``onnx.helper`` and seeded weights: the model of issues 17 (dynamic shapes) and 19 (speed).

The architecture is ``yolov8.yaml`` at scale n (``width_multiple`` 0.25, ``depth_multiple`` 0.33):
Conv (BatchNorm folded into the Conv's bias, SiLU exported as ``Sigmoid`` + ``Mul``), C2f blocks as
the exporter's ``forward_split`` writes them (Conv 1x1, ``Split`` in two, bottlenecks on the last
half, ``Concat``, Conv 1x1), SPPF (three 5x5 stride-1 MaxPools), ``nn.Upsample`` (``Resize``
nearest, scales 2) + ``Concat`` in the PAN neck, and the decoupled Detect head per stride 8 / 16 /
32 (box branch to ``4 * reg_max`` = 64 channels, class branch to 80), then ``Detect._inference``:
per-level Reshape to ``(batch, 144, -1)``, Concat, Split 64 / 80, the DFL (Reshape to
``(b, 4, 16, A)``, Transpose, Softmax, a 1x1 Conv with weights ``arange(16)``, Reshape to
``(b, 4, A)``), dist2bbox (``chunk`` exported as two Slices; Sub, Add, Div, Sub, Concat; Mul by
the strides), Sigmoid on the class logits, output ``output0`` of shape ``(batch, 84, A)``.

Static (``dynamic=False``): shapes folded, as a static-shape export gives -- Reshape targets and
the anchor / stride grids are constants for the given size. ``dynamic=True``: the input has
dim_params ``batch``, ``height``, ``width`` (output ``batch``, 84, ``anchors``) and everything
shape-dependent is computed in the graph as the exporter traces it: Reshape targets from
``Shape`` -> ``Gather`` -> ``Unsqueeze`` -> ``Concat``, ``chunk`` as ``prim::ConstantChunk``'s
Shape / Gather / Add / Div / Mul feeding the Slices, and ``make_anchors`` per level: ``Shape`` ->
``Gather`` h and w, ``Cast`` -> ``Range`` (+ 0.5), torch's meshgrid (Reshape, Shape, Concat,
Expand), stack (Unsqueeze, Concat), ``view(-1, 2)``, ``torch.full`` as ``ConstantOfShape``.

Weights: He-scaled with SiLU's gain so activations stay O(1), small folded-BN biases; the last
1x1 convs of the head keep the box and class logits O(1), so float32 comparisons mean something.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

__all__ = ["yolov8n_model", "yolov8n_input", "STRIDES", "CLASSES", "REG_MAX"]

STRIDES = (8, 16, 32)
CLASSES = 80
REG_MAX = 16
_SILU_GAIN = 2.8  # 1 / E[silu(z)^2] for z ~ N(0, 1): keeps the variance through Conv + SiLU


def _width(channels: int, multiple: float) -> int:
    """Ultralytics' ``make_divisible(min(c, 1024) * width_multiple, 8)``."""
    return int(math.ceil(min(channels, 1024) * multiple / 8) * 8)


def _depth(n: int, multiple: float) -> int:
    return max(round(n * multiple), 1)


class _Graph:
    """Nodes, initializers and names as torch.onnx writes them (``/model.4/m.0/cv1/conv/Conv``)."""

    def __init__(self, seed: int, dynamic: bool) -> None:
        self.rng = np.random.default_rng(seed)
        self.dynamic = dynamic
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.counts: dict[str, int] = {}

    def node(self, op: str, inputs: list[str], scope: str, outputs: int = 1, **attrs: Any) -> list[str]:
        count = self.counts.get(f"{scope}/{op}", 0)
        self.counts[f"{scope}/{op}"] = count + 1
        name = f"{scope}/{op}" + (f"_{count}" if count else "")
        outs = [f"{name}_output_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=name, **attrs))
        return outs

    def op(self, op: str, inputs: list[str], scope: str, **attrs: Any) -> str:
        return self.node(op, inputs, scope, **attrs)[0]

    def const(self, value: Any, scope: str, dtype: Any = np.int64) -> str:
        """A ``Constant`` node, as the exporter's symbolics emit small tensors."""
        array = np.asarray(value, dtype=dtype)
        return self.op("Constant", [], scope, value=numpy_helper.from_array(array))

    def init(self, name: str, array: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(array.astype(np.float32), name))
        return name

    def conv(self, x: str, scope: str, cin: int, cout: int, k: int, s: int = 1, act: bool = True,
             gain: float = _SILU_GAIN, bias: float = 0.1) -> str:
        """``Conv(c1, c2, k, s)`` with its BatchNorm folded in, then SiLU (``act``); or a plain
        ``nn.Conv2d`` with bias (``act=False``, the head's last layers)."""
        conv = f"{scope}/conv" if act else scope
        w = self.init(f"model{conv.replace('/', '.')}.weight",
                      self.rng.standard_normal((cout, cin, k, k)) * math.sqrt(gain / (cin * k * k)))
        b = self.init(f"model{conv.replace('/', '.')}.bias", self.rng.standard_normal(cout) * bias)
        y = self.op("Conv", [x, w, b], conv, dilations=[1, 1], group=1, kernel_shape=[k, k],
                    pads=[k // 2] * 4, strides=[s, s])
        if not act:
            return y
        return self.op("Mul", [y, self.op("Sigmoid", [y], f"{scope}/act")], f"{scope}/act")

    def c2f(self, x: str, scope: str, cin: int, cout: int, n: int, shortcut: bool) -> str:
        """``C2f.forward_split``: cv1, Split in two halves, n bottlenecks on the last, Concat, cv2."""
        c = cout // 2
        y = self.conv(x, f"{scope}/cv1", cin, 2 * c, 1)
        parts = self.node("Split", [y, self.const([c, c], scope)], scope, outputs=2, axis=1)
        for i in range(n):
            m = f"{scope}/m.{i}"
            z = self.conv(self.conv(parts[-1], f"{m}/cv1", c, c, 3), f"{m}/cv2", c, c, 3)
            parts.append(self.op("Add", [parts[-1], z], m) if shortcut else z)
        return self.conv(self.op("Concat", parts, scope, axis=1), f"{scope}/cv2", (2 + n) * c, cout, 1)

    def sppf(self, x: str, scope: str, cin: int, cout: int) -> str:
        parts = [self.conv(x, f"{scope}/cv1", cin, cin // 2, 1)]
        for _ in range(3):
            parts.append(self.op("MaxPool", [parts[-1]], f"{scope}/m", ceil_mode=0, dilations=[1, 1],
                                 kernel_shape=[5, 5], pads=[2, 2, 2, 2], strides=[1, 1]))
        return self.conv(self.op("Concat", parts, scope, axis=1), f"{scope}/cv2", 2 * cin, cout, 1)

    def upsample(self, x: str, scope: str) -> str:
        scales = self.const([1.0, 1.0, 2.0, 2.0], scope, np.float32)
        return self.op("Resize", [x, "", scales], scope, coordinate_transformation_mode="asymmetric",
                       cubic_coeff_a=-0.75, mode="nearest", nearest_mode="floor")

    def dim(self, x: str, index: int | list[int], scope: str) -> str:
        """``x.shape[index]``: Shape -> Gather (a scalar for an int index, 1-D for a list)."""
        return self.op("Gather", [self.op("Shape", [x], scope), self.const(index, scope)], scope, axis=0)

    def shape_of(self, scope: str, *dims: str | int) -> str:
        """A ``view`` target: a constant where every dim is known, else Unsqueeze + Concat."""
        if all(isinstance(d, int) for d in dims):
            return self.const(list(dims), scope)
        parts = [self.op("Unsqueeze", [d, self.const([0], scope)], scope) if isinstance(d, str)
                 else self.const([d], scope) for d in dims]
        return self.op("Concat", parts, scope, axis=0)


def _backbone_and_neck(g: _Graph, w: float, d: float) -> list[tuple[str, int]]:
    """Layers 0-21 of yolov8.yaml; returns the P3 / P4 / P5 outputs with their channel counts."""
    c = {k: _width(k, w) for k in (64, 128, 256, 512, 1024)}
    x = g.conv("images", "/model.0", 3, c[64], 3, 2)
    x = g.conv(x, "/model.1", c[64], c[128], 3, 2)
    x = g.c2f(x, "/model.2", c[128], c[128], _depth(3, d), True)
    x = g.conv(x, "/model.3", c[128], c[256], 3, 2)
    p3 = g.c2f(x, "/model.4", c[256], c[256], _depth(6, d), True)
    x = g.conv(p3, "/model.5", c[256], c[512], 3, 2)
    p4 = g.c2f(x, "/model.6", c[512], c[512], _depth(6, d), True)
    x = g.conv(p4, "/model.7", c[512], c[1024], 3, 2)
    x = g.c2f(x, "/model.8", c[1024], c[1024], _depth(3, d), True)
    p5 = g.sppf(x, "/model.9", c[1024], c[1024])
    x = g.op("Concat", [g.upsample(p5, "/model.10"), p4], "/model.11", axis=1)
    h4 = g.c2f(x, "/model.12", c[1024] + c[512], c[512], _depth(3, d), False)
    x = g.op("Concat", [g.upsample(h4, "/model.13"), p3], "/model.14", axis=1)
    o3 = g.c2f(x, "/model.15", c[512] + c[256], c[256], _depth(3, d), False)
    x = g.op("Concat", [g.conv(o3, "/model.16", c[256], c[256], 3, 2), h4], "/model.17", axis=1)
    o4 = g.c2f(x, "/model.18", c[256] + c[512], c[512], _depth(3, d), False)
    x = g.op("Concat", [g.conv(o4, "/model.19", c[512], c[512], 3, 2), p5], "/model.20", axis=1)
    o5 = g.c2f(x, "/model.21", c[512] + c[1024], c[1024], _depth(3, d), False)
    return [(o3, c[256]), (o4, c[512]), (o5, c[1024])]


def _branches(g: _Graph, feats: list[tuple[str, int]]) -> list[str]:
    """Per level: ``cat(cv2[i](x), cv3[i](x))`` -> ``(b, 144, h, w)``."""
    s = "/model.22"
    c2, c3 = max(16, feats[0][1] // 4, 4 * REG_MAX), max(feats[0][1], min(CLASSES, 100))
    out = []
    for i, (x, ch) in enumerate(feats):
        branches = []
        for name, mid, cout in ((f"cv2.{i}", c2, 4 * REG_MAX), (f"cv3.{i}", c3, CLASSES)):
            y = g.conv(g.conv(x, f"{s}/{name}/{name}.0", ch, mid, 3), f"{s}/{name}/{name}.1", mid, mid, 3)
            branches.append(g.conv(y, f"{s}/{name}/{name}.2", mid, cout, 1, act=False, gain=1.0, bias=0.5))
        out.append(g.op("Concat", branches, s, axis=1))
    return out


def _static_anchors(height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """``make_anchors`` at a known size, transposed and unsqueezed: ``(1, 2, A)`` and ``(1, A)``."""
    points, strides = [], []
    for stride in STRIDES:
        h, w = height // stride, width // stride
        sy, sx = np.meshgrid(np.arange(h) + 0.5, np.arange(w) + 0.5, indexing="ij")
        points.append(np.stack((sx, sy), -1).reshape(-1, 2))
        strides.append(np.full((h * w, 1), stride))
    return np.concatenate(points).T[None].astype(np.float32), np.concatenate(strides).T.astype(np.float32)


def _dynamic_anchors(g: _Graph, levels: list[str]) -> tuple[str, str]:
    """``make_anchors`` traced: the grids from each level's Shape, as the dynamic export has them."""
    s = "/model.22"
    points, strides = [], []
    for level, stride in zip(levels, STRIDES, strict=True):
        h, w = g.dim(level, 2, s), g.dim(level, 3, s)
        start, delta, half = (g.const(v, s, np.float32) for v in (0.0, 1.0, 0.5))
        sx, sy = (g.op("Add", [g.op("Range", [start, g.op("Cast", [n], s, to=TensorProto.FLOAT), delta], s),
                               half], s) for n in (w, h))
        # torch.meshgrid(sy, sx, indexing="ij") as opset 9's symbolic writes it
        flat = [g.op("Reshape", [t, g.const([-1], s)], s) for t in (sy, sx)]
        dims = [g.op("Shape", [t], s) for t in flat]
        grid = g.op("Concat", dims, s, axis=0)
        one = g.const([1], s)
        gy, gx = (g.op("Expand", [g.op("Reshape", [t, g.op("Concat", target, s, axis=0)], s), grid], s)
                  for t, target in ((flat[0], [dims[0], one]), (flat[1], [one, dims[1]])))
        stacked = g.op("Concat", [g.op("Unsqueeze", [t, g.const([-1], s)], s) for t in (gx, gy)], s, axis=-1)
        points.append(g.op("Reshape", [stacked, g.const([-1, 2], s)], s))
        count = g.op("Unsqueeze", [g.op("Mul", [h, w], s), g.const([0], s)], s)
        strides.append(g.op("ConstantOfShape", [g.op("Concat", [count, g.const([1], s)], s, axis=0)], s,
                            value=numpy_helper.from_array(np.array([stride], np.float32))))
    anchors = g.op("Transpose", [g.op("Concat", points, s, axis=0)], s, perm=[1, 0])
    stride_row = g.op("Transpose", [g.op("Concat", strides, s, axis=0)], s, perm=[1, 0])
    return g.op("Unsqueeze", [anchors, g.const([0], s)], s), stride_row


def _detect(g: _Graph, feats: list[tuple[str, int]], batch: int, height: int, width: int) -> str:
    """``Detect._inference`` (Ultralytics 8.0-8.2): decoded xywh boxes and class scores."""
    s, no = "/model.22", 4 * REG_MAX + CLASSES
    levels = _branches(g, feats)
    anchors_count = sum((height // t) * (width // t) for t in STRIDES)
    b: str | int = g.dim(levels[0], 0, s) if g.dynamic else batch
    x_cat = g.op("Concat", [g.op("Reshape", [x, g.shape_of(s, b, no, -1)], s) for x in levels], s, axis=2)
    box, cls = g.node("Split", [x_cat, g.const([4 * REG_MAX, CLASSES], s)], s, outputs=2, axis=1)
    if g.dynamic:
        anchors, strides = _dynamic_anchors(g, levels)
    else:
        grid, row = _static_anchors(height, width)
        anchors, strides = g.init("/model.22/anchors", grid), g.init("/model.22/strides", row)
    dfl = f"{s}/dfl"
    a: str | int = anchors_count
    if g.dynamic:
        b, a = g.dim(box, 0, dfl), g.dim(box, 2, dfl)
    x = g.op("Reshape", [box, g.shape_of(dfl, b, 4, REG_MAX, a)], dfl)
    x = g.op("Softmax", [g.op("Transpose", [x], dfl, perm=[0, 2, 1, 3])], dfl, axis=1)
    weight = g.init("model.22.dfl.conv.weight", np.arange(REG_MAX, dtype=np.float32).reshape(1, -1, 1, 1))
    x = g.op("Conv", [x, weight], f"{dfl}/conv", dilations=[1, 1], group=1, kernel_shape=[1, 1],
             pads=[0, 0, 0, 0], strides=[1, 1])
    dist = g.op("Reshape", [x, g.shape_of(dfl, b, 4, a)], dfl)
    lt, rb = _chunk2(g, dist, s)
    x1y1, x2y2 = g.op("Sub", [anchors, lt], s), g.op("Add", [anchors, rb], s)
    c_xy = g.op("Div", [g.op("Add", [x1y1, x2y2], s), g.const(2.0, s, np.float32)], s)
    wh = g.op("Sub", [x2y2, x1y1], s)
    dbox = g.op("Mul", [g.op("Concat", [c_xy, wh], s, axis=1), strides], s)
    return g.op("Concat", [dbox, g.op("Sigmoid", [cls], s)], s, axis=1)


def _chunk2(g: _Graph, x: str, s: str) -> tuple[str, str]:
    """``x.chunk(2, 1)``: Slices, their ends from prim::ConstantChunk's shape arithmetic (dynamic)
    or folded to constants (static)."""
    axes = g.const([1], s)
    if not g.dynamic:
        return (g.op("Slice", [x, g.const([0], s), g.const([2], s), axes], s),
                g.op("Slice", [x, g.const([2], s), g.const([4], s), axes], s))
    size = g.dim(x, [1], s)
    chunk = g.op("Div", [g.op("Add", [size, g.const([1], s)], s), g.const([2], s)], s)
    mid, end = (g.op("Mul", [chunk, g.const([i], s)], s) for i in (1, 2))
    return (g.op("Slice", [x, g.const([0], s), mid, axes], s), g.op("Slice", [x, mid, end, axes], s))


def yolov8n_model(*, height: int = 320, width: int = 320, batch: int = 1, dynamic: bool = False,
                  seed: int = 0, width_multiple: float = 0.25,
                  depth_multiple: float = 0.33) -> onnx.ModelProto:
    """The detector for ``(batch, 3, height, width)`` images (multiples of 32); with ``dynamic``
    the sizes only name the model's nominal shape and the input dims are symbolic."""
    if height % 32 or width % 32 or height <= 0 or width <= 0:
        raise ValueError(f"height {height} and width {width} must be positive multiples of 32")
    g = _Graph(seed, dynamic)
    _detect(g, _backbone_and_neck(g, width_multiple, depth_multiple), batch, height, width)
    g.nodes[-1].output[0] = "output0"  # the final Concat
    anchors = sum((height // t) * (width // t) for t in STRIDES)
    dims: list[Any] = ["batch", 3, "height", "width"] if dynamic else [batch, 3, height, width]
    out_dims: list[Any] = ["batch", 4 + CLASSES, "anchors"] if dynamic else [batch, 4 + CLASSES, anchors]
    graph = helper.make_graph(g.nodes, "main_graph",
                              [helper.make_tensor_value_info("images", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("output0", TensorProto.FLOAT, out_dims)],
                              g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="pytorch")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def yolov8n_input(model: onnx.ModelProto, batch: int = 1, height: int | None = None, width: int | None = None,
                  seed: int = 0) -> dict[str, np.ndarray]:
    """An image batch in [0, 1) (Ultralytics feeds pixels / 255); sizes default to the model's."""
    dims = model.graph.input[0].type.tensor_type.shape.dim
    height = height if height is not None else dims[2].dim_value
    width = width if width is not None else dims[3].dim_value
    if not height or not width:
        raise ValueError("a dynamic model needs height and width")
    shape = (batch, 3, height, width)
    return {"images": np.random.default_rng(seed).random(shape, dtype=np.float32)}
