"""I/O binding (onnxruntime's ``IOBinding``): inputs and outputs bound once, runs copy nothing.

Graph inputs and outputs never live in the arena: kernels read inputs where the caller's arrays
are and write outputs straight into the caller's arrays. ``bind_input`` / ``bind_output`` check
an array once (name, dtype, shape, contiguity, writability) and ``Session.run_with_iobinding``
then passes the bound arrays' addresses to the kernels directly: no feed checks, no output
allocation, no copies. An input that is not C-contiguous or aligned is copied once, at bind time.
An output bound without an array is allocated once by the binding and reused by every run.

For a dynamic plan (docs/dynamic-shapes.md) an array may take any shape within each dim's range;
the run derives the binding from the bound inputs, checks each bound output against the shape it
has at that binding (``InputError`` otherwise), and allocates the outputs bound without an array
at each new shape.

Device arrays (cupy) can be bound to a CUDA artifact's inputs and outputs when only CUDA
partitions touch them (the plan's host <-> device transfer then becomes one device-to-device
copy); a value read or written on the host needs a numpy array, and the error says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.errors import InputError
from runtime.plan_schema import TensorSpec

__all__ = ["IOBinding", "SessionIO"]


@dataclass(frozen=True)
class SessionIO:
    """A session's inputs and outputs as a binding needs them (``Session.io``): the specs, the
    plan's value each output is written as, and the ext values only CUDA partitions touch (those
    may be bound to device arrays); ``where`` names the artifact in messages."""

    where: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    output_values: tuple[str, ...]
    device_values: frozenset[str]


def _is_numpy(array: Any) -> bool:
    return isinstance(array, np.ndarray)


def _device_module(array: Any) -> Any:
    """cupy, when ``array`` is a cupy array (cupy is imported only if the caller already has)."""
    import sys

    cp = sys.modules.get("cupy")
    if cp is not None and isinstance(array, cp.ndarray):
        return cp
    return None


class IOBinding:
    """Arrays bound to a session's inputs and outputs; run with ``session.run_with_iobinding``.

    Made by ``session.io_binding()``; ``IOBinding(session)`` works too (anything with the
    session's ``io`` description), so this module never imports the session.
    """

    def __init__(self, io: SessionIO | Any) -> None:
        io = getattr(io, "io", io)
        self._io = io
        self._inputs: dict[str, Any] = {}
        self._outputs: dict[str, Any] = {}
        self._specs_in = {s.name: s for s in io.inputs}
        self._specs_out = {s.name: s for s in io.outputs}
        self._value_of = dict(zip((s.name for s in io.outputs), io.output_values, strict=True))
        self._ext: dict[str, Any] | None = None
        self._ext_shapes: tuple[tuple[int, ...], ...] | None = None  # a dynamic plan's: the shapes ext has
        self._own: set[str] = set()  # outputs a dynamic plan's binding allocates per shape

    # -- binding -------------------------------------------------------------------------------
    def bind_input(self, name: str, array: Any) -> None:
        """Bind ``array`` (numpy; cupy for a CUDA artifact) to input ``name``; runs read it in place."""
        spec = self._specs_in.get(name)
        if spec is None:
            raise InputError(f"bind_input: unknown input {name!r}; the model's inputs are "
                             f"{', '.join(map(repr, self._specs_in))}")
        array = self._check(f"input {name!r}", spec, array, name, output=False)
        if _is_numpy(array) and (not array.flags.c_contiguous or not array.flags.aligned):
            array = np.array(array, order="C", copy=True)
        elif not _is_numpy(array) and not array.flags.c_contiguous:
            array = _device_module(array).ascontiguousarray(array)
        self._inputs[name] = array
        self._ext = None

    bind_cpu_input = bind_input

    def bind_output(self, name: str, array: Any = None) -> None:
        """Bind ``array`` to output ``name`` (kernels write into it); without an array, one is
        allocated now and reused by every run (``get_outputs()``)."""
        spec = self._specs_out.get(name)
        if spec is None:
            raise InputError(f"bind_output: unknown output {name!r}; the model's outputs are "
                             f"{', '.join(map(repr, self._specs_out))}")
        if array is None:
            if spec.ranges is not None:  # a dynamic shape: allocated by each run at its shape
                self._outputs.pop(name, None)
                self._own.add(name)
                self._ext = None
                return
            array = np.empty(spec.shape, spec.dtype)
        self._own.discard(name)
        array = self._check(f"output {name!r}", spec, array, self._value_of[name], output=True)
        if not array.flags.c_contiguous:
            raise InputError(f"bind_output: output {name!r}: the array must be C-contiguous "
                             f"(kernels write it in place)")
        if _is_numpy(array) and (not array.flags.writeable or not array.flags.aligned):
            raise InputError(f"bind_output: output {name!r}: the array must be writable and aligned")
        self._outputs[name] = array
        self._ext = None

    def _check(self, what: str, spec: TensorSpec, array: Any, value: str, *, output: bool) -> Any:
        if not _is_numpy(array):
            if _device_module(array) is None:
                if output:
                    raise InputError(f"bind_output: {what}: expected a numpy or cupy array, "
                                     f"got {type(array).__name__}")
                array = np.asarray(array)
            elif value not in self._io.device_values:
                raise InputError(f"{what}: a device (cupy) array, but this value is read or written on "
                                 f"the host in {self._io.where}; bind a numpy array")
        if np.dtype(array.dtype) != spec.dtype:
            raise InputError(f"{what}: dtype {array.dtype}, expected {spec.dtype}")
        if spec.ranges is None:
            if tuple(array.shape) != spec.shape:
                raise InputError(f"{what}: shape {tuple(array.shape)}, expected {spec.shape}")
        elif len(array.shape) != len(spec.shape) or not all(
                lo <= n <= hi for n, (lo, hi) in zip(array.shape, spec.ranges, strict=True)):
            ranges = ", ".join(str(lo) if lo == hi else f"{lo}..{hi}" for lo, hi in spec.ranges)
            raise InputError(f"{what}: shape {tuple(array.shape)} is outside the ranges ({ranges})")
        return array

    def clear_binding_inputs(self) -> None:
        self._inputs.clear()
        self._ext = None

    def clear_binding_outputs(self) -> None:
        self._outputs.clear()
        self._own.clear()
        self._ext = None

    # -- results -------------------------------------------------------------------------------
    def get_outputs(self) -> list[Any]:
        """The output arrays in the model's output order (bound, or allocated by the last run)."""
        missing = [n for n in self._specs_out if n not in self._outputs]
        if missing:
            raise InputError(f"output(s) {', '.join(map(repr, missing))} are not bound and no run has "
                             f"produced them yet")
        return [self._outputs[n] for n in self._specs_out]

    def copy_outputs_to_cpu(self) -> list[np.ndarray]:
        """The outputs as numpy arrays (device arrays copied to the host)."""
        return [a if _is_numpy(a) else _device_module(a).asnumpy(a) for a in self.get_outputs()]

    # -- used by Session.run_with_iobinding ------------------------------------------------------
    def _input_arrays(self, io: SessionIO) -> dict[str, Any]:
        """The bound inputs (a dynamic plan's run reads its binding off their shapes)."""
        if io is not self._io:
            raise InputError("this IOBinding belongs to another session")
        missing = [n for n in self._specs_in if n not in self._inputs]
        if missing:
            raise InputError(f"run_with_iobinding: input(s) {', '.join(map(repr, missing))} are not bound")
        return self._inputs

    def _ext_for(self, io: SessionIO, shapes: list[tuple[int, ...]] | None = None) -> dict[str, Any]:
        """Value name -> array for a run; ``shapes``: a dynamic plan's output shapes at this run."""
        if io is not self._io:
            raise InputError("this IOBinding belongs to another session")
        ext = self._ext
        if ext is not None and (shapes is None or tuple(shapes) == self._ext_shapes):
            return ext
        self._input_arrays(io)
        if shapes is not None:
            self._shape_outputs(shapes)
        for name, spec in self._specs_out.items():  # unbound outputs: allocated once, then reused
            if name not in self._outputs:
                self._outputs[name] = np.empty(spec.shape, spec.dtype)
        for out_name, out in self._outputs.items():
            for in_name, arr in self._inputs.items():
                if _is_numpy(out) and _is_numpy(arr) and np.may_share_memory(out, arr):
                    raise InputError(f"run_with_iobinding: output {out_name!r} overlaps input {in_name!r}")
        ext = dict(self._inputs)
        for name, array in self._outputs.items():
            ext[self._value_of[name]] = array
        self._ext = ext
        self._ext_shapes = tuple(shapes) if shapes is not None else None
        return ext

    def _shape_outputs(self, shapes: list[tuple[int, ...]]) -> None:
        """A dynamic plan's outputs at this run's shapes: those bound without an array (or never
        bound) allocated at them, those bound to an array checked against them."""
        for (name, spec), shape in zip(self._specs_out.items(), shapes, strict=True):
            array = self._outputs.get(name)
            if array is None or (name in self._own and tuple(array.shape) != tuple(shape)):
                self._outputs[name] = np.empty(shape, spec.dtype)
                self._own.add(name)
            elif tuple(array.shape) != tuple(shape):
                raise InputError(f"run_with_iobinding: output {name!r} is bound to an array of shape "
                                 f"{tuple(array.shape)}; at the bound inputs' shapes it has shape "
                                 f"{tuple(shape)}")
