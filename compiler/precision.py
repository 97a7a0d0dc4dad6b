"""``--precision {fp32,bf16,auto}``: the precision the GEMM and convolution weights are stored and read in.

``fp32`` (the default) keeps every weight as the model gives it. ``bf16`` rounds the weights of the
packed GEMM steps (``compiler/passes/pack_gemm_weights.py``) and of the NHWC convolutions of one
group (``compiler/passes/pack_conv_bf16.py``; the small convs stay fp32; a per-channel affine +
Relu ahead of a 1x1 one is folded into its input pass, ``fuse_conv_prescale.py``) to
bfloat16, to nearest even, at compile time, and stores them as bfloat16 codes in AMX-BF16's pair
layout (``runtime/kernels/amx_pack.py``: half their bytes). Those steps compute bf16 products in
fp32 sums on AMX-BF16 tiles where the CPU has them (the GEMM input rounded to bf16 per run), and in
fp32 on the weights widened per run elsewhere (``templates/c/gemm_amx.c.j2``, ``conv_amx.c.j2``):
one artifact runs on every CPU. A Gemm whose rows are known at run time only keeps fp32 panels of
the rounded weights, stored as bfloat16 codes and widened at load (``runtime/narrow_weights.py``).
Activations between steps, elementwise, normalization and softmax stay float32. ``auto`` is bf16
where the ``--cpu`` target computes bf16 dot products natively (AVX512_BF16,
``TargetInfo.bf16_dot``), else fp32, and says which.

The golden cases take the fp32 model's outputs as their reference and the measured difference of
the bf16 steps (the reference kernels round the weights, and the input of each AMX step, as the
artifact does) as their added tolerance (``compiler/artifact/golden_precision.py``): bfloat16's
8-bit significand rounds each operand by at most 2**-9 of itself (tests/test_bf16.py and
tests/test_amx_bf16.py bound and measure it).

Which convs go bf16, and which 3x3 convs keep fp32's Winograd form instead, follows the bf16 engine
the ``--cpu`` target will run (``bf16_engine``; the rules and their measurements:
``compiler/passes/bf16_cost.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import ml_dtypes
import numpy as np

from compiler.codegen.options import BuildOptions
from runtime.errors import CompileError

__all__ = ["PRECISIONS", "DEFAULT_PRECISION", "bf16_engine", "resolve_precision", "to_bf16"]

PRECISIONS = ("fp32", "bf16", "auto")
DEFAULT_PRECISION = "fp32"
BF16 = np.dtype(ml_dtypes.bfloat16)


def resolve_precision(precision: str, build: BuildOptions, say: Callable[[str], None]) -> str:
    """``precision`` as the compile runs it: ``fp32`` or ``bf16`` (``auto`` decided by ``build``'s
    target, with a progress line saying what it chose and why). ``CompileError`` for a value not in
    PRECISIONS, naming the option."""
    if precision not in PRECISIONS:
        raise CompileError(f"--precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision != "auto":
        return precision
    from compiler.codegen.toolchain import target_info

    if target_info(build).bf16_dot:
        say(f"--precision auto: bf16 (the --cpu target {build.isa} has AVX512_BF16)")
        return "bf16"
    say(f"--precision auto: fp32 (the --cpu target {build.isa} has no native bf16 dot product, AVX512_BF16)")
    return "fp32"


def bf16_engine(build: BuildOptions) -> tuple[str, str]:
    """The bf16 engine whose rules a bf16 compile for ``build``'s target follows, and why:
    ``"amx"`` where the target has AMX-BF16, ``"dpbf16"`` where it has AVX512_BF16 without AMX;
    a target that names neither (x86-64-v4, whose artifact takes AMX or vdpbf16ps at run time) the
    build machine's where it is the build machine's own level (the default ``--cpu``), else
    ``"amx"`` (the rules measured first; also on targets without AVX-512, whose bf16 steps run in
    fp32, as before)."""
    from compiler.codegen.toolchain import target_info
    from runtime.isa import host_cpu_flags
    from runtime.isa import host_x86_level

    info = target_info(build)
    if info.amx_bf16:
        return "amx", f"the --cpu target {build.isa} has AMX-BF16"
    if info.bf16_dot:
        return "dpbf16", f"the --cpu target {build.isa} has AVX512_BF16 without AMX"
    flags = host_cpu_flags() or frozenset()
    if info.vector_bytes == 64 and build.isa == host_x86_level(flags):
        if "amx_bf16" in flags:
            return "amx", f"the --cpu target {build.isa} is this machine's level: AMX-BF16"
        if "avx512_bf16" in flags:
            return "dpbf16", f"the --cpu target {build.isa} is this machine's level: AVX512_BF16, no AMX"
    return "amx", f"the --cpu target {build.isa} names no bf16 unit"


def to_bf16(array: np.ndarray) -> np.ndarray:
    """The float32 ``array`` rounded to nearest even as bfloat16 codes (NaN stays NaN)."""
    assert array.dtype == np.float32
    return np.ascontiguousarray(array).astype(BF16)
