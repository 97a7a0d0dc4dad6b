"""C kernels of the recurrent ops (``templates/c/lstm.c.j2``).

LSTM (canonical form in ``compiler/frontend/canonical/recurrent.py``, reference in
``runtime/kernels/recurrent.py``) is claimed for float32 with: directions forward, reverse and
bidirectional; layouts 0 and 1; optional B, initial_h, initial_c and peepholes P; any clip; the
default activations (Sigmoid, Tanh, Tanh in every direction) and input_forget 0. Not claimed, so
they stay on the reference provider: ``sequence_lens``, other activations, input_forget 1.

The kernel first computes the input projections of every timestep of a direction at once
(X[t]·Wᵀ + Wb + Rb for all t, into scratch), then per step the recurrent product H·Rᵀ with the
gates, the cell update and the outputs fused after it. A step is split over OpenMP threads only when
its product is large (a small model such as Silero VAD's hidden 128, batch 1 runs on one thread).
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.codegen.elementwise import literal
from compiler.codegen.toolchain import TargetInfo
from compiler.ir.graph import Node
from compiler.providers.base import StepPlan
from compiler.providers.base import shape_of
from compiler.providers.c.common import PARALLEL_MIN_WORK
from compiler.providers.c.common import CKernel
from compiler.providers.c.common import StepCode
from compiler.providers.c.common import all_float32
from compiler.providers.c.common import input_args
from compiler.providers.c.common import output_args
from compiler.providers.c.common import params
from compiler.providers.c.common import scratch_arg
from compiler.providers.kit import Param

__all__ = ["LstmContext", "LstmKernel"]

_LSTM_DEFAULT = ("Sigmoid", "Tanh", "Tanh")
# A step's recurrent product is split over threads from this many multiply-adds (a fork/join per
# timestep costs more than a small product).
_STEP_PARALLEL_WORK = 4 * PARALLEL_MIN_WORK


@dataclass(frozen=True)
class LstmContext:
    """One LSTM node: sizes, which optional inputs are present, and element strides of the
    layout (x: t, b; y: t, direction, b; states: direction, b)."""

    params: tuple[Param, ...]
    dirs: int
    reverse: bool  # direction "reverse" (a bidirectional node's second direction is always reversed)
    seq: int
    batch: int
    input: int
    hidden: int
    has_b: bool
    has_h0: bool
    has_c0: bool
    has_p: bool
    clip: str | None  # float literal, None without clip
    x_t: int
    x_b: int
    y_t: int
    y_d: int
    y_b: int
    s_d: int
    s_b: int
    vw: int  # float lanes of the target's vectors
    proj_parallel: bool
    step_parallel: bool


def _sizes(node: Node) -> tuple[int, int, int, int, int]:
    """(directions, seq, batch, input size, hidden size) of a canonical LSTM node."""
    xs = shape_of(node.input(0))
    layout = int(node.attrs["layout"])
    seq, batch = (xs[0], xs[1]) if layout == 0 else (xs[1], xs[0])
    dirs = 2 if node.attrs["direction"] == "bidirectional" else 1
    return dirs, seq, batch, xs[2], int(node.attrs["hidden_size"])


class LstmKernel(CKernel):
    kinds: tuple[str, ...] = ("LSTM",)

    def supports(self, node: Node) -> bool:
        a = node.attrs
        if not all_float32(node) or node.input(4) is not None or len(node.outputs) != 3:
            return False
        dirs = 2 if a.get("direction") == "bidirectional" else 1
        return (
            a.get("layout") in (0, 1)
            and a.get("input_forget") == 0
            and tuple(a.get("activations", ())) == _LSTM_DEFAULT * dirs
            and min(_sizes(node)) >= 1
        )

    def scratch_nbytes(self, node: Node) -> int:
        _, seq, batch, _, hidden = _sizes(node)
        return 4 * (seq * batch * 4 * hidden + batch * 4 * hidden + 2 * batch * hidden)

    def build(self, step: StepPlan, target: TargetInfo) -> StepCode:
        node = step.node
        dirs, seq, batch, size, hidden = _sizes(node)
        layout0 = int(node.attrs["layout"]) == 0
        present = [i for i in range(8) if node.input(i) is not None]
        names = [("x", "w", "r", "b", "lens", "h0", "c0", "p")[i] for i in present]
        scratch = scratch_arg(step, self.scratch_nbytes(node))
        args = [*input_args(step), *output_args(step), *scratch]
        names += ["y", "yh", "yc", "scratch"]
        restrict = [True] * len(present) + [True, True, True, True]
        clip = float(node.attrs["clip"])
        ctx = LstmContext(
            params=params(names, args, restrict),
            dirs=dirs,
            reverse=node.attrs["direction"] == "reverse",
            seq=seq,
            batch=batch,
            input=size,
            hidden=hidden,
            has_b=3 in present,
            has_h0=5 in present,
            has_c0=6 in present,
            has_p=7 in present,
            clip=literal(clip) if clip != float("inf") else None,
            x_t=batch * size if layout0 else size,
            x_b=size if layout0 else seq * size,
            y_t=dirs * batch * hidden if layout0 else dirs * hidden,
            y_d=batch * hidden if layout0 else hidden,
            y_b=hidden if layout0 else seq * dirs * hidden,
            s_d=batch * hidden if layout0 else hidden,
            s_b=hidden if layout0 else dirs * hidden,
            vw=target.vector_bytes // 4,
            proj_parallel=seq * batch * 4 * hidden * size >= _STEP_PARALLEL_WORK,
            step_parallel=batch * 4 * hidden * hidden >= _STEP_PARALLEL_WORK,
        )
        return StepCode("c/lstm.c.j2", ctx, tuple(args))


KERNELS = (LstmKernel(),)
