"""C kernels for Conv / FusedConv (2-D NCHW; 1-D as H = 1).

Three methods, chosen from the node alone (so ``scratch_nbytes`` needs no target):

- "packed": im2col of each image and group into the GEMM tile's panels in scratch, then the
  register-blocked tile (``gemm``) with bias, residual and activation in its epilogue;
- "direct": a 1x1, stride-1, unpadded conv reads X in place as the tile's B (no scratch);
- "depthwise": one input channel per group (depthwise, or with a channel multiplier): a direct
  loop per output plane, vectorized along the output row, same epilogue.
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.codegen.toolchain import TargetInfo
from compiler.ir.graph import Node
from compiler.providers.base import StepPlan
from compiler.providers.c.common import (
    PARALLEL_MIN_WORK,
    Arg,
    Param,
    StepCode,
    all_float32,
    comment,
    fn_name,
    input_args,
    output_args,
    params,
    register,
    scratch_arg,
    shape_of,
)
from compiler.providers.c.gemm import Epilogue, Tiling, activation, choose_tiling, fused_ok, packed_nbytes

__all__ = ["ConvContext", "DepthwiseContext", "ConvKernel", "conv_operands", "epilogue_operands_ok"]


@dataclass(frozen=True)
class ConvContext:
    fn: str
    comment: str
    params: tuple[Param, ...]
    t: Tiling
    e: Epilogue
    batch: int
    c: int
    h: int
    w: int
    m: int
    oh: int
    ow: int
    groups: int
    cg: int
    mg: int
    kh: int
    kw: int
    sh: int
    sw: int
    pt: int
    pl: int
    dh: int
    dw: int
    packed: bool
    parallel: bool


@dataclass(frozen=True)
class DepthwiseContext:
    fn: str
    comment: str
    params: tuple[Param, ...]
    e: Epilogue
    batch: int
    c: int
    h: int
    w: int
    m: int
    oh: int
    ow: int
    mg: int  # output channels per group (channel multiplier)
    kh: int
    kw: int
    sh: int
    sw: int
    pt: int
    pl: int
    dh: int
    dw: int
    wp: int  # width of a zero-padded input row: pl zeros, the row, zeros up to the last tap
    parallel: bool


@dataclass(frozen=True)
class _ConvGeometry:
    batch: int
    c: int
    h: int
    w: int
    m: int
    oh: int
    ow: int
    groups: int
    kh: int
    kw: int
    sh: int
    sw: int
    pt: int
    pl: int
    dh: int
    dw: int

    @property
    def k(self) -> int:
        return (self.c // self.groups) * self.kh * self.kw

    @property
    def method(self) -> str:
        """ "depthwise", "direct" (1x1 / stride 1 / unpadded, unless a one-panel tail dominates),
        or "packed" (im2col)."""
        if self.groups > 1 and self.c == self.groups:
            return "depthwise"
        one = self.kh == self.kw == 1 and self.sh == self.sw == 1 and self.pt == self.pl == 0
        p = self.oh * self.ow
        return "direct" if one and (p % 16 == 0 or p >= 256) else "packed"


def conv_geometry(node: Node) -> _ConvGeometry | None:
    """The conv as 2-D NCHW (1-D as H = 1), or None when it is not one the kernel handles."""
    x, wv = node.input(0), node.input(1)
    if x is None or wv is None or len(node.outputs) != 1:
        return None
    xs, ws, ys = shape_of(x), shape_of(wv), shape_of(node.outputs[0])
    a = node.attrs
    try:
        ks, strides, pads, dil, group = (
            list(a["kernel_shape"]),
            list(a["strides"]),
            list(a["pads"]),
            list(a["dilations"]),
            int(a["group"]),
        )
    except (KeyError, TypeError):
        return None
    rank = len(xs) - 2
    if rank not in (1, 2) or len(ws) != rank + 2 or len(ys) != rank + 2:
        return None
    if len(ks) != rank or len(strides) != rank or len(dil) != rank or len(pads) != 2 * rank:
        return None
    if tuple(ws[2:]) != tuple(ks) or group < 1 or xs[1] % group or ws[0] % group or ws[1] * group != xs[1]:
        return None
    if min(strides) < 1 or min(dil) < 1 or min(pads) < 0:
        return None
    for d in range(rank):
        span = (ks[d] - 1) * dil[d] + 1
        if ys[2 + d] != (xs[2 + d] + pads[d] + pads[rank + d] - span) // strides[d] + 1 or ys[2 + d] < 1:
            return None
    if ys[0] != xs[0] or ys[1] != ws[0]:
        return None
    if rank == 1:  # as 2-D with H = 1
        return _ConvGeometry(
            xs[0], xs[1], 1, xs[2], ws[0], 1, ys[2], group, 1, ks[0], 1, strides[0], 0, pads[0], 1, dil[0]
        )
    return _ConvGeometry(
        xs[0], xs[1], xs[2], xs[3], ws[0], ys[2], ys[3], group, ks[0], ks[1],
        strides[0], strides[1], pads[0], pads[1], dil[0], dil[1],
    )  # fmt: skip


def epilogue_operands_ok(node: Node, m: int) -> bool:
    """Whether a FusedConv-like node (X, W, B?, Z?) with ``m`` output channels is float32 with an
    epilogue the C kernels have (``fused_ok``), a bias of shape (m,) and a residual of the
    output's shape."""
    if not all_float32(node) or not fused_ok(node) or len(node.inputs) > 4:
        return False
    b, z = node.input(2), node.input(3)
    if b is not None and shape_of(b) != (m,):
        return False
    return z is None or shape_of(z) == shape_of(node.outputs[0])


def conv_operands(
    step: StepPlan, weights: str, scratch_nbytes: int
) -> tuple[Epilogue, list[Arg], tuple[Param, ...]]:
    """A (Fused)Conv-like step's epilogue, arguments and parameters: x, ``weights``, bias?, z?, y,
    scratch? (inputs X, W, B?, Z? as FusedConv has them; z may alias y, so it is not restrict)."""
    node = step.node
    has_bias, has_res = node.input(2) is not None, node.input(3) is not None
    e = Epilogue("", has_bias, "", 1, 0, has_res, activation(node), activation(node, vector=True))
    names = ["x", weights] + (["bias"] if has_bias else []) + (["z"] if has_res else [])
    restrict = [True, True] + ([True] if has_bias else []) + ([False] if has_res else [])
    scratch = scratch_arg(step, scratch_nbytes)
    args = [*input_args(step), *output_args(step), *scratch]
    names += ["y"] + (["scratch"] if scratch else [])
    restrict += [False] + ([True] if scratch else [])
    return e, args, params(names, args, restrict)


class ConvKernel:
    kinds: tuple[str, ...] = ("Conv", "onnx_aot.FusedConv")

    def supports(self, node: Node) -> bool:
        if not all_float32(node) or not fused_ok(node) or conv_geometry(node) is None:
            return False
        b, z = node.input(2), node.input(3)
        if b is not None and shape_of(b) != (shape_of(node.input(1))[0],):
            return False
        if z is not None and (node.domain != "onnx_aot" or shape_of(z) != shape_of(node.outputs[0])):
            return False
        return len(node.inputs) <= (4 if node.domain == "onnx_aot" else 3)

    def scratch_nbytes(self, node: Node) -> int:
        g = conv_geometry(node)
        assert g is not None, node.describe()
        return packed_nbytes(g.k, g.oh * g.ow) if g.method == "packed" else 0

    def build(self, step: StepPlan, target: TargetInfo) -> StepCode:
        node = step.node
        g = conv_geometry(node)
        assert g is not None, node.describe()
        mg = g.m // g.groups
        e, args, step_params = conv_operands(step, "w", self.scratch_nbytes(node))
        if g.method == "depthwise":
            dctx = DepthwiseContext(
                fn=fn_name(step),
                comment=comment(node),
                params=step_params,
                e=e,
                batch=g.batch,
                c=g.c,
                h=g.h,
                w=g.w,
                m=g.m,
                oh=g.oh,
                ow=g.ow,
                mg=mg,
                kh=g.kh,
                kw=g.kw,
                sh=g.sh,
                sw=g.sw,
                pt=g.pt,
                pl=g.pl,
                dh=g.dh,
                dw=g.dw,
                wp=max(g.pl + g.w, (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1),
                parallel=2 * g.batch * g.m * g.oh * g.ow * g.kh * g.kw >= PARALLEL_MIN_WORK,
            )
            return StepCode("c/depthwise.c.j2", dctx, dctx.fn, tuple(args))
        t = choose_tiling(mg, g.oh * g.ow, g.k, target)
        ctx = ConvContext(
            fn=fn_name(step),
            comment=comment(node),
            params=step_params,
            t=t,
            e=e,
            batch=g.batch,
            c=g.c,
            h=g.h,
            w=g.w,
            m=g.m,
            oh=g.oh,
            ow=g.ow,
            groups=g.groups,
            cg=g.c // g.groups,
            mg=mg,
            kh=g.kh,
            kw=g.kw,
            sh=g.sh,
            sw=g.sw,
            pt=g.pt,
            pl=g.pl,
            dh=g.dh,
            dw=g.dw,
            packed=g.method == "packed",
            parallel=2 * g.batch * g.m * t.n * t.k >= PARALLEL_MIN_WORK,
        )
        return StepCode("c/conv.c.j2", ctx, ctx.fn, tuple(args))


register(ConvKernel())
