"""Graph optimization passes, the PassManager and the optimization levels.

Level 0 runs nothing; level 1 the basic passes (identity elimination, constant folding, common
subexpression elimination, dead code elimination, denormal weights stored as zero); level 2 adds
the fusions (Conv+BatchNorm, MatMul+Add -> Gemm, Conv/Gemm + residual + activation, elementwise
chains); level 3 is level 2. After them, ``optimize(..., target="cpu")`` lowers 3x3 stride-1
convolutions to Winograd F(4x4 / 2x2, 3x3) for the C provider, and at level 3 puts convolution
regions in NHWC. Every pass changes the graph only through the IR's methods.
"""

from __future__ import annotations

from compiler.passes.base import Pass
from compiler.passes.base import PassResult
from compiler.passes.eliminate_common_subexpressions import EliminateCommonSubexpressions
from compiler.passes.eliminate_dead_code import EliminateDeadCode
from compiler.passes.eliminate_identity import EliminateIdentity
from compiler.passes.flush_denormal_weights import FlushDenormalWeights
from compiler.passes.fold_constants import FoldConstants
from compiler.passes.fuse_conv_activation import FuseConvActivation
from compiler.passes.fuse_conv_batchnorm import FuseConvBatchNorm
from compiler.passes.fuse_elementwise import FuseElementwise
from compiler.passes.fuse_matmul_add import FuseMatMulAdd
from compiler.passes.layout_nhwc import LayoutNhwc
from compiler.passes.manager import MAX_LEVEL
from compiler.passes.manager import PassManager
from compiler.passes.manager import lowerings_for
from compiler.passes.manager import optimize
from compiler.passes.manager import passes_for_level
from compiler.passes.materialize_outputs import MaterializeOutputs
from compiler.passes.use_winograd import UseWinograd

__all__ = [
    "MAX_LEVEL",
    "EliminateCommonSubexpressions",
    "EliminateDeadCode",
    "EliminateIdentity",
    "FlushDenormalWeights",
    "FoldConstants",
    "FuseConvActivation",
    "FuseConvBatchNorm",
    "FuseElementwise",
    "FuseMatMulAdd",
    "LayoutNhwc",
    "MaterializeOutputs",
    "Pass",
    "PassManager",
    "PassResult",
    "optimize",
    "passes_for_level",
    "lowerings_for",
    "UseWinograd",
]
