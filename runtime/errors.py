"""The project's exception types.

Every failure a user can cause -- a bad model, an unsupported op, a damaged artifact, a bad
feed -- ends in one of these. The compiler's errors derive from the same base so a caller can
catch :class:`OnnxAotError` around either half.
"""

from __future__ import annotations

__all__ = [
    "OnnxAotError",
    "ArtifactError",
    "InputError",
    "IndexRangeError",
    "RuntimeKernelError",
    "ConcurrentRunError",
    "ModelError",
    "UnsupportedOpError",
    "CompileError",
    "InternalError",
    "ShapeError",
    "GoldenReferenceError",
    "ArtifactCheckError",
    "AccuracyBoundError",
    "CpuFallbackWarning",
    "UncheckedArtifactWarning",
]


class OnnxAotError(Exception):
    """Base class of every error onnx-aot raises on purpose."""


class ArtifactError(OnnxAotError):
    """An artifact folder is missing, damaged, tampered with or of an unknown format."""


class InputError(OnnxAotError):
    """A feed does not match the plan's inputs (name, dtype or shape)."""


class IndexRangeError(InputError):
    """An index tensor holds a value outside its axis' ``[-size, size)`` (Gather, GatherElements,
    GatherND, ScatterElements, ScatterND): names where (the node, once a provider knows it), the
    first offending value in order, the axis and its size. A feed no vocabulary or table fits."""

    def __init__(self, where: str, value: int, axis: int, size: int) -> None:
        super().__init__(where, value, axis, size)  # args stay the constructor's (pickling)
        self.where, self.value, self.axis, self.size = where, int(value), int(axis), int(size)

    def __str__(self) -> str:
        return (f"{self.where}: index {self.value} is out of range for axis {self.axis} of size "
                f"{self.size} (valid: {-self.size}..{self.size - 1})")

    def at(self, where: str) -> IndexRangeError:
        """The same error located at ``where`` (a provider adds the node it ran)."""
        return IndexRangeError(where, self.value, self.axis, self.size)


class RuntimeKernelError(OnnxAotError):
    """A kernel reported a failure while running."""


class ConcurrentRunError(OnnxAotError):
    """A run started while another run was using the same caller-owned or shared arena."""


class ModelError(OnnxAotError):
    """The ONNX model cannot be read, is invalid, or cannot be given static shapes."""


class ShapeError(ModelError):
    """A shape is unknown, symbolic without a binding, or inconsistent."""


class UnsupportedOpError(ModelError):
    """One or more nodes use an op (or attribute) that no provider supports."""

    def __init__(self, message: str, nodes: list[tuple[str, str]] | None = None) -> None:
        super().__init__(message)
        self.nodes = list(nodes or [])


class CompileError(OnnxAotError):
    """A compile cannot go on: its options are invalid (an unknown target, level or CPU), or code
    generation, the native toolchain or the built artifact's check failed."""


class InternalError(OnnxAotError):
    """A broken invariant of the compiler's IR or plan (``Graph.verify``, ``Graph.sort``, the
    memory plan's check): a bug in onnx-aot, not in the model or the options. The message says
    which invariant and where; please report it with the model."""


class GoldenReferenceError(CompileError):
    """The golden self-test's reference run failed on its seeded inputs (the message names the
    step); the compile wrote nothing."""


class ArtifactCheckError(CompileError):
    """The built artifact failed its first run on the golden inputs, or disagreed with the
    reference outputs beyond their tolerance (the message names the step or output); the compile
    wrote nothing. ``mismatches``: (case, output name, relative error) of each output off its
    tolerance (empty when a step failed or the artifact did not load)."""

    def __init__(self, message: str, mismatches: tuple[tuple[int, str, float], ...] = ()) -> None:
        super().__init__(message)
        self.mismatches = mismatches


class AccuracyBoundError(CompileError):
    """``--max-error E`` cannot be met: with every reduced-precision step back in fp32 the measured
    error is still E or more (the message names the bound and that error); the compile wrote
    nothing."""


class UncheckedArtifactWarning(UserWarning):
    """A compile wrote an artifact whose run it did not check (``--golden-cases 0``, a graph that
    draws random numbers, a value too large for the reference run, a target this host cannot run)."""


class ModelQuirkWarning(UserWarning):
    """The model breaks a rule of the ONNX version it declares in a way whose meaning is clear
    (what onnxruntime runs); it was read as the later version that allows it (the message names
    the rule and the node or initializer)."""


class CpuFallbackWarning(RuntimeWarning):
    """This CPU lacks features the artifact's preferred C build needs; a slower build runs."""
