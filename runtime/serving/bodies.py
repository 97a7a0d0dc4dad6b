"""Request and response bodies of the HTTP route: JSON and npz, to and from ``{NAME: array}``.

JSON: a request ``{"inputs": {NAME: nested list, ...}}``, each value converted to its input's
dtype; a response ``{"outputs": {NAME: nested list}}``; an error ``{"error": "<one line>"}``.
Binary (``Content-Type: application/octet-stream``): an npz archive keyed by input names (read
without pickles), answered with an npz keyed by output names. Every malformed body is an
``InputError`` saying what was wrong, answered 400 by the deployment.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np

from runtime.errors import InputError

__all__ = ["NPZ_TYPE", "JSON_TYPE", "is_npz", "decode_json", "decode_npz", "encode_json", "encode_npz",
           "error_json", "info_json"]

NPZ_TYPE = "application/octet-stream"
JSON_TYPE = "application/json"


def is_npz(content_type: str | None) -> bool:
    return (content_type or "").split(";")[0].strip().lower() == NPZ_TYPE


def decode_json(body: bytes, inputs: Sequence[Any]) -> dict[str, np.ndarray]:
    """``{"inputs": {NAME: nested list}}`` -> arrays of each input's dtype (unknown names are left
    as they are, for the input check to name)."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"the body is not JSON ({exc}); send {{\"inputs\": {{NAME: nested list}}}} "
                         f"or an npz with Content-Type: {NPZ_TYPE}") from None
    if not isinstance(data, dict) or not isinstance(data.get("inputs"), dict):
        raise InputError('the JSON body must be an object {"inputs": {NAME: nested list, ...}}')
    dtypes = {s.name: s.dtype for s in inputs}
    feeds: dict[str, np.ndarray] = {}
    for name, value in data["inputs"].items():
        dtype = dtypes.get(name)
        try:
            feeds[name] = np.asarray(value) if dtype is None else np.asarray(value, dtype=dtype)
        except (ValueError, TypeError, OverflowError) as exc:
            raise InputError(f"input {name!r}: cannot be read as {dtype} ({exc})") from None
        if feeds[name].dtype == object:
            raise InputError(f"input {name!r}: not a nested list of numbers")
    return feeds


def decode_npz(body: bytes) -> dict[str, np.ndarray]:
    """An npz body (``numpy.savez``) -> its arrays, read without pickles."""
    problem = f"the {NPZ_TYPE} body is not an npz archive of input arrays (numpy.savez, no object arrays)"
    if body.startswith(b"\x93NUMPY"):
        raise InputError(f"{problem}: it is one .npy array; name each input (numpy.savez(f, NAME=array))")
    if not body.startswith(b"PK"):
        raise InputError(f"{problem}: it is not a zip file")
    try:
        with np.load(io.BytesIO(body), allow_pickle=False) as loaded:
            return {name: loaded[name] for name in loaded.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        raise InputError(f"{problem}: {exc}") from None


def encode_json(outputs: Mapping[str, np.ndarray]) -> bytes:
    """``{"outputs": {NAME: nested list}}`` (NaN and infinities written as JavaScript writes them)."""
    return json.dumps({"outputs": {name: a.tolist() for name, a in outputs.items()}}).encode()


def encode_npz(outputs: Mapping[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    savez: Any = np.savez  # (numpy's stubs type **arrays against its allow_pickle keyword)
    savez(buffer, **outputs)
    return buffer.getvalue()


def error_json(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


def _spec_json(spec: Any) -> dict[str, Any]:
    dims = spec.shape if spec.dims is None else spec.dims
    return {"name": spec.name, "dtype": spec.dtype.name,
            "shape": [d if type(d) is int else str(d) for d in dims],
            "ranges": None if spec.ranges is None else [list(r) for r in spec.ranges]}


def info_json(folder: str, session: Any, batch: Any, max_batch: int, why_unbatched: str | None) -> bytes:
    """What ``GET`` on the route answers: the folder, the inputs and outputs, how requests batch."""
    return json.dumps({
        "artifact": folder, "inputs": [_spec_json(s) for s in session.inputs],
        "outputs": [_spec_json(s) for s in session.outputs],
        "batching": ({"symbol": batch.symbol, "max_batch": max_batch, "request": "one sample per input"}
                     if batch is not None else {"off": why_unbatched, "request": "whole tensors"}),
    }).encode()
