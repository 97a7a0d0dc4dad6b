"""``data_address(array)``: the address of a numpy array's data, for the per-run pointer arrays.

``array.ctypes.data`` builds a ctypes helper object on every call (about 1.6 us), which made filling
the C entries' pointer arrays the largest part of a tiny model's run (``onnx-aot bench --overhead``).
numpy's array object is ``PyArrayObject_fields`` (numpy/ndarraytypes.h): the ``char *data`` field
comes right after the object header, a layout numpy's C ABI has kept since 1.x. On CPython, where
``id()`` is the object's address, reading that field costs about 0.2 us. The read is checked at
import against ``ctypes.data`` on arrays with and without offsets; anywhere it disagrees (another
interpreter, another header size) ``data_address`` is plain ``ctypes.data``, and so it is for
anything but an exact ``numpy.ndarray`` (subclasses, other libraries' arrays).
"""

from __future__ import annotations

import ctypes
import platform
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["data_address"]

_HEADER = object.__basicsize__  # sizeof(PyObject): the offset of PyArrayObject's data pointer


def _ctypes_address(array: Any) -> int:
    return int(array.ctypes.data)


def _header_address(array: Any, _read: Any = ctypes.c_void_p.from_address, _offset: int = _HEADER,
                    _ndarray: type = np.ndarray) -> int:
    if type(array) is _ndarray:  # exactly numpy's array: anything else (cupy...) goes through ctypes
        return _read(id(array) + _offset).value or 0
    return int(array.ctypes.data)


def _choose() -> Callable[[Any], int]:
    if platform.python_implementation() != "CPython":
        return _ctypes_address
    base = np.arange(24, dtype=np.float32)
    probes = (base, base[5:], base.reshape(4, 6)[1:, 2:], np.empty((2, 3), np.int64), np.zeros(0, np.uint8))
    try:
        same = all(_header_address(p) == int(p.ctypes.data) for p in probes if p.size)
    except (ValueError, OSError, OverflowError):
        same = False
    return _header_address if same else _ctypes_address


data_address: Callable[[Any], int] = _choose()
