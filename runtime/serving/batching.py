"""The batch dim of an artifact, one sample's checks, and stacking samples into one run.

An artifact batches when axis 0 of every input is one and the same symbol, used nowhere else in
the inputs, whose range starts at 1 (``--dim batch=1..16``, ``--shape x=1..8x3x224x224``), and
axis 0 of every output is that symbol too (so a run's results split back per sample).
``batch_dim`` finds it (``None``: the artifact runs requests one by one). A request then holds
one sample per input, without the batch axis: ``check_sample`` checks its names, dtypes and
shapes against the inputs' dims after axis 0 (the ``InputError`` names the input), ``groups``
puts samples whose shapes agree together (a batch of sentences of two lengths is two runs), and
``run_stacked`` stacks a group along a new axis 0, runs it once and splits the results back.

Pure numpy: Ray Serve's deployment (``runtime/serving/deployment.py``) and the Triton model
(``runtime/serving/triton_model.py``) both use it.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.errors import InputError
from runtime.errors import InternalError
from runtime.symbolic import free_symbols

__all__ = ["BatchDim", "batch_dim", "batching_of", "no_batch_reason", "check_sample", "groups", "run_stacked",
           "run_concatenated", "Sample", "RunFn"]

Sample = dict[str, np.ndarray]
RunFn = Callable[[dict[str, np.ndarray]], list[np.ndarray]]


@dataclass(frozen=True)
class BatchDim:
    """Axis 0 of every input and output: the symbol and its largest value."""

    symbol: str
    max_size: int


def _leading_symbol(spec: Any) -> str | None:
    """The bare symbol at axis 0 of ``spec`` (None when axis 0 is a fixed size or an expression)."""
    if spec.dims is None or not spec.dims:
        return None
    first = spec.dims[0]
    if type(first) is int:
        return None
    names = free_symbols(first)
    return str(first) if names == {str(first)} else None


def no_batch_reason(inputs: Sequence[Any], outputs: Sequence[Any]) -> str | None:
    """Why the specs have no batch dim (None when they have one): the one line the server logs."""
    if not inputs:
        return "the model has no inputs"
    leading = {s.name: _leading_symbol(s) for s in (*inputs, *outputs)}
    fixed = [name for name, sym in leading.items() if sym is None]
    if fixed:
        return f"axis 0 of {fixed[0]!r} is not a dynamic dim (compile with e.g. --dim batch=1..16)"
    symbols = set(leading.values())
    if len(symbols) > 1:
        return f"axis 0 is not one symbol in every input and output ({', '.join(sorted(map(str, symbols)))})"
    (symbol,) = symbols
    for spec in inputs:
        if any(symbol in free_symbols(d) for d in spec.dims[1:]):
            return f"the batch symbol {symbol!r} also sizes another dim of input {spec.name!r}"
    lo, hi = inputs[0].ranges[0]
    if lo != 1 or hi < 2:
        return f"the range of axis 0 ({symbol} in {lo}..{hi}) does not start at 1 and reach 2 or more"
    return None


def batch_dim(inputs: Sequence[Any], outputs: Sequence[Any]) -> BatchDim | None:
    """The batch dim of a session's ``inputs`` / ``outputs`` specs (see the module docstring)."""
    if no_batch_reason(inputs, outputs) is not None:
        return None
    symbol = _leading_symbol(inputs[0])
    assert symbol is not None
    return BatchDim(symbol, int(inputs[0].ranges[0][1]))


def batching_of(inputs: Sequence[Any], outputs: Sequence[Any], max_batch: int | None,
                where: str) -> tuple[BatchDim | None, int, str | None]:
    """How a deployment of ``where`` batches with the ``max_batch`` setting (None: the artifact's
    largest batch; 1: off): the batch dim (None when off), the largest run, and why it is off.
    A ``max_batch`` past the artifact's batch range is a ``ServingError``."""
    from runtime.serving import ServingError

    batch = batch_dim(inputs, outputs)
    if batch is None:
        return None, 1, no_batch_reason(inputs, outputs)
    if max_batch is not None and max_batch > batch.max_size:
        raise ServingError(f"max batch {max_batch}: {where} runs batches of 1..{batch.max_size} "
                           f"({batch.symbol}); give at most {batch.max_size}")
    if max_batch == 1:
        return None, 1, "max batch is 1"
    return batch, max_batch or batch.max_size, None


def _sample_text(spec: Any) -> str:
    """``float32 [3, W in 32..2048]``: one sample of ``spec`` (its dims after axis 0)."""
    parts = [str(d) if type(d) is int else f"{d} in {lo}..{hi}"
             for d, (lo, hi) in zip(spec.dims[1:], spec.ranges[1:], strict=True)]
    return f"{spec.dtype.name} [{', '.join(parts)}]"


def check_sample(inputs: Sequence[Any], feeds: Mapping[str, Any]) -> Sample:
    """One sample's feeds, checked against the inputs' dims after the batch axis: every input
    present and no other, its dtype, its rank, fixed dims equal, dynamic dims in range and a symbol
    shared by several dims of one size. Raises ``InputError`` naming the input."""
    if not isinstance(feeds, Mapping):
        raise InputError(f"the inputs must be a mapping of input name -> array, got {type(feeds).__name__}")
    names = [s.name for s in inputs]
    extra = sorted(set(feeds) - set(names))
    if extra:
        raise InputError(f"unknown input(s) {', '.join(map(repr, extra))}; the model's inputs are "
                         f"{', '.join(map(repr, names))}")
    sample: Sample = {}
    seen: dict[str, tuple[int, str, int]] = {}
    for spec in inputs:
        if spec.name not in feeds:
            raise InputError(f"missing input {spec.name!r} (one sample: {_sample_text(spec)})")
        value = np.asarray(feeds[spec.name])
        if value.dtype != spec.dtype:
            raise InputError(f"input {spec.name!r}: dtype {value.dtype}, expected {spec.dtype}")
        dims = spec.dims[1:]
        if value.ndim != len(dims):
            raise InputError(f"input {spec.name!r}: one sample has shape {value.shape} ({value.ndim} dims), "
                             f"expected {len(dims)} dims: {_sample_text(spec)} (no batch axis)")
        for k, (d, (lo, hi), size) in enumerate(zip(dims, spec.ranges[1:], value.shape, strict=True)):
            if not lo <= size <= hi:
                raise InputError(f"input {spec.name!r}: dim {k} of one sample is {size}, expected "
                                 f"{d if lo == hi else f'{lo}..{hi}'} ({_sample_text(spec)})")
            if type(d) is not int:
                first = seen.setdefault(str(d), (size, spec.name, k))
                if first[0] != size:
                    raise InputError(f"input {spec.name!r} dim {k} is {size} but input {first[1]!r} dim "
                                     f"{first[2]} is {first[0]}: both are {str(d)!r} and must agree")
        sample[spec.name] = value
    return sample


def groups(requests: Sequence[Sample], max_size: int, *, batched: bool = False) -> list[list[int]]:
    """Indices of ``requests`` in runs: requests whose input shapes agree (after axis 0 where
    ``batched``: each request then holds a batch of its own), at most ``max_size`` samples each,
    in order of first arrival."""
    by_shape: dict[tuple[tuple[int, ...], ...], list[tuple[int, list[int]]]] = {}
    for index, request in enumerate(requests):
        arrays = list(request.values())
        key = tuple(a.shape[1:] if batched else a.shape for a in arrays)
        count = int(arrays[0].shape[0]) if batched and arrays else 1
        runs = by_shape.setdefault(key, [])
        if not runs or runs[-1][0] + count > max_size:
            runs.append((0, []))
        total, members = runs[-1]
        members.append(index)
        runs[-1] = (total + count, members)
    return [members for runs in by_shape.values() for _, members in runs]


def run_concatenated(run: RunFn, requests: Sequence[Sample]) -> list[list[np.ndarray]]:
    """Concatenate ``requests`` (each a batch along axis 0; other dims equal), ``run`` them once and
    split each output back: per request, the outputs in order (each owning its memory)."""
    names = list(requests[0])
    counts = [int(r[names[0]].shape[0]) for r in requests]
    feeds = {name: np.concatenate([r[name] for r in requests]) for name in names}
    results = run(feeds)
    for array in results:
        if array.shape[:1] != (sum(counts),):
            raise InternalError(f"an output of shape {array.shape} does not have the batch of "
                                f"{sum(counts)} on axis 0 (batch_dim said every output has)")
    cuts = np.cumsum(counts)[:-1]
    split = [np.split(array, cuts) for array in results]
    return [[np.array(parts[i]) for parts in split] for i in range(len(requests))]


def run_stacked(run: RunFn, samples: Sequence[Sample]) -> list[list[np.ndarray]]:
    """Stack ``samples`` (one sample per input, equal shapes) along a new axis 0, ``run`` them once,
    and split each output back: per sample, the outputs in order, without the batch axis."""
    batches = [{name: a[None] for name, a in sample.items()} for sample in samples]
    return [[a[0, ...] for a in outs] for outs in run_concatenated(run, batches)]
