"""``--precision {fp32,bf16,auto}``: the precision the GEMM weights are stored and read in.

``fp32`` (the default) keeps every weight as the model gives it. ``bf16`` rounds the weights of the
packed GEMM steps (``compiler/passes/pack_gemm_weights.py``) to bfloat16, to nearest even, at
compile time: the packed panels hold those rounded values, weights.bin stores them as bfloat16
codes (half their bytes, ``compiler/ir/narrow.py``'s stored forms), and the loader widens them to
float32 (``runtime/narrow_weights.py``), so every kernel computes in float32 on bf16 weights -- what
the portable build of a bf16 artifact does on every CPU. Activations, elementwise, normalization
and softmax stay float32. ``auto`` is bf16 where the ``--cpu`` target computes bf16 dot products
natively (AVX512_BF16, ``TargetInfo.bf16_dot``), else fp32, and says which.

The golden cases take the fp32 model's outputs as their reference and the measured difference of
the rounded weights as their added tolerance (``compiler/artifact/golden_precision.py``): the error
is what bfloat16's 8-bit significand gives the weights, a relative rounding of at most 2**-9 each
(tests/test_bf16.py bounds and measures it).
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
