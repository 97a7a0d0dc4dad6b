"""C kernels for Conv / FusedConv (2-D NCHW; 1-D as H = 1).

Three methods, chosen from the node alone (so ``scratch_nbytes`` needs no target):

- "packed": im2col of each image and group into the GEMM tile's panels in scratch, then the
  register-blocked tile (``gemm``) with bias, residual and activation in its epilogue;
- "direct": a 1x1, stride-1, unpadded conv reads X in place as the tile's B (no scratch);
- "depthwise": one input channel per group (depthwise, or with a channel multiplier): a direct
  loop per output plane, vectorized along the output row, same epilogue.

In a dynamic graph (run-time batch and spatial sizes, ``dynamic_geometry``) the same methods run
with those sizes as C locals read from the binding: "direct" for every 1x1 / stride-1 / unpadded
conv (its N is not known at compile time; its last panel is copied into scratch, zero-padded),
"packed" with a run-time panel count and last panel (``conv_dynamic.c.j2``), "depthwise" with
run-time rows and row length. A residual input (Z) is left to the reference kernels there.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import replace
from typing import Any
from typing import TypeVar

from compiler.codegen.cdims import CDim
from compiler.codegen.cdims import kernel_dims
from compiler.codegen.toolchain import TargetInfo
from compiler.ir.graph import Node
from compiler.providers.base import GenStep
from compiler.providers.base import shape_of
from compiler.providers.c.common import PARALLEL_MIN_WORK
from compiler.providers.c.common import Arg
from compiler.providers.c.common import CKernel
from compiler.providers.c.common import StepCode
from compiler.providers.c.common import all_float32
from compiler.providers.c.common import arg
from compiler.providers.c.common import dyn_arg
from compiler.providers.c.common import params
from compiler.providers.c.common import scratch_arg
from compiler.providers.c.common import step_args
from compiler.providers.c.gemm import MAX_PANEL
from compiler.providers.c.gemm import ROWS_OUTER_MAX_PANELS
from compiler.providers.c.gemm import Epilogue
from compiler.providers.c.gemm import Tiling
from compiler.providers.c.gemm import activation
from compiler.providers.c.gemm import choose_tiling
from compiler.providers.c.gemm import fused_ok
from compiler.providers.c.gemm import packed_nbytes
from compiler.providers.geometry import ConvGeometry
from compiler.providers.geometry import Spatial
from compiler.providers.geometry import claimed
from compiler.providers.kit import KernelContext
from compiler.providers.kit import Param
from runtime.contract import AOT_DOMAIN
from runtime.contract import FUSED_CONV
from runtime.errors import CompileError
from runtime.symbolic import Expr
from runtime.symbolic import bounds

__all__ = [
    "ConvContext",
    "DepthwiseContext",
    "ConvKernel",
    "DynamicConvContext",
    "conv_method",
    "Decls",
    "dynamic_geometry",
    "is_dynamic",
    "conv_operands",
    "dynamic_conv_operands",
    "epilogue_operands_ok",
    "pool_condition",
]


S = TypeVar("S", bound=Spatial)
Decls = tuple[tuple[str, str], ...]  # a dynamic kernel's run-time sizes: (C local, C expression)


@dataclass(frozen=True)
class ConvContext(KernelContext):
    t: Tiling
    e: Epilogue
    g: ConvGeometry
    packed: bool
    pool: str  # C condition: the step runs on the worker pool ("1", "0" or a run-time test)


@dataclass(frozen=True)
class DepthwiseContext(KernelContext):
    e: Epilogue
    g: ConvGeometry  # one input channel per group; g.mg output channels each (channel multiplier)
    wp: int | CDim  # width of a zero-padded input row: pl zeros, the row, zeros up to the last tap
    pool: str  # C condition: the planes run on the worker pool (threads only for enough work)
    decls: Decls = ()  # a dynamic node's run-time sizes
    ring: bool = False  # padded rows in a ring, each input row copied once (a dynamic node's)


@dataclass(frozen=True)
class DynamicConvContext(KernelContext):
    t: Tiling  # M, K and the register tile; its N fields are unused (N is a run-time size)
    e: Epilogue
    g: ConvGeometry  # run-time sizes as C locals (CDim), declared by ``decls``
    decls: Decls
    packed: bool
    pool: str  # C condition over the run's sizes: its work is enough for the worker pool
    rows_outer_max: int


def is_dynamic(node: Node) -> bool:
    """Whether some input or output of ``node`` has a run-time dim."""
    return any(v is not None and v.is_symbolic for v in (*node.inputs, *node.outputs))


def dynamic_geometry(g: S, symbols: tuple[str, ...]) -> tuple[S, Decls]:
    """``g`` with its run-time sizes (batch NB, H, W, OH, OW) replaced by C locals (``CDim``), and
    the declarations of those locals (name, C expression over the binding ``dyn``)."""
    write = kernel_dims(symbols)
    decls: list[tuple[str, str]] = []

    def local(name: str, d: Any) -> Any:
        if not isinstance(d, Expr):
            return d
        decls.append((name, str(write(d))))
        return CDim(name)

    rows = replace(g.rows, size=local("H", g.h), out=local("OH", g.oh))
    cols = replace(g.cols, size=local("W", g.w), out=local("OW", g.ow))
    return replace(g, batch=local("NB", g.batch), rows=rows, cols=cols), tuple(decls)


def pool_condition(work: int | CDim | Expr, least: int = PARALLEL_MIN_WORK) -> str:
    """The C condition under which a step of ``work`` scalar operations runs on the worker pool:
    "1" or "0" where the work is known at compile time, else its run-time test (a small run then
    calls its loop directly, at no cost)."""
    if isinstance(work, int):
        return "1" if work >= least else "0"
    return f"{work} >= {least}"


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
    if b is not None and shape_of(b, symbolic=True) != (m,):
        return False
    return z is None or shape_of(z, symbolic=True) == shape_of(node.outputs[0], symbolic=True)


def conv_operands(
    step: GenStep, weights: str, scratch_nbytes: int
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
    kinds: tuple[str, ...] = ("Conv", FUSED_CONV)
    dynamic = True  # run-time batch and spatial sizes (conv_dynamic.c.j2, depthwise.c.j2)

    def supports(self, node: Node) -> bool:
        if not all_float32(node) or not fused_ok(node):
            return False
        if is_dynamic(node):
            return self._supports_dynamic(node)
        g = ConvGeometry.from_node(node, "NCHW")
        if g is None:
            return False
        b, z = node.input(2), node.input(3)
        if b is not None and shape_of(b) != (g.m,):
            return False
        if z is not None and (node.domain != AOT_DOMAIN or shape_of(z) != shape_of(node.outputs[0])):
            return False
        return len(node.inputs) <= (4 if node.domain == AOT_DOMAIN else 3)

    @staticmethod
    def _supports_dynamic(node: Node) -> bool:
        g = ConvGeometry.from_symbolic_node(node)
        if g is None or node.input(3) is not None or len(node.inputs) > 3:
            return False
        b = node.input(2)
        return b is None or (not b.is_symbolic and shape_of(b) == (g.m,))

    def scratch_nbytes(self, node: Node) -> int | Expr:  # type: ignore[override]
        if is_dynamic(node):
            g = claimed(ConvGeometry.from_symbolic_node(node), node)
            return _dynamic_scratch(g, _dynamic_method(g))
        return _static_scratch(node)

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        if is_dynamic(node):
            return _build_dynamic(step, target)
        g = claimed(ConvGeometry.from_node(node, "NCHW"), node)
        e, args, step_params = conv_operands(step, "w", _static_scratch(node))
        method = conv_method(g)
        if method == "depthwise":
            dctx = DepthwiseContext(
                params=step_params,
                e=e,
                g=g,
                wp=max(g.pl + g.w, g.cols.reach),
                pool=pool_condition(2 * g.batch * g.m * g.oh * g.ow * g.kh * g.kw),
            )
            return StepCode("c/depthwise.c.j2", dctx, tuple(args))
        t = choose_tiling(g.mg, g.oh * g.ow, g.k, target)
        ctx = ConvContext(
            params=step_params,
            t=t,
            e=e,
            g=g,
            packed=method == "packed",
            pool=pool_condition(2 * g.batch * g.m * t.n * t.k),
        )
        return StepCode("c/conv.c.j2", ctx, tuple(args))


def _static_scratch(node: Node) -> int:
    g = claimed(ConvGeometry.from_node(node, "NCHW"), node)
    return packed_nbytes(g.k, g.oh * g.ow) if conv_method(g) == "packed" else 0


def _dynamic_method(g: ConvGeometry) -> str:
    if g.one_channel_groups:
        return "depthwise"
    one = g.kh == g.kw == 1 and g.sh == g.sw == 1 and g.pt == g.pl == 0 and g.pb == g.pr == 0
    return "direct" if one else "packed"


def _dynamic_scratch(g: ConvGeometry, method: str) -> int | Expr:
    """The im2col panels ("packed"), or the direct path's last panel (K x MAX_PANEL floats)."""
    if method == "packed":
        return packed_nbytes(g.k, g.oh * g.ow)
    return 4 * g.k * MAX_PANEL if method == "direct" else 0


def pixels_bound(g: ConvGeometry, node: Node) -> int:
    """The most output pixels per image (the GEMM's N) over the ranges, capped at
    ``64 * MAX_PANEL``: the register tile is the static kernel's for that N. Chosen for the widest
    N (as before), a few-pixel conv (Silero's STFT: 3-4 columns) ran 64-column panels, mostly
    zero padding, at 3-4x the static kernel's time; an N that reaches 64 columns somewhere in
    the range gets that widest tile either way."""
    ranges = node.graph.symbols if node.graph is not None else {}
    return max(1, min(bounds(g.oh * g.ow, ranges)[1], 64 * MAX_PANEL))


def dynamic_conv_operands(
    step: GenStep, weights: str, scratch: int | Expr
) -> tuple[Epilogue, list[Arg], tuple[Param, ...]]:
    """``conv_operands`` of a dynamic step: x, ``weights``, bias?, z?, y, scratch? (of an
    expression's size) and the binding ``dyn``."""
    e, args, step_params = conv_operands(step, weights, 0)
    names, restrict = [p.name for p in step_params], [p.restrict for p in step_params]
    if not isinstance(scratch, int) or scratch:
        if step.scratch is None or step.scratch_nbytes != scratch:
            raise CompileError(f"{step.node.describe()}: needs {scratch} bytes of scratch, "
                               f"plan gives {step.scratch_nbytes}")
        args.append(arg(step.scratch, "float", False, step, "scratch"))
        names.append("scratch")
        restrict.append(True)
    args.append(dyn_arg(step))
    return e, args, (*params(names, args[:-1], restrict), Param("dyn", "int64_t", True, True))


def _build_dynamic(step: GenStep, target: TargetInfo) -> StepCode:
    node = step.node
    g0 = claimed(ConvGeometry.from_symbolic_node(node), node)
    method = _dynamic_method(g0)
    e, args, step_params = dynamic_conv_operands(step, "w", _dynamic_scratch(g0, method))
    g, decls = dynamic_geometry(g0, step.symbols)
    work = g.batch * g.m * g.oh * g.ow * (2 * g.kh * g.kw * g.cg)
    if method == "depthwise":
        wp = max(g.pl + g.w, g.cols.reach) if isinstance(g.w, int) else CDim("WP")
        if isinstance(g.w, CDim):  # the padded row's length: pl + W, or the windows' reach
            reach = g.cols.reach
            decls += (("WP", f"({g.pl} + W > {reach} ? {g.pl} + W : {reach})"),)
        dctx = DepthwiseContext(params=step_params, e=e, g=g, wp=wp, pool=pool_condition(work),
                                decls=decls, ring=True)
        return StepCode("c/depthwise.c.j2", dctx, tuple(args))
    t = choose_tiling(g.mg, pixels_bound(g0, node), g.k, target)
    ctx = DynamicConvContext(params=step_params, t=t, e=e, g=g, decls=decls, packed=method == "packed",
                             pool=pool_condition(work), rows_outer_max=ROWS_OUTER_MAX_PANELS)
    return StepCode("c/conv_dynamic.c.j2", ctx, tuple(args))


KERNELS = (ConvKernel(),)
