"""The C integer GEMM: ``onnx_aot.QGemm`` on the int8 micro-kernel (templates/c/qgemm.c.j2).

The micro-kernel (``templates/c/qgemm_tile.c.j2``) is chosen by the target's ``int8_dot``
(``compiler/codegen/toolchain.py``): AVX512-VNNI / AVX-VNNI ``vpdpbusd`` where the ``--cpu`` target
has it, B widened to 16 bit and ``pmaddwd`` with AVX-512BW or AVX2 (exact: no ``pmaddubsw``
saturation), plain C otherwise; ``QISA_TILES`` gives each its tile (rows x 16-column panels). B
arrives packed (``runtime/kernels/qgemm.py: pack_qb``, one layout for every target, so the portable
build shares the plan); A is copied into scratch per run (its +128 shift or its dynamic
quantization done there, with its row sums), so scratch depends on the node alone. An AVX-512BW
target without VNNI (x86-64-v4, the default ``--cpu`` level of an AVX-512 host) carries the VNNI
loops too and takes them at run time where the CPU has AVX512-VNNI (inline asm, so the build needs
no VNNI flag and the artifact still runs on AVX-512 CPUs without it). Every x86-64 AVX-512 target
also carries AMX-INT8 tiles (``templates/c/qamx.c.j2``, inline asm too), taken at each run where
the CPU has them and ``$ONNX_AOT_NO_AMX`` is unset; scratch pads A by 32 rows for their blocks.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from compiler.codegen.toolchain import TargetInfo
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.providers.base import GenStep
from compiler.providers.c.common import PARALLEL_MIN_WORK
from compiler.providers.c.common import Arg
from compiler.providers.c.common import CKernel
from compiler.providers.c.common import StepCode
from compiler.providers.c.common import arg
from compiler.providers.c.common import params
from compiler.providers.c.gemm import activation
from compiler.providers.c.gemm import fused_ok
from compiler.providers.kit import KernelContext
from runtime.contract import QGEMM
from runtime.contract import round_up
from runtime.errors import CompileError
from runtime.kernels.qgemm import QGROUP
from runtime.kernels.qgemm import QPANEL
from runtime.kernels.qoperator import binary_ratios

__all__ = ["QISA_TILES", "QGemmContext", "add_literals", "qtile_shape"]

# (rows, panels of 16 columns) per tile, for each int8_dot: as many int32 accumulators as the
# registers hold beside B's vectors and A's broadcasts
QISA_TILES: dict[str, tuple[int, int]] = {
    "avx512vnni": (6, 4), "avxvnni": (4, 1), "avx512bw": (6, 2), "avx2": (3, 1), "portable": (4, 1),
}
MAX_TILE_ROWS = 32  # scratch holds A padded to this many rows more, whatever the target's tile (AMX: 32)
AMX_ROWS, AMX_PANELS = 32, 2  # the AMX-INT8 tile step (templates/c/qamx.c.j2): 2 x 2 tiles of 16 x 16
_NAMES = ("a", "bpack", "bsum", "a_scale", "a_zero", "b_scale", "b_zero", "y_scale", "y_zero", "bias",
          "addend", "addend_scale", "addend_zero", "out_scale", "out_zero", "lut",
          "addend2", "addend2_scale", "addend2_zero", "out2_scale", "out2_zero")
_INPUTS = len(_NAMES)
_CTYPES = {np.dtype(np.float32): "float", np.dtype(np.int8): "int8_t", np.dtype(np.uint8): "uint8_t",
           np.dtype(np.int32): "int32_t"}


def qtile_shape(target: TargetInfo) -> tuple[int, int]:
    """The micro-kernel's (rows, panels) for ``target``."""
    return QISA_TILES[target.int8_dot]


@dataclass(frozen=True)
class QGemmContext(KernelContext):
    isa: str
    mr: int
    npan: int
    m: int
    k: int
    kp: int  # K rounded up to the group of 4
    n: int
    nmb: int  # row blocks
    ngroups: int  # tiles along N (npan panels each, the last tail_npan when that is not 0)
    tail_npan: int
    rows_padded: int
    rsum_offset: int  # bytes: A's row sums after A's copy in scratch
    a_ctype: str
    a_shift: int  # 128 for an int8 A (the micro-kernel reads u8)
    b_shift: int  # 128 for a uint8 B (packed less 128)
    dynamic: bool
    a_scale: bool
    a_zero: bool
    b_zero: bool
    b_zero_n: int
    b_scale_n: int
    bias: bool
    output: str
    y_ctype: str
    qmin: int
    qmax: int
    act: str
    when: str
    dispatch: bool = False  # AVX-512BW: the VNNI loops too, taken where the CPU has AVX512-VNNI
    amx: bool = False  # x86-64 AVX-512: the AMX-INT8 part too, taken where onnx_aot_amx_usable says so
    amx_nmb: int = 0  # AMX row blocks of 32
    amx_ngroups: int = 0  # AMX column groups of 2 panels (the last of one where amx_odd)
    amx_odd: bool = False
    pack_rows: int = 0  # rows of A copied into scratch (padded with zero rows to every tile's)
    add: str = ""  # "row" (an addend of n) / "full" (of the output's shape): QBinary's Add after the codes
    add_ry: str = ""  # double literals: QBinary's float32 ratios y_scale / out_scale and
    add_ra: str = ""  # addend_scale / out_scale
    add_za: int = 0  # the addend's zero point, the output's
    add_zc: int = 0
    add2: str = ""  # a second Add after the first (its input the first's output): the same fields
    add2_ry: str = ""
    add2_ra: str = ""
    add2_za: int = 0
    add2_zc: int = 0
    lut: bool = False  # each code then through lut[its byte] (260 bytes: the AVX-512 gather reads 4)


def _size(v: Value | None) -> int:
    return 0 if v is None or v.shape is None else math.prod(v.shape)


def _rows(node: Node) -> int:
    a = node.inputs[0]
    assert a is not None and a.shape is not None
    return math.prod(a.shape[:-1])


def _scratch(node: Node) -> tuple[int, int]:
    """A's copy (int16 at most) and the row sums after it: (offset of the sums, total bytes)."""
    k, rows = int(node.attrs["k"]), _rows(node) + MAX_TILE_ROWS
    offset = round_up(rows * round_up(k, QGROUP) * 2, 64)
    return offset, offset + 4 * rows


def _shapes_ok(node: Node) -> bool:
    a, bp, bsum, y = node.input(0), node.input(1), node.input(2), node.outputs[0]
    k, n = int(node.attrs["k"]), int(node.attrs["n"])
    if a is None or bp is None or bsum is None or a.shape is None or y.shape is None or not a.shape:
        return False
    want_bp = (-(-n // QPANEL), -(-k // QGROUP), QPANEL, QGROUP)
    if tuple(bp.shape or ()) != want_bp or bp.dtype != np.int8 or tuple(bsum.shape or ()) != (n,):
        return False
    return a.shape[-1] == k and tuple(y.shape) == (*a.shape[:-1], n) and _rows(node) >= 1


def _params_ok(node: Node) -> bool:
    """Scalars where the kernel reads one, per-column (n) parameters where it reads n."""
    n, out = int(node.attrs["n"]), str(node.attrs["output"])
    ins = [node.input(i) for i in range(_INPUTS)]
    dynamic = bool(int(node.attrs["dynamic"]))
    a, y = ins[0], node.outputs[0]
    assert a is not None
    if (a.dtype == np.float32) != dynamic or a.dtype not in _CTYPES or y.dtype not in _CTYPES:
        return False
    if dynamic and (ins[3] is not None or ins[4] is not None):
        return False
    if any(_size(ins[i]) not in (0, 1) for i in (3, 4, 7, 8)):
        return False
    if any(_size(ins[i]) not in (0, 1, n) for i in (5, 6)):
        return False
    if ins[6] is not None and ins[6].dtype not in (np.int8, np.uint8):
        return False
    if out == "int32":
        bias = ins[9]
        return (y.dtype == np.int32 and ins[7] is None and ins[8] is None
                and (bias is None or (bias.dtype == np.int32 and _size(bias) == n)))
    scaled = (ins[3] is not None or dynamic) and ins[5] is not None
    if out == "float":
        return scaled and y.dtype == np.float32 and ins[7] is None and _size(ins[9]) in (0, n)
    if any(ins[base] is None and any(v is not None for v in ins[base:base + 5]) for base in (10, 16)):
        return False
    if ins[16] is not None and (ins[10] is None or not _addend_ok(ins, n, y, 16)):
        return False
    lut = ins[15]
    if lut is not None and (lut.const is None or lut.dtype != y.dtype or lut.const.size != 260):
        return False
    return (out == "quantized" and scaled and ins[7] is not None and ins[8] is not None
            and ins[9] is None and y.dtype == ins[8].dtype and y.dtype in (np.int8, np.uint8)
            and (ins[10] is None or _addend_ok(ins, n, y, 10)))


def _addend_ok(ins: list[Value | None], n: int, y: Value, base: int) -> bool:
    """The addend at input ``base``: codes of y's type, a constant of n or a value of y's shape;
    the ratios' scales (its input's, its own, its output's) constant float32 scalars, the zero
    points constants of y's type."""
    addend = ins[base]
    assert addend is not None
    row = addend.const is not None and _size(addend) == n
    if addend.dtype != y.dtype or not (row or addend.shape == y.shape):
        return False
    scales = (ins[base - 3], ins[base + 1], ins[base + 3])
    zeros = (ins[base - 2], ins[base + 2], ins[base + 4])
    return (all(v is not None and v.const is not None and v.const.dtype == np.float32 for v in scales)
            and all(v is not None and v.const is not None and v.dtype == y.dtype for v in zeros))


def _hex(value: float) -> str:
    """A C double literal equal to ``value`` (hexadecimal, parenthesized: exact)."""
    return f"({float(value).hex()})"


def _add_fields(node: Node, base: int, prefix: str) -> dict[str, object]:
    """The context's fields (``prefix``: "add", "add2") of the addend at input ``base`` (none
    without it)."""
    addend = node.input(base)
    if addend is None:
        return {}
    ry, ra, za, zc = add_literals(*(node.input(base + k) for k in (-3, 1, 2, 3, 4)))
    full = addend.const is None or addend.shape == node.outputs[0].shape
    return {prefix: "full" if full else "row", f"{prefix}_ry": ry, f"{prefix}_ra": ra,
            f"{prefix}_za": za, f"{prefix}_zc": zc}


def add_literals(y_scale: Value | None, addend_scale: Value | None, addend_zero: Value | None,
                 out_scale: Value | None, out_zero: Value | None) -> tuple[str, str, int, int]:
    """QBinary's Add in an epilogue (here and compiler/providers/c/qconv.py): its float32 ratios
    y_scale / out_scale and addend_scale / out_scale as exact C double literals, the addend's and
    the output's zero points (absent: 0); the scales constants."""
    scales = [np.asarray(v.const) for v in (y_scale, addend_scale, out_scale)]  # type: ignore[union-attr]
    ry, ra = binary_ratios("Add", *scales)
    za, zc = (0 if v is None else int(np.asarray(v.const).reshape(-1)[0]) for v in (addend_zero, out_zero))
    return _hex(ry), _hex(ra), za, zc


class QGemmKernel(CKernel):
    kinds: tuple[str, ...] = (QGEMM,)

    def supports(self, node: Node) -> bool:
        if len(node.outputs) != 1 or not fused_ok(node) or str(node.attrs["b_type"]) not in ("int8", "uint8"):
            return False
        return _shapes_ok(node) and _params_ok(node)

    def scratch_nbytes(self, node: Node) -> int:
        return _scratch(node)[1]

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        k, n, m = int(node.attrs["k"]), int(node.attrs["n"]), _rows(node)
        ins = [node.input(i) for i in range(_INPUTS)]
        args: list[Arg] = []
        names: list[str] = []
        for i, value in enumerate(ins):
            if value is not None:
                args.append(arg(step.inputs[i], _CTYPES[np.dtype(value.dtype)], True, step, f"input {i}"))
                names.append(_NAMES[i])
        y = node.outputs[0]
        args.append(arg(step.outputs[0], _CTYPES[np.dtype(y.dtype)], False, step, "output 0"))
        offset, total = _scratch(node)
        if step.scratch is None or step.scratch_nbytes < total:
            raise_scratch(step, total)
        args.append(arg(step.scratch, "uint8_t", False, step, "scratch"))
        prms = params([*names, "y", "scratch"], args, [True] * len(args))
        mr, npan = qtile_shape(target)
        panels = -(-n // QPANEL)
        a, bz = ins[0], ins[6]
        assert a is not None and a.dtype is not None and y.dtype is not None
        info = np.iinfo(y.dtype) if y.dtype in (np.int8, np.uint8) else np.iinfo(np.int32)
        ctx = QGemmContext(
            params=prms, isa=target.int8_dot, mr=mr, npan=npan, m=m, k=k, kp=round_up(k, QGROUP), n=n,
            nmb=-(-m // mr), ngroups=-(-panels // npan), tail_npan=panels % npan,
            rows_padded=-(-m // mr) * mr,
            rsum_offset=offset, a_ctype=_CTYPES[np.dtype(a.dtype)], a_shift=128 if a.dtype == np.int8 else 0,
            b_shift=128 if node.attrs["b_type"] == "uint8" else 0, dynamic=bool(int(node.attrs["dynamic"])),
            a_scale=ins[3] is not None, a_zero=ins[4] is not None, b_zero=bz is not None, b_zero_n=_size(bz),
            b_scale_n=_size(ins[5]), bias=ins[9] is not None, output=str(node.attrs["output"]),
            y_ctype=_CTYPES[np.dtype(y.dtype)], qmin=int(info.min), qmax=int(info.max), act=activation(node),
            when="1" if 2 * m * n * k >= PARALLEL_MIN_WORK else "0", dispatch=target.int8_dot == "avx512bw",
            lut=ins[15] is not None, **_add_fields(node, 10, "add"),  # type: ignore[arg-type]
            **_add_fields(node, 16, "add2"),  # type: ignore[arg-type]
        )
        return StepCode("c/qgemm.c.j2", _with_amx(ctx, target, panels), tuple(args))


def amx_target(target: TargetInfo) -> bool:
    """Whether ``target``'s build carries the AMX-INT8 loops (x86-64 with AVX-512BW; inline asm)."""
    return target.int8_dot in ("avx512vnni", "avx512bw")


def _with_amx(ctx: QGemmContext, target: TargetInfo, panels: int) -> QGemmContext:
    """``ctx`` with the AMX part's blocking where ``target`` carries it; A padded to every tile's rows."""
    if not amx_target(target):
        return dataclasses.replace(ctx, pack_rows=ctx.rows_padded)
    m = ctx.m
    return dataclasses.replace(ctx, amx=True, amx_nmb=-(-m // AMX_ROWS), amx_ngroups=-(-panels // AMX_PANELS),
                               amx_odd=panels % AMX_PANELS != 0,
                               pack_rows=max(ctx.rows_padded, round_up(m, AMX_ROWS)))


def raise_scratch(step: GenStep, needed: int) -> None:
    raise CompileError(f"{step.node.describe()}: needs {needed} bytes of scratch, "
                       f"plan gives {step.scratch_nbytes}")


KERNELS = (QGemmKernel(),)
