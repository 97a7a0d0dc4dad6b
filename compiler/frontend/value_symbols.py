"""Value symbols (``--value NAME=LO..HI``; ``compile_model(..., values={"M": (0, 64)})``).

A one-element integer or bool graph input whose *value* decides lengths -- a Loop's trip count, its
first condition -- may be declared a symbol with a range instead of being bound to one value
(``--bind``): the import sees it as a symbolic constant (its value is the symbol), so a Loop that
reads it gets scan outputs of length ``M`` (``M*C`` with a value-symbol condition ``C``), planned
per binding like any dynamic dim. The input stays a graph input: the runtime reads the symbol off
the feed's value at each run (``runtime/dynamic.py``), checks its range, and binds the plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper

from compiler.frontend.dims import symbol_name
from compiler.ir.graph import Graph
from compiler.ir.graph import Value
from runtime.errors import ShapeError
from runtime.symbolic import sym

__all__ = ["ValueSymbol", "value_symbols", "symbolic_input"]

ValueSymbol = tuple[str, int, int]  # (symbol, lo, hi)


def _range(name: str, spec: Any, dtype: np.dtype) -> tuple[int, int]:
    if isinstance(spec, int | np.integer):
        lo = hi = int(spec)
    elif isinstance(spec, Sequence) and len(spec) == 2 and all(isinstance(v, int | np.integer) for v in spec):
        lo, hi = int(spec[0]), int(spec[1])
    else:
        raise ShapeError(f"--value {name}: give a range LO..HI of whole numbers (Python: (LO, HI)), "
                         f"got {spec!r}")
    top = 1 if dtype == np.bool_ else np.iinfo(dtype).max
    if not 0 <= lo <= hi <= top:
        raise ShapeError(f"--value {name}: range {lo}..{hi} must have 0 <= LO <= HI <= {top} "
                         f"(input {name!r} is {dtype})")
    return lo, hi


def value_symbols(proto: onnx.ModelProto, values: Mapping[str, Any] | None,
                  taken: Sequence[str]) -> dict[str, ValueSymbol]:
    """Each input named in ``values`` -> its symbol (named after the input, unlike every name in
    ``taken``) and range; ``ShapeError`` naming the input where it is not a real graph input of one
    integer or bool element."""
    if not values:
        return {}
    initializers = {t.name for t in proto.graph.initializer}
    inputs = {i.name: i for i in proto.graph.input if i.name not in initializers}
    out: dict[str, ValueSymbol] = {}
    used = set(taken)
    for name, spec in values.items():
        info = inputs.get(name)
        if info is None:
            raise ShapeError(f"--value names no graph input: {name!r} (inputs: {', '.join(sorted(inputs))})")
        ttype = info.type.tensor_type if info.type.HasField("tensor_type") else None
        dims = list(ttype.shape.dim) if ttype is not None and ttype.HasField("shape") else None
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(ttype.elem_type)) if ttype is not None else None
        if dtype is None or dtype.kind not in "iub" or dims is None \
                or not all(d.HasField("dim_value") and d.dim_value == 1 for d in dims):
            raise ShapeError(f"--value {name}: a value symbol is a graph input of one integer or bool "
                             f"element with a declared shape ([] or [1]); {name!r} is not")
        lo, hi = _range(name, spec, dtype)
        symbol = symbol_name(name)
        while symbol in used:
            symbol += "_v"
        used.add(symbol)
        out[name] = (symbol, lo, hi)
    return out


def symbolic_input(graph: Graph, value: Value, symbol: str) -> Value:
    """The symbolic constant (in ``graph``) the import reads in place of graph input ``value``:
    its one element is ``symbol``."""
    assert value.shape is not None and value.dtype is not None
    array = np.empty(value.shape, dtype=object)
    array.reshape(-1)[0] = sym(symbol)
    const = Value(graph.unique_name(f"{value.name}/value"), value.dtype, const=array)
    graph.constants[const.name] = const
    return const
