"""C kernel of onnx_aot.MultiHeadAttention: softmax(Q K^T * scale + mask) V, one step.

Q (b, sq, h, d), K (b, sk, h, d), V (b, sk, h, dv) and the output (b, sq, h, dv) are read and
written in the layout the heads were split into (``compiler/passes/fuse_attention.py``). The
kernel (``templates/c/attention.c.j2``) first copies each head's K^T into scratch as (d, skp)
panels (skp: sk rounded up to ``MAX_PANEL``, zero columns after sk), then splits the work into
(batch, head, block of R query rows): the scores of the block on the GEMM register tile
(``templates/c/gemm_tile.c.j2``, the scale in its epilogue) into an R x skp buffer on the stack,
the mask added and the softmax taken row by row while they are in L1 (``softmax_row.c.j2``), and the
block's output rows on the tile again, A the probabilities, B the head's rows of V read in place,
stored straight into the output's (b, sq, h, dv) rows. R is the smaller of the two tiles' rows.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from compiler.codegen.elementwise import broadcast_strides
from compiler.codegen.elementwise import literal
from compiler.codegen.toolchain import TargetInfo
from compiler.ir.graph import Node
from compiler.providers.base import StepPlan
from compiler.providers.base import shape_of
from compiler.providers.c.common import PARALLEL_MIN_WORK
from compiler.providers.c.common import CKernel
from compiler.providers.c.common import StepCode
from compiler.providers.c.common import all_float32
from compiler.providers.c.common import input_args
from compiler.providers.c.common import output_args
from compiler.providers.c.common import params
from compiler.providers.c.common import scratch_arg
from compiler.providers.c.gemm import MAX_PANEL
from compiler.providers.c.gemm import Epilogue
from compiler.providers.c.gemm import Tiling
from compiler.providers.c.gemm import choose_tiling
from compiler.providers.c.movement import register_transpose
from compiler.providers.kit import Param

__all__ = ["AttentionContext", "MAX_KEYS", "attention_dims"]

MAX_KEYS = 1024  # the score rows of a block live on the stack: at most 12 x 1024 floats


@dataclass(frozen=True)
class AttentionContext:
    params: tuple[Param, ...]
    dims: tuple[int, int, int, int, int, int]  # b, sq, sk, h, d, dv
    skp: int  # K^T panels' row length: sk rounded up to MAX_PANEL
    tiles: tuple[Tiling, Tiling]  # the scores' (R rows x skp columns over d), the output's (R x dv over sk)
    rows: int  # query rows per work item (R)
    epilogues: tuple[Epilogue, Epilogue]  # the scores' (the scale), the output's
    mask: tuple[int, int, int, int] | None  # the mask's element strides along (b, h, query, key)
    vw: int
    shuffles: tuple[tuple[str, str, str, tuple[int, ...]], ...]  # vw x vw register transpose
    shuffled: tuple[str, ...]  # the variable holding each of its rows
    parallel: bool


def attention_dims(node: Node) -> tuple[int, int, int, int, int, int] | None:
    """(b, sq, sk, h, d, dv) of a MultiHeadAttention the C kernel runs, else None."""
    q, k, v = (node.input(i) for i in range(3))
    if q is None or k is None or v is None or q.shape is None or k.shape is None or v.shape is None:
        return None
    if len(q.shape) != 4 or len(k.shape) != 4 or len(v.shape) != 4:
        return None
    (b, sq, h, d), (_, sk, _, _), dv = q.shape, k.shape, v.shape[3]
    if k.shape != (b, sk, h, d) or v.shape != (b, sk, h, dv) or node.outputs[0].shape != (b, sq, h, dv):
        return None
    if min(b, sq, sk, h, d, dv) < 1 or sk > MAX_KEYS:
        return None
    return b, sq, sk, h, d, dv


class AttentionKernel(CKernel):
    kinds: tuple[str, ...] = ("onnx_aot.MultiHeadAttention",)

    def supports(self, node: Node) -> bool:
        if not all_float32(node) or len(node.outputs) != 1 or len(node.inputs) not in (3, 4):
            return False
        dims = attention_dims(node)
        mask = node.input(3)
        if dims is None or (len(node.inputs) == 4 and mask is None) or "scale" not in node.attrs:
            return False
        if mask is not None:
            b, sq, sk, h, _, _ = dims
            try:
                broadcast_strides(shape_of(mask), (b, h, sq, sk))
            except ValueError:
                return False
        return True

    def scratch_nbytes(self, node: Node) -> int:
        b, _, sk, h, d, _ = attention_dims(node) or (0, 0, 0, 0, 0, 0)
        return 4 * b * h * d * _padded(sk)

    def build(self, step: StepPlan, target: TargetInfo) -> StepCode:
        node = step.node
        dims = attention_dims(node)
        assert dims is not None, node.describe()
        b, sq, sk, h, d, dv = dims
        skp = _padded(sk)
        ts = choose_tiling(sq, skp, d, target, MAX_PANEL)
        to = choose_tiling(sq, dv, sk, target)
        mask = node.input(3)
        strides = broadcast_strides(shape_of(mask), (b, h, sq, sk)) if mask is not None else None
        scale = float(node.attrs["scale"])
        scaled = "" if scale == 1.0 else f" * {literal(scale)}"
        vw = target.vector_bytes // 4
        shuffles, shuffled = register_transpose(vw) if vw >= 4 else ((), ())
        plain = Epilogue(alpha="", bias=False, beta="", bias_sm=0, bias_sn=0, residual=False, act="v")
        ins, outs = input_args(step), output_args(step)
        scratch = scratch_arg(step, self.scratch_nbytes(node))
        names = ["qin", "kin", "vin", *(["mask"] if mask is not None else []), "y", "scratch"]
        args = [*ins, *outs, *scratch]
        ctx = AttentionContext(
            params=params(names, args, [True] * len(ins) + [False, True]),
            dims=dims,
            skp=skp,
            tiles=(ts, to),
            rows=min(ts.mr, to.mr),
            epilogues=(dataclasses.replace(plain, alpha=scaled), plain),
            mask=tuple(strides) if strides is not None else None,  # type: ignore[arg-type]
            vw=vw,
            shuffles=shuffles,
            shuffled=shuffled,
            parallel=2 * b * h * sq * sk * (d + dv) >= PARALLEL_MIN_WORK,
        )
        return StepCode("c/attention.c.j2", ctx, tuple(args))


def _padded(sk: int) -> int:
    return math.ceil(sk / MAX_PANEL) * MAX_PANEL


KERNELS = (AttentionKernel(),)
