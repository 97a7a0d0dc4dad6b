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

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from runtime.contract import IF
from runtime.contract import LOOP
from runtime.contract import SCAN
from runtime.contract import SLICE_AT
from runtime.errors import OnnxAotError
from runtime.errors import RuntimeKernelError
from runtime.kernels.common import finish
from runtime.kernels.registry import OutputSpec
from runtime.kernels.registry import get_kernel
from runtime.kernels.registry import register

__all__ = ["run_sub_schedule", "check_control_attrs"]

_REF = re.compile(r"(?:[iat])(?:0|[1-9][0-9]*)")
_NUMERIC_KINDS = "biuf"


def run_sub_schedule(
    xp: Any, program: dict[str, Any], inputs: Sequence[Any], args: Sequence[Any] = ()
) -> list[Any]:
    """The values of ``program``'s outputs, its refs read from ``inputs`` and ``args``."""
    temps: dict[str, Any] = {}

    def read(ref: str | None) -> Any:
        if ref is None:
            return None
        if ref[0] == "i":
            return inputs[int(ref[1:])]
        return args[int(ref[1:])] if ref[0] == "a" else temps[ref]

    for step in program["steps"]:
        specs: list[OutputSpec] = [(tuple(shape), np.dtype(dtype)) for shape, dtype in step["specs"]]
        results = get_kernel(step["kind"])(xp, [read(r) for r in step["inputs"]], step["attrs"], specs)
        temps.update(zip(step["outputs"], results, strict=True))
    return [read(ref) for ref in program["outputs"]]


def _truth(xp: Any, value: Any) -> bool:
    return bool(xp.asarray(value).reshape(-1)[0])


@register(IF)
def if_(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    branch = attrs["then_branch"] if _truth(xp, inputs[0]) else attrs["else_branch"]
    return finish(
        xp, IF, [xp.array(r, copy=True) for r in run_sub_schedule(xp, branch, inputs)], outputs
    )


@register(LOOP)
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
        outs = run_sub_schedule(xp, attrs["body"], inputs, [*args, *carried])
        running = _truth(xp, outs[0])
        carried = [xp.array(v, copy=True) for v in outs[1 : 1 + n]]
        for k, value in enumerate(outs[1 + n :]):
            if len(scans[k]) == outputs[n + k][0][0]:  # (stop before memory grows past the plan)
                raise RuntimeKernelError(f"{LOOP}: more iterations than the {len(scans[k])} its "
                                         f"scan outputs were compiled for")
            scans[k].append(xp.array(value, copy=True))
        i += 1
    stacked = []
    for k, (shape, _) in enumerate(outputs[n:]):
        if len(scans[k]) != shape[0]:
            raise RuntimeKernelError(
                f"{LOOP}: ran {len(scans[k])} iterations, but its scan outputs "
                f"were compiled for {shape[0]}"
            )
        stacked.append(xp.stack(scans[k]) if scans[k] else xp.zeros(shape, outputs[n + k][1]))
    return finish(xp, LOOP, carried + stacked, outputs)


@register(SCAN)
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
        outs = run_sub_schedule(xp, attrs["body"], inputs, [*states, *slices])
        states = [xp.array(v, copy=True) for v in outs[:n]]
        for k, value in enumerate(outs[n:]):
            elems[k].append(xp.array(value, copy=True))
    stacked = [
        xp.stack(e[::-1] if d else e, axis=int(a))
        for e, a, d in zip(elems, attrs["out_axes"], attrs["out_dirs"], strict=True)
    ]
    return finish(xp, SCAN, states + stacked, outputs)


@register(SLICE_AT)
def slice_at(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """ONNX Slice (opset 10+) whose starts / ends / axes / steps are known only at run time (a loop
    body's ``x[i:i+1]``): Python's slices clamp as ONNX does; the shape is checked against the plan."""
    x = inputs[0]
    starts, ends = (np.asarray(v).reshape(-1).tolist() for v in inputs[1:3])
    axes = np.asarray(inputs[3]).reshape(-1).tolist() if len(inputs) > 3 and inputs[3] is not None \
        else list(range(len(starts)))
    steps = np.asarray(inputs[4]).reshape(-1).tolist() if len(inputs) > 4 and inputs[4] is not None \
        else [1] * len(starts)
    index = [slice(None)] * x.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        if step == 0:
            raise RuntimeKernelError(f"{SLICE_AT}: step 0")
        index[int(axis) % x.ndim] = slice(int(start), int(end), int(step))
    return finish(xp, SLICE_AT, [x[tuple(index)]], outputs)


# -- checking a plan's programs once, at load ------------------------------------------------------
def check_control_attrs(kind: str, attrs: Any, n_inputs: int, where: str) -> None:
    """ValueError naming ``where`` unless a control step's attributes (its programs, nested ones
    included) are well formed: known kinds, refs to inputs / arguments / earlier results only,
    numeric dtypes and whole-number shapes. A kind that is not a control step passes."""
    check = _ATTR_CHECKS.get(kind)
    if check is not None:
        if not isinstance(attrs, dict):
            raise ValueError(f"{where}: attributes are not an object")
        check(attrs, n_inputs, where)


def _check_if(attrs: dict[str, Any], n_inputs: int, where: str) -> None:
    for key in ("then_branch", "else_branch"):
        _check_program(attrs.get(key), n_inputs, 0, f"{where} {key}")


def _check_loop(attrs: dict[str, Any], n_inputs: int, where: str) -> None:
    n = attrs.get("n_carried")
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= n_inputs - 2:
        raise ValueError(f"{where}: n_carried {n!r} does not fit its {n_inputs} inputs")
    body = attrs.get("body")
    args = body.get("args") if isinstance(body, dict) else None
    if not isinstance(args, list) or len(args) != 2 + n:
        raise ValueError(f"{where}: the body must take {2 + n} arguments")
    for spec in args:
        _check_spec(spec, f"{where} body args")
    _check_program(body, n_inputs, len(args), f"{where} body")


def _check_scan(attrs: dict[str, Any], n_inputs: int, where: str) -> None:
    n, length = attrs.get("n_states"), attrs.get("length")
    lists = [attrs.get(k) for k in ("in_axes", "in_dirs", "out_axes", "out_dirs")]
    if not all(_count(v) for v in (n, length)) or not all(
        isinstance(v, list) and all(_count(x) for x in v) for v in lists
    ):
        raise ValueError(f"{where}: n_states, length and the axes / directions must be whole numbers >= 0")
    in_axes, in_dirs, out_axes, out_dirs = (list(v or ()) for v in lists)
    assert isinstance(n, int)
    n_scans = len(in_axes)
    if n + n_scans > n_inputs or len(in_dirs) != n_scans or len(out_axes) != len(out_dirs):
        raise ValueError(f"{where}: states, scan inputs and axes do not fit its {n_inputs} inputs")
    _check_program(attrs.get("body"), n_inputs, n + n_scans, f"{where} body")


_ATTR_CHECKS = {IF: _check_if, LOOP: _check_loop, SCAN: _check_scan}


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_program(program: Any, n_inputs: int, n_args: int, where: str) -> None:
    if not isinstance(program, dict) or not isinstance(program.get("steps"), list) \
            or not isinstance(program.get("outputs"), list):
        raise ValueError(f"{where}: a program needs 'steps' and 'outputs' lists")
    made: set[str] = set()
    for k, step in enumerate(program["steps"]):
        at = f"{where} step {k}"
        if not isinstance(step, dict) or not isinstance(step.get("attrs"), dict) or not all(
            isinstance(step.get(key), list) for key in ("inputs", "outputs", "specs")
        ):
            raise ValueError(f"{at}: needs 'kind', 'attrs', 'inputs', 'outputs' and 'specs'")
        try:
            get_kernel(str(step.get("kind")))
        except OnnxAotError as exc:
            raise ValueError(f"{at}: {exc}") from None
        for ref in step["inputs"]:
            if ref is not None:
                _check_ref(ref, n_inputs, n_args, made, at)
        if len(step["specs"]) != len(step["outputs"]):
            raise ValueError(f"{at}: {len(step['specs'])} specs for {len(step['outputs'])} outputs")
        for spec in step["specs"]:
            _check_spec(spec, at)
        for ref in step["outputs"]:
            if not isinstance(ref, str) or not ref.startswith("t") or not _REF.fullmatch(ref) or ref in made:
                raise ValueError(f"{at}: output {ref!r} is not a new result name t<k>")
            made.add(ref)
        check_control_attrs(str(step["kind"]), step["attrs"], len(step["inputs"]), at)
    for ref in program["outputs"]:
        _check_ref(ref, n_inputs, n_args, made, f"{where} outputs")


def _check_ref(ref: Any, n_inputs: int, n_args: int, made: set[str], where: str) -> None:
    if not isinstance(ref, str) or not _REF.fullmatch(ref):
        raise ValueError(f"{where}: {ref!r} is not a ref (i<k>, a<k> or t<k>)")
    limit = {"i": n_inputs, "a": n_args}.get(ref[0])
    if (limit is not None and int(ref[1:]) >= limit) or (limit is None and ref not in made):
        raise ValueError(f"{where}: {ref!r} names no input, argument or earlier result")


def _check_spec(spec: Any, where: str) -> None:
    if not isinstance(spec, list) or len(spec) != 2 or not isinstance(spec[0], list) \
            or not all(_count(d) for d in spec[0]) or not isinstance(spec[1], str):
        raise ValueError(f"{where}: spec {spec!r} is not [shape, dtype]")
    try:
        dtype = np.dtype(spec[1])
    except TypeError:
        dtype = np.dtype(object)
    if dtype.kind not in _NUMERIC_KINDS:
        raise ValueError(f"{where}: dtype {spec[1]!r} is not a numeric or bool type")
