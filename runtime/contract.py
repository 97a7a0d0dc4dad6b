"""The contract between the compiler and the runtime: the ``onnx_aot`` ops and the plan format's names.

Both halves name our own ops through the constants here (``FUSED_CONV`` is ``"onnx_aot.FusedConv"``,
a node's ``kind``), never through string literals: the canonical forms and passes that make them,
the providers that claim them and the reference kernels that run them. ``OPS`` is the op table
(docs/ops.md, "onnx-aot ops"): each op's name, its inputs (``"B?"`` optional, ``"V..."`` any number)
and its attributes with their defaults (``REQUIRED``: the op has no meaning without it);
``attr_problems`` checks a node's attributes against it (``Graph.verify`` calls it for every
``onnx_aot`` node). The attributes are those of the reference form; a control step compiled into
nested schedules is recorded in plan.json with other attributes (its slots, docs/architecture.md).

Two words have one meaning each, in the plan records of both halves:

- a **memory space** (``space``, ``memory_space``): whose memory a buffer is in, ``HOST`` or
  ``CUDA`` (a provider's ``memory_space``, an arena's, a Transfer's ``from`` / ``to``);
- a location's **kind** (``LOCATION_KINDS``): which part of memory holds a value's bytes,
  "arena" (an offset into the space's arena), "weights" (an offset into weights.bin), "ext" (the
  caller's array of a graph input or output) or "symbolic" (a small tensor of expressions, dynamic
  plans only).

The plan format's names: a dynamic plan places buffer ``k`` at the placeholder ``placeholder(k)``
(``_b<k>``) until the runtime binds it, and a C partition of a dynamic plan reads the binding
through its ext slot ``DYN_EXT``; arenas, nested schedules' buffers and weights.bin records are
aligned to ``ALIGNMENT`` / ``WEIGHT_ALIGNMENT`` bytes with ``round_up``. This module imports nothing
of the project, so the runtime loads without the compiler.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any
from typing import Final

__all__ = [
    "AOT_DOMAIN", "REQUIRED", "OPTIONAL", "AotOp", "OPS", "aot_kind", "attr_problems", "op_name",
    "COPY", "TRANSFER", "SLICE_AT", "BATCH_NORM_TRAINING", "FUSED_CONV", "FUSED_GEMM", "PACKED_GEMM",
    "WINOGRAD_CONV", "CONV_NHWC", "WINOGRAD_CONV_NHWC", "MAX_POOL_NHWC", "AVERAGE_POOL_NHWC",
    "GLOBAL_AVERAGE_POOL_NHWC", "LRN_NHWC", "MULTI_HEAD_ATTENTION", "FUSED_ELEMENTWISE", "IF", "LOOP",
    "PACKED_QCONV",
    "SCAN", "CONTROL_KINDS", "QGEMM", "BODIES", "NO_ACTIVATION", "Q_BINARY", "Q_LOOKUP", "Q_AVERAGE_POOL",
    "Q_CHANNEL_LOOKUP", "Q_TABLE_ADD", "Q_GLOBAL_AVERAGE_POOL", "Q_SOFTMAX", "Q_LSTM",
    "HOST", "CUDA", "SPACES", "LOCATION_KINDS",
    "PLACEHOLDER_PREFIX", "placeholder", "placeholder_index", "DYN_EXT", "ALIGNMENT", "WEIGHT_ALIGNMENT",
    "round_up",
]

AOT_DOMAIN: Final = "onnx_aot"  # the domain of our own fused / internal ops


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


class _Optional:
    def __repr__(self) -> str:
        return "OPTIONAL"


REQUIRED: Final[Any] = _Required()  # an attribute default meaning "always present"
OPTIONAL: Final[Any] = _Optional()  # may be absent; its default is the op's rule (docs/ops.md)


@dataclass(frozen=True)
class AotOp:
    """One ``onnx_aot`` op: ``name`` (the node's op_type), its inputs in order (``"B?"`` may be
    omitted, ``"V..."`` stands for any number) and its attributes, name -> default, REQUIRED or
    OPTIONAL (a default that depends on the node, e.g. dilations: 1 per spatial axis)."""

    name: str
    inputs: tuple[str, ...]
    attrs: Mapping[str, Any]

    @property
    def kind(self) -> str:
        return aot_kind(self.name)

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(k for k, v in self.attrs.items() if v is REQUIRED)


def aot_kind(name: str) -> str:
    """The kind of op ``name`` in our domain: ``"onnx_aot.<name>"``."""
    return f"{AOT_DOMAIN}.{name}"


def op_name(kind: str) -> str:
    """The op_type of one of our kinds (``FUSED_CONV`` -> ``"FusedConv"``)."""
    return OPS[kind].name


# -- attribute groups --------------------------------------------------------------------------
# Activation attributes of a fused epilogue without an activation (FusedConv, FusedGemm and their
# lowerings): ``activation`` is "" / "Relu" / "Clip" / "LeakyRelu" / "Silu".
NO_ACTIVATION: Final[Mapping[str, Any]] = MappingProxyType(
    {"activation": "", "act_min": -math.inf, "act_max": math.inf, "act_alpha": 0.0}
)
# The canonical Conv's and pools' attributes (compiler/frontend/canonical/conv.py writes them all);
# dilations: 1 per spatial axis.
_WINDOW = {"kernel_shape": REQUIRED, "strides": REQUIRED, "pads": REQUIRED, "dilations": OPTIONAL}
_CONV = {**_WINDOW, "group": 1}
_POOL = {**_WINDOW, "ceil_mode": 0}
_GEMM = {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0}
BODIES: Final = "bodies"  # compile side only: a control step's subgraphs (compiler/frontend/control)
_SCAN = {"n_states": REQUIRED, "length": REQUIRED, "in_axes": REQUIRED, "in_dirs": REQUIRED,
         "out_axes": REQUIRED, "out_dirs": REQUIRED}


def _op(name: str, inputs: str, **attrs: Any) -> AotOp:
    return AotOp(name, tuple(inputs.split()), MappingProxyType(dict(attrs)))


_TABLE = (
    _op("Copy", "X"),
    _op("Transfer", "X", **{"from": REQUIRED, "to": REQUIRED}),  # memory spaces
    _op("SliceAt", "data starts ends axes? steps?"),
    _op("BatchNormTraining", "X scale B mean var", epsilon=1e-5, momentum=0.9),
    _op("FusedConv", "X W B? Z?", **_CONV, **NO_ACTIVATION),
    _op("WinogradConv", "X U B? Z?", **_CONV, **NO_ACTIVATION),
    # S, T (--precision bf16, compiler/passes/fuse_conv_prescale.py): X * S + T per input channel,
    # then Relu where pre_relu, before the conv (a 1x1 unpadded conv of an AMX pack only)
    _op("ConvNhwc", "X W B? Z? S? T?", **_CONV, **NO_ACTIVATION, pre_relu=0),
    _op("WinogradConvNhwc", "X U B? Z?", **_CONV, **NO_ACTIVATION),
    _op("MaxPoolNhwc", "X", **_POOL, storage_order=0),
    _op("AveragePoolNhwc", "X", **_POOL, count_include_pad=0),
    _op("GlobalAveragePoolNhwc", "X"),
    _op("LRNNhwc", "X", alpha=1e-4, beta=0.75, bias=1.0, size=REQUIRED),
    _op("FusedGemm", "A B C?", **_GEMM, **NO_ACTIVATION),
    _op("PackedGemm", "A Bp C?", alpha=1.0, beta=1.0, transA=0, n=REQUIRED, **NO_ACTIVATION),
    # the integer GEMM (runtime/kernels/qgemm.py): B packed, output "int32" | "float" | "quantized"
    # ("quantized" with addend: QBinary's Add of the codes and an addend, per column or full, after it;
    # addend2: a second such Add after it (a residual after a bias); with lut: each code at last
    # through a 256-entry table, stored with 4 bytes of padding)
    _op("QGemm", "A Bp Bsum a_scale? a_zero? b_scale? b_zero? y_scale? y_zero? bias? "
        "addend? addend_scale? addend_zero? out_scale? out_zero? lut? "
        "addend2? addend2_scale? addend2_zero? out2_scale? out2_zero?", k=REQUIRED, n=REQUIRED,
        b_type=REQUIRED, output=REQUIRED, dynamic=0, **NO_ACTIVATION),
    _op("MultiHeadAttention", "Q K V mask?", scale=REQUIRED),
    # QLinearConv / ConvInteger on weights packed ahead of time (runtime/kernels/qconv.py)
    # Lut: codes of channel m mapped through row m of an (M, 256) table, stored flat + 4 bytes;
    # Addend (the output's shape and type): the codes then through QBinary's Add with it (A_scale,
    # A_zero: the codes' quantization as the Add reads them; Out_*: the result's)
    _op("PackedQConv", "X Wp Corr Wz? Scale? Lut? Addend? A_scale? A_zero? Addend_scale? Addend_zero? "
        "Out_scale? Out_zero?", **_CONV, method=REQUIRED, x_zero=REQUIRED, y_zero=0,
        qmin=REQUIRED, qmax=REQUIRED),
    _op("FusedElementwise", "X...", program=REQUIRED),
    _op("If", "cond V...", then_branch=REQUIRED, else_branch=REQUIRED, **{BODIES: None}),
    _op("Loop", "M? cond? carried... V...", body=REQUIRED, n_carried=REQUIRED, **{BODIES: None}),
    _op("Scan", "states... scans... V...", body=REQUIRED, **_SCAN, **{BODIES: None}),
    # 8-bit integer ops (docs/ops.md, "Integer ops"): per-tensor scales (float32) and zero points
    # (the output's dtype) are inputs; an omitted zero point is 0
    _op("QBinary", "A A_scale A_zero? B B_scale B_zero? C_scale C_zero?", op=REQUIRED),  # "Add" / "Mul"
    _op("QLookup", "X table"),  # y = table[the byte of x], a 256-entry table of the output's dtype
    _op("QChannelLookup", "X table"),  # y[n, c, ...] = table[c, the byte of x]: a (C, 256) table
    # y = clip(saturate(rint((TA[c, byte of a] + TB[c, byte of b]) / Y_scale) + Y_zero), qmin, qmax):
    # (C, 256) float32 tables, float32 sum and division (docs/ops.md, "QDQ folding"); a form (C, 5):
    # [x_scale, x_zero, mean, factor, bias] that computes its table as ((code - x_zero) * x_scale -
    # mean) * factor + bias in float32 (a BatchNormalization's, checked when built)
    _op("QTableAdd", "A TA B TB Y_scale Y_zero? A_form? B_form?", qmin=REQUIRED, qmax=REQUIRED),
    _op("QAveragePool", "X X_scale X_zero? Y_scale Y_zero?", **_POOL, count_include_pad=0),
    _op("QGlobalAveragePool", "X X_scale X_zero? Y_scale Y_zero?", channels_last=0),
    _op("QSoftmax", "X X_scale Y_scale Y_zero?"),  # over the last axis
    # onnxruntime's DynamicQuantizeLSTM (runtime/kernels/qrecurrent.py): W (dirs, input, 4H) and R
    # (dirs, H, 4H) 8-bit, scales / zero points (dirs) or (dirs, 4H); X and H quantized at run time;
    # packed 1: W and R packed per direction as QGemm's B, W_sum / R_sum their column sums
    _op("QLSTM",
        "X W R B? sequence_lens? initial_h? initial_c? P? W_scale W_zero R_scale R_zero W_sum? R_sum?",
        hidden_size=REQUIRED, direction=REQUIRED, layout=0, clip=REQUIRED, activations=REQUIRED,
        activation_alpha=REQUIRED, activation_beta=REQUIRED, input_forget=0, zero_finished=0, packed=0),
)
OPS: Final[Mapping[str, AotOp]] = MappingProxyType({op.kind: op for op in _TABLE})

COPY: Final = aot_kind("Copy")  # a real copy (a graph output that would alias something else)
TRANSFER: Final = aot_kind("Transfer")  # a move between memory spaces (the partitioner's)
SLICE_AT: Final = aot_kind("SliceAt")  # Slice with run-time starts / ends
BATCH_NORM_TRAINING: Final = aot_kind("BatchNormTraining")
FUSED_CONV: Final = aot_kind("FusedConv")
WINOGRAD_CONV: Final = aot_kind("WinogradConv")
CONV_NHWC: Final = aot_kind("ConvNhwc")
WINOGRAD_CONV_NHWC: Final = aot_kind("WinogradConvNhwc")
MAX_POOL_NHWC: Final = aot_kind("MaxPoolNhwc")
AVERAGE_POOL_NHWC: Final = aot_kind("AveragePoolNhwc")
GLOBAL_AVERAGE_POOL_NHWC: Final = aot_kind("GlobalAveragePoolNhwc")
LRN_NHWC: Final = aot_kind("LRNNhwc")
FUSED_GEMM: Final = aot_kind("FusedGemm")
PACKED_GEMM: Final = aot_kind("PackedGemm")
MULTI_HEAD_ATTENTION: Final = aot_kind("MultiHeadAttention")
QGEMM: Final = aot_kind("QGemm")
PACKED_QCONV: Final = aot_kind("PackedQConv")
FUSED_ELEMENTWISE: Final = aot_kind("FusedElementwise")
IF: Final = aot_kind("If")
LOOP: Final = aot_kind("Loop")
SCAN: Final = aot_kind("Scan")
CONTROL_KINDS: Final = (IF, LOOP, SCAN)
Q_BINARY: Final = aot_kind("QBinary")
Q_LOOKUP: Final = aot_kind("QLookup")
Q_CHANNEL_LOOKUP: Final = aot_kind("QChannelLookup")
Q_TABLE_ADD: Final = aot_kind("QTableAdd")
Q_AVERAGE_POOL: Final = aot_kind("QAveragePool")
Q_GLOBAL_AVERAGE_POOL: Final = aot_kind("QGlobalAveragePool")
Q_SOFTMAX: Final = aot_kind("QSoftmax")
Q_LSTM: Final = aot_kind("QLSTM")


def attr_problems(kind: str, attrs: Mapping[str, Any]) -> list[str]:
    """What is wrong with the attributes of an ``onnx_aot`` node of ``kind`` (empty: nothing): an
    op the table does not know, an attribute it does not know, a required one missing."""
    op = OPS.get(kind)
    if op is None:
        return [f"{kind!r} is not an op of the {AOT_DOMAIN!r} domain"]
    problems = [f"unknown attribute {key!r}" for key in attrs if key not in op.attrs]
    problems += [f"missing attribute {key!r}" for key in op.required if key not in attrs]
    return problems


# -- memory spaces and location kinds (see the module docstring) -----------------------------------
HOST: Final = "host"
CUDA: Final = "cuda"
SPACES: Final = (HOST, CUDA)
LOCATION_KINDS: Final = ("arena", "weights", "ext", "symbolic")

# -- the plan format's names ------------------------------------------------------------------------
PLACEHOLDER_PREFIX: Final = "_b"
# The ext slot (first) of a dynamic plan's C partition: the binding's int64 array, the symbols'
# values then the buffers' offsets (runtime/binding.py; compiler/codegen/cdims.py writes the C).
DYN_EXT: Final = "#dyn"
WEIGHT_ALIGNMENT: Final = 64  # of each record in weights.bin
ALIGNMENT: Final = 64  # of a nested schedule's buffers and of the slots in a control step's region


def placeholder(k: int) -> str:
    """The name that stands for buffer ``k``'s offset in a dynamic plan until the runtime places it."""
    return f"{PLACEHOLDER_PREFIX}{k}"


def placeholder_index(name: str) -> int | None:
    """``k`` when ``name`` is ``placeholder(k)``, else None."""
    rest = name[len(PLACEHOLDER_PREFIX):]
    return int(rest) if name.startswith(PLACEHOLDER_PREFIX) and rest.isdigit() else None


def round_up(n: Any, alignment: int) -> Any:
    """``n`` rounded up to a multiple of ``alignment`` (an int, or a numpy array of them)."""
    return (n + alignment - 1) // alignment * alignment
