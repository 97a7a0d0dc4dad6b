"""The calibration file of ``--quantize int8 --calibration DATA.npz``: read, checked, split into feeds.

``DATA.npz`` (``numpy.savez``) holds one array per graph input name, the samples along a leading
axis: for an input of shape (1, 3, 224, 224), an array (N, 1, 3, 224, 224); where the input's first
dim is 1, (N, 3, 224, 224) is read too (each sample gets the batch dim back). Inputs bound with
``--bind`` need no array (one given is ignored). Every array must hold the same number N >= 1 of
samples, of the input's dtype kind (float data for a float input; integer or bool data is cast to
the input's integer / bool type), with no NaN or Inf. Each failure is a :class:`CalibrationError`
naming the file and the input.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Mapping
from collections.abc import Sequence

import numpy as np

from runtime.errors import CompileError

__all__ = ["CalibrationError", "MIN_SAMPLES", "load_feeds"]

MIN_SAMPLES = 1


class CalibrationError(CompileError):
    """The calibration data of ``--quantize`` cannot be used: a missing or unknown input name, a
    wrong shape or dtype, too few samples, NaN / Inf; the message names the file and the input."""


def load_feeds(path: str | os.PathLike[str] | Mapping[str, np.ndarray],
               inputs: Mapping[str, tuple[tuple[int, ...], np.dtype]],
               bound: Sequence[str] = ()) -> list[dict[str, np.ndarray]]:
    """The calibration feeds (one dict per sample) for the graph ``inputs`` (name -> (shape, dtype),
    static) from the npz at ``path`` (or already loaded arrays); ``bound``: inputs made constants."""
    where = str(path) if not isinstance(path, Mapping) else "the calibration data"
    arrays = _read(path) if not isinstance(path, Mapping) else {k: np.asarray(v) for k, v in path.items()}
    unknown = sorted(set(arrays) - set(inputs) - set(bound))
    if unknown:
        raise CalibrationError(f"{where}: holds arrays for no input of the model: {', '.join(unknown)} "
                               f"(inputs: {', '.join(inputs)})")
    samples = {name: _samples(where, name, arrays, shape, dtype) for name, (shape, dtype) in inputs.items()}
    counts = {name: len(s) for name, s in samples.items()}
    if len(set(counts.values())) > 1:
        raise CalibrationError(f"{where}: the inputs hold different numbers of samples: "
                               + ", ".join(f"{n} {c}" for n, c in counts.items()))
    count = next(iter(counts.values()), 0)
    return [{name: s[k] for name, s in samples.items()} for k in range(count)]


def _read(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            if not hasattr(data, "files"):
                raise CalibrationError(f"{path}: not an .npz file (one array per input name, numpy.savez)")
            return {name: data[name] for name in data.files}
    except FileNotFoundError:
        raise CalibrationError(f"--calibration {path}: no such file") from None
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise CalibrationError(f"--calibration {path}: cannot read it as .npz: {exc}") from None


def _samples(where: str, name: str, arrays: Mapping[str, np.ndarray], shape: tuple[int, ...],
             dtype: np.dtype) -> np.ndarray:
    """``name``'s samples as an array (N, *shape) of ``dtype``, checked."""
    if name not in arrays:
        raise CalibrationError(f"{where}: no array for input {name!r} (it holds: "
                               f"{', '.join(arrays) or 'nothing'})")
    array = arrays[name]
    if array.shape[1:] == shape:
        pass
    elif shape[:1] == (1,) and array.shape[1:] == shape[1:]:
        array = array[:, None]
    else:
        batch = f" or (N, {', '.join(map(str, shape[1:]))})" if shape[:1] == (1,) else ""
        raise CalibrationError(f"{where}: input {name!r} has shape {tuple(shape)}, so its array must be "
                               f"(N, {', '.join(map(str, shape))}){batch}; got {array.shape}")
    if array.shape[0] < MIN_SAMPLES:
        raise CalibrationError(f"{where}: input {name!r} has {array.shape[0]} samples; at least "
                               f"{MIN_SAMPLES} needed")
    return _typed(where, name, array, dtype)


def _typed(where: str, name: str, array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    wanted = np.dtype(dtype)
    float_input, float_data = wanted.kind == "f", array.dtype.kind == "f"
    if float_input != float_data or array.dtype.kind not in "fiub":
        raise CalibrationError(f"{where}: input {name!r} is {wanted}, its array {array.dtype}")
    if float_data:
        bad = ~np.isfinite(array.reshape(array.shape[0], -1)).all(axis=1)
        if bad.any():
            raise CalibrationError(f"{where}: input {name!r}: sample {int(np.argmax(bad))} holds NaN or Inf")
    return np.ascontiguousarray(array.astype(wanted, copy=False))
