"""The reference provider's kernels: one per supported node kind, written against ``xp``.

``xp`` is the array module (numpy on the host, cupy on the device), so kernels use only what
both provide. Every kernel has the signature ``kernel(xp, inputs, attrs, outputs) -> list``:
``inputs`` are arrays (None for omitted optional inputs), ``attrs`` the canonical attributes of
docs/ops.md, ``outputs`` the expected (shape, dtype) of each output; it returns one array per
output with exactly that shape and dtype, never modifying its inputs. These kernels are the
completeness fallback and the oracle generated C / CUDA kernels are tested against; the compiler
also runs them for constant folding.

Importing this package registers every kernel module below in :data:`REGISTRY`.
"""

from __future__ import annotations

from runtime.kernels import (  # noqa: F401  (imported to register their kernels)
    conv,
    elementwise,
    fused,
    indexing,
    linalg,
    loss,
    math_ops,
    nhwc,
    nn,
    nn_ext,
    pool,
    reduce,
    sequence,
    sequence_quant,
    sequence_sample,
    sequence_signal,
    spatial,
    tensor,
    winograd,
)
from runtime.kernels.registry import REGISTRY, Kernel, OutputSpec, get_kernel, register, supported_kinds

__all__ = ["REGISTRY", "Kernel", "OutputSpec", "get_kernel", "register", "supported_kinds"]
