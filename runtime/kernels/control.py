"""Control steps: ``onnx_aot.If`` runs one of two sub-schedules, ``onnx_aot.Loop`` and
``onnx_aot.Scan`` run one per iteration.

A sub-schedule (*program*) is plain JSON data in the step's attributes, written by the frontend
(``compiler/frontend/control/program.py``)::

    {"steps": [{"kind": "Add", "attrs": {...}, "inputs": [ref | null, ...], "outputs": [ref, ...],
                "specs": [[shape, dtype], ...]}, ...],
     "outputs": [ref, ...]}

where a ref is ``"i<k>"`` (input k of the control step), ``"a<k>"`` (argument k of the program: a
Loop body's iteration number, condition and carried values) or ``"t<k>"`` (a value an earlier
step of the program made). Each step runs the reference kernel of its kind, so a program may hold
control steps of its own. Only the branch taken runs; a Loop runs its body while the trip count and
the condition allow and stacks the scan outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from runtime.errors import RuntimeKernelError
from runtime.kernels.common import finish
from runtime.kernels.registry import OutputSpec
from runtime.kernels.registry import get_kernel
from runtime.kernels.registry import register

__all__ = ["run_program"]


def run_program(
    xp: Any, program: dict[str, Any], inputs: Sequence[Any], args: Sequence[Any] = ()
) -> list[Any]:
    """The values of ``program``'s outputs, its refs read from ``inputs`` and ``args``."""
    temps: dict[str, Any] = {}

    def read(ref: str | None) -> Any:
        if ref is None:
            return None
        table = {"i": inputs, "a": args}.get(ref[0])
        return table[int(ref[1:])] if table is not None else temps[ref]

    for step in program["steps"]:
        specs: list[OutputSpec] = [(tuple(shape), np.dtype(dtype)) for shape, dtype in step["specs"]]
        results = get_kernel(step["kind"])(xp, [read(r) for r in step["inputs"]], step["attrs"], specs)
        temps.update(zip(step["outputs"], results, strict=True))
    return [read(ref) for ref in program["outputs"]]


def _truth(xp: Any, value: Any) -> bool:
    return bool(xp.asarray(value).reshape(-1)[0])


@register("onnx_aot.If")
def if_(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    branch = attrs["then_branch"] if _truth(xp, inputs[0]) else attrs["else_branch"]
    return finish(
        xp, "onnx_aot.If", [xp.array(r, copy=True) for r in run_program(xp, branch, inputs)], outputs
    )


@register("onnx_aot.Loop")
def loop(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """inputs: trip count (or None), condition (or None), the carried values, then what the body
    reads from outside; outputs: the final carried values, then the scan outputs."""
    n = int(attrs["n_carried"])
    trips = None if inputs[0] is None else int(xp.asarray(inputs[0]).reshape(-1)[0])
    running = True if inputs[1] is None else _truth(xp, inputs[1])
    carried = list(inputs[2 : 2 + n])
    scans: list[list[Any]] = [[] for _ in outputs[n:]]
    (iteration_shape, _), (cond_shape, _) = attrs["body"]["args"][:2]
    i = 0
    while running and (trips is None or i < trips):
        args = [xp.asarray(np.int64(i)).reshape(iteration_shape), xp.asarray(True).reshape(cond_shape)]
        outs = run_program(xp, attrs["body"], inputs, [*args, *carried])
        running = _truth(xp, outs[0])
        carried = [xp.array(v, copy=True) for v in outs[1 : 1 + n]]
        for k, value in enumerate(outs[1 + n :]):
            scans[k].append(xp.array(value, copy=True))
        i += 1
    stacked = []
    for k, (shape, _) in enumerate(outputs[n:]):
        if len(scans[k]) != shape[0]:
            raise RuntimeKernelError(
                f"onnx_aot.Loop: ran {len(scans[k])} iterations, but its scan outputs "
                f"were compiled for {shape[0]}"
            )
        stacked.append(xp.stack(scans[k]))
    return finish(xp, "onnx_aot.Loop", carried + stacked, outputs)


@register("onnx_aot.Scan")
def scan(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """inputs: the states, the scan inputs, then what the body reads from outside; outputs: the
    final states, then the scan outputs (stacked on ``out_axes``, reversed where ``out_dirs`` is 1)."""
    n, length = int(attrs["n_states"]), int(attrs["length"])
    xs = inputs[n : n + len(attrs["in_axes"])]
    states = list(inputs[:n])
    elems: list[list[Any]] = [[] for _ in outputs[n:]]
    for t in range(length):
        slices = [
            xp.take(x, length - 1 - t if d else t, axis=int(a))
            for x, a, d in zip(xs, attrs["in_axes"], attrs["in_dirs"], strict=True)
        ]
        outs = run_program(xp, attrs["body"], inputs, [*states, *slices])
        states = [xp.array(v, copy=True) for v in outs[:n]]
        for k, value in enumerate(outs[n:]):
            elems[k].append(xp.array(value, copy=True))
    stacked = [
        xp.stack(e[::-1] if d else e, axis=int(a))
        for e, a, d in zip(elems, attrs["out_axes"], attrs["out_dirs"], strict=True)
    ]
    return finish(xp, "onnx_aot.Scan", states + stacked, outputs)
