"""C kernels of the recurrent ops: RNN, GRU and LSTM (``templates/c/recurrent.c.j2``).

Canonical forms in ``compiler/frontend/canonical/recurrent.py``, references in
``runtime/kernels/recurrent.py``. Claimed for float32 X, W, R, B, initial states and peepholes
(sequence_lens int32) with every attribute the canonical form allows: directions forward, reverse
and bidirectional; layouts 0 and 1; any subset of the optional inputs; any clip; every activation
function of the canonical table (with its alpha / beta, per direction); GRU's linear_before_reset
0 and 1; LSTM's input_forget 0 and 1. Only empty sizes (a zero dimension) are left to the
reference provider. In a dynamic graph the sequence length and the batch may be run-time sizes
(C locals read from the binding, ``SEQ`` and ``NB``; input and hidden sizes stay compile-time): the
same loops run over them, the threads' decisions become C conditions over the run's sizes,
and a run-time batch switches to the batch-1 register block of the step's product at batch 1.

Per direction the kernel first computes the input projections of every timestep at once
(X[t]·Wᵀ + Wb + Rb for all t, into scratch), then per step the recurrent product H·Rᵀ with the
gates, the cell update and the outputs fused after it (GRU with linear_before_reset 0 runs a
second product, (r ⊙ H)·R_hᵀ, within the step). The two directions of a bidirectional node are
the two items of one job of the worker pool (templates/c/workers.c.j2); otherwise the projections'
and a step's register blocks are claimed by the pool only when the product is large: a small model
such as Silero VAD's LSTM (hidden 128, batch 1) runs on the calling thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.codegen.cdims import CDim
from compiler.codegen.cdims import kernel_dims
from compiler.codegen.elementwise import literal
from compiler.codegen.toolchain import TargetInfo
from compiler.codegen.vmath import scalar_math_expr
from compiler.codegen.vmath import vector_math_expr
from compiler.ir.graph import Node
from compiler.providers.base import GenStep
from compiler.providers.base import shape_of
from compiler.providers.c.common import PARALLEL_MIN_WORK
from compiler.providers.c.common import Arg
from compiler.providers.c.common import CKernel
from compiler.providers.c.common import StepCode
from compiler.providers.c.common import arg
from compiler.providers.c.common import dyn_arg
from compiler.providers.c.common import output_args
from compiler.providers.c.common import params
from compiler.providers.c.gemm import sized_scratch
from compiler.providers.c.rundims import is_dynamic
from compiler.providers.kit import KernelContext
from compiler.providers.kit import Param
from runtime.symbolic import Dim
from runtime.symbolic import Expr
from runtime.symbolic import bounds

__all__ = ["ACTIVATIONS", "RecurrentContext", "RecurrentKernel", "activation_exprs", "sizes_ok",
           "vector_activation_exprs"]

# Per op: (gates, activation functions per direction, outputs, names of the inputs).
_OPS: dict[str, tuple[int, int, int, tuple[str, ...]]] = {
    "RNN": (1, 1, 2, ("x", "w", "r", "b", "lens", "h0")),
    "GRU": (3, 2, 2, ("x", "w", "r", "b", "lens", "h0")),
    "LSTM": (4, 3, 3, ("x", "w", "r", "b", "lens", "h0", "c0", "p")),
}
# The canonical activation functions as C expressions of ``x`` ({a}: alpha, {b}: beta), each
# computing what runtime.kernels.recurrent.activation computes (NaN in, NaN out).
ACTIVATIONS: dict[str, str] = {
    "Tanh": scalar_math_expr("Tanh", "x"),  # the vector math's scalar twins (lane 0 of its vectors)
    "Sigmoid": scalar_math_expr("Sigmoid", "x"),
    "Relu": "(x < 0.0f ? 0.0f : x)",
    "Affine": "{a} * x + {b}",
    "LeakyRelu": "(x >= 0.0f ? x : {a} * x)",
    "ThresholdedRelu": "(x > {a} ? x : 0.0f)",
    "ScaledTanh": "{a} * tanhf({b} * x)",
    "HardSigmoid": "({a} * x + {b} < 0.0f ? 0.0f : ({a} * x + {b} > 1.0f ? 1.0f : {a} * x + {b}))",
    "Elu": "(x >= 0.0f ? x : {a} * expm1f(x))",
    "Softsign": "x / (1.0f + fabsf(x))",
    "Softplus": "((x > 0.0f ? x : 0.0f) + log1pf(expf(-fabsf(x))))",
}
# A step's recurrent product goes to the pool from this many multiply-adds (a pool job per
# timestep costs more than a small product).
_STEP_PARALLEL_WORK = 4 * PARALLEL_MIN_WORK


Decls = tuple[tuple[str, str], ...]  # run-time sizes and thread decisions: (C local, C expression)


@dataclass(frozen=True)
class RecurrentContext(KernelContext):
    """One recurrent node: sizes, which optional inputs are present, the activation functions
    (C expressions, direction-major), and element strides of the layout (x: t, b; y: t,
    direction, b; states: direction, b)."""

    op: str
    gates: int
    dirs: int
    reverse: bool  # direction "reverse" (a bidirectional node's second direction is always reversed)
    seq: int | CDim  # CDim: a run-time size (a C local declared by ``decls``)
    batch: int | CDim
    input: int
    hidden: int
    has_b: bool
    has_lens: bool
    has_h0: bool
    has_c0: bool
    has_p: bool
    clip: str | None  # float literal, None without clip
    acts: tuple[str, ...]
    vacts: tuple[str | None, ...]  # vector forms (None: the scalar one lane by lane)
    nact: int  # activation functions per direction
    linear_before_reset: bool
    input_forget: bool
    x_t: int | CDim
    x_b: int | CDim
    x_r: int | None  # x's stride per (t, b) row where those rows are contiguous (layout 0), else None
    y_t: int | CDim
    y_d: int | CDim
    y_b: int | CDim
    s_d: int | CDim
    s_b: int | CDim
    vw: int  # float lanes of the target's vectors
    dir_floats: int | CDim  # scratch floats of one direction
    # the two directions as one pool job (then nothing within one is split); with run-time sizes
    # each of the three is a C condition (the pool where it holds, else the calling thread)
    dir_parallel: bool | str
    proj_parallel: bool | str
    step_parallel: bool | str
    proj_block: tuple[int, int]  # (rows of x, rows of W) per register block of the projections
    step_block: tuple[int, int]  # (rows of h, rows of R) per register block of a step's product
    decls: Decls = ()  # run-time sizes: (C local, C expression over dyn)
    step_block1: tuple[int, int] | None = None  # a run-time batch's block at batch 1


def _blocks(batch: Dim, target: TargetInfo) -> tuple[tuple[int, int], tuple[int, int]]:
    """Register blocks of the two products: ra x rb accumulators plus ra + rb loaded vectors must
    fit the target's vector registers (32 with AVX-512, else 16). A step's product has only
    ``batch`` rows of h: at batch 1 it runs one h row against many rows of R (a run-time batch:
    ``_batch_one_block``, switched to at run time)."""
    ra, rb = (4, 4) if target.vector_registers >= 32 else (2, 4)
    if isinstance(batch, Expr):
        return (ra, rb), (ra, rb)
    step = _batch_one_block(target) if batch == 1 else (min(ra, batch), rb)
    return (ra, rb), step


def _batch_one_block(target: TargetInfo) -> tuple[int, int]:
    return (1, 8 if target.vector_registers >= 32 else 6)


def _sizes(node: Node) -> tuple[int, Dim, Dim, int, int]:
    """(directions, seq, batch, input size, hidden size) of a canonical recurrent node (seq and
    batch expressions of the symbols in a dynamic graph)."""
    xs = shape_of(node.input(0), symbolic=True)
    layout = int(node.attrs["layout"])
    seq, batch = (xs[0], xs[1]) if layout == 0 else (xs[1], xs[0])
    dirs = 2 if node.attrs["direction"] == "bidirectional" else 1
    return dirs, seq, batch, int(xs[2]), int(node.attrs["hidden_size"])


def _dtypes_ok(node: Node) -> bool:
    """float32 everywhere with shapes, except an int32 sequence_lens; a dynamic node's run-time
    dims only in its sequence length and batch (weights, biases and peepholes static)."""
    values = [(i, v) for i, v in enumerate(node.inputs) if v is not None]
    values += [(-1, v) for v in node.outputs]
    if any(v.is_symbolic for i, v in values if i in (1, 2, 3, 7)):
        return False
    return all(
        v.shape is not None and v.dtype == (np.int32 if i == 4 else np.float32) for i, v in values
    )


def sizes_ok(node: Node) -> bool:
    """No size is empty: a static one at least 1, a run-time one at least 1 over the ranges."""
    graph = node.graph
    for d in _sizes(node):
        if isinstance(d, Expr):
            if graph is None or bounds(d, graph.symbols)[0] < 1:
                return False
        elif d < 1:
            return False
    return True


# The same over a vector ``x`` (type vf) where the vector math has the function; the others run
# their scalar form lane by lane.
_VECTOR_ACTIVATIONS: dict[str, str] = {name: vector_math_expr(name, "x") for name in ("Tanh", "Sigmoid")}


def activation_exprs(node: Node) -> tuple[str, ...]:
    a = node.attrs
    out = []
    for name, alpha, beta in zip(a["activations"], a["activation_alpha"], a["activation_beta"], strict=True):
        out.append(ACTIVATIONS[str(name)].format(a=literal(float(alpha)), b=literal(float(beta))))
    return tuple(out)


def vector_activation_exprs(node: Node) -> tuple[str | None, ...]:
    """Each activation's vector C expression of ``x``, None where it runs lane by lane."""
    return tuple(_VECTOR_ACTIVATIONS.get(str(name)) for name in node.attrs["activations"])


def _strides(layout: int, dirs: int, seq: Any, batch: Any, size: int, hidden: int) -> dict[str, Any]:
    """Element strides of x (t, b), y (t, d, b) and the states (d, b) in the node's layout (ints,
    or C text where seq / batch are run-time: ``CDim``)."""
    if layout == 0:
        return dict(x_t=batch * size, x_b=size, x_r=size, y_t=dirs * batch * hidden, y_d=batch * hidden,
                    y_b=hidden, s_d=batch * hidden, s_b=hidden)  # fmt: skip
    return dict(x_t=size, x_b=seq * size, x_r=None, y_t=dirs * hidden, y_d=hidden, y_b=seq * dirs * hidden,
                s_d=hidden, s_b=dirs * hidden)  # fmt: skip


def _direction_floats(gates: int, seq: Any, batch: Any, hidden: int) -> Any:
    """Scratch floats of one direction: projections of every step, gates, h and c."""
    return seq * batch * gates * hidden + batch * gates * hidden + 2 * batch * hidden


def _parallel(node: Node) -> tuple[bool, bool, bool]:  # a static node's
    """Which loops fork (directions, projections, step products): the two directions of a large
    enough bidirectional node run on two threads (no synchronization per step); otherwise the
    projections and each step's product are split when large (a fork/join per step costs more
    than a small product, and far more on a loaded machine)."""
    dirs, s, b, size, hidden = _sizes(node)
    seq, batch = int(s), int(b)  # type: ignore[arg-type]  # a static node: ints
    width = _OPS[node.op_type][0] * hidden
    dir_parallel = dirs == 2 and seq * batch * width * (size + hidden) >= PARALLEL_MIN_WORK
    return (
        dir_parallel,
        not dir_parallel and seq * batch * width * size >= _STEP_PARALLEL_WORK,
        not dir_parallel and batch * width * hidden >= _STEP_PARALLEL_WORK,
    )


def _run_time_parallel(node: Node, seq: Any, batch: Any) -> Decls:
    """``_parallel``'s three decisions as C conditions over the run's sizes (``seq`` / ``batch``:
    ints or the C locals SEQ / NB): declarations of DIRPAR, PROJPAR, STEPPAR."""
    dirs, _, _, size, hidden = _sizes(node)
    width = _OPS[node.op_type][0] * hidden
    rows = seq * batch
    dir_par = f"({rows} * {width * (size + hidden)} >= {PARALLEL_MIN_WORK})" if dirs == 2 else "0"
    return (
        ("DIRPAR", dir_par),
        ("PROJPAR", f"(!DIRPAR && {rows} * {width * size} >= {_STEP_PARALLEL_WORK})"),
        ("STEPPAR", f"(!DIRPAR && {batch} * {width * hidden} >= {_STEP_PARALLEL_WORK})"),
    )


def _run_time_sizes(node: Node, symbols: tuple[str, ...]) -> tuple[dict[str, Any], Decls]:
    """A dynamic node's seq and batch as C locals SEQ / NB where they are run-time, its strides
    and scratch floats as C text over them, and the declarations (sizes, then thread decisions)."""
    dirs, seq, batch, size, hidden = _sizes(node)
    write = kernel_dims(symbols)
    decls: list[tuple[str, str]] = []
    local: dict[str, Any] = {}
    for name, d in (("SEQ", seq), ("NB", batch)):
        local[name] = CDim(name) if isinstance(d, Expr) else d
        if isinstance(d, Expr):
            decls.append((name, str(write(d))))
    s, b = local["SEQ"], local["NB"]
    fields = dict(seq=s, batch=b, dir_floats=_direction_floats(_OPS[node.op_type][0], s, b, hidden),
                  **_strides(int(node.attrs["layout"]), dirs, s, b, size, hidden))
    return fields, (*decls, *_run_time_parallel(node, s, b))


class RecurrentKernel(CKernel):
    kinds: tuple[str, ...] = ("RNN", "GRU", "LSTM")
    dynamic = True  # run-time sequence length and batch (_run_time_sizes)

    def supports(self, node: Node) -> bool:
        a = node.attrs
        gates, nact, n_out, names = _OPS[node.op_type]
        if not _dtypes_ok(node) or len(node.outputs) != n_out or len(node.inputs) > len(names):
            return False
        dirs = 2 if a.get("direction") == "bidirectional" else 1
        acts = a.get("activations", ())
        return (
            a.get("layout") in (0, 1)
            and len(acts) == nact * dirs
            and all(str(f) in ACTIVATIONS for f in acts)
            and sizes_ok(node)
        )

    def scratch_nbytes(self, node: Node) -> int | Expr:  # type: ignore[override]
        dirs, seq, batch, _, hidden = _sizes(node)
        return 4 * dirs * _direction_floats(_OPS[node.op_type][0], seq, batch, hidden)  # type: ignore[no-any-return]

    def build(self, step: GenStep, target: TargetInfo) -> StepCode:
        node = step.node
        gates, nact, _, input_names = _OPS[node.op_type]
        dirs, seq, batch, size, hidden = _sizes(node)
        present = [i for i in range(len(input_names)) if node.input(i) is not None]
        ins: list[Arg] = [arg(step.inputs[i], "int" if i == 4 else "float", True, step, f"input {i}")
                          for i in present]  # fmt: skip
        args = [*ins, *output_args(step), *sized_scratch(step, self.scratch_nbytes(node))]
        names = [input_names[i] for i in present] + ["y", "yh", "yc"][: len(node.outputs)] + ["scratch"]
        step_params = params(names, args, [True] * len(args))
        blocks = _blocks(batch, target)
        sizes: dict[str, Any]
        extra: dict[str, Any]
        if is_dynamic(node):
            sizes, decls = _run_time_sizes(node, step.symbols)
            # one direction: no direction threads (DIRPAR is 0), so no region for them either
            forks: tuple[bool | str, ...] = ("DIRPAR" if dirs == 2 else False, "PROJPAR", "STEPPAR")
            one = _batch_one_block(target) if isinstance(batch, Expr) else None
            extra = dict(decls=decls, step_block1=one)
            step_params += (Param("dyn", "int64_t", True, True),)
            args.append(dyn_arg(step))
        else:
            sizes = dict(seq=seq, batch=batch, dir_floats=_direction_floats(gates, seq, batch, hidden),
                         **_strides(int(node.attrs["layout"]), dirs, seq, batch, size, hidden))
            forks, extra = _parallel(node), {}
        clip = float(node.attrs["clip"])
        ctx = RecurrentContext(
            params=step_params,
            op=node.op_type,
            gates=gates,
            dirs=dirs,
            reverse=node.attrs["direction"] == "reverse",
            input=size,
            hidden=hidden,
            has_b=3 in present,
            has_lens=4 in present,
            has_h0=5 in present,
            has_c0=6 in present,
            has_p=7 in present,
            clip=literal(clip) if np.isfinite(clip) else None,
            acts=activation_exprs(node),
            vacts=vector_activation_exprs(node),
            nact=nact,
            linear_before_reset=bool(node.attrs.get("linear_before_reset", 0)),
            input_forget=bool(node.attrs.get("input_forget", 0)),
            **sizes,
            vw=target.vector_bytes // 4,
            dir_parallel=forks[0],
            proj_parallel=forks[1],
            step_parallel=forks[2],
            proj_block=blocks[0],
            step_block=blocks[1],
            **extra,
        )
        return StepCode("c/recurrent.c.j2", ctx, tuple(args))


KERNELS = (RecurrentKernel(),)
