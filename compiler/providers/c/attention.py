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
from dataclasses import dataclass

from compiler.codegen.cdims import CDim
from compiler.codegen.cdims import kernel_dims
from compiler.codegen.elementwise import broadcast_strides
from compiler.codegen.elementwise import literal
from compiler.codegen.toolchain import TargetInfo
from compiler.ir.graph import Node
from compiler.providers.base import GenStep
from compiler.providers.base import shape_of
from compiler.providers.c.common import PARALLEL_MIN_WORK
from compiler.providers.c.common import CKernel
from compiler.providers.c.common import StepCode
from compiler.providers.c.common import all_float32
from compiler.providers.c.common import dyn_arg
from compiler.providers.c.common import input_args
from compiler.providers.c.common import output_args
from compiler.providers.c.common import params
from compiler.providers.c.gemm import MAX_PANEL
from compiler.providers.c.gemm import MAX_ROWS
from compiler.providers.c.gemm import Epilogue
from compiler.providers.c.gemm import Tiling
from compiler.providers.c.gemm import choose_tiling
from compiler.providers.c.gemm import sized_scratch
from compiler.providers.c.movement import register_transpose
from compiler.providers.kit import KernelContext
from compiler.providers.kit import Param
from runtime.contract import MULTI_HEAD_ATTENTION
from runtime.symbolic import Dim
from runtime.symbolic import Expr
from runtime.symbolic import bounds
from runtime.symbolic import ceildiv

__all__ = ["AttentionContext", "MAX_KEYS", "attention_dims"]

MAX_KEYS = 1024  # the score rows of a block live on the stack: at most 12 x 1024 floats


@dataclass(frozen=True)
class AttentionContext(KernelContext):
    dims: tuple[int | CDim, int | CDim, int | CDim, int, int, int]  # b, sq, sk (C text if run-time), h, d, dv
    skp: int | CDim  # K^T panels' row length: sk rounded up to MAX_PANEL
    sbuf: int  # floats of the block's score rows (on the stack): rows x the largest skp
    tiles: tuple[Tiling, Tiling]  # the scores' (R rows x skp columns over d), the output's (R x dv over sk)
    rows: int  # query rows per work item (R)
    epilogues: tuple[Epilogue, Epilogue]  # the scores' (the scale), the output's
    mask: tuple[int, int, int, int] | None  # the mask's element strides along (b, h, query, key)
    vw: int
    shuffles: tuple[tuple[str, str, str, tuple[int, ...]], ...]  # vw x vw register transpose
    shuffled: tuple[str, ...]  # the variable holding each of its rows
    parallel: bool
    parallel_if: str = ""  # run-time dims: the threads start when the run's work is large enough


def attention_dims(node: Node) -> tuple[Dim, Dim, Dim, int, int, int] | None:
    """(b, sq, sk, h, d, dv) of a MultiHeadAttention the C kernel runs, else None. In a dynamic
    graph b, sq and sk may be expressions of the symbols (h, d and dv static; sk at most MAX_KEYS
    over the symbols' ranges)."""
    q, k, v = (node.input(i) for i in range(3))
    if q is None or k is None or v is None or q.shape is None or k.shape is None or v.shape is None:
        return None
    if len(q.shape) != 4 or len(k.shape) != 4 or len(v.shape) != 4:
        return None
    (b, sq, h, d), (_, sk, _, _), dv = q.shape, k.shape, v.shape[3]
    if tuple(k.shape) != (b, sk, h, d) or tuple(v.shape) != (b, sk, h, dv):
        return None
    if node.outputs[0].shape is None or tuple(node.outputs[0].shape) != (b, sq, h, dv):
        return None
    if not all(isinstance(x, int) for x in (h, d, dv)):
        return None
    ranges = node.graph.symbols if node.graph is not None else {}
    if min(bounds(x, ranges)[0] for x in (b, sq, sk, h, d, dv)) < 1 or bounds(sk, ranges)[1] > MAX_KEYS:
        return None
    return b, sq, sk, h, d, dv


class AttentionKernel(CKernel):
    kinds: tuple[str, ...] = (MULTI_HEAD_ATTENTION,)
    dynamic = True  # run-time batch and sequence lengths (attention_dims)

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
                strides = broadcast_strides(shape_of(mask, symbolic=True), (b, h, sq, sk))  # type: ignore[arg-type]
            except ValueError:
                return False
            return strides[3] in (0, 1)
        return True

    def scratch_nbytes(self, node: Node) -> Dim:  # type: ignore[override]  # an Expr: run-time scratch
        b, _, sk, h, d, _ = attention_dims(node) or (0, 0, 0, 0, 0, 0)
        return 4 * h * d * b * _padded(sk)

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        dims = attention_dims(node)
        assert dims is not None, node.describe()
        b, sq, sk, h, d, dv = dims
        dynamic = any(isinstance(x, Expr) for x in dims)
        write = kernel_dims(step.symbols)
        static_rows = sq if isinstance(sq, int) else MAX_ROWS  # a run-time sq: the tiles' full rows
        ts = choose_tiling(static_rows, _padded_keys(sk) if isinstance(sk, int) else MAX_PANEL, d, target,
                           MAX_PANEL)
        to = choose_tiling(static_rows, dv, sk if isinstance(sk, int) else MAX_PANEL, target)
        if isinstance(sk, Expr):  # the output tile's k loop runs over the run-time keys
            to = dataclasses.replace(to, k=write(sk))  # type: ignore[arg-type]
        mask = node.input(3)
        scores = (b, h, sq, sk)
        strides = broadcast_strides(shape_of(mask, symbolic=True), scores) if mask is not None else None  # type: ignore[arg-type]
        scale = float(node.attrs["scale"])
        scaled = "" if scale == 1.0 else f" * {literal(scale)}"
        vw = target.vector_bytes // 4
        shuffles, shuffled = register_transpose(vw) if vw >= 4 else ((), ())
        plain = Epilogue(alpha="", bias=False, beta="", bias_sm=0, bias_sn=0, residual=False, act="v")
        ins, outs = input_args(step), output_args(step)
        scratch = sized_scratch(step, self.scratch_nbytes(node))
        names = ["qin", "kin", "vin", *(["mask"] if mask is not None else []), "y", "scratch"]
        args = [*ins, *outs, *scratch]
        prms = params(names, args, [True] * len(ins) + [False, True])
        if dynamic:  # the binding: b, sq, sk are C over it
            args.append(dyn_arg(step))
            prms = (*prms, Param("dyn", "int64_t", True, True))
        rows = min(ts.mr, to.mr)
        ctx = AttentionContext(
            params=prms,
            dims=tuple(write(x) for x in dims),  # type: ignore[arg-type]
            skp=write(_padded(sk)),
            sbuf=rows * _padded_keys(bounds(sk, node.graph.symbols if node.graph is not None else {})[1]),
            tiles=(ts, to),
            rows=rows,
            epilogues=(dataclasses.replace(plain, alpha=scaled), plain),
            mask=tuple(write(x) for x in strides) if strides is not None else None,  # type: ignore[arg-type]
            vw=vw,
            shuffles=shuffles,
            shuffled=shuffled,
            parallel=dynamic or 2 * b * h * sq * sk * (d + dv) >= PARALLEL_MIN_WORK,  # type: ignore[operator]
            parallel_if=f"{write(b * h * sq * sk)} * {2 * (d + dv)} >= {PARALLEL_MIN_WORK}" * dynamic,
        )
        return StepCode("c/attention.c.j2", ctx, tuple(args))


def _padded(sk: Dim) -> Dim:
    return ceildiv(sk, MAX_PANEL) * MAX_PANEL


def _padded_keys(sk: int) -> int:
    return -(-sk // MAX_PANEL) * MAX_PANEL


KERNELS = (AttentionKernel(),)
