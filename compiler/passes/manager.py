"""The PassManager and the optimization levels.

``PassManager`` runs a list of passes over and over until none of them changes the graph (at
most ``max_iterations`` rounds), verifying the graph after every pass so that a pass that breaks
the IR is named in a :class:`~runtime.errors.InternalError`. ``passes_for_level`` maps the
``--opt-level`` option to the pass list: 0 none, 1 basic (denormal weights flushed too), 2 basic
+ fusions, 3 as 2; ``lowerings_for`` adds a target's lowerings (for the C target: Winograd
convolutions from level 2, the NHWC layout of convolution regions at level 3).
"""

from __future__ import annotations

from collections.abc import Sequence

from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.passes.base import Pass
from compiler.passes.base import PassResult
from compiler.passes.compose_qbinary import ComposeQBinary
from compiler.passes.eliminate_common_subexpressions import EliminateCommonSubexpressions
from compiler.passes.eliminate_dead_code import EliminateDeadCode
from compiler.passes.eliminate_identity import EliminateIdentity
from compiler.passes.flush_denormal_weights import FlushDenormalWeights
from compiler.passes.fold_constants import FoldConstants
from compiler.passes.fold_qdq import FoldQdq
from compiler.passes.fuse_attention import FuseAttention
from compiler.passes.fuse_conv_activation import FuseConvActivation
from compiler.passes.fuse_conv_batchnorm import FuseConvBatchNorm
from compiler.passes.fuse_conv_prescale import FuseConvPrescale
from compiler.passes.fuse_dynamic_qgemm import FuseDynamicQGemm
from compiler.passes.fuse_elementwise import FuseElementwise
from compiler.passes.fuse_matmul_add import FuseMatMulAdd
from compiler.passes.fuse_qconv_add import FuseQConvAdd
from compiler.passes.fuse_qconv_lookup import FuseQConvLookup
from compiler.passes.fuse_qgemm_add import FuseQGemmAdd
from compiler.passes.layout_nhwc import LayoutNhwc
from compiler.passes.pack_conv_bf16 import PackConvBf16
from compiler.passes.pack_gemm_weights import PackGemmWeights
from compiler.passes.pack_qconv_weights import PackQConvWeights
from compiler.passes.pack_qconv_weights import lowers as qconv_lowers
from compiler.passes.pack_qlstm_weights import PackQLSTMWeights
from compiler.passes.use_qgemm import UseQGemm
from compiler.passes.use_qgemm import lowers as qgemm_lowers
from compiler.passes.use_winograd import UseWinograd
from runtime.contract import Q_BINARY
from runtime.contract import Q_CHANNEL_LOOKUP
from runtime.contract import Q_LOOKUP
from runtime.contract import Q_TABLE_ADD
from runtime.errors import CompileError
from runtime.errors import InternalError

__all__ = ["MAX_LEVEL", "PassManager", "lowerings_for", "optimize", "passes_for_level"]

MAX_LEVEL = 3


class PassManager:
    """Run ``passes`` in order, repeatedly, until a whole round changes nothing."""

    def __init__(self, passes: Sequence[Pass], verify: bool = True, max_iterations: int = 10) -> None:
        self.passes = list(passes)
        self.verify = verify
        self.max_iterations = max_iterations

    def run(self, graph: Graph) -> PassResult:
        """Optimize ``graph``; stops quietly after ``max_iterations`` rounds."""
        if self.verify and self.passes:
            self._check(graph, "the input graph (before any pass)")
        modified = False
        for _ in range(self.max_iterations):
            changed = False
            for p in self.passes:
                try:
                    result = p.run(graph)
                except CompileError:
                    raise
                except Exception as exc:
                    raise CompileError(
                        f"pass {p.name!r} failed on graph {graph.name!r}: {type(exc).__name__}: {exc}"
                    ) from exc
                graph = result.graph
                if self.verify:
                    self._check(graph, f"pass {p.name!r}")
                changed = changed or result.modified
            modified = modified or changed
            if not changed:
                break
        return PassResult(graph, modified)

    @staticmethod
    def _check(graph: Graph, culprit: str) -> None:
        try:
            graph.verify()
        except InternalError as exc:
            raise InternalError(f"{culprit} left graph {graph.name!r} invalid: {exc}") from exc


def passes_for_level(level: int, target: str | None = None) -> list[Pass]:
    """Fresh pass instances for optimization level 0-3, in the order they run. SiLU goes into conv
    and gemm epilogues only at level 3 for "cpu": CUDA kernels lack the vector math, and the NCHW
    kernels of level 2 (Winograd, depthwise) apply the epilogue one float at a time, where ssilu
    costs more than a separate vectorized step (YOLOv8n 320 at -O2: 34.9 -> 56.3 ms)."""
    if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= MAX_LEVEL:
        raise CompileError(f"unknown optimization level {level!r}; expected 0 to {MAX_LEVEL}")
    if level == 0:
        return []
    basic: list[Pass] = [
        EliminateIdentity(),
        FoldConstants(),
        EliminateCommonSubexpressions(),
        EliminateDeadCode(),
        FlushDenormalWeights(),
    ]
    if level == 1:
        return basic
    # Order matters within a round: BatchNorm folds into a plain Conv before the Conv becomes a
    # FusedConv, MatMul+Add becomes Gemm before Gemm+activation, and elementwise fusion runs
    # last so that activations go into conv/gemm epilogues first. Level 3 adds layout later.
    # QDQ patterns fold first, while their Conv / MatMul are still plain; only on the C target,
    # and only where its kernels claim the integer nodes (fold_qdq.py).
    extended: list[Pass] = [FoldQdq(claims=_c_claims)] if target == "cpu" else []
    extended += [
        FuseConvBatchNorm(),
        FuseMatMulAdd(),
        FuseConvActivation(silu=level >= 3 and target == "cpu"),
        *([FuseDynamicQGemm()] if target == "cpu" else []),  # before the chain's Mul / Add fuse elsewhere
        FuseElementwise(),
    ]
    return basic + extended


# The node kinds fold_qdq may make on the C target, each where the C provider claims it: a kind is
# here once its C kernel beats the fused float steps it replaces (measure with scripts/bench_int8.py
# and extend the set when a kernel lands). Measured 2026-12-07, 2 shared cores, alternating runs,
# with / without: QLookup 0.98 (SqueezeNet QDQ), 0.96 (MiniLM-size QDQ), 0.98 (DenseNet-121), 1.00
# (ShuffleNet), QBinary 0.99 (ResNet-50), 0.96 (DenseNet-121), 0.97 (MiniLM-size), 1.00 (ShuffleNet)
# with qop's table kernel for a per-channel operand (before it: 1.07 and 1.43). Left out:
# onnx_aot.QSoftmax (MiniLM-size 1.01, 1.04), onnx_aot.QAveragePool / QGlobalAveragePool (ShuffleNet
# 1.03, DenseNet-121 0.99). QLinearConv / QLinearMatMul / MatMulInteger / ConvInteger fold where
# their kernels claim them (through the lowerings pack_qconv_weights and use_qgemm).
C_FOLDABLE = frozenset({
    "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Slice", "Gather", "MaxPool", "Resize",
    "Concat", "Expand", "Tile", "DepthToSpace", "SpaceToDepth", "Identity",
    "QLinearConv", "QLinearMatMul", "MatMulInteger", "ConvInteger", "Cast", "Mul", "Add",
    Q_LOOKUP, Q_BINARY, Q_CHANNEL_LOOKUP,
    "QuantizeLinear",  # sunk through data movement (fold_qdq._sink)
    Q_TABLE_ADD,  # the residual Add of two per-channel float chains (fold_qdq_residual)
})


# fuse_qconv_add (a QDQ residual Add into PackedQConv's store: bit-exact, one step fewer) is off:
# measured 2026-12-08 on the AMD EPYC Zen 4 (2 cores, AVX512-VNNI), alternating profiled runs in one
# process, it does not pay yet. With the Add in float64 lanes the fused convs cost more than the
# QBinary steps they remove (ResNet-50 QDQ steps 17.2 vs 16.6-16.8 ms); in int32 lanes (fixed_add,
# where exact) about as much: QDQ 16.75 vs 16.81 and 17.55 vs 17.64 ms, `--quantize int8` 20.95 vs
# 20.91 ms (bench_int8 int8 / our fp32 0.537-0.557 on, 0.536-0.553 off: noise). A trivial Add costs
# the fused convs +3-5% and saves 1 ms: the Add's arithmetic is what is left to cut (tests turn it on).
FUSE_QCONV_ADD = False


def _c_claims(node: Node) -> bool:
    """Whether fold_qdq may make ``node`` for the C target: a kind of ``C_FOLDABLE`` the C provider
    runs, as it is or once the C lowerings below take it (integer convs and GEMMs with constant
    weights: ``pack_qconv_weights``, ``use_qgemm``). The provider is imported here: its modules are
    large."""
    from compiler.providers.c.provider import KERNELS

    if node.kind not in C_FOLDABLE:
        return False
    return KERNELS.supports(node) or qconv_lowers(node) or qgemm_lowers(node)


def lowerings_for(level: int, target: str, winograd: bool = True, precision: str = "fp32",
                  bf16_engine: str = "amx") -> list[Pass]:
    """Target-specific lowerings, run once after ``level``'s passes reach their fixed point.

    For the C target at level 2 and up: the constant B of a Gemm stored packed in the C tile's
    column panels (``pack_gemm_weights``), integer convolutions' weights packed
    (``pack_qconv_weights``; a QDQ residual Add into the conv's store: ``fuse_qconv_add``, where
    ``FUSE_QCONV_ADD``), multi-head attention as one step (``fuse_attention``),
    and 3x3 stride-1 convolutions as Winograd F(4x4 / 2x2, 3x3)
    (``use_winograd``, unless ``winograd`` is False; it must see the convolutions with BatchNorm
    and epilogues already folded in). At level 3 the convolution regions then go NHWC
    (``layout_nhwc``), and elementwise fusion runs once more over what it produced. A graph of
    symbolic dims gets the same lowerings: their C kernels all take run-time dims. ``precision``
    "bf16" packs the GEMM and NHWC convolution weights rounded to bfloat16 (compiler/precision.py;
    ``pack_conv_bf16``, then ``fuse_conv_prescale``) under the rules of ``bf16_engine``
    (``bf16_cost.RULES``): for "amx" without Winograd, for "dpbf16" with it on the 3x3 convs where
    it beats the bf16 direct conv (``bf16_cost.keeps_winograd``), which then stay fp32.
    """
    cpu2 = level >= 2 and target == "cpu"
    passes: list[Pass] = [PackGemmWeights(precision), PackQConvWeights(), FuseAttention()] if cpu2 else []
    passes += [FuseQConvLookup(), ComposeQBinary()] if cpu2 else []  # after the convs are packed
    passes += [FuseQConvAdd()] if cpu2 and FUSE_QCONV_ADD else []  # a QDQ residual Add into the conv
    if cpu2:
        passes += [UseQGemm()]  # the integer GEMM (quantize_dynamic's chains: fuse_dynamic_qgemm)
        passes += [FuseQGemmAdd()]  # a QDQ bias / residual Add (QBinary) into its requantizing epilogue
        passes += [PackQLSTMWeights()]  # DynamicQuantizeLSTM's weights in the int8 tile's panels
    if level >= 2 and target == "cpu" and winograd:
        passes.append(UseWinograd(bf16_engine if precision == "bf16" else None))
    if level >= 3 and target == "cpu":
        passes += [LayoutNhwc(), FuseElementwise()]
        passes += [PackConvBf16(bf16_engine), FuseConvPrescale()] if precision == "bf16" else []
    return passes


def optimize(
    graph: Graph, level: int, verify: bool = True, target: str | None = None, winograd: bool = True,
    precision: str = "fp32", bf16_engine: str = "amx",
) -> Graph:
    """Run the passes of ``level`` over ``graph`` (changed in place) and return it.

    ``target`` ("cpu", "cuda") adds that target's lowerings (``lowerings_for``); None adds none.
    """
    graph = PassManager(passes_for_level(level, target), verify=verify).run(graph).graph
    lowerings = lowerings_for(level, target, winograd, precision, bf16_engine) if target is not None else []
    if lowerings:
        graph = PassManager(lowerings, verify=verify, max_iterations=1).run(graph).graph
    return graph
