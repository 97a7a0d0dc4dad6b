"""The C Einsum kernel: a loop nest generated from the equation (float32, any number of inputs).

The equation is resolved at compile time into labels, each with a size and a stride per input
(a label repeated within one input -- a diagonal -- strides by the sum; an ellipsis becomes one
label per broadcast dimension, right-aligned). Output labels are walked by the parallel loop,
contracted labels by nested loops inside it. Two loop orders: "dot" puts a contracted label
innermost and sums a dot product per output element (``bhid,bhjd->bhij``: ``d`` is contiguous in
both inputs); "axpy" puts the last output label innermost and accumulates a whole output row per
contracted position (``bij,bjk->bik``: ``k`` is contiguous in the output and in the second input).
The order whose innermost label is contiguous (or absent) in more inputs is chosen.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from compiler.codegen.elementwise import contiguous_strides
from compiler.codegen.elementwise import index_expr
from compiler.codegen.toolchain import TargetInfo
from compiler.ir.graph import Node
from compiler.providers.base import GenStep
from compiler.providers.base import shape_of
from compiler.providers.c.common import PARALLEL_MIN_WORK
from compiler.providers.c.common import Arg
from compiler.providers.c.common import CKernel
from compiler.providers.c.common import StepCode
from compiler.providers.c.common import params
from compiler.providers.c.common import step_args
from compiler.providers.c.dtypes import CType
from compiler.providers.c.dtypes import all_nonempty
from compiler.providers.c.dtypes import ctype_of
from compiler.providers.c.dtypes import offset_expr
from compiler.providers.c.dtypes import prod
from compiler.providers.kit import KernelContext

__all__ = ["EinsumContext", "EinsumKernel", "Contraction", "contraction"]

AXPY_MIN_INNER = 8  # when both orders stride equally, "axpy" needs output rows at least this long


@dataclass(frozen=True)
class Contraction:
    """An einsum resolved against its input shapes."""

    terms: tuple[tuple[str, ...], ...]  # the label of each input dimension
    output: tuple[str, ...]
    sizes: tuple[tuple[str, int], ...]  # every label's size, in first-appearance order

    def size(self, label: str) -> int:
        return dict(self.sizes)[label]

    def stride(self, k: int, label: str, shape: tuple[int, ...]) -> int:
        """Input ``k``'s element stride along ``label`` (0 where it is absent or broadcast)."""
        own = contiguous_strides(shape)
        return sum(s for lab, n, s in zip(self.terms[k], shape, own, strict=True) if lab == label and n != 1)


def _split_term(term: str) -> tuple[str, bool, str]:
    """(letters before '...', whether there is one, letters after); ValueError on bad syntax."""
    head, dots, tail = term.partition("...")
    if "." in head + tail or not all(c.isascii() and c.isalpha() for c in head + tail):
        raise ValueError(f"bad einsum term {term!r}")
    return head, bool(dots), tail


def contraction(equation: str, shapes: Sequence[tuple[int, ...]]) -> Contraction:
    """Resolve ``equation`` for inputs of ``shapes``; ValueError when it does not fit them."""
    lhs, arrow, rhs = equation.partition("->")
    specs = [_split_term(t) for t in lhs.split(",")]
    if len(specs) != len(shapes):
        raise ValueError(f"{len(specs)} terms for {len(shapes)} inputs")
    ell_rank = max([len(s) - len(h) - len(t) for (h, d, t), s in zip(specs, shapes, strict=True) if d] + [0])
    ell = [str(d) for d in range(ell_rank)]  # digits never clash with letter labels
    terms: list[tuple[str, ...]] = []
    for (head, dots, tail), shape in zip(specs, shapes, strict=True):
        n_ell = len(shape) - len(head) - len(tail)
        if n_ell < 0 or (n_ell and not dots):
            raise ValueError(f"term {head}{'...' if dots else ''}{tail} does not fit rank {len(shape)}")
        terms.append((*head, *ell[ell_rank - n_ell :], *tail))
    if arrow:
        head, dots, tail = _split_term(rhs)
        output = (*head, *(ell if dots else []), *tail)
    else:
        counts = Counter(lab for term in terms for lab in term if not lab.isdigit())
        output = (*ell, *sorted(lab for lab, c in counts.items() if c == 1))
    sizes: dict[str, int] = {}
    for term, shape in zip(terms, shapes, strict=True):
        for lab, n in zip(term, shape, strict=True):
            old = sizes.setdefault(lab, n)
            if old != n and not (lab.isdigit() and 1 in (old, n)):
                raise ValueError(f"label {lab!r} has sizes {old} and {n}")
            sizes[lab] = max(old, n) if lab.isdigit() else n
    if len(set(output)) != len(output) or any(lab not in sizes for lab in output):
        raise ValueError(f"bad output labels {''.join(output)!r}")
    return Contraction(tuple(terms), output, tuple(sizes.items()))


@dataclass(frozen=True)
class EinsumContext(KernelContext):
    ctype: str
    nin: int
    mode: str  # "dot" | "axpy"
    outer: int  # positions walked by ``o`` (all output labels, or all but the last)
    outer_offs: tuple[str, ...]  # each input's offset at ``o``
    con_dims: tuple[int, ...]  # contracted loops, outermost first
    con_names: tuple[str, ...]
    con_index: tuple[str, ...]  # each input's offset in the contracted loops
    inner: int  # axpy: length of an output row
    inner_index: tuple[str, ...]  # axpy: each input's offset along the row (variable ``n``)
    parallel: bool


def _misses(strides: Sequence[int]) -> int:
    """How many inputs read a label non-contiguously."""
    return sum(1 for s in strides if s not in (0, 1))


def _plan(c: Contraction, shapes: Sequence[tuple[int, ...]]) -> tuple[str, list[str]]:
    """The loop order ("dot" | "axpy") and the contracted labels, innermost last."""
    contracted = [lab for lab, _ in c.sizes if lab not in c.output and c.size(lab) != 1]

    def misses(lab: str) -> int:
        return _misses([c.stride(k, lab, s) for k, s in enumerate(shapes)])

    if contracted:
        best = min(reversed(contracted), key=misses)  # ties: the label appearing last
        contracted.remove(best)
        contracted.append(best)
    if not c.output:
        return "dot", contracted
    if not contracted:
        return "axpy", contracted
    dot_misses, axpy_misses = misses(contracted[-1]), misses(c.output[-1])
    if dot_misses < axpy_misses or (dot_misses == axpy_misses and c.size(c.output[-1]) < AXPY_MIN_INNER):
        return "dot", contracted
    return "axpy", contracted


def _einsum_type(node: Node) -> CType | None:
    """The C type shared by every operand (numeric, not bool), or None."""
    t = ctype_of(node.outputs[0])
    if t is None or t.kind == "b":
        return None
    if any(v is None or ctype_of(v) != t for v in node.inputs):
        return None
    return t


def _context(step: GenStep, t: CType, args: list[Arg]) -> EinsumContext:
    node = step.node
    shapes = [shape_of(v) for v in node.inputs]
    c = contraction(str(node.attrs["equation"]), shapes)
    mode, contracted = _plan(c, shapes)
    walked = list(c.output if mode == "dot" else c.output[:-1])
    dims = [c.size(lab) for lab in walked]
    names = [f"c{d}" for d in range(len(contracted))]
    con_dims = [c.size(lab) for lab in contracted]
    offs, con_index, inner_index = [], [], []
    for k, shape in enumerate(shapes):
        strides = [c.stride(k, lab, shape) for lab in walked]
        offs.append(offset_expr("o", dims, strides))
        con_index.append(index_expr([c.stride(k, lab, shape) for lab in contracted], names))
        inner_index.append(index_expr([c.stride(k, c.output[-1], shape)], ["n"]) if mode == "axpy" else "0")
    in_names = [f"x{k}" for k in range(len(shapes))]
    work = prod(shape_of(node.outputs[0])) * max(1, prod(con_dims)) * len(shapes)
    return EinsumContext(
        params=params([*in_names, "y"], args, [all_nonempty(node)] * len(args)),
        ctype=t.name,
        nin=len(shapes),
        mode=mode,
        outer=prod(dims),
        outer_offs=tuple(offs),
        con_dims=tuple(con_dims),
        con_names=tuple(names),
        con_index=tuple(con_index),
        inner=c.size(c.output[-1]) if mode == "axpy" else 1,
        inner_index=tuple(inner_index),
        parallel=work >= PARALLEL_MIN_WORK and prod(dims) > 1,
    )


class EinsumKernel(CKernel):
    kinds: tuple[str, ...] = ("Einsum",)

    def supports(self, node: Node) -> bool:
        if not node.inputs or len(node.outputs) != 1 or _einsum_type(node) is None:
            return False
        shapes = [shape_of(v) for v in node.inputs]
        try:
            c = contraction(str(node.attrs["equation"]), shapes)
        except ValueError:
            return False
        return tuple(c.size(lab) for lab in c.output) == shape_of(node.outputs[0])

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        t = _einsum_type(step.node)
        assert t is not None, step.node.describe()
        args = step_args(step, t.name)
        ctx = _context(step, t, args)
        return StepCode("c/einsum.c.j2", ctx, tuple(args))


KERNELS = (EinsumKernel(),)
