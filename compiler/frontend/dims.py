"""One meaning for the dims of a model: a size, or unknown; and the ``--shape`` text that binds them.

ONNX writes an unknown dim three ways: a name (``dim_param``), no value at all, and -- as the
PaddlePaddle exporter does -- a negative ``dim_value`` (-1). All three mean *unknown*: the size is
chosen at compile time with ``--shape NAME=AxBxC`` (``shapes=`` in Python). ``dim_value: 0`` is a
real zero: an empty tensor.

When an unknown dim is left unbound, the error gives ``--shape`` text the user can paste as it is
and edit: each unknown dim gets a *placeholder* size (:func:`placeholders`).

A dim may also be given a range, ``LO..HI`` (``--shape x=1x3x48x32..2048``, ``--dim seq=1..512``;
``(32, 2048)`` in Python): it becomes a *symbol* (runtime/symbolic.py) named after its
``dim_param`` (:func:`symbol_name`), or after the input and dim index where it has none.
"""

from __future__ import annotations

import keyword
import re
import shlex
from collections.abc import Sequence
from typing import Any

__all__ = ["SPATIAL_PLACEHOLDER", "DimSpec", "dim_label", "dim_text", "known_size", "placeholders",
           "shape_arg", "symbol_name"]

# A dim as --shape / shapes= gives it: a size, or an inclusive range (LO, HI) of sizes
DimSpec = int | tuple[int, int]

# The placeholder of an unknown dim that is neither a batch dim nor next to a known spatial dim
SPATIAL_PLACEHOLDER = 224


def known_size(dim: Any) -> int | None:
    """The size of an ``onnx.TensorShapeProto.Dimension``; None when it is unknown.

    Unknown: a ``dim_param``, no value at all, or a negative ``dim_value``. 0 is a size.
    """
    if dim.HasField("dim_value") and dim.dim_value >= 0:
        return int(dim.dim_value)
    return None


def dim_label(dim: Any) -> str:
    """How a message names an unknown dim: its ``dim_param``, its negative value or 'no value'."""
    if dim.HasField("dim_param"):
        return repr(dim.dim_param)
    if dim.HasField("dim_value"):
        return str(dim.dim_value)
    return "no value"


def placeholders(sizes: Sequence[int | None], names: Sequence[str] = (),
                 chosen: dict[str, int] | None = None) -> tuple[int, ...]:
    """``sizes`` with a placeholder in place of each unknown (None) dim.

    Dim 0 (the batch, in almost every model) gets 1; a spatial dim of a 4-D or 5-D input (NCHW,
    NCDHW: dim 2 and up) gets the first known spatial dim of the same input (a square image:
    ``-1x3x48x-1`` -> ``1x3x48x48``), else :data:`SPATIAL_PLACEHOLDER`; dim 1 of a 4-D or 5-D
    input (channels) gets 3; any other dim gets :data:`SPATIAL_PLACEHOLDER`. ``names`` are the
    dims' ``dim_param`` names: a name met before (in ``chosen``, shared between the inputs of one
    message) gets the same placeholder again.
    """
    rank = len(sizes)
    image = rank in (4, 5)
    spatial = [s for s in sizes[2:] if s is not None] if image else []
    out = []
    for k, size in enumerate(sizes):
        name = names[k] if k < len(names) else ""
        if size is not None:
            out.append(size)
            continue
        if chosen is not None and name and name != "?" and name in chosen:
            out.append(chosen[name])
            continue
        if k == 0:
            guess = 1
        elif image and k == 1:
            guess = 3
        elif spatial:
            guess = spatial[0]
        else:
            guess = SPATIAL_PLACEHOLDER
        if chosen is not None and name and name != "?":
            chosen[name] = guess
        out.append(guess)
    return tuple(out)


def dim_text(dim: DimSpec) -> str:
    """A dim as ``--shape`` writes it: ``N`` or ``LO..HI``."""
    return f"{dim[0]}..{dim[1]}" if isinstance(dim, tuple) else str(dim)


def shape_arg(name: str, sizes: Sequence[DimSpec]) -> str:
    """``--shape NAME=AxBxC`` (a range as ``LO..HI``), quoted for a POSIX shell where the name needs it."""
    return "--shape " + shlex.quote(f"{name}={'x'.join(dim_text(s) for s in sizes)}")


def symbol_name(text: str) -> str:
    """A valid symbol name (runtime/symbolic.py: a Python identifier, not ``min`` / ``max`` or a
    keyword) made from a ``dim_param`` or an ``INPUT_K`` label: other characters become ``_``."""
    name = re.sub(r"\W", "_", text) or "_"
    if not name.isidentifier() or name in ("min", "max") or keyword.iskeyword(name):
        name = "d_" + name
    return name

