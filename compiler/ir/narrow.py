"""Which constants the artifact stores at the width the model shipped them in (weight-only narrowing).

A model that keeps int8 / uint8 / fp16 initializers behind a ``Cast`` to float, or int8 / uint8
behind a ``DequantizeLinear`` feeding float ops, ships small weights; folding the Cast / the
DequantizeLinear at compile time widens them to float32, and later lowerings move them around
(packed GEMM panels, transposes). Each graph carries a :class:`Narrowing`:

- ``widths``: the narrow dtypes its model stores such weights in (the importer sets them). When
  there are any, every float constant whose values are exactly that dtype's (a cast round trip
  that gives back every bit) is stored as those codes, whatever its layout: a panel packing only
  moves values and pads zeros, so the packed form qualifies as well as the folded one;
- ``forms``: the dequantized constants, recorded when ``fold_constants`` folds a
  DequantizeLinear (codes, a float32 scale and a zero point, broadcast to full size), and carried
  by a lowering that moves the array (``carry``: the same move applied to the codes, the scale and
  the zero point).

:meth:`Narrowing.narrow_form` gives the form plan.py stores (scale and zero point shrunk to the
axes they vary along), checked with the runtime's own :func:`runtime.narrow_weights.widen` to give
the constant back bit for bit; anything else stays as it is. A model without such weights has no
widths and no forms, so its artifact is byte-identical to one compiled before this existed.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field

import numpy as np

from runtime.narrow_weights import widen

__all__ = ["NARROW_DTYPES", "MIN_NARROW_ELEMENTS", "WIDENING_OPS", "Affine", "Narrowing", "shipped_widths"]

NARROW_DTYPES = tuple(np.dtype(d) for d in ("int8", "uint8", "int16", "uint16", "float16"))
MIN_NARROW_ELEMENTS = 256  # smaller constants stay as they are: a record costs more than it saves
WIDENING_OPS = ("Cast", "DequantizeLinear")


def shipped_widths(uses: Iterable[tuple[str, str]],
                   initializers: Mapping[str, np.ndarray]) -> tuple[np.dtype, ...]:
    """The narrow dtypes of the initializers (of at least MIN_NARROW_ELEMENTS) that a Cast or a
    DequantizeLinear reads as its first input; ``uses``: each node's (op_type, first input)."""
    found = {initializers[name].dtype for op, name in uses if op in WIDENING_OPS and name in initializers
             and initializers[name].size >= MIN_NARROW_ELEMENTS}
    return tuple(d for d in NARROW_DTYPES if d in found)


@dataclass(frozen=True)
class Affine:
    """``array == (codes - zero) * scale`` in float32; ``scale`` / ``zero`` broadcast to ``codes``'
    shape (None: absent)."""

    codes: np.ndarray
    scale: np.ndarray | None
    zero: np.ndarray | None

    def stored_nbytes(self) -> int:
        return sum(a.nbytes for a in (self.codes, self.scale, self.zero) if a is not None)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def _shrunk(table: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray | None:
    """``table`` broadcast to ``shape``, reduced to size 1 along every axis it does not vary along."""
    if table is None:
        return None
    full = np.broadcast_to(table, shape)
    bits = full.view(_bits(full.dtype))
    index = tuple(slice(None) if int(np.ptp(bits, axis=ax).max(initial=0)) else slice(0, 1)
                  for ax in range(full.ndim))
    return np.ascontiguousarray(full[index])


def _bits(dtype: np.dtype) -> np.dtype:
    return np.dtype(f"u{dtype.itemsize}")


def cast_codes(array: np.ndarray, width: np.dtype) -> np.ndarray | None:
    """``array`` as ``width`` codes when casting them back gives every bit of it; else None."""
    if width.kind in "iu":
        info = np.iinfo(width)
        if not np.isfinite(array).all() or array.min() < info.min or array.max() > info.max:
            return None
    with np.errstate(over="ignore", invalid="ignore"):
        codes = array.astype(width)
    return codes if _same_bits(codes.astype(array.dtype), array) else None


@dataclass
class Narrowing:
    """A graph's narrow-weight facts (see the module docstring)."""

    widths: tuple[np.dtype, ...] = ()
    forms: dict[int, tuple[np.ndarray, Affine]] = field(default_factory=dict)
    enabled: bool = True  # False: store every constant as the kernels read it (--wide-weights)
    # id(constant) -> (the constant rounded to bf16, its fp32 original): --precision bf16's weights,
    # which the golden cases run at fp32 too (compiler/artifact/golden.py measures the difference)
    rounded: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def record(self, array: np.ndarray, affine: Affine) -> None:
        """``array`` (a constant's array) is ``affine``, exactly."""
        self.forms[id(array)] = (array, affine)

    def note_fold(self, kind: str, attrs: Mapping[str, object], inputs: list[np.ndarray | None],
                  result: np.ndarray) -> None:
        """``result`` is the folded value of a ``kind`` node over the constant ``inputs``: a Cast of
        integer codes to float32, a DequantizeLinear, or a Mul of such a cast by a float32 table
        (``Cast(q) * scale``, the form exporters write for weight-only int8) gets recorded."""
        if result.dtype != np.float32 or not inputs:
            return
        if kind == "Cast" and inputs[0] is not None and inputs[0].dtype in (np.int8, np.uint8):
            if inputs[0].shape == result.shape:
                self.record(result, Affine(inputs[0], None, None))
        elif kind == "DequantizeLinear":
            axis, block = attrs.get("axis", 1), attrs.get("block_size", 0)
            assert isinstance(axis, int) and isinstance(block, int)
            self.record_dequantized(result, inputs, axis, block)
        elif kind == "Mul" and len(inputs) == 2:
            for a, b in (inputs, inputs[::-1]):
                form = self.affine_of(a) if a is not None else None
                if form is not None and form.scale is None and b is not None and b.dtype == np.float32 \
                        and a is not None and a.shape == result.shape and b.ndim <= a.ndim:
                    self.record(result, Affine(form.codes, np.broadcast_to(b, a.shape), form.zero))
                    return

    def record_dequantized(self, array: np.ndarray, inputs: list[np.ndarray | None], axis: int,
                           block_size: int) -> None:
        """``array`` is a folded DequantizeLinear of the constant ``inputs`` (x, scale, zero point?):
        recorded when x is int8 / uint8, the scale float32 per tensor or per axis, ``array`` float32."""
        x, scale = inputs[0], inputs[1]
        zero = inputs[2] if len(inputs) > 2 else None
        if (x is None or scale is None or x.dtype not in (np.int8, np.uint8) or scale.dtype != np.float32
                or array.dtype != np.float32 or block_size or x.shape != array.shape):
            return
        dims = [1] * x.ndim
        if scale.size != 1:
            dims[axis % x.ndim] = scale.size
        tables = [None if t is None else np.broadcast_to(t.reshape(dims if t.size != 1 else [1] * x.ndim),
                                                         x.shape)
                  for t in (scale, zero)]
        self.record(array, Affine(x, tables[0], tables[1]))

    def affine_of(self, array: np.ndarray) -> Affine | None:
        entry = self.forms.get(id(array))
        return entry[1] if entry is not None and entry[0] is array else None

    def carry(self, old: np.ndarray, new: np.ndarray, move: Callable[[np.ndarray], np.ndarray]) -> None:
        """``new`` is ``move(old)`` for a ``move`` that only places elements (and pads zeros)."""
        affine = self.affine_of(old)
        if affine is None:
            return
        shape = affine.codes.shape
        tables = [None if t is None else move(np.ascontiguousarray(np.broadcast_to(t, shape)))
                  for t in (affine.scale, affine.zero)]
        self.record(new, Affine(move(affine.codes), tables[0], tables[1]))

    def carry_if_same(self, old: np.ndarray, new: np.ndarray) -> None:
        """``new`` was computed from ``old`` (a Conv's weights times a channel scale that is 1, when
        only a bias is folded in): it keeps ``old``'s form where it has every bit of it."""
        if self.affine_of(old) is not None and _same_bits(old, new):
            self.carry(old, new, lambda a: a)

    def narrow_form(self, array: np.ndarray) -> Affine | None:
        """How to store the constant ``array`` narrow (scale and zero point shrunk), or None."""
        if not self.enabled or array.dtype.kind != "f" or array.size < MIN_NARROW_ELEMENTS:
            return None
        affine = self.affine_of(array)
        if affine is not None and array.dtype == np.float32:
            shape = array.shape
            form = Affine(affine.codes, _shrunk(affine.scale, shape), _shrunk(affine.zero, shape))
            if form.stored_nbytes() < array.nbytes and self._gives_back(form, array):
                return form
        for width in self.widths:
            if width.itemsize < array.dtype.itemsize:
                codes = cast_codes(array, width)
                if codes is not None:
                    return Affine(codes, None, None)
        return None

    @staticmethod
    def _gives_back(form: Affine, array: np.ndarray) -> bool:
        out = np.empty_like(array)
        widen(form.codes, form.zero, form.scale, out)
        return _same_bits(out, array)
