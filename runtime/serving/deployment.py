"""``ArtifactModel``: the Ray Serve deployment of one artifact folder (docs/serving.md).

Each replica loads the folder into one ``runtime.Session`` (every file's hash checked, weights
included; with ``verify`` the golden self-test runs too, and a mismatch keeps the replica from
starting) and runs it on one thread of its own, with ``threads`` threads for the kernels, so the
replica's event loop stays free for requests. An artifact with a batch dim
(``runtime/serving/batching.py``) takes one sample per request, gathered by ``@serve.batch``
and handed to the replica's runner: Ray forms its batches on a timer whether or not a run is going
on, so the runner pools them, and each run waits up to ``batch_wait_s`` for ``max_batch`` samples,
takes all that are waiting (at most ``max_batch``), stacked in groups of equal shapes, and splits
the results back;
without one, each request is one run of the whole tensors.

Two ways in: HTTP (``__call__``: JSON or npz bodies, ``runtime/serving/bodies.py``; ``GET`` says
what the model takes) and the Python handle (``predict``: ``{NAME: ndarray}`` in and out). A bad
request is answered 400 ``{"error": ...}`` (on the handle: the ``InputError``), a failure of the run
500 with its one line; the replica keeps serving either way. The health check is the session
loaded; the metrics (``ray.serve.metrics``): ``onnx_aot_requests`` by status, the
``onnx_aot_batch_size`` histogram of runs, ``onnx_aot_latency_ms`` per request; ``stats()`` gives
the same counts of this replica.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import ray
from ray import serve
from ray.serve import metrics
from starlette.requests import Request
from starlette.responses import Response

from runtime.errors import InputError
from runtime.errors import OnnxAotError
from runtime.serving import ServingError
from runtime.serving import bodies
from runtime.serving.batching import Sample
from runtime.serving.batching import batching_of
from runtime.serving.batching import check_sample
from runtime.serving.batching import groups
from runtime.serving.batching import run_stacked

__all__ = ["ArtifactModel", "DEFAULT_BATCH_WAIT_S", "CONCURRENT_BATCHES", "SessionFactory"]

DEFAULT_BATCH_WAIT_S = 0.005
# Ray batches handed to the runner at once: in effect unbounded (max_ongoing_requests bounds them),
# since their samples are pooled and run together (``_batched``); a bound here capped the runs at
# that many samples
CONCURRENT_BATCHES = 1024
BATCH_BOUNDARIES = [1.5, 2.5, 4.5, 8.5, 16.5, 32.5, 64.5, 128.5]
LATENCY_BOUNDARIES_MS = [0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]
# (folder, threads) -> an object with Session's .inputs, .outputs and .run(None, feeds)
SessionFactory = Callable[[str, int], Any]


class _QuietBatchWarning(logging.Filter):
    """Drops Ray's warning that max_batch_size x max_concurrent_batches exceeds max_ongoing_requests:
    true of Ray's batches, not of the runs here, which pool them (``ArtifactModel._batched``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "max_concurrent_batches" not in record.getMessage()


class _Failed:
    """One sample's ``InputError`` inside a batch (the other samples' results are answered)."""

    def __init__(self, error: InputError) -> None:
        self.error = error


class _Metrics:
    """Ray's metrics of this replica, and the same counts kept here for ``stats()``."""

    def __init__(self) -> None:
        self.requests = metrics.Counter("onnx_aot_requests", description="requests answered, by status",
                                        tag_keys=("status",))
        self.batch_size = metrics.Histogram("onnx_aot_batch_size", description="samples per run",
                                            boundaries=BATCH_BOUNDARIES)
        self.latency = metrics.Histogram("onnx_aot_latency_ms", description="request latency (ms)",
                                         boundaries=LATENCY_BOUNDARIES_MS)
        self.counts = {"ok": 0, "bad_request": 0, "error": 0}
        self.batches: dict[int, int] = {}
        self._lock = threading.Lock()

    def request(self, status: str, start: float) -> None:
        self.requests.inc(tags={"status": status})
        self.latency.observe((time.perf_counter() - start) * 1000)
        with self._lock:
            self.counts[status] += 1

    def batch(self, size: int) -> None:
        self.batch_size.observe(size)
        with self._lock:
            self.batches[size] = self.batches.get(size, 0) + 1


def _load(folder: str, threads: int, verify: bool, factory: SessionFactory | None) -> Any:
    if factory is not None:
        return factory(folder, threads)
    from runtime.session import Session

    session = Session(folder, threads=threads, verify_weights=True)
    if verify:
        session.verify()  # SelfTestError on a mismatch: the replica does not start
    return session


def _one_line(exc: BaseException) -> str:
    """The error as one line: ours as its message, another with its type first."""
    text = " ".join(str(exc).split())
    return text if isinstance(exc, OnnxAotError) and text else f"{type(exc).__name__}: {text}"


@serve.deployment
class ArtifactModel:
    """One artifact folder served by each replica (see the module docstring)."""

    def __init__(self, folder: str, threads: int = 1, verify: bool = False, max_batch: int | None = None,
                 batch_wait_s: float = DEFAULT_BATCH_WAIT_S, session_factory: SessionFactory | None = None
                 ) -> None:
        self.folder = folder
        self.session = _load(folder, threads, verify, session_factory)
        self.batch, self.max_batch, self.why_unbatched = batching_of(
            self.session.inputs, self.session.outputs, max_batch, folder)
        batched: Any = self._batched  # @serve.batch's wrapper: its settings, per replica
        batched.set_max_batch_size(self.max_batch)
        batched.set_batch_wait_timeout_s(0.0)  # the runner waits (_drain): Ray's batches go straight to it
        self._wait_s = batch_wait_s
        self._names = [s.name for s in self.session.outputs]
        self._runner = ThreadPoolExecutor(1, thread_name_prefix="onnx-aot-run")
        self._pending: list[tuple[Sample, asyncio.Future[Any]]] = []
        self._arrived = asyncio.Event()
        self._draining: asyncio.Task[None] | None = None
        self._metrics = _Metrics()
        logging.getLogger("ray.serve").addFilter(_QuietBatchWarning())

    # -- the two ways in -------------------------------------------------------------------------
    async def __call__(self, request: Request) -> Response:
        if request.method == "GET":
            return Response(bodies.info_json(self.folder, self.session, self.batch, self.max_batch,
                                             self.why_unbatched),
                            media_type=bodies.JSON_TYPE)
        start = time.perf_counter()
        npz = bodies.is_npz(request.headers.get("content-type"))
        try:
            body = await request.body()
            feeds = bodies.decode_npz(body) if npz else bodies.decode_json(body, self.session.inputs)
            outputs = await self._infer(feeds)
        except InputError as exc:
            self._metrics.request("bad_request", start)
            return Response(bodies.error_json(_one_line(exc)), 400, media_type=bodies.JSON_TYPE)
        except Exception as exc:  # the run failed: one line, no traceback, the replica goes on
            self._metrics.request("error", start)
            return Response(bodies.error_json(_one_line(exc)), 500, media_type=bodies.JSON_TYPE)
        self._metrics.request("ok", start)
        if npz:
            return Response(bodies.encode_npz(outputs), media_type=bodies.NPZ_TYPE)
        return Response(bodies.encode_json(outputs), media_type=bodies.JSON_TYPE)

    async def predict(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The Python handle's call: ``{NAME: array}`` (one sample each when batching) -> outputs."""
        start = time.perf_counter()
        try:
            outputs = await self._infer(feeds)
        except InputError:
            self._metrics.request("bad_request", start)
            raise
        except Exception:
            self._metrics.request("error", start)
            raise
        self._metrics.request("ok", start)
        return outputs

    async def _infer(self, feeds: Any) -> dict[str, np.ndarray]:
        if self.batch is None:
            loop = asyncio.get_running_loop()
            results = await loop.run_in_executor(self._runner, self._run_whole, feeds)
        else:
            result = await self._batched(check_sample(self.session.inputs, feeds))
            if isinstance(result, _Failed):
                raise result.error
            results = result
        return dict(zip(self._names, results, strict=True))

    # -- running -----------------------------------------------------------------------------------
    def _run_whole(self, feeds: Any) -> list[np.ndarray]:
        self._metrics.batch(1)
        return self.session.run(None, feeds)

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=DEFAULT_BATCH_WAIT_S,
                 max_concurrent_batches=CONCURRENT_BATCHES)
    async def _batched(self, samples: list[Sample]) -> list[Any]:
        """Ray's batch, handed to the runner: Ray forms batches on its timer even while a run is
        going on, so the samples wait in ``_pending`` and each run takes all that are there."""
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in samples]
        self._pending.extend(zip(samples, futures, strict=True))
        self._arrived.set()
        if self._draining is None or self._draining.done():
            self._draining = loop.create_task(self._drain())
        return list(await asyncio.gather(*futures))

    async def _fill(self, deadline: float) -> None:
        """Wait until ``max_batch`` samples are pending or the loop's clock reaches ``deadline``."""
        loop = asyncio.get_running_loop()
        while len(self._pending) < self.max_batch and loop.time() < deadline:
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), deadline - loop.time())
            except asyncio.TimeoutError:
                return

    async def _drain(self) -> None:
        """Run what is pending, up to ``max_batch`` samples a run, until nothing is."""
        loop = asyncio.get_running_loop()
        while self._pending:
            await self._fill(loop.time() + self._wait_s)
            taken, self._pending = self._pending[:self.max_batch], self._pending[self.max_batch:]
            try:
                results = await loop.run_in_executor(self._runner, self._run_batch, [s for s, _ in taken])
            except Exception as exc:  # the run failed: every sample of it answers the failure
                results = [exc] * len(taken)
            for (_, future), result in zip(taken, results, strict=True):
                if future.done():
                    continue
                if isinstance(result, Exception):
                    future.set_exception(result)
                else:
                    future.set_result(result)

    def _run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(None, feeds)

    def _run_batch(self, samples: list[Sample]) -> list[Any]:
        """Each group of equal shapes stacked into one run; where the run refuses the stacked feeds
        (a binding the model cannot take), each sample of the group alone, so only its own fails."""
        results: list[Any] = [None] * len(samples)
        for run in groups(samples, self.max_batch):
            picked = [samples[i] for i in run]
            self._metrics.batch(len(picked))
            try:
                outs: list[Any] = run_stacked(self._run, picked)
            except InputError:
                outs = [self._run_alone(sample) for sample in picked]
            for index, out in zip(run, outs, strict=True):
                results[index] = out
        return results

    def _run_alone(self, sample: Sample) -> Any:
        try:
            return run_stacked(self._run, [sample])[0]
        except InputError as exc:
            return _Failed(exc)

    # -- Ray's calls -------------------------------------------------------------------------------
    def check_health(self) -> None:
        if getattr(self, "session", None) is None:
            raise ServingError(f"{self.folder}: the replica's session is not loaded")

    def stats(self) -> dict[str, Any]:
        """This replica's counts: requests by status, runs by batch size; its id and actor name."""
        replica = serve.get_replica_context().replica_id.unique_id
        actor = ray.get_runtime_context().get_actor_name()
        with self._metrics._lock:
            return {"replica": replica, "actor": actor, "requests": dict(self._metrics.counts),
                    "batches": dict(self._metrics.batches), "max_batch": self.max_batch}
