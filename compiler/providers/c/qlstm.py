"""The C int8 LSTM: ``onnx_aot.QLSTM`` (onnxruntime's DynamicQuantizeLSTM) on the int8
micro-kernel of the integer GEMM (``templates/c/qlstm.c.j2``).

Reference: runtime/kernels/qrecurrent.py, which this follows step for step: per direction, X's rows
of the first max(sequence_lens) steps quantized at once (DynamicQuantizeLinear's arithmetic,
qquant.c.j2) and multiplied with W, then per step H quantized and multiplied with R, each product
exact in int32 on ``qgemm_tile.c.j2``'s tile (VNNI, 16-bit pmaddwd or plain C by the target's
``int8_dot``) and scaled to float in the tile's epilogue, then the LSTM cell of
``recurrent_cell.c.j2`` (the float kernel's). W and R are packed into the tile's panels at every
run, into scratch (a pass packing them ahead of time, as QGemm's are, is left to do: the packing
is O(weights), the products O(steps · batch · weights)). The packing, the quantized rows and the
tiles are items of the worker pool, each computed whole by whichever thread takes it: the results
are the same at any thread count. Claimed for static shapes, layout 0 and float32 / int32 around
8-bit weights; anything else stays on the reference kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from compiler.codegen.elementwise import literal
from compiler.codegen.toolchain import TargetInfo
from compiler.ir.graph import Node
from compiler.providers.base import GenStep
from compiler.providers.c.common import PARALLEL_MIN_WORK
from compiler.providers.c.common import Arg
from compiler.providers.c.common import CKernel
from compiler.providers.c.common import StepCode
from compiler.providers.c.common import arg
from compiler.providers.c.common import output_args
from compiler.providers.c.common import params
from compiler.providers.c.common import scratch_arg
from compiler.providers.c.qgemm import MAX_TILE_ROWS
from compiler.providers.c.qgemm import qtile_shape
from compiler.providers.c.recurrent import ACTIVATIONS
from compiler.providers.c.recurrent import activation_exprs
from compiler.providers.c.recurrent import vector_activation_exprs
from compiler.providers.kit import KernelContext
from runtime.contract import Q_LSTM
from runtime.contract import op_name
from runtime.contract import round_up

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
    seq: int
    batch: int
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
    regions: tuple[tuple[str, int], ...]  # (name, byte offset) in scratch
    pack_when: str
    proj_when: str  # C condition over the run's projected rows ``rows``: the pool's decision
    step_when: str
    cell_when: str  # a step's cell updates split over the batch on the pool
    dispatch: bool  # AVX-512BW: the VNNI loops too, taken where the CPU has AVX512-VNNI
    packed: bool  # W and R arrive packed with their sums (compiler/passes/pack_qlstm_weights.py)


def _regions(seq: int, batch: int, size: int, hidden: int) -> tuple[tuple[str, int], ...]:
    """Scratch of one direction at a time (the directions run in turn): packed W and R with their
    column sums, the quantized rows and their sums, projections, gates, states, H's copy, biases."""
    g = 4 * hidden
    panels = -(-g // 16)
    rows = seq * batch + MAX_TILE_ROWS  # padded to any target's tile
    sizes = [("wpack", panels * round_up(size, 4) * 16), ("wsum", 4 * g),
             ("rpack", panels * round_up(hidden, 4) * 16), ("rsum", 4 * g),
             ("apack", rows * round_up(max(size, hidden), 4) * 2), ("asum", 4 * rows),
             ("proj", 4 * seq * batch * g), ("gates", 4 * batch * g), ("h", 4 * batch * hidden),
             ("c", 4 * batch * hidden), ("hin", 4 * batch * hidden), ("rb", 4 * g), ("end", 0)]
    out, at = [], 0
    for name, nbytes in sizes:
        out.append((name, at))
        at = round_up(at + nbytes, 64)
    return tuple(out)


def _sizes(node: Node) -> tuple[int, int, int, int, int]:
    x = node.inputs[0]
    assert x is not None and x.shape is not None
    dirs = 2 if node.attrs["direction"] == "bidirectional" else 1
    return dirs, int(x.shape[0]), int(x.shape[1]), int(x.shape[2]), int(node.attrs["hidden_size"])


def _types_ok(node: Node) -> bool:
    byte = (np.int8, np.uint8)
    int32 = (np.int32,)
    want = {1: byte, 2: byte, 4: int32, 9: byte, 11: byte, 12: int32, 13: int32}  # the others float32
    for i, value in enumerate(node.inputs):
        if value is None:
            continue
        if value.shape is None or value.is_symbolic or value.dtype not in want.get(i, (np.float32,)):
            return False
    return all(v.dtype == np.float32 and v.shape is not None and not v.is_symbolic for v in node.outputs)


class QLSTMKernel(CKernel):
    kinds: tuple[str, ...] = (Q_LSTM,)

    def supports(self, node: Node) -> bool:
        packed = bool(int(node.attrs["packed"]))
        if len(node.inputs) != (14 if packed else 12) or len(node.outputs) != 3 or not _types_ok(node):
            return False
        known = all(str(f) in ACTIVATIONS for f in node.attrs["activations"])
        if int(node.attrs["layout"]) != 0 or not known:
            return False
        return min(_sizes(node)) >= 1

    def scratch_nbytes(self, node: Node) -> int:
        return _regions(*_sizes(node)[1:])[-1][1]

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        dirs, seq, batch, size, hidden = _sizes(node)
        present = [i for i in range(len(node.inputs)) if node.input(i) is not None]
        ins: list[Arg] = [arg(step.inputs[i], _CTYPES[np.dtype(node.inputs[i].dtype)], True, step,  # type: ignore[union-attr]
                              f"input {i}") for i in present]
        args = [*ins, *output_args(step), *scratch_arg(step, self.scratch_nbytes(node))]
        args[-1] = Arg(args[-1].kind, args[-1].offset, "uint8_t", False)
        names = [_NAMES[i] for i in present] + ["y", "yh", "yc", "scratch"]
        packed = bool(int(node.attrs["packed"]))
        zeros = [v.dtype if v is not None else None for v in (node.inputs[9], node.inputs[11])]  # W, R types
        mr, npan = qtile_shape(target)
        g = 4 * hidden
        per_dir = {i: math.prod(node.inputs[i].shape) // dirs for i in (8, 9, 10, 11)}  # type: ignore[union-attr, arg-type]
        clip = float(node.attrs["clip"])
        ctx = QLSTMContext(
            params=params(names, args, [True] * len(args)), op=op_name(Q_LSTM), dirs=dirs,
            reverse=node.attrs["direction"] == "reverse", seq=seq, batch=batch, input=size, hidden=hidden,
            has_b=3 in present, has_lens=4 in present, has_h0=5 in present, has_c0=6 in present,
            has_p=7 in present, clip=literal(clip) if np.isfinite(clip) else None,
            acts=activation_exprs(node), vacts=vector_activation_exprs(node), nact=3,
            linear_before_reset=False, input_forget=bool(node.attrs["input_forget"]),
            zero_finished=bool(node.attrs["zero_finished"]), vw=target.vector_bytes // 4,
            isa=target.int8_dot, mr=mr, step_mr=-(-batch // -(-batch // mr)), npan=npan,
            kpx=round_up(size, 4), kph=round_up(hidden, 4),
            w_shift=128 if zeros[0] == np.uint8 else 0, r_shift=128 if zeros[1] == np.uint8 else 0,
            w_scale_n=per_dir[8], w_zero_n=per_dir[9], r_scale_n=per_dir[10], r_zero_n=per_dir[11],
            regions=_regions(seq, batch, size, hidden),
            pack_when="1" if g * (size + hidden) >= PARALLEL_MIN_WORK else "0",
            proj_when=f"rows * {2 * g * size} >= {PARALLEL_MIN_WORK}",
            step_when="1" if 2 * batch * g * hidden >= PARALLEL_MIN_WORK else "0",
            cell_when="1" if batch >= 2 and batch * hidden >= _CELL_PARALLEL else "0",
            dispatch=target.int8_dot == "avx512bw", packed=packed,
        )
        return StepCode("c/qlstm.c.j2", ctx, tuple(args))


KERNELS = (QLSTMKernel(),)
