"""The C int8 LSTM: ``onnx_aot.QLSTM`` (onnxruntime's DynamicQuantizeLSTM) on the int8
micro-kernel of the integer GEMM (``templates/c/qlstm.c.j2``).

Reference: runtime/kernels/qrecurrent.py, which this follows step for step: per direction, X's rows
of the first max(sequence_lens) steps quantized at once (DynamicQuantizeLinear's arithmetic,
qquant.c.j2) and multiplied with W, then per step H quantized and multiplied with R, each product
exact in int32 on ``qgemm_tile.c.j2``'s tile (VNNI, 16-bit pmaddwd or plain C by the target's
``int8_dot``) and scaled to float in the tile's epilogue, then the LSTM cell of
``recurrent_cell.c.j2`` (the float kernel's). W and R arrive packed in the tile's panels with
their column sums (``packed`` 1: compiler/passes/pack_qlstm_weights.py, from level 2); at level 1
the kernel packs them into scratch at every run. The packing, the quantized rows, the tiles and
the cell updates are items of the worker pool, each computed whole by whichever thread takes it:
the results are the same at any thread count. Claimed for layout 0 and float32 / int32
around 8-bit weights; in a dynamic graph the sequence length and the batch may be run-time sizes
(the C locals SEQ / NB, the pool's decisions C conditions over them, scratch an expression of
them), the weights static. Anything else stays on the reference kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.codegen.cdims import CDim
from compiler.codegen.cdims import kernel_dims
from compiler.codegen.elementwise import literal
from compiler.codegen.toolchain import TargetInfo
from compiler.ir.graph import Node
from compiler.providers.base import GenStep
from compiler.providers.base import shape_of
from compiler.providers.c.common import PARALLEL_MIN_WORK
from compiler.providers.c.common import Arg
from compiler.providers.c.common import CKernel
from compiler.providers.c.common import StepCode
from compiler.providers.c.common import arg
from compiler.providers.c.common import dyn_arg
from compiler.providers.c.common import output_args
from compiler.providers.c.common import params
from compiler.providers.c.gemm import sized_scratch
from compiler.providers.c.qgemm import MAX_TILE_ROWS
from compiler.providers.c.qgemm import qtile_shape
from compiler.providers.c.recurrent import ACTIVATIONS
from compiler.providers.c.recurrent import activation_exprs
from compiler.providers.c.recurrent import sizes_ok
from compiler.providers.c.recurrent import vector_activation_exprs
from compiler.providers.kit import KernelContext
from compiler.providers.kit import Param
from runtime.contract import Q_LSTM
from runtime.contract import op_name
from runtime.contract import round_up
from runtime.symbolic import Expr

__all__ = ["QLSTMContext"]

_NAMES = ("x", "w", "r", "b", "lens", "h0", "c0", "p", "w_scale", "w_zero", "r_scale", "r_zero", "w_sum",
          "r_sum")
_CELL_PARALLEL = 1024  # a step's cell updates (~6 ns each) go to the pool from this many
_CTYPES = {np.dtype(np.float32): "float", np.dtype(np.int8): "int8_t", np.dtype(np.uint8): "uint8_t",
           np.dtype(np.int32): "int"}


@dataclass(frozen=True)
class QLSTMContext(KernelContext):
    """One QLSTM node: the float cell's fields (read by recurrent_cell.c.j2), the int8 tile and the
    scratch regions (byte offsets)."""

    op: str  # op_name(Q_LSTM), which recurrent_cell.c.j2 knows
    dirs: int
    reverse: bool
    seq: int | CDim  # CDim: a run-time size, the C local SEQ / NB of ``decls``
    batch: int | CDim
    input: int
    hidden: int
    has_b: bool
    has_lens: bool
    has_h0: bool
    has_c0: bool
    has_p: bool
    clip: str | None
    acts: tuple[str, ...]
    vacts: tuple[str | None, ...]
    nact: int
    linear_before_reset: bool
    input_forget: bool
    zero_finished: bool
    vw: int
    isa: str
    mr: int  # rows of the projections' tile (the target's)
    step_mr: int  # rows of a step's tile: the batch in blocks of at most mr, as even as they go
    npan: int
    kpx: int  # input size rounded up to the group of 4
    kph: int  # hidden size, the same
    w_shift: int  # 128 for a uint8 W (packed less 128)
    r_shift: int
    w_scale_n: int  # scales / zero points per direction: 1 or 4 * hidden
    r_scale_n: int
    w_zero_n: int
    r_zero_n: int
    regions: tuple[tuple[str, int | CDim], ...]  # (name, byte offset) in scratch
    pack_when: str
    proj_when: str  # C condition over the run's projected rows ``rows``: the pool's decision
    step_when: str
    cell_when: str  # a step's cell updates split over the batch on the pool
    dispatch: bool  # AVX-512BW: the VNNI loops too, taken where the CPU has AVX512-VNNI
    packed: bool  # W and R arrive packed with their sums (compiler/passes/pack_qlstm_weights.py)
    decls: tuple[tuple[str, str], ...] = ()  # run-time sizes: (C local SEQ / NB, C expression over dyn)


Size = Any  # an int, a symbolic Expr (scratch_nbytes) or a CDim (C text over the run's sizes)


def _regions(seq: Size, batch: Size, size: int, hidden: int) -> tuple[tuple[str, Size], ...]:
    """Scratch of one direction at a time (the directions run in turn): packed W and R with their
    column sums, the quantized rows and their sums, projections, gates, states, H's copy, biases;
    offsets rounded up to 64 bytes (ints, or expressions of run-time seq / batch)."""
    g = 4 * hidden
    panels = -(-g // 16)
    rows = seq * batch + MAX_TILE_ROWS  # padded to any target's tile
    sizes = [("wpack", panels * round_up(size, 4) * 16), ("wsum", 4 * g),
             ("rpack", panels * round_up(hidden, 4) * 16), ("rsum", 4 * g),
             ("apack", rows * round_up(max(size, hidden), 4) * 2), ("asum", 4 * rows),
             ("proj", 4 * seq * batch * g), ("gates", 4 * batch * g), ("h", 4 * batch * hidden),
             ("c", 4 * batch * hidden), ("hin", 4 * batch * hidden), ("rb", 4 * g), ("end", 0)]
    out: list[tuple[str, Size]] = []
    at: Size = 0
    for name, nbytes in sizes:
        out.append((name, at))
        at = (at + nbytes + 63) // 64 * 64
    return tuple(out)


def _sizes(node: Node) -> tuple[int, Size, Size, int, int]:
    """(directions, seq, batch, input size, hidden size): seq and batch Exprs where run-time."""
    x = shape_of(node.input(0), symbolic=True)
    dirs = 2 if node.attrs["direction"] == "bidirectional" else 1
    return dirs, x[0], x[1], int(x[2]), int(node.attrs["hidden_size"])


def _run_time(node: Node, step: GenStep) -> tuple[Size, Size, tuple[tuple[str, str], ...]]:
    """seq and batch as ints or the C locals SEQ / NB, and those locals' declarations."""
    _, seq, batch, _, _ = _sizes(node)
    write = kernel_dims(step.symbols)
    local: list[Size] = []
    decls: list[tuple[str, str]] = []
    for name, d in (("SEQ", seq), ("NB", batch)):
        local.append(CDim(name) if isinstance(d, Expr) else int(d))
        if isinstance(d, Expr):
            decls.append((name, str(write(d))))
    return local[0], local[1], tuple(decls)


def _when(static: bool | None, text: str) -> str:
    """A pool decision: "1" / "0" where the sizes are static, else the C condition ``text``."""
    return text if static is None else ("1" if static else "0")


def _types_ok(node: Node) -> bool:
    byte = (np.int8, np.uint8)
    int32 = (np.int32,)
    want = {1: byte, 2: byte, 4: int32, 9: byte, 11: byte, 12: int32, 13: int32}  # the others float32
    for i, value in enumerate(node.inputs):
        if value is None:
            continue
        if value.shape is None or value.dtype not in want.get(i, (np.float32,)):
            return False
        if value.is_symbolic and i not in (0, 4, 5, 6):  # run-time seq / batch only in X, lengths, states
            return False
    return all(v.dtype == np.float32 and v.shape is not None for v in node.outputs)


class QLSTMKernel(CKernel):
    kinds: tuple[str, ...] = (Q_LSTM,)
    dynamic = True  # run-time sequence length and batch (_run_time)

    def supports(self, node: Node) -> bool:
        packed = bool(int(node.attrs["packed"]))
        if len(node.inputs) != (14 if packed else 12) or len(node.outputs) != 3 or not _types_ok(node):
            return False
        known = all(str(f) in ACTIVATIONS for f in node.attrs["activations"])
        if int(node.attrs["layout"]) != 0 or not known:
            return False
        return sizes_ok(node)

    def scratch_nbytes(self, node: Node) -> int | Expr:  # type: ignore[override]
        return _regions(*_sizes(node)[1:])[-1][1]  # type: ignore[no-any-return]

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        dirs, _, _, size, hidden = _sizes(node)
        seq, batch, decls = _run_time(node, step)
        present = [i for i in range(len(node.inputs)) if node.input(i) is not None]
        ins: list[Arg] = [arg(step.inputs[i], _CTYPES[np.dtype(node.inputs[i].dtype)], True, step,  # type: ignore[union-attr]
                              f"input {i}") for i in present]
        args = [*ins, *output_args(step), *sized_scratch(step, self.scratch_nbytes(node))]
        args[-1] = Arg(args[-1].kind, args[-1].offset, "uint8_t", False)
        names = [_NAMES[i] for i in present] + ["y", "yh", "yc", "scratch"]
        prms = params(names, args, [True] * len(args))
        if decls:
            prms += (Param("dyn", "int64_t", True, True),)
            args.append(dyn_arg(step))
        static = isinstance(batch, int)
        packed = bool(int(node.attrs["packed"]))
        zeros = [v.dtype if v is not None else None for v in (node.inputs[9], node.inputs[11])]  # W, R types
        mr, npan = qtile_shape(target)
        g = 4 * hidden
        per_dir = {i: math.prod(node.inputs[i].shape) // dirs for i in (8, 9, 10, 11)}  # type: ignore[union-attr, arg-type]
        clip = float(node.attrs["clip"])
        ctx = QLSTMContext(
            params=prms, op=op_name(Q_LSTM), dirs=dirs,
            reverse=node.attrs["direction"] == "reverse", seq=seq, batch=batch, input=size, hidden=hidden,
            has_b=3 in present, has_lens=4 in present, has_h0=5 in present, has_c0=6 in present,
            has_p=7 in present, clip=literal(clip) if np.isfinite(clip) else None,
            acts=activation_exprs(node), vacts=vector_activation_exprs(node), nact=3,
            linear_before_reset=False, input_forget=bool(node.attrs["input_forget"]),
            zero_finished=bool(node.attrs["zero_finished"]), vw=target.vector_bytes // 4,
            isa=target.int8_dot, mr=mr, step_mr=-(-batch // -(-batch // mr)) if static else mr, npan=npan,
            kpx=round_up(size, 4), kph=round_up(hidden, 4),
            w_shift=128 if zeros[0] == np.uint8 else 0, r_shift=128 if zeros[1] == np.uint8 else 0,
            w_scale_n=per_dir[8], w_zero_n=per_dir[9], r_scale_n=per_dir[10], r_zero_n=per_dir[11],
            regions=_regions(seq, batch, size, hidden),
            pack_when="1" if g * (size + hidden) >= PARALLEL_MIN_WORK else "0",
            proj_when=f"rows * {2 * g * size} >= {PARALLEL_MIN_WORK}",
            step_when=_when(2 * batch * g * hidden >= PARALLEL_MIN_WORK if static else None,
                            f"{batch} * {2 * g * hidden} >= {PARALLEL_MIN_WORK}"),
            cell_when=_when(batch >= 2 and batch * hidden >= _CELL_PARALLEL if static else None,
                            f"{batch} >= 2 && {batch} * {hidden} >= {_CELL_PARALLEL}"),
            dispatch=target.int8_dot == "avx512bw", packed=packed, decls=decls,
        )
        return StepCode("c/qlstm.c.j2", ctx, tuple(args))


KERNELS = (QLSTMKernel(),)
