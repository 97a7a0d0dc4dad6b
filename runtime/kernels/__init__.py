"""The reference provider's kernels: one per supported node kind, written against ``xp``.

``xp`` is the array module (numpy on the host, cupy on the device), so kernels use only what
both provide. Every kernel has the signature ``kernel(xp, inputs, attrs, outputs) -> list``:
``inputs`` are arrays (None for omitted optional inputs), ``attrs`` the canonical attributes of
docs/ops.md, ``outputs`` the expected (shape, dtype) of each output; it returns one array per
output with exactly that shape and dtype, never modifying its inputs. These kernels are the
completeness fallback and the oracle generated C / CUDA kernels are tested against; the compiler
also runs them for constant folding.

Importing this package registers the kernels of every module in :data:`KERNEL_MODULES` in
:data:`REGISTRY`.
"""

from __future__ import annotations

from runtime.kernels import control
from runtime.kernels import conv
from runtime.kernels import elementwise
from runtime.kernels import fused
from runtime.kernels import indexing
from runtime.kernels import linalg
from runtime.kernels import loss
from runtime.kernels import math_ops
from runtime.kernels import movement
from runtime.kernels import nhwc
from runtime.kernels import normalization
from runtime.kernels import pool
from runtime.kernels import qconv
from runtime.kernels import qgemm
from runtime.kernels import qoperator
from runtime.kernels import qrecurrent
from runtime.kernels import quantize
from runtime.kernels import recurrent
from runtime.kernels import reduce
from runtime.kernels import sampling
from runtime.kernels import spatial
from runtime.kernels import spectral
from runtime.kernels import transformer
from runtime.kernels import winograd
from runtime.kernels.registry import REGISTRY
from runtime.kernels.registry import Kernel
from runtime.kernels.registry import OutputSpec
from runtime.kernels.registry import get_kernel
from runtime.kernels.registry import register
from runtime.kernels.registry import supported_kinds

__all__ = ["KERNEL_MODULES", "REGISTRY", "SUPPORT_MODULES", "Kernel", "OutputSpec", "get_kernel", "register",
           "supported_kinds"]

# The kernel modules, each registering the reference kernels of one family of ops.
KERNEL_MODULES = (elementwise, reduce, movement, indexing, math_ops, linalg, conv, pool, normalization,
                  loss, spatial, fused, winograd, nhwc, transformer, recurrent, quantize, qconv, qgemm,
                  qoperator, qrecurrent, sampling, spectral, control)
# The modules they share, which register nothing: a module of this package is in one of the two lists
# (a test checks it), so a new kernel module cannot be left out of the registry unnoticed.
SUPPORT_MODULES = ("common", "registry", "window", "amx_pack")
