"""Golden self-test data: a few seeded inputs and the reference provider's outputs for them.

At compile time the final graph (after the passes, before partitioning) is evaluated node by node
(``compiler/ir/evaluate.py``) with the reference kernels of ``runtime/kernels`` -- the oracle every
generated kernel is tested against -- on inputs from the runtime's own generator
(``runtime.selftest.generate_input``: splitmix64, so no numpy version changes them). The inputs
are not stored: ``golden.json`` records each one's generator, seed and sha256, and the deploy
machine regenerates it. The outputs go into ``golden.bin`` as raw little-endian bytes, whole when
a case's outputs fit the byte budget (``max_bytes`` over all cases, 4 MiB), else as an evenly spaced
sample of each output with its ``max|ref|``; per output the tolerance (for a quantized output, a
few steps of its scale where that is more: ``compiler/artifact/quantum.py``). A model whose inputs and
outputs of one case exceed the budget gets one case (each case is a reference run at compile
time). Both files are hashed in the manifest like every other file and marked optional
(``onnx-aot strip`` removes them).
``runtime/selftest.py`` reruns them on the deploy machine.

So every artifact carries golden cases whatever its input size. Only a graph that draws random
numbers or one with an intermediate value over 256 MiB (the reference run is kept bounded) gets a
``golden.json`` that says why it has none (``skipped_reason``); ``verify`` then says it cannot verify
and exits 1. A reference run that fails is no reason to skip: when no case runs (a static graph's
one binding, or every binding of a range) it raises ``GoldenReferenceError`` naming the step, and the
compile writes nothing (the compile then runs the built artifact on these cases too:
``compiler/artifact/check.py``); a binding of a range the model itself cannot run at (a trip count
past the data its loop slices, a height its pooling cannot take) is left out with an
``UncheckedArtifactWarning`` naming the step.
Everything is seeded and ordered, so two compiles stay byte-identical.
"""

from __future__ import annotations

import functools
import json
import math
import warnings
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np

from compiler.artifact.golden_precision import with_fp32_reference
from compiler.artifact.quantum import output_quantum
from compiler.artifact.quantum import quantum_tolerance
from compiler.ir.evaluate import Interpreter
from compiler.ir.evaluate import concrete_shape
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.passes.base import NONDETERMINISTIC
from runtime.errors import GoldenReferenceError
from runtime.errors import OnnxAotError
from runtime.errors import UncheckedArtifactWarning
from runtime.selftest import array_sha256
from runtime.selftest import generate_input
from runtime.selftest import sample_indices

__all__ = ["GOLDEN_BIN", "GOLDEN_JSON", "DEFAULT_CASES", "DEFAULT_MAX_BYTES", "case_feeds", "make_golden",
           "skipped_reason", "tolerance_for"]

GOLDEN_JSON = "golden.json"
GOLDEN_BIN = "golden.bin"
DEFAULT_CASES = 2
DEFAULT_MAX_BYTES = 4 << 20
MAX_VALUE_BYTES = 256 << 20
GOLDEN_FORMAT = 2
_ALIGN = 64
Binding = Mapping[str, int]  # the symbols' values in a graph with symbolic dims


_REFERENCE_FAILURES = (OnnxAotError, ArithmeticError, ValueError, TypeError, IndexError, KeyError,
                       MemoryError, FloatingPointError)


class _Tracked(Interpreter):
    """The IR interpreter, remembering the node it runs (the one a failure names)."""

    current: Node | None = None

    def run_node(self, node: Node, args: list[Any]) -> list[Any]:
        self.current = node
        return super().run_node(node, args)


def tolerance_for(dtype: np.dtype) -> float:
    """Largest accepted normwise relative error (max |got - ref| / max |ref|) for ``dtype``."""
    if dtype.kind == "f":
        return {2: 2e-2, 4: 2e-3}.get(dtype.itemsize, 1e-8)
    if dtype.kind == "c":
        return 2e-3 if dtype.itemsize <= 8 else 1e-8
    return 0.0  # integers and bools must match exactly


def _input_kind(dtype: np.dtype, integers: bool) -> str:
    if dtype.kind in "fc":
        return "uniform"
    if dtype.kind == "b":
        return "bool"
    return "int0to3" if integers else "zeros"  # zeros: a safe index / count where random ones are not


def case_feeds(graph: Graph, seed: int, binding: Binding | None,
               integers: bool = True) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    """(input records, feeds) of golden case ``seed``: float inputs uniform, integer inputs 0..3
    (``integers``) or zeros, value-symbol inputs their ``binding``."""
    valued = {name: symbol for symbol, name in graph.value_symbols.items()}  # fed their binding
    records, feeds = [], {}
    for k, value in enumerate(graph.inputs):
        assert value.dtype is not None and value.shape is not None
        kind, input_seed = _input_kind(value.dtype, integers), (seed << 16) + k
        if value.name in valued and binding is not None:
            kind, input_seed = "fill", binding[valued[value.name]]
        shape = concrete_shape(value.shape, binding)
        array = generate_input(kind, value.dtype, shape, input_seed)
        feeds[value.name] = array
        records.append({"name": value.name, "dtype": value.dtype.name, "shape": list(shape),
                        "generator": kind, "seed": input_seed, "sha256": array_sha256(array)})
    return records, feeds


def _case(graph: Graph, seed: int, binding: Binding | None) -> tuple[list[dict[str, Any]], list[np.ndarray]]:
    """(input records, reference outputs) for case ``seed`` (symbolic dims at ``binding``): integer
    inputs 0..3, else zeros; ``GoldenReferenceError`` naming the step when neither runs."""
    failure = ""
    for integers in (True, False):
        records, feeds = case_feeds(graph, seed, binding, integers)
        interpreter = _Tracked(graph, binding=binding)
        try:
            return records, interpreter.run(feeds)
        except _REFERENCE_FAILURES as exc:
            node = interpreter.current
            where = f"step {node.name!r} ({node.kind})" if node is not None else "reading its inputs"
            failure = f"{where}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    at = "" if binding is None else " at " + ", ".join(f"{k}={v}" for k, v in sorted(binding.items()))
    raise GoldenReferenceError(
        f"the golden self-test's reference run failed on its seeded inputs (case {seed}{at}) at {failure}; "
        "nothing was written (a model that needs inputs of particular values: --bind them, or "
        "--golden-cases 0 compiles without this check)")


def _nbytes(value: Value, binding: Binding | None = None) -> int:
    assert value.dtype is not None and value.shape is not None
    return math.prod(concrete_shape(value.shape, binding)) * value.dtype.itemsize  # Python ints


def _largest(graph: Graph, binding: Binding | None) -> int:
    return max((_nbytes(v, binding) for node in graph.nodes for v in node.outputs if v.shape is not None),
               default=0)


def _skip_reason(graph: Graph, cases: int, binding: Binding | None) -> str | None:
    if cases <= 0:
        return "disabled at compile time (--golden-cases 0)"
    if any(node.op_type in NONDETERMINISTIC for node in graph.nodes):
        return "the graph draws random numbers (" + ", ".join(
            sorted({n.op_type for n in graph.nodes if n.op_type in NONDETERMINISTIC})) + ")"
    if _largest(graph, binding) > MAX_VALUE_BYTES:
        return (f"an intermediate value takes {_largest(graph, binding)} bytes, over the "
                f"{MAX_VALUE_BYTES}-byte cap for the compile-time reference run")
    return None


def make_golden(graph: Graph, output_names: list[str], *, seed: int = 0, cases: int = DEFAULT_CASES,
                max_bytes: int = DEFAULT_MAX_BYTES,
                bindings: Sequence[Binding] | None = None) -> dict[str, bytes]:
    """The self-test files for ``graph``: ``{golden.json: ..., golden.bin: ...}``. A graph with
    symbolic dims takes ``bindings`` (the symbols' values): case k runs at ``bindings[k]`` (the
    last one repeated), its inputs of that shape; bindings whose intermediate values pass
    MAX_VALUE_BYTES are left out unless none fits."""
    index: dict[str, Any] = {"format": GOLDEN_FORMAT, "seed": seed, "metric":
                             "max|got-ref| / max|ref| per output (exact for integers and bools); a "
                             "sampled output: over its sample, and | max|got| - max|ref| | / max|ref|",
                             "cases": []}
    blob = bytearray()
    at: list[Binding | None] = [*bindings] if bindings else [None]
    # a binding whose values pass the cap is left out while another one fits (a wide range's middle)
    at = [b for b in at if _largest(graph, b) <= MAX_VALUE_BYTES] or at

    def binding(k: int) -> Binding | None:
        return at[min(k, len(at) - 1)]

    largest = max(at, key=lambda b: _largest(graph, b))
    skip = _skip_reason(graph, cases, largest)
    # each case costs a reference run at compile time: one case when a case's tensors exceed the
    # budget (large inputs and outputs: the slow reference runs), else as many as fit, up to ``cases``
    per_case = sum(_nbytes(v, largest) for v in (*graph.inputs, *graph.outputs))
    count = max(min(cases, len(at)), min(cases, max_bytes // max(per_case, 1)), 1)  # every binding
    budget = max_bytes // count  # output bytes per case
    failures: list[GoldenReferenceError] = []
    quanta = [output_quantum(v) for v in graph.outputs]
    for k in range(count if skip is None else 0):
        try:
            records, outputs = _case(graph, seed + k, binding(k))
            rerun = functools.partial(_case, graph, seed + k, binding(k))
            outputs, errors = with_fp32_reference(graph, rerun, outputs)
        except GoldenReferenceError as exc:
            # a binding of a range the model itself may not run at (a trip count past the data its
            # loop slices, a height its pooling cannot take): left out, said; none left: the error
            failures.append(exc)
            continue
        whole = sum(a.nbytes for a in outputs) <= budget
        case: dict[str, Any] = {"inputs": records, "outputs": []}
        at_k = binding(k)
        if at_k is not None:  # the symbols' values of this case (compiler/artifact/conditioning.py)
            case["binding"] = {name: int(v) for name, v in sorted(at_k.items())}
        for k_out, array in enumerate(outputs):
            share = budget // max(len(outputs), 1) // max(array.dtype.itemsize, 1)
            record = _put_output(blob, output_names[k_out], array, None if whole else max(1, share))
            case["outputs"].append(_with_tolerance(record, array, quanta[k_out], errors[k_out]))
        index["cases"].append(case)
    if failures and not index["cases"]:
        raise failures[0]
    for failure in failures:
        warnings.warn(f"a golden case left out: {failure}".replace("; nothing was written", ""),
                      UncheckedArtifactWarning, stacklevel=2)
    if skip is not None:
        index["skipped"] = skip
    text = json.dumps(index, indent=1, ensure_ascii=False) + "\n"
    return {GOLDEN_JSON: text.encode("utf-8"), GOLDEN_BIN: bytes(blob)}


def _with_tolerance(record: dict[str, Any], array: np.ndarray, quantum: float | None,
                    bf16_error: float | None = None) -> dict[str, Any]:
    """``record`` with its output's tolerance: its dtype's, or for a quantized value (``quantum``,
    its grid step) ``QUANTUM_STEPS`` steps where that is more (compiler/artifact/quantum.py); plus
    the measured ``bf16_error`` of a --precision bf16 graph (compiler/artifact/golden_precision.py)."""
    record["tolerance"] = tolerance_for(array.dtype)
    if bf16_error is not None:
        record["bf16_error"] = bf16_error
        record["tolerance"] += bf16_error
    if quantum is not None:
        record["quantum"] = quantum
        record["tolerance"] = max(record["tolerance"], quantum_tolerance(quantum, array))
    return record


def skipped_reason(files: Mapping[str, bytes]) -> str | None:
    """Why the golden files ``make_golden`` gave hold no case (None: they hold some)."""
    index = json.loads(files[GOLDEN_JSON].decode("utf-8"))
    return None if index["cases"] else str(index.get("skipped", "no case"))


def _put_output(blob: bytearray, name: str, array: np.ndarray, count: int | None) -> dict[str, Any]:
    """Store ``array`` whole, or (``count`` given and smaller than its size) ``count`` evenly
    spaced elements of it and the largest finite magnitude of all of them."""
    if count is None or count >= array.size:
        return _put(blob, name, array)
    flat = np.asarray(array).reshape(-1)
    record = _put(blob, name, flat[sample_indices(flat.size, count)])
    record["shape"] = list(array.shape)
    magnitudes = np.abs(flat.astype(np.complex128 if flat.dtype.kind == "c" else np.float64))
    finite = magnitudes[np.isfinite(magnitudes)]
    record["sample"] = {"count": int(count), "of": int(flat.size),
                        "absmax": float(finite.max()) if finite.size else 0.0}
    return record


def _put(blob: bytearray, name: str, array: np.ndarray) -> dict[str, Any]:
    blob.extend(b"\0" * (-len(blob) % _ALIGN))
    data = np.array(array, order="C", copy=True)  # (ascontiguousarray would make 0-d arrays 1-d)
    little = data.astype(data.dtype.newbyteorder("<"), copy=False)
    offset = len(blob)
    blob.extend(little.tobytes())
    return {"name": name, "dtype": data.dtype.name, "shape": list(data.shape), "offset": offset,
            "nbytes": int(data.nbytes)}
