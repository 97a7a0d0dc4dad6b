"""The toolchain choices of one compile (``BuildOptions``), recorded in the manifest.

They belong to code generation: the C toolchain reads the compiler, ``-march`` and flags, the
CUDA toolchain its architectures from ``extra``; every provider's ``generate`` takes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field

__all__ = ["BuildOptions"]


@dataclass(frozen=True)
class BuildOptions:
    """Toolchain choices recorded in the manifest."""

    cc: str = "cc"
    isa: str = "native"  # -march value
    # a second, portable build of the same kernels (-march value; None: only ``isa``), shipped so
    # the artifact also runs on CPUs that lack ``isa``'s features (compile_model sets x86-64-v2)
    portable_isa: str | None = None
    # its optimization flags: -O2 compiles ~20% faster than -O3 and runs ResNet-50 within ~3%
    # (docs/performance.md), which keeps a cold compile of both builds within budget
    portable_opt_flags: tuple[str, ...] = ("-O2",)
    opt_flags: tuple[str, ...] = ("-O3",)
    extra: dict[str, str] = field(default_factory=dict)
