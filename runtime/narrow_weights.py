"""Weights stored narrower than the kernels read them, widened once at load (plan format version 4).

A model that ships its weights narrow -- int8 / uint8 / fp16 initializers behind a ``Cast`` to
float, or int8 behind a ``DequantizeLinear`` (weight-only quantization, per tensor or per axis) --
gets float32 weights once the compiler folds the Cast, packs the panels and so on. The compiler
stores each such constant as its *codes* instead (``StoredForm``: the narrow integers or halves in
the constant's final shape and layout, packed panels included) plus, for a dequantized one, a
float32 scale and a zero point whose shapes broadcast to it. The plan's constant records keep
describing the **weights image** the kernels read (``offset`` / ``nbytes`` / ``dtype`` into it,
exactly as before); :func:`widen_weights` rebuilds that image at load:

- weights.bin is the image with each stored constant's slot cut out (its ``nbytes`` rounded up to
  64, the image's alignment), followed by the stored forms at the file offsets their records give;
- each stored constant's image slot becomes ``(codes - zero) * scale`` computed in float32
  (``codes.astype(float32)`` for a plain cast; bfloat16 codes are the high 16 bits of float32),
  which is bit for bit the value the compiler folded (it checks that before choosing the form).

Widening once at load keeps every kernel and its packed layout as it is (run latency unchanged)
and costs one pass over the weights (docs/architecture.md, "Narrow weights", has the figures).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.contract import WEIGHT_ALIGNMENT
from runtime.contract import round_up
from runtime.json_fields import Fields
from runtime.json_fields import Where
from runtime.json_fields import is_count

__all__ = ["STORED_DTYPES", "IMAGE_ALIGNMENT", "StoredTable", "StoredForm", "codes_of", "cut_slots",
           "stored_nbytes", "widen", "widen_weights"]

STORED_DTYPES = ("int8", "uint8", "int16", "uint16", "float16", "bfloat16")  # a stored form's codes
IMAGE_ALIGNMENT = WEIGHT_ALIGNMENT  # (the weights image is laid out as weights.bin)


def _itemsize(dtype: str) -> int:
    return 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize


def _sizes(f: Fields, key: str) -> tuple[int, ...]:
    value = f.array(key)
    if not all(is_count(d) for d in value):
        raise f.at(key).wrong("a list of sizes", value)
    return tuple(int(d) for d in value)


@dataclass(frozen=True)
class StoredTable:
    """A dequantizing constant's scale (float32) or zero point (``dtype``) in weights.bin: ``shape``
    has the constant's rank and broadcasts to its shape."""

    offset: int
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _itemsize(self.dtype)

    def to_json(self) -> dict[str, Any]:
        return {"offset": self.offset, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_json(cls, data: Any, where: Where) -> StoredTable:
        f = Fields.of(data, where)
        dtype = f.text("dtype")
        if dtype not in (*STORED_DTYPES, "float32"):
            raise f.at("dtype").wrong(f"one of {', '.join((*STORED_DTYPES, 'float32'))}", dtype)
        return cls(f.count("offset"), dtype, _sizes(f, "shape"))


@dataclass(frozen=True)
class StoredForm:
    """How weights.bin holds a constant narrower than its image: ``nbytes`` of ``dtype`` codes in
    the constant's shape at ``offset``; widened to ``(codes - zero) * scale`` in float32 (no
    ``scale`` / ``zero``: a plain cast to the constant's dtype)."""

    dtype: str
    offset: int
    nbytes: int
    scale: StoredTable | None = None
    zero: StoredTable | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"dtype": self.dtype, "offset": self.offset, "nbytes": self.nbytes}
        if self.scale is not None:
            data["scale"] = self.scale.to_json()
        if self.zero is not None:
            data["zero_point"] = self.zero.to_json()
        return data

    @classmethod
    def from_json(cls, data: Any, where: Where) -> StoredForm:
        f = Fields.of(data, where)
        dtype = f.text("dtype")
        if dtype not in STORED_DTYPES:
            raise f.at("dtype").wrong(f"one of {', '.join(STORED_DTYPES)}", dtype)
        return cls(dtype, f.count("offset"), f.count("nbytes"), f.record("scale", StoredTable.from_json),
                   f.record("zero_point", StoredTable.from_json))


def stored_nbytes(stored: StoredForm) -> int:
    """The bytes of weights.bin a stored constant takes (codes and tables, unaligned)."""
    return stored.nbytes + sum(t.nbytes for t in (stored.scale, stored.zero) if t is not None)


def codes_of(raw: np.ndarray, dtype: str, offset: int, shape: tuple[int, ...]) -> np.ndarray:
    """``shape`` elements of ``dtype`` read from ``raw`` (bytes) at ``offset``; bfloat16 as float32."""
    n = math.prod(shape) * _itemsize(dtype)
    chunk = raw[offset:offset + n]
    if dtype == "bfloat16":
        return (chunk.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
    return chunk.view(np.dtype(dtype).newbyteorder("<")).reshape(shape)


def cut_slots(constants: Any) -> list[tuple[int, int]]:
    """The image regions weights.bin leaves out, sorted: each stored constant's slot, ``(offset,
    nbytes rounded up to IMAGE_ALIGNMENT)``."""
    return sorted((c.offset, round_up(c.nbytes, IMAGE_ALIGNMENT))
                  for c in constants if c.stored is not None)


def widen_weights(constants: Any, raw: np.ndarray, image_nbytes: int, where: Where) -> np.ndarray:
    """The weights image of ``image_nbytes`` bytes that the plan's ``constants`` describe, built
    from weights.bin's bytes ``raw``; ``raw`` itself when nothing is stored narrow.
    ``ArtifactError`` (at ``where``, the plan's constants) for a record that does not fit."""
    slots = cut_slots(constants)
    if not slots:
        return raw
    base = np.zeros(image_nbytes + IMAGE_ALIGNMENT, np.uint8)
    start = -base.ctypes.data % IMAGE_ALIGNMENT
    image = base[start:start + image_nbytes]
    image_at = file_at = 0
    for offset, nbytes in [*slots, (image_nbytes, 0)]:
        if offset < image_at or offset + nbytes > image_nbytes:
            raise where.error(f"a stored constant's slot {offset}..{offset + nbytes} overlaps another or "
                              f"lies past the weights image's {image_nbytes} bytes")
        run = offset - image_at
        if file_at + run > raw.size:
            raise where.error(f"weights.bin holds {raw.size} bytes, fewer than the weights stored as is")
        image[image_at:offset] = raw[file_at:file_at + run]
        image_at, file_at = offset + nbytes, file_at + run
    for k, const in enumerate(constants):
        if const.stored is not None:
            _widen_into(image, raw, const, where.item(k))
    image.flags.writeable = False
    return image


def widen(codes: np.ndarray, zero: np.ndarray | None, scale: np.ndarray | None, out: np.ndarray) -> None:
    """``out[...] = (codes - zero) * scale`` in ``out``'s dtype (float32 when scaled), broadcasting
    ``zero`` and ``scale``; a plain cast without them. Every step is exact but the one rounding
    multiply (integer codes and their differences are floats exactly), and the compiler checks its
    stored forms with this same function, so the load gives the folded value bit for bit."""
    if zero is not None:  # int8 / uint8 codes and zero points: the difference fits int16 exactly
        codes = np.subtract(codes, zero, dtype=np.int16)
    if scale is None:
        np.copyto(out, codes, casting="unsafe")
    else:
        np.multiply(codes, scale, out=out, dtype=np.float32, casting="unsafe")


def _table(raw: np.ndarray, table: StoredTable | None, shape: tuple[int, ...],
           where: Where) -> np.ndarray | None:
    if table is None:
        return None
    pairs = zip(table.shape, shape, strict=False)
    fits = len(table.shape) == len(shape) and all(t in (1, n) for t, n in pairs)
    if not fits:
        raise where.error(f"shape {list(table.shape)} does not broadcast to the constant's {list(shape)}")
    if table.offset + table.nbytes > raw.size:
        raise where.error(f"bytes {table.offset}..{table.offset + table.nbytes} lie past weights.bin's "
                          f"{raw.size}")
    return codes_of(raw, table.dtype, table.offset, table.shape)


def _widen_into(image: np.ndarray, raw: np.ndarray, const: Any, where: Where) -> None:
    stored: StoredForm = const.stored
    at = where.key("stored")
    shape = tuple(int(d) for d in const.shape)
    codes_nbytes = math.prod(shape) * _itemsize(stored.dtype)
    if stored.nbytes != codes_nbytes or stored.offset + stored.nbytes > raw.size:
        raise at.error(f"{stored.nbytes} bytes of {stored.dtype} at {stored.offset} do not hold the "
                       f"constant's {list(shape)} inside weights.bin's {raw.size} bytes")
    if const.nbytes != math.prod(shape) * const.dtype.itemsize:
        raise where.error(f"nbytes {const.nbytes} is not the size of a {const.dtype.name} {list(shape)}")
    scaled = stored.scale is not None or stored.zero is not None
    if const.dtype.kind != "f" or (scaled and const.dtype != np.float32):
        raise at.error(f"codes widen to a float (float32 when scaled), not to {const.dtype.name}")
    if stored.scale is not None and stored.scale.dtype != "float32":
        raise at.key("scale").wrong("float32", stored.scale.dtype)
    out = image[const.offset:const.offset + const.nbytes].view(const.dtype).reshape(shape)
    zero = _table(raw, stored.zero, shape, at.key("zero_point"))
    scale = _table(raw, stored.scale, shape, at.key("scale"))
    widen(codes_of(raw, stored.dtype, stored.offset, shape), zero, scale, out)
