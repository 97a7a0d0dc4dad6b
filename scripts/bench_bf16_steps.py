"""Each conv of the compute-bound zoo models in three forms, per step, for the bf16 cost model.

For each model (seeded random weights, ``tests/support/zoo.py``) it compiles three artifacts --
fp32 as the default compile makes it (Winograd for the 3x3 stride-1 convs it takes), fp32 without
Winograd (every conv direct) and ``--precision bf16`` with every conv of one group in bf16 (the
eligibility of ``compiler/passes/pack_conv_bf16.py`` and the Winograd choice turned off) -- loads
them with ``Session(profile=True)``, runs them in turn (A B C A B C ...) and prints one JSON line
per conv: its geometry and the median time of its step in each form (the step holding the conv,
plus any step made only of nodes that step holds in another form: a pre-scale folded into a bf16
conv). Those are the measurements behind the constants of ``compiler/passes/bf16_cost.py``.

Usage: python -m scripts.bench_bf16_steps [--runs N] [--threads N] [--cpu TARGET] [MODEL ...]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from compiler.bench import prepare_environment

prepare_environment()  # before any kernel library loads libgomp

import onnx  # noqa: E402

from compiler import compile_model  # noqa: E402
from compiler.bench import round_robin  # noqa: E402
from compiler.passes import bf16_cost  # noqa: E402
from runtime import Session  # noqa: E402
from scripts.bench_zoo import COMPUTE_BOUND  # noqa: E402
from tests.support.zoo import dummy_input  # noqa: E402
from tests.support.zoo import zoo_model  # noqa: E402

FORMS = ("fp32", "direct", "bf16")


@contextmanager
def every_conv_bf16() -> Iterator[None]:
    """Every engine's rules at their floor: each conv of one group bf16, no Winograd kept."""
    saved = dict(bf16_cost.RULES)
    floor = bf16_cost.Bf16Rules(min_channels=0, stem_min_taps=0, min_pixel_products=0, min_deep_k=0,
                                min_deep_m=0, min_small_products=0)
    bf16_cost.RULES.update({engine: floor for engine in saved})
    try:
        yield
    finally:
        bf16_cost.RULES.update(saved)


def conv_geometry(model: onnx.ModelProto) -> dict[str, dict[str, int]]:
    """Each one-group Conv node's C, M, kernel, stride and output size (by ONNX shape inference)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output)}
    inits = {t.name: list(t.dims) for t in model.graph.initializer}
    out: dict[str, dict[str, int]] = {}
    for node in model.graph.node:
        if node.op_type != "Conv":
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        w, y = inits.get(node.input[1]), shapes.get(node.output[0])
        if w is None or not y or int(attrs.get("group", 1)) != 1:
            continue
        out[node.name] = {"c": w[1], "m": w[0], "kh": w[2], "kw": w[3],
                          "stride": int(attrs.get("strides", [1])[0]), "oh": y[2], "ow": y[3]}
    return out


def step_medians(trace: Path) -> Steps:
    """Each step's ONNX nodes and its median time (us) over the profiled runs."""
    runs: dict[tuple[int, str], list[float]] = {}
    nodes: dict[tuple[int, str], frozenset[str]] = {}
    for event in json.loads(trace.read_text()):
        if event.get("cat") != "Node":
            continue
        key = (int(event["args"]["step"]), str(event["args"].get("partition", "")))
        runs.setdefault(key, []).append(float(event["dur"]))
        nodes[key] = frozenset(event["args"].get("onnx_nodes", [event["name"]]))
    return [(nodes[k], statistics.median(v)) for k, v in runs.items()]


Steps = list[tuple[frozenset[str], float]]


def conv_times(steps: list[Steps], convs: dict[str, Any]) -> dict[str, list[float]]:
    """Per conv, its time in each form: the step holding it plus the steps inside its node group."""
    out: dict[str, list[float]] = {}
    for conv in convs:
        group: set[str] = set()
        for form in steps:
            for names, _ in form:
                if conv in names:
                    group |= names
        others = set(convs) - {conv}
        out[conv] = [sum(t for names, t in form if conv in names or (names <= group and not names & others))
                     for form in steps]
    return out


def measure(name: str, tmp: Path, threads: int, runs: int, cpu: str | None) -> list[dict[str, Any]]:
    model = zoo_model(name)
    common: dict[str, Any] = {"golden_cases": 0, "run_check": False, "cpu": cpu}
    dirs = [compile_model(model, tmp / f"{name}-fp32", **common),
            compile_model(model, tmp / f"{name}-direct", winograd=False, **common)]
    with every_conv_bf16():
        dirs.append(compile_model(model, tmp / f"{name}-bf16", precision="bf16", **common))
    sessions = [Session(d, threads=threads, profile=True) for d in dirs]
    feeds = dummy_input(model)
    round_robin([functools.partial(s.run, None, feeds) for s in sessions], runs, warmup=3)
    steps = [step_medians(Path(s.end_profiling(tmp / f"{name}-{form}.json")))
             for s, form in zip(sessions, FORMS, strict=True)]
    convs = conv_geometry(model)
    times = conv_times(steps, convs)
    return [{"model": name, "conv": c, **convs[c], **dict(zip(FORMS, times[c], strict=True))} for c in convs]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(COMPUTE_BOUND))
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cpu", default=None,
                        help="--cpu target of the three compiles (default: this machine's level)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            for row in measure(name, Path(tmp), args.threads, args.runs, args.cpu):
                print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
