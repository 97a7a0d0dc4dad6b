"""Issue 33's serving bench: onnx-aot on Ray Serve against the same deployment running onnxruntime.

A closed-loop load generator, local only: ``--clients`` threads, each with one keep-alive HTTP
connection, send one sample (an npz body) and wait for its answer, again and again, for
``--seconds`` per measurement. Per model it compiles the artifact for a batch range, starts one
local Ray instance and deploys, side by side, each on ``--replicas`` replicas x ``--threads``
threads, all batching the same way (``runtime.serving``'s ``ArtifactModel``, ``--max-batch`` up to
the range's top, ``--batch-wait-ms``):

- ``aot``: the artifact (``runtime.Session``);
- ``ort``: onnxruntime on the original model, behind the very same deployment class (its specs
  read from the artifact, so requests are checked, stacked and split alike);
- ``aot-unbatched`` (encoder only): the artifact with ``max_batch=1``.

The deployments are measured alternating (``--rounds`` rounds, each deployment ``--seconds`` in
each round); throughput (answers per second) and p50 / p99 latency over all rounds, and the ratios
onnx-aot / onnxruntime. Before serving, ``kernel_batching`` times a direct ``Session.run`` per
sample at batch 1 and at the top of the range (alternating): batching on / off cannot gain more
than that ratio plus the per-request cost it spreads. ``--ingress direct`` (the default, as
``onnx-aot serve``'s): client k sends to replica k mod R's own port (direct ingress, no proxy hop,
as a balancer in front of the replicas would); ``--ingress proxy``: all to Ray Serve's proxy.
``--overhead`` (``--only-overhead``: nothing else) measures the serving layer's own cost: a
one-element model served over HTTP without batching, one client, p50 latency minus a direct
``Session.run``'s p50, and minus a bare Ray Serve deployment's p50 (a fixed answer: Ray's own HTTP
path), through the proxy and (direct) straight to the replica; and the Python handle's p50,
alternating.

Models: ``minilm`` (tests/support/encoder_model.py's MiniLM-size encoder, ``--dim batch=1..16``,
seq ``--seq``), ``resnet50`` (the random-weight zoo ResNet-50, ``N=1..8``). Slow and heavy (run it
under the CPU lock); ``--smoke`` runs a two-layer encoder for 2 s per deployment. Not part of CI.

Usage: python -m scripts.bench_serve [--models minilm,resnet50] [--clients 16] [--seconds 10]
                                     [--rounds 3] [--replicas 2] [--threads 1] [--ingress direct|proxy]
                                     [--overhead | --only-overhead] [--smoke]
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from compiler.bench import for_onnxruntime  # noqa: E402
from compiler.driver import compile_model  # noqa: E402
from runtime import Session  # noqa: E402
from runtime.serving.app import ServeSettings  # noqa: E402
from runtime.serving.app import start  # noqa: E402
from runtime.serving.app import stop  # noqa: E402
from scripts.bench_zoo import machine_facts  # noqa: E402
from tests.support.encoder_model import MINILM  # noqa: E402
from tests.support.encoder_model import encoder_model  # noqa: E402

SMOKE = {"layers": 2, "hidden": 64, "heads": 4, "ffn": 128}
MAX_BATCH = {"minilm": 16, "resnet50": 8, "smoke": 16}


class OrtSession:
    """onnxruntime on ``model_path`` with the artifact's input and output specs (the deployment's
    checks and batching see the same interface) and ``Session.run``'s call."""

    def __init__(self, model_path: str, folder: str, threads: int) -> None:
        import onnxruntime as ort

        from runtime.plan_info import load_plan

        plan = load_plan(folder)
        self.inputs, self.outputs = list(plan.inputs), list(plan.outputs)
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        options.log_severity_level = 3
        self._session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])

    def run(self, names: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return list(self._session.run(None, feeds))


def ort_factory(model_path: str, folder: str, threads: int) -> OrtSession:
    return OrtSession(model_path, folder, threads)


def batched_resnet50() -> onnx.ModelProto:
    """The zoo ResNet-50 with its batch dim named ``N`` (input, output, and the Reshape before the
    classifier keeping dim 0 with a 0)."""
    from tests.support.zoo import zoo_model

    model = zoo_model("resnet50")
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    for value in (*[i for i in graph.input if i.name not in inits], *graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = "N"
    for node in graph.node:
        if node.op_type == "Reshape" and node.input[1] in inits:
            shape = numpy_helper.to_array(inits[node.input[1]]).copy()
            if shape[0] == 1:
                shape[0] = 0
                inits[node.input[1]].CopyFrom(numpy_helper.from_array(shape, node.input[1]))
    return model


def build(name: str, seq: int) -> tuple[onnx.ModelProto, dict[str, Any], dict[str, np.ndarray]]:
    """The model, its compile keywords and one sample (no batch axis)."""
    rng = np.random.default_rng(0)
    if name == "resnet50":
        model = batched_resnet50()
        (x,) = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
        return model, {"dims": {"N": (1, 8)}}, {x: rng.standard_normal((3, 224, 224)).astype(np.float32)}
    size = SMOKE if name == "smoke" else MINILM
    model = encoder_model(**size, dynamic=True)
    sample = {"hidden_states": rng.standard_normal((seq, size["hidden"])).astype(np.float32),
              "attention_mask": np.arange(seq) < max(1, seq * 3 // 4)}
    return model, {"dims": {"batch": (1, MAX_BATCH[name]), "seq": (seq, seq)}}, sample


def one_element_model() -> onnx.ModelProto:
    node = helper.make_node("Add", ["x", "one"], ["y"], name="add")
    one = numpy_helper.from_array(np.ones(1, np.float32), "one")
    graph = helper.make_graph([node], "one", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], initializer=[one])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def npz_body(sample: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **sample)
    return buffer.getvalue()


def load(ports: list[int], route: str, body: bytes, clients: int, seconds: float) -> list[float]:
    """Closed loop: ``clients`` threads for ``seconds``, client k on ``ports[k % len(ports)]``
    (the proxy's port, or the replicas' own: direct ingress); every answered request's latency (s)."""
    latencies: list[float] = []
    lock = threading.Lock()
    deadline = time.perf_counter() + seconds
    failures: list[str] = []

    def client(port: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        mine = []
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            conn.request("POST", route, body, {"Content-Type": "application/octet-stream"})
            response = conn.getresponse()
            data = response.read()
            if response.status != 200:
                failures.append(f"{response.status}: {data[:200]!r}")
                return
            mine.append(time.perf_counter() - t0)
        conn.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client, args=(ports[k % len(ports)],)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise RuntimeError(f"{route}: {failures[0]}")
    return latencies


def summary(latencies: list[float], seconds: float) -> dict[str, float]:
    ordered = sorted(latencies)
    return {"throughput": len(ordered) / seconds, "p50_ms": 1000 * ordered[len(ordered) // 2],
            "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], "n": len(ordered)}


def mean_batch(served: Any, replicas: int) -> float:
    """Samples per run over the deployment's replicas (their ``stats()``, warm-up included)."""
    seen: dict[str, dict[int, int]] = {}
    for _ in range(40):
        stats = served.handle.stats.remote().result()
        seen[stats["replica"]] = stats["batches"]
        if len(seen) == replicas:
            break
    runs = sum(n for batches in seen.values() for n in batches.values())
    samples = sum(int(size) * n for batches in seen.values() for size, n in batches.items())
    return samples / max(1, runs)


def kernel_batching(folder: Path, sample: dict[str, np.ndarray], top: int, threads: int,
                    rounds: int = 3) -> dict[str, float]:
    """Per-sample ms of a direct ``Session.run`` at batch 1 and at ``top`` (alternating): the gain
    batching can give before any serving cost, which bounds the served on / off ratio."""
    session = Session(str(folder), threads=threads)
    feeds = {b: {k: np.repeat(v[None], b, axis=0) for k, v in sample.items()} for b in (1, top)}
    per_sample: dict[int, list[float]] = {1: [], top: []}
    for b in (1, top):
        session.run(None, feeds[b])  # warm: the binding's first run
    for _ in range(rounds):
        for b in (1, top):
            for _ in range(max(2, 2 * top // b)):
                t0 = time.perf_counter()
                session.run(None, feeds[b])
                per_sample[b].append((time.perf_counter() - t0) / b)
    one, full = (1000 * statistics.median(per_sample[b]) for b in (1, top))
    return {"batch1_ms_per_sample": one, f"batch{top}_ms_per_sample": full, "gain": one / full}


def entry_ports(served: Any, replicas: int, port: int) -> list[int]:
    """Where the clients send: each replica's own port with direct ingress (asked until all
    ``replicas`` have one), else the proxy's ``port``."""
    if served.settings.ingress != "direct":
        return [port]
    for _ in range(60):
        ports = replica_ports(served.settings.name, served.settings.route)
        if len(ports) >= replicas:
            return ports
        time.sleep(0.5)
    raise RuntimeError(f"{served.settings.name}: {len(ports)} of {replicas} replicas answer directly")


def replica_ports(app_name: str, route: str) -> list[int]:
    from runtime.serving.ingress import replica_urls

    return [int(url.split(":")[2].split("/")[0]) for url in replica_urls(app_name, route)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bench_model(name: str, args: argparse.Namespace, tmp: Path, port: int) -> dict[str, Any]:
    model, options, sample = build(name, args.seq)
    folder = compile_model(model, tmp / name, **options)
    model_path = tmp / f"{name}.onnx"
    onnx.save(for_onnxruntime(model), str(model_path))
    # the deployments run one at a time: each reserves its share of Ray's CPUs, so all fit at once
    share = args.threads / (2 if name == "resnet50" else 3)
    common = {"port": port, "replicas": args.replicas, "threads": args.threads, "num_cpus": share,
              "ingress": args.ingress,
              "batch_wait_ms": args.batch_wait_ms, "max_batch": min(args.max_batch, MAX_BATCH[name])}
    variants = {"aot": ServeSettings(str(folder), route=f"/{name}-aot", name=f"{name}-aot", **common),
                "ort": ServeSettings(str(folder), route=f"/{name}-ort", name=f"{name}-ort",
                                     session_factory=partial(ort_factory, str(model_path)), **common)}
    if name != "resnet50":
        variants["aot-unbatched"] = ServeSettings(str(folder), route=f"/{name}-aot1", name=f"{name}-aot1",
                                                  **{**common, "max_batch": 1})
    # a batching deployment takes one sample; one with batching off the whole tensors (a batch of 1)
    bodies = {key: npz_body(sample if key != "aot-unbatched" else {k: v[None] for k, v in sample.items()})
              for key in variants}
    kernels = kernel_batching(folder, sample, common["max_batch"], args.threads)
    served = {key: start(s, ray_init={"num_cpus": os.cpu_count()}) for key, s in variants.items()}
    try:
        ports = {key: entry_ports(s, args.replicas, port) for key, s in served.items()}
        for key, s in served.items():  # warm: every replica's first runs (bindings, thread choice)
            load(ports[key], s.settings.route, bodies[key], args.clients, 2.0)
        runs: dict[str, list[float]] = {key: [] for key in served}
        for _ in range(args.rounds):
            for key, s in served.items():
                runs[key] += load(ports[key], s.settings.route, bodies[key], args.clients, args.seconds)
        batch_means = {key: mean_batch(s, args.replicas) for key, s in served.items()}
    finally:
        for s in reversed(list(served.values())):
            stop(s)
    total = args.rounds * args.seconds
    rows = {key: {**summary(lat, total), "mean_batch": batch_means[key]} for key, lat in runs.items()}
    result = {"model": name, "rows": rows,
              "throughput_ratio": rows["aot"]["throughput"] / rows["ort"]["throughput"],
              "p99_ratio": rows["aot"]["p99_ms"] / rows["ort"]["p99_ms"], "kernel_batching": kernels}
    if "aot-unbatched" in rows:
        result["batching_gain"] = rows["aot"]["throughput"] / rows["aot-unbatched"]["throughput"]
    return result


class BareModel:
    """A Ray Serve deployment answering a fixed body: Ray's own HTTP cost, for the overhead row."""

    async def __call__(self, request: Any) -> Any:
        from starlette.responses import Response

        await request.body()
        return Response(b'{"outputs": {"y": [2.0]}}', media_type="application/json")


def _sequential(port: int, route: str, body: bytes, seconds: float) -> list[float]:
    """One client, one request after another, for ``seconds``: the latencies (s)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        conn.request("POST", route, body, {"Content-Type": "application/json"})
        conn.getresponse().read()
        latencies.append(time.perf_counter() - t0)
    conn.close()
    return latencies[10:]


def _sequential_handle(handle: Any, feeds: dict[str, np.ndarray], seconds: float) -> list[float]:
    """The same over the Python handle (``predict``, no HTTP proxy): the latencies (s)."""
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        handle.predict.remote(feeds).result()
        latencies.append(time.perf_counter() - t0)
    return latencies[10:]


def bench_overhead(tmp: Path, port: int, seconds: float, ingress: str) -> dict[str, float]:
    """The serving layer's p50 over a direct ``Session.run`` (one-element model, HTTP, no batching),
    and over a bare Ray Serve deployment answering a fixed body, through the proxy and (direct
    ingress) straight to the replica; and the Python handle's (alternating, 1 s turns)."""
    from ray import serve

    folder = compile_model(one_element_model(), tmp / "one")
    session = Session(folder, threads=1)
    feeds = {"x": np.ones(1, np.float32)}
    direct = []
    for _ in range(2000):
        t0 = time.perf_counter()
        session.run(None, feeds)
        direct.append(time.perf_counter() - t0)
    settings = ServeSettings(str(folder), port=port, route="/one", name="one", threads=1, ingress=ingress)
    served = start(settings, ray_init={"num_cpus": os.cpu_count()})
    body = json.dumps({"inputs": {"x": [1.0]}}).encode()
    paths: dict[str, Any] = {"http": partial(_sequential, port, "/one", body),
                             "bare_ray": partial(_sequential, port, "/bare", body),
                             "handle": partial(_sequential_handle, served.handle, feeds)}
    try:
        serve.run(serve.deployment(BareModel).bind(), name="bare", route_prefix="/bare")
        if ingress == "direct":
            (one_port,), (bare_port,) = entry_ports(served, 1, port), replica_ports("bare", "/bare")
            paths["direct_http"] = partial(_sequential, one_port, "/one", body)
            paths["direct_bare_ray"] = partial(_sequential, bare_port, "/bare", body)
        times: dict[str, list[float]] = {key: [] for key in paths}
        for _ in range(max(1, int(seconds))):
            for key, path in paths.items():
                times[key] += path(1.0)
        serve.delete("bare")
    finally:
        stop(served)
    p50 = {key: 1000 * statistics.median(values) for key, values in times.items()}
    run_p50 = 1000 * statistics.median(direct)
    result = {f"{key}_p50_ms": value for key, value in p50.items()} | {"run_p50_ms": run_p50}
    result |= {"overhead_p50_ms": p50["http"] - run_p50,
               "over_bare_ray_p50_ms": p50["http"] - p50["bare_ray"]}
    if "direct_http" in p50:
        result["direct_overhead_p50_ms"] = p50["direct_http"] - run_p50
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="minilm,resnet50", help="comma list of minilm, resnet50")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0, help="per deployment per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="kernel threads per replica")
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--batch-wait-ms", type=float, default=5.0)
    parser.add_argument("--seq", type=int, default=128, help="the encoder's sequence length")
    parser.add_argument("--overhead", action="store_true", help="also the serving layer's own p50 cost")
    parser.add_argument("--only-overhead", action="store_true", help="only the overhead (no models)")
    parser.add_argument("--ingress", choices=("direct", "proxy"), default="direct",
                        help="direct (default): clients send to the replicas' own ports; proxy: to "
                             "Ray Serve's proxy")
    parser.add_argument("--smoke", action="store_true", help="a two-layer encoder, 2 s per deployment")
    args = parser.parse_args(argv)
    models = args.models.split(",")
    if args.smoke:
        models, args.seconds, args.rounds, args.seq = ["smoke"], 2.0, 1, 16
    if args.only_overhead:
        models = []
    print(f"# {json.dumps(machine_facts())}")
    print(f"# {args.clients} clients ({args.ingress} ingress), {args.replicas} replicas x {args.threads} "
          f"threads, {args.rounds} rounds x {args.seconds:g} s per deployment, alternating; "
          f"a shared machine: read the ratios")
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        for name in models:
            result = bench_model(name, args, Path(tmp), port)
            for key, row in result["rows"].items():
                print(f"{name:9s} {key:14s} {row['throughput']:8.1f}/s  p50 {row['p50_ms']:8.2f} ms  "
                      f"p99 {row['p99_ms']:8.2f} ms  {row['mean_batch']:5.2f} samples/run  "
                      f"({row['n']} answers)")
            print(f"{name:9s} kernels        per sample {json.dumps(result['kernel_batching'])}")
            print(json.dumps(result), flush=True)
        if args.overhead or args.only_overhead:
            overhead = bench_overhead(Path(tmp), port, 5.0 if args.smoke else 20.0, args.ingress)
            print(json.dumps({"overhead": overhead}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
