"""QLookup on whole vectors (qoperator.py's QLookup kernel takes it): y = table[the byte of x] over
contiguous codes, 64 at a time by AVX512-VBMI byte permutes where the CPU has them
(``templates/c/qlookup.c.j2``: an AVX-512 build carries them behind a target attribute and asks
the CPU at run time, so an x86-64-v4 artifact still runs without VBMI), a table read in C
elsewhere. The same entries, so the element map's bits."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.providers.base import GenStep
from compiler.providers.base import shape_of
from compiler.providers.c.common import PARALLEL_MIN_WORK
from compiler.providers.c.common import StepCode
from compiler.providers.c.common import arg
from compiler.providers.c.common import output_args
from compiler.providers.c.common import params
from compiler.providers.c.elementwise_typed import value_ctype
from compiler.providers.kit import KernelContext

__all__ = ["QLutContext", "lookup_code"]

_CHUNK = 16384  # codes per work item (a multiple of 64)


@dataclass(frozen=True)
class QLutContext(KernelContext):
    ctype: str
    out_ctype: str
    n: int
    chunk: int
    chunks: int
    parallel: bool


def lookup_code(step: GenStep) -> StepCode:
    """The QLookup of ``step`` (x and y of one static shape, the table of 256 entries)."""
    node = step.node
    x, y = node.input(0), node.outputs[0]
    assert x is not None and x.dtype is not None and y.dtype is not None
    ctype, out_ctype = value_ctype(x.dtype), value_ctype(y.dtype)
    args = (arg(step.inputs[0], ctype, True, step, "input 0"),
            arg(step.inputs[1], out_ctype, True, step, "input 1 (table)"), *output_args(step, out_ctype))
    n = int(np.prod(shape_of(y)))
    ctx = QLutContext(params=params(["x", "table", "y"], args, [True, True, True]), ctype=ctype,
                      out_ctype=out_ctype, n=n, chunk=_CHUNK, chunks=-(-n // _CHUNK),
                      parallel=n >= PARALLEL_MIN_WORK)
    return StepCode("c/qlookup.c.j2", ctx, args)
