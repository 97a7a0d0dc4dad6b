"""The C Resize over run-time dims whose scales only a run knows (spatial_resize_runtime.c.j2).

A dynamic graph's Resize by ``sizes`` that is not a whole multiple of its input keeps ``sizes``
and a 0.0 scale per such axis (compiler/frontend/canonical/spatial.py); a static attribute scale
over a run-time size needs its taps at run time too. This kernel computes each axis's taps in C at
the start of the step with the reference kernel's arithmetic (``runtime.kernels.spatial``:
``resize_taps``), into scratch, then gathers (nearest) or blends two rows and two columns
(linear). Claimed: float32, only the last two axes resized, nearest or linear without antialias
or exclude_outside, any coordinate_transformation_mode but tf_crop_and_resize, stretch
(``keep_aspect_ratio_policy`` picks one scale from both axes: left to the reference kernel).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from compiler.ir.graph import Node
from compiler.providers.base import GenStep
from compiler.providers.base import shape_of
from compiler.providers.c.common import PARALLEL_MIN_WORK
from compiler.providers.c.common import StepCode
from compiler.providers.c.common import params
from compiler.providers.c.common import step_args
from compiler.providers.c.gemm import sized_scratch
from compiler.providers.c.rundims import parallel_if
from compiler.providers.c.rundims import run_dims
from compiler.providers.kit import KernelContext
from runtime.symbolic import Expr

__all__ = ["RuntimeResizeContext", "runtime_resize", "runtime_resize_scratch", "takes_runtime_scales"]

_MODES = frozenset({"align_corners", "asymmetric", "tf_half_pixel_for_nn", "pytorch_half_pixel", "half_pixel",
                    "half_pixel_symmetric"})


@dataclass(frozen=True)
class RuntimeResizeContext(KernelContext):
    outer: object  # ints, or CDim: C over the binding
    h: object
    w: object
    oh: object
    ow: object
    scale_h: str  # a C double: the attribute's scale, 0.0 for sizes / input at run time
    scale_w: str
    linear: bool
    coordinate_mode: str
    nearest_mode: str
    parallel: bool
    parallel_if: str


def takes_runtime_scales(node: Node) -> bool:
    """Whether this kernel takes the (float32, dynamic) Resize ``node``."""
    a = node.attrs
    if a.get("mode") not in ("nearest", "linear") or a.get("antialias") or a.get("exclude_outside"):
        return False
    if a.get("coordinate_transformation_mode") not in _MODES:
        return False
    if a.get("keep_aspect_ratio_policy", "stretch") != "stretch":
        return False
    xs, ys = shape_of(node.input(0), symbolic=True), shape_of(node.outputs[0], symbolic=True)
    scales = [float(s) for s in a.get("scales", ())]
    if len(xs) < 2 or len(ys) != len(xs) or len(scales) != len(xs):
        return False
    return list(ys[:-2]) == list(xs[:-2]) and all(s == 1.0 for s in scales[:-2])


def runtime_resize_scratch(node: Node) -> int | Expr:
    """Two int32 indices and two float weights per output row and column."""
    ys = shape_of(node.outputs[0], symbolic=True)
    return 16 * (ys[-2] + ys[-1])


def runtime_resize(step: GenStep) -> StepCode:
    node = step.node
    xs, ys = shape_of(node.input(0), symbolic=True), shape_of(node.outputs[0], symbolic=True)
    scales = [float(s) for s in node.attrs["scales"]]
    scratch = sized_scratch(step, runtime_resize_scratch(node))
    args = [*step_args(step), *scratch]
    rd = run_dims(step)
    work = rd.write(math.prod(ys) * 4)
    ctx = RuntimeResizeContext(
        params=params(["x", "y", "scratch"], args, [True, True, True]) + rd.params,
        outer=rd.write(math.prod(xs[:-2])),
        h=rd.write(xs[-2]),
        w=rd.write(xs[-1]),
        oh=rd.write(ys[-2]),
        ow=rd.write(ys[-1]),
        scale_h=repr(scales[-2]),
        scale_w=repr(scales[-1]),
        linear=node.attrs["mode"] == "linear",
        coordinate_mode=str(node.attrs["coordinate_transformation_mode"]),
        nearest_mode=str(node.attrs["nearest_mode"]),
        parallel=not isinstance(work, int) or work >= PARALLEL_MIN_WORK,
        parallel_if=parallel_if(work, PARALLEL_MIN_WORK),
    )
    return StepCode("c/spatial_resize_runtime.c.j2", ctx, (*args, *rd.args))
