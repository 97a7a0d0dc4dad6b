"""Golden self-test data: a few seeded inputs and the reference provider's outputs for them.

At compile time the final graph (after the passes, before partitioning) is evaluated node by node
(``compiler/ir/evaluate.py``) with the reference kernels of ``runtime/kernels`` -- the oracle every
generated kernel is tested against -- on inputs drawn from a seeded generator. The inputs and
outputs go into the artifact as raw little-endian bytes (``golden.bin``) with a JSON index
(``golden.json``: per case, per tensor name, dtype, shape, offset, nbytes; per output the
tolerance), both hashed in the manifest like every other file. ``runtime/selftest.py`` reruns them
on the deploy machine.

Kept small: at most ``cases`` cases and ``max_bytes`` (4 MiB) of inputs plus outputs in all; a
model whose one case is bigger, with an intermediate value over 256 MiB, whose graph draws random
numbers, or whose reference run fails on every input tried gets a ``golden.json`` that says why
it has no cases (``verify`` then reports that and passes). Everything is seeded and ordered, so
two compiles stay byte-identical.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.ir.evaluate import evaluate
from compiler.ir.graph import Graph
from compiler.ir.graph import Value
from compiler.passes.base import NONDETERMINISTIC
from runtime.errors import OnnxAotError

__all__ = ["GOLDEN_BIN", "GOLDEN_JSON", "DEFAULT_CASES", "DEFAULT_MAX_BYTES", "make_golden", "tolerance_for"]

GOLDEN_JSON = "golden.json"
GOLDEN_BIN = "golden.bin"
DEFAULT_CASES = 2
DEFAULT_MAX_BYTES = 4 << 20
MAX_VALUE_BYTES = 256 << 20
GOLDEN_FORMAT = 1
_ALIGN = 64


@dataclass(frozen=True)
class _Failure:
    reason: str


def tolerance_for(dtype: np.dtype) -> float:
    """Largest accepted normwise relative error (max |got - ref| / max |ref|) for ``dtype``."""
    if dtype.kind == "f":
        return {2: 2e-2, 4: 2e-3}.get(dtype.itemsize, 1e-8)
    if dtype.kind == "c":
        return 2e-3 if dtype.itemsize <= 8 else 1e-8
    return 0.0  # integers and bools must match exactly


def _random_feeds(graph: Graph, rng: np.random.Generator, integers: bool) -> dict[str, np.ndarray]:
    feeds = {}
    for value in graph.inputs:
        assert value.dtype is not None and value.shape is not None
        dtype, shape = value.dtype, value.shape
        if dtype.kind in "fc":
            array = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            array = rng.integers(0, 2, shape).astype(bool)
        elif integers:
            array = rng.integers(0, 4, shape).astype(dtype)
        else:
            array = np.zeros(shape, dtype)  # a safe index / count where random ones are not
        feeds[value.name] = array
    return feeds


def _case(graph: Graph, seed: int) -> tuple[dict[str, np.ndarray], list[np.ndarray]] | _Failure:
    last = ""
    for integers in (True, False):
        feeds = _random_feeds(graph, np.random.default_rng(seed), integers)
        try:
            return feeds, evaluate(graph, feeds)
        except (OnnxAotError, ArithmeticError, ValueError, TypeError, IndexError, KeyError,
                MemoryError, FloatingPointError) as exc:
            last = f"{type(exc).__name__}: {exc}"
    return _Failure(f"the reference run failed on seeded inputs ({last[:300]})")


def _nbytes(value: Value) -> int:
    assert value.dtype is not None and value.shape is not None
    return math.prod(value.shape) * value.dtype.itemsize  # Python ints: no overflow


def _largest(graph: Graph) -> int:
    return max((_nbytes(v) for node in graph.nodes for v in node.outputs if v.shape is not None),
               default=0)


def make_golden(graph: Graph, output_names: list[str], *, seed: int = 0, cases: int = DEFAULT_CASES,
                max_bytes: int = DEFAULT_MAX_BYTES) -> dict[str, bytes]:
    """The self-test files for ``graph``: ``{golden.json: ..., golden.bin: ...}``."""
    index: dict[str, Any] = {"format": GOLDEN_FORMAT, "seed": seed, "metric":
                             "max|got-ref| / max|ref| per output (exact for integers and bools)",
                             "cases": []}
    blob = bytearray()
    per_case = sum(_nbytes(v) for v in (*graph.inputs, *graph.outputs))
    skip = None
    if cases <= 0:
        skip = "disabled at compile time"
    elif any(node.op_type in NONDETERMINISTIC for node in graph.nodes):
        skip = "the graph draws random numbers (" + ", ".join(
            sorted({n.op_type for n in graph.nodes if n.op_type in NONDETERMINISTIC})) + ")"
    elif per_case > max_bytes:
        skip = f"one case's inputs and outputs take {per_case} bytes, over the {max_bytes}-byte cap"
    elif _largest(graph) > MAX_VALUE_BYTES:
        skip = (f"an intermediate value takes {_largest(graph)} bytes, over the {MAX_VALUE_BYTES}-byte "
                "cap for the compile-time reference run")
    if skip is None:
        count = max(1, min(cases, max_bytes // max(per_case, 1)))
        for k in range(count):
            result = _case(graph, seed + k)
            if isinstance(result, _Failure):
                if not index["cases"]:
                    skip = result.reason
                break
            feeds, outputs = result
            case: dict[str, Any] = {"inputs": [], "outputs": []}
            for value in graph.inputs:
                case["inputs"].append(_put(blob, value.name, feeds[value.name]))
            for k_out, array in enumerate(outputs):
                name = output_names[k_out]
                record = _put(blob, name, array)
                record["tolerance"] = tolerance_for(array.dtype)
                case["outputs"].append(record)
            index["cases"].append(case)
    if skip is not None:
        index["skipped"] = skip
    text = json.dumps(index, indent=1, ensure_ascii=False) + "\n"
    return {GOLDEN_JSON: text.encode("utf-8"), GOLDEN_BIN: bytes(blob)}


def _put(blob: bytearray, name: str, array: np.ndarray) -> dict[str, Any]:
    blob.extend(b"\0" * (-len(blob) % _ALIGN))
    data = np.array(array, order="C", copy=True)  # (ascontiguousarray would make 0-d arrays 1-d)
    little = data.astype(data.dtype.newbyteorder("<"), copy=False)
    offset = len(blob)
    blob.extend(little.tobytes())
    return {"name": name, "dtype": data.dtype.name, "shape": list(data.shape), "offset": offset,
            "nbytes": int(data.nbytes)}
