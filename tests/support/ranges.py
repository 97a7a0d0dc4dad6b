"""Dynamic-range compiles generated from a model's static shape (tests/test_dynamic_ranges.py).

``plan_ranges`` takes a model and the sizes it is used at (its ``--shape`` options, else its
declared sizes) and picks ranges for the dims the model leaves open: every dim its file declares
unknown (a ``dim_param``, no value, -1), or -- for a model declared fully static, such as the
fuzzer's seeds -- dim 0 of each input and the spatial dims of a 4-D one, which ``open_dims``
rewrites to unknown (its value_info and output dims cleared, so neither engine holds them to the
old sizes). A candidate's range, from its role and static size ``s``: a batch (dim 0) 1..max(4, s);
a spatial dim of a 4-D input s/2..s in steps of 32 when s is a multiple of 32 (s/4..s/2 above 320,
to keep CI fast), else s..3s/2; any other dim 3s/4..s. Dims sharing a ``dim_param`` share one range.

Which dims take a range is the model's business, so onnxruntime (the oracle) decides: candidates
are added one at a time and kept when onnxruntime runs the model at the bindings of the ranges so
far (all dims at the low end, at the high end, at an odd size inside; the newest one at the odd size
or the high end while the others are at the other). ``compare_at``
then runs the compiled artifact and onnxruntime on the same seeded feeds at a binding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from tests.support.int8_spread import self_spread
from tests.support.real_models import Comparison

__all__ = ["Candidate", "RangePlan", "compare_at", "feeds_at", "open_dims", "ort_session", "plan_ranges"]

BATCH_MAX = 4
SPATIAL_STEP = 32
SPATIAL_CHEAP = 320  # a spatial size above this is ranged over s/4..s/2


@dataclass(frozen=True)
class Candidate:
    """One dim (or every dim of one ``dim_param``) that may take a range."""

    key: str  # the dim_param, or "input:position"
    places: tuple[tuple[str, int], ...]  # (input, position) of each of its dims
    low: int
    high: int
    odd: int


@dataclass
class RangePlan:
    """The static sizes of every input and the candidates onnxruntime accepted."""

    static: dict[str, tuple[int, ...]]
    dtypes: dict[str, np.dtype]
    ranged: list[Candidate] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # candidates onnxruntime would not run

    def shapes(self) -> dict[str, tuple[int | tuple[int, int], ...]]:
        """The ``shapes=`` of the compile: each ranged dim as (LO, HI)."""
        out: dict[str, list[int | tuple[int, int]]] = {k: list(v) for k, v in self.static.items()}
        for c in self.ranged:
            for name, pos in c.places:
                out[name][pos] = (c.low, c.high)
        return {k: tuple(v) for k, v in out.items()}

    def binding(
        self, which: str, ranged: list[Candidate] | None = None, last: str | None = None
    ) -> dict[str, tuple[int, ...]]:
        """Every input's shape with the ranged dims at their ``low`` / ``high`` / ``odd`` size (the
        last one at ``last`` when given)."""
        out = {k: list(v) for k, v in self.static.items()}
        chosen = self.ranged if ranged is None else ranged
        for k, c in enumerate(chosen):
            at = last if last is not None and k == len(chosen) - 1 else which
            for name, pos in c.places:
                out[name][pos] = getattr(c, at)
        return {k: tuple(v) for k, v in out.items()}


def _role_range(position: int, rank: int, size: int) -> tuple[int, int, int]:
    """(low, high, odd) of a dim at ``position`` of a rank-``rank`` input used at ``size``."""
    if position == 0:
        return 1, max(BATCH_MAX, size), 3
    if rank == 4 and size % SPATIAL_STEP == 0 and size >= 2 * SPATIAL_STEP:
        high = size if size <= SPATIAL_CHEAP else size // 2
        low = max(SPATIAL_STEP, high // 2 // SPATIAL_STEP * SPATIAL_STEP)
        steps = (high - low) // SPATIAL_STEP
        return low, high, low + SPATIAL_STEP * max(1, steps // 3) if steps > 1 else high
    if rank == 4:  # above the static size: a smaller one may pool to nothing, which only onnxruntime runs
        low, high = size, size + max(1, size // 2)
    else:
        low, high = max(1, size * 3 // 4), size
    odd = low + (high - low) // 3
    return low, high, odd | 1 if (odd | 1) < high else odd


def _dims(value: onnx.ValueInfoProto) -> list[Any]:
    return list(value.type.tensor_type.shape.dim)


def _graph_inputs(model: onnx.ModelProto, binds: Mapping[str, Any]) -> list[onnx.ValueInfoProto]:
    initializers = {i.name for i in model.graph.initializer}
    return [v for v in model.graph.input if v.name not in initializers and v.name not in binds]


def open_dims(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of the fully static ``model`` with dim 0 of each input and the spatial dims of 4-D
    inputs unknown (named ``<input>_<position>``), value_info and output dims cleared."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for value in out.graph.input:
        dims = _dims(value)
        for pos, dim in enumerate(dims):
            if pos == 0 or (len(dims) == 4 and pos >= 2):
                dim.Clear()
                dim.dim_param = f"{value.name}_{pos}"
    for value in out.graph.output:
        for dim in _dims(value):
            dim.Clear()  # unknown (the rank stays: the checker wants a shape)
    del out.graph.value_info[:]
    return out


def _candidates(inputs: list[onnx.ValueInfoProto], static: Mapping[str, tuple[int, ...]]) -> list[Candidate]:
    from compiler.frontend.dims import known_size

    by_key: dict[str, list[tuple[str, int]]] = {}
    first: dict[str, tuple[int, int, int]] = {}
    for value in inputs:
        dims = _dims(value)
        for pos, dim in enumerate(dims):
            if known_size(dim) is not None:
                continue
            key = dim.dim_param or f"{value.name}:{pos}"
            by_key.setdefault(key, []).append((value.name, pos))
            first.setdefault(key, _role_range(pos, len(dims), static[value.name][pos]))
    return [Candidate(key, tuple(places), *first[key]) for key, places in by_key.items()]


def _static_sizes(
    inputs: list[onnx.ValueInfoProto], shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, tuple[int, ...]]:
    from compiler.frontend.dims import known_size
    from compiler.frontend.dims import placeholders

    out = {}
    for value in inputs:
        if value.name in shapes:
            out[value.name] = tuple(int(d) for d in shapes[value.name])
        else:
            out[value.name] = placeholders([known_size(d) for d in _dims(value)])
    return out


def ort_session(model: onnx.ModelProto) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def feeds_at(plan: RangePlan, shapes: Mapping[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray]:
    """Seeded feeds: floats in [-1, 1), integers 0..3 (a valid index or byte anywhere), masks 1."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, shape in shapes.items():
        dtype = plan.dtypes[name]
        if dtype.kind == "f":
            feeds[name] = rng.uniform(-1, 1, shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[name] = rng.integers(0, 2, shape).astype(bool)
        elif "mask" in name.lower():
            feeds[name] = np.ones(shape, dtype)
        else:
            feeds[name] = rng.integers(0, 4, shape).astype(dtype)
    return feeds


def _runs(session: Any, plan: RangePlan, ranged: list[Candidate], binds: Mapping[str, np.ndarray]) -> bool:
    """onnxruntime runs the model with every dim of ``ranged`` at each end and the odd size, and with
    the last one at the odd size or the high end while the others are at the other (independent
    ranges: each combination must be a valid shape, e.g. no two broadcast dims of different sizes)."""
    probes = [(w, None) for w in ("low", "high", "odd")]
    if len(ranged) > 1:
        probes += [("high", "odd"), ("odd", "high")]
    for which, last in probes:
        try:
            outputs = session.run(None, {**feeds_at(plan, plan.binding(which, ranged, last), 0), **binds})
        except Exception:  # noqa: BLE001 - onnxruntime's refusal, whatever its type, says "not this size"
            return False
        if any(np.asarray(o).size == 0 for o in outputs):  # an empty result: a size the model cannot
            return False  # take (onnxruntime runs empty tensors through; onnx-aot refuses them)
    return True


def plan_ranges(
    model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]], binds: Mapping[str, np.ndarray]
) -> RangePlan:
    """The ranges ``model`` takes (see the module docstring); ``binds``: inputs fed fixed values."""
    from onnx import helper

    inputs = _graph_inputs(model, binds)
    static = _static_sizes(inputs, shapes)
    dtypes = {v.name: np.dtype(helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)) for v in inputs}
    plan = RangePlan(static, dtypes)
    session = ort_session(model)
    for candidate in _candidates(inputs, static):
        if _runs(session, plan, [*plan.ranged, candidate], binds):
            plan.ranged.append(candidate)
        else:
            plan.refused.append(candidate.key)
    return plan


def compare_at(
    artifact_session: Any,
    ort: Any,
    plan: RangePlan,
    which: str,
    binds: Mapping[str, np.ndarray],
    tolerance: tuple[float, float],
    spread_of: Path | None = None,
) -> Comparison:
    """Both engines on the same seeded feeds with the ranged dims at ``which``; with ``spread_of``
    (the model file of a dynamically quantized model) each output is held to 1.25x onnxruntime's
    spread around itself plus the tolerance's atol (tests/support/int8_spread.py)."""
    shapes = plan.binding(which)
    feeds = feeds_at(plan, shapes, seed=1)
    names = [o.name for o in ort.get_outputs()]
    want = ort.run(None, {**feeds, **binds})
    got = dict(
        zip([s.name for s in artifact_session.outputs], artifact_session.run(None, feeds), strict=True)
    )
    result = Comparison(rtol=tolerance[0], atol=tolerance[1])
    if spread_of is not None:
        spread = self_spread(spread_of, {**feeds, **binds}, want)
        for k, (name, expected) in enumerate(zip(names, want, strict=True)):
            err = float(np.abs(np.asarray(got[name], np.float64) - expected).max(initial=0.0))
            allowed = 1.25 * spread.max_abs[k] + tolerance[1]
            if err > allowed:
                result.mismatches.append(f"at {which} {dict(shapes)} output {name!r}: strays {err:.3g}, "
                                         f"onnxruntime from itself {spread.max_abs[k]:.3g}")
        return result
    for name, expected in zip(names, want, strict=True):
        result.add(f"at {which} {dict(shapes)} output {name!r}", np.asarray(got[name]), np.asarray(expected))
    return result
