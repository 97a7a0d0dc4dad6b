"""``kernels/cpu/model.h``: the header a C program includes to run an artifact without Python.

Rendered from ``templates/c/model.h.j2`` out of plan.json alone (deterministic, like every other
artifact file): the ABI version, the host arena's size and alignment, the weights' size, every
graph input's and output's name, dtype and shape, the partitions' entry functions and an
``onnx_aot_run`` that calls them in order with each partition's ``ext`` array built from the
caller's input and output pointers. An artifact where some step is not C (the reference
provider, or any device partition) cannot run from C: its header says why in
``ONNX_AOT_NOT_RUNNABLE_REASON`` and stops the build with ``#error`` unless the includer defines
``ONNX_AOT_ALLOW_PARTIAL`` (then only the declarations are usable).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from compiler.codegen.env import render
from compiler.providers.c.provider import ABI_VERSION
from runtime.errors import CompileError
from runtime.plan_schema import Plan
from runtime.plan_schema import TensorSpec

__all__ = ["HEADER_NAME", "HeaderContext", "header_context", "write_c_header"]

HEADER_NAME = "model.h"


@dataclass(frozen=True)
class TensorInfo:
    index: int
    name: str  # a C string literal's contents (escaped)
    comment: str  # safe inside /* */
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    shape_name: str


@dataclass(frozen=True)
class EntryInfo:
    symbol: str
    first_step: int
    last_step: int
    slots: tuple[str, ...]  # C expressions for ext[k]: "(void*)inputs[i]" or "outputs[j]"


@dataclass(frozen=True)
class TensorGroup:
    """The graph's inputs or its outputs, in the header's order."""

    kind: str  # "input" | "output": names the macros and arrays (ONNX_AOT_INPUT_0_BYTES, onnx_aot_inputs)
    tensors: tuple[TensorInfo, ...]


@dataclass(frozen=True)
class HeaderContext:
    model: str
    guard: str
    abi_version: int
    reason: str  # why a C program cannot run the plan; "" when it can
    arena_nbytes: int
    arena_alignment: int
    weights_nbytes: int
    num_steps: int
    inputs: TensorGroup
    outputs: TensorGroup
    entries: tuple[EntryInfo, ...]

    @property
    def runnable(self) -> bool:
        return not self.reason


def _c_string(text: str) -> str:
    """``text`` as the inside of a C string literal: printable ASCII kept, the rest octal-escaped."""
    out = []
    for byte in text.encode("utf-8"):
        char = chr(byte)
        if 32 <= byte < 127 and char not in '"\\?':
            out.append(char)
        else:
            out.append(f"\\{byte:03o}")
    return "".join(out)


def _comment(text: str) -> str:
    return _c_string(text).replace("*/", "* /")


def _group(kind: str, specs: tuple[TensorSpec, ...]) -> TensorGroup:
    tensors = []
    for index, spec in enumerate(specs):
        dims = "x".join(map(str, spec.shape)) or "scalar"
        comment = _comment(f"{spec.name}: {spec.dtype.name} {dims}")
        # a dynamic dim (an expression of the plan's symbols) is -1 and the size 0: known per run
        static = all(isinstance(d, int) for d in spec.shape)
        shape = tuple(d if isinstance(d, int) else -1 for d in spec.shape)
        tensors.append(TensorInfo(index, _c_string(spec.name), comment, spec.dtype.name, shape,
                                  spec.nbytes if static else 0, f"onnx_aot_{kind}_shape_{index}"))
    return TensorGroup(kind, tuple(tensors))


def _not_runnable(plan: Plan) -> str:
    """Why a C program cannot run this plan ("" when it can)."""
    others = [p for p in plan.partitions if p.runner != "c"]
    if not plan.partitions:
        return "the plan has no steps"
    if plan.symbols:
        return _c_string("the plan has dynamic dims (its memory is placed per binding by the runtime)")
    if others:
        steps = [s for p in others for s in plan.partition_steps(p)]
        names = ", ".join(f"{s.name} ({s.op_type})" for s in steps[:3])
        more = f" and {len(steps) - 3} more" if len(steps) > 3 else ""
        providers = sorted({p.runner for p in others})
        return _c_string(f"{len(steps)} step(s) run on the {'/'.join(providers)} provider: {names}{more}")
    spaces = sorted({a.memory_space for a in plan.arenas} - {"host"})
    if spaces:
        return _c_string(f"the plan has arenas in {', '.join(spaces)}")
    narrow = sum(c.stored is not None for c in plan.constants)
    if narrow:
        return _c_string(f"{narrow} constant(s) are stored narrow in weights.bin, widened at load by the "
                         "Python runtime (compile with --wide-weights to store them as kernels read them)")
    return ""


def _entries(plan: Plan) -> tuple[EntryInfo, ...]:
    """The C partitions' entries, each with its ext slots as the caller's input/output pointers."""
    slot_of = {s.name: f"(void*)inputs[{i}]" for i, s in enumerate(plan.inputs)}
    slot_of.update({o.value: f"outputs[{i}]" for i, o in enumerate(plan.outputs)})
    entries = []
    for part in plan.partitions:
        if part.runner != "c":
            continue
        missing = [name for name in part.ext if name not in slot_of]
        if missing:
            raise CompileError(f"C partition {part.index}: ext value(s) {missing} are not graph "
                               f"inputs or outputs")
        entries.append(EntryInfo(part.entry, part.first_step, part.last_step,
                                 tuple(slot_of[name] for name in part.ext)))
    return tuple(entries)


def header_context(plan: Plan) -> HeaderContext:
    host = plan.arena("host")
    return HeaderContext(
        model=_comment(plan.name),
        guard="ONNX_AOT_MODEL_" + re.sub(r"[^A-Za-z0-9]", "_", plan.name).upper() + "_H",
        abi_version=ABI_VERSION,
        reason=_not_runnable(plan),
        arena_nbytes=host.nbytes if host is not None else 0,
        arena_alignment=max(64, host.alignment) if host is not None else 64,
        weights_nbytes=plan.weights_nbytes,
        num_steps=len(plan.steps),
        inputs=_group("input", plan.inputs),
        outputs=_group("output", plan.output_specs),
        entries=_entries(plan) if not plan.symbols else (),
    )


def write_c_header(kernels_dir: Path, plan: Plan) -> Path:
    """Render ``kernels_dir/model.h`` for ``plan`` and return its path."""
    kernels_dir.mkdir(parents=True, exist_ok=True)
    path = kernels_dir / HEADER_NAME
    path.write_text(render("c/model.h.j2", header_context(plan)), encoding="utf-8")
    return path
