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
"""

from __future__ import annotations

from collections.abc import Callable

import ml_dtypes
import numpy as np

from compiler.codegen.options import BuildOptions
from runtime.errors import CompileError

__all__ = ["PRECISIONS", "DEFAULT_PRECISION", "resolve_precision", "to_bf16"]

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


def to_bf16(array: np.ndarray) -> np.ndarray:
    """The float32 ``array`` rounded to nearest even as bfloat16 codes (NaN stays NaN)."""
    assert array.dtype == np.float32
    return np.ascontiguousarray(array).astype(BF16)
