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
from compiler.providers.base import shape_of
from compiler.providers.c.common import PARALLEL_MIN_WORK
from compiler.providers.c.common import Arg
from compiler.providers.c.common import CKernel
from compiler.providers.c.common import StepCode
from compiler.providers.c.common import all_float32
from compiler.providers.c.common import params
from compiler.providers.c.common import scratch_arg
from compiler.providers.c.common import step_args
from compiler.providers.c.gemm import Epilogue
from compiler.providers.c.gemm import Tiling
from compiler.providers.c.gemm import activation
from compiler.providers.c.gemm import choose_tiling
from compiler.providers.c.gemm import fused_ok
from compiler.providers.c.gemm import packed_nbytes
from compiler.providers.geometry import ConvGeometry
from compiler.providers.geometry import claimed
from compiler.providers.kit import Param

__all__ = [
    "ConvContext",
    "DepthwiseContext",
    "ConvKernel",
    "conv_method",
    "conv_operands",
    "epilogue_operands_ok",
]


@dataclass(frozen=True)
class ConvContext:
    params: tuple[Param, ...]
    t: Tiling
    e: Epilogue
    g: ConvGeometry
    packed: bool
    parallel: bool


@dataclass(frozen=True)
class DepthwiseContext:
    params: tuple[Param, ...]
    e: Epilogue
    g: ConvGeometry  # one input channel per group; g.mg output channels each (channel multiplier)
    wp: int  # width of a zero-padded input row: pl zeros, the row, zeros up to the last tap
    parallel: bool


def conv_method(g: ConvGeometry) -> str:
    """ "depthwise", "direct" (1x1 / stride 1 / unpadded, unless a one-panel tail dominates),
    or "packed" (im2col)."""
    if g.one_channel_groups:
        return "depthwise"
    one = g.kh == g.kw == 1 and g.sh == g.sw == 1 and g.pt == g.pl == 0
    p = g.oh * g.ow
    return "direct" if one and (p % 16 == 0 or p >= 256) else "packed"


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
    args = [*step_args(step), *scratch]
    names += ["y"] + (["scratch"] if scratch else [])
    restrict += [False] + ([True] if scratch else [])
    return e, args, params(names, args, restrict)


class ConvKernel(CKernel):
    kinds: tuple[str, ...] = ("Conv", "onnx_aot.FusedConv")

    def supports(self, node: Node) -> bool:
        if not all_float32(node) or not fused_ok(node):
            return False
        g = ConvGeometry.from_node(node, "NCHW")
        if g is None:
            return False
        b, z = node.input(2), node.input(3)
        if b is not None and shape_of(b) != (g.m,):
            return False
        if z is not None and (node.domain != "onnx_aot" or shape_of(z) != shape_of(node.outputs[0])):
            return False
        return len(node.inputs) <= (4 if node.domain == "onnx_aot" else 3)

    def scratch_nbytes(self, node: Node) -> int:
        g = claimed(ConvGeometry.from_node(node, "NCHW"), node)
        return packed_nbytes(g.k, g.oh * g.ow) if conv_method(g) == "packed" else 0

    def build(self, step: StepPlan, target: TargetInfo) -> StepCode:
        node = step.node
        g = claimed(ConvGeometry.from_node(node, "NCHW"), node)
        e, args, step_params = conv_operands(step, "w", self.scratch_nbytes(node))
        method = conv_method(g)
        if method == "depthwise":
            dctx = DepthwiseContext(
                params=step_params,
                e=e,
                g=g,
                wp=max(g.pl + g.w, g.cols.reach),
                parallel=2 * g.batch * g.m * g.oh * g.ow * g.kh * g.kw >= PARALLEL_MIN_WORK,
            )
            return StepCode("c/depthwise.c.j2", dctx, tuple(args))
        t = choose_tiling(g.mg, g.oh * g.ow, g.k, target)
        ctx = ConvContext(
            params=step_params,
            t=t,
            e=e,
            g=g,
            packed=method == "packed",
            parallel=2 * g.batch * g.m * t.n * t.k >= PARALLEL_MIN_WORK,
        )
        return StepCode("c/conv.c.j2", ctx, tuple(args))


KERNELS = (ConvKernel(),)
