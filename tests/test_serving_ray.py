"""A real Ray Serve application on this machine (issue 33, item 4).

One module-scoped Ray instance serves two applications over real HTTP on 127.0.0.1 (a free port):
``/tiny``, a batched artifact (x [batch, 4], z [batch, 3] -> y, batch in 1..8) on 2 replicas, and
``/small``, a static CNN that runs request by request on 1 replica (which reruns the golden self-test
before it serves: ``--verify``); every replica reserves a tenth
of one of Ray's 2 CPUs and runs 1 kernel thread. Checked: answers (JSON, npz, the Python handle)
equal a direct ``Session.run``; concurrent one-sample requests are batched (Ray's batch-size
histogram, read from its Prometheus endpoint, counts runs of more than one) and their answers
equal unbatched runs; bad requests get 400 with the runtime's message naming the input and the
replicas keep serving; a replica killed under load is replaced by Ray and a retrying client loses
no request. First, ``python -m runtime serve`` itself: its line, an answer, and SIGTERM stopping
the app and its Ray instance. Skipped, with the reason, where Ray Serve is not importable.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is not installed here (pip install 'onnx-aot[serve]')")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # no token-authentication notice for a local test

import ray  # noqa: E402
from ray import serve  # noqa: E402

from runtime import Session  # noqa: E402
from runtime.errors import InputError  # noqa: E402
from runtime.serving import ServingError  # noqa: E402
from runtime.serving.app import Served  # noqa: E402
from runtime.serving.app import ServeSettings  # noqa: E402
from runtime.serving.app import start  # noqa: E402
from runtime.serving.app import stop  # noqa: E402
from tests.support.serving import compile_batched  # noqa: E402
from tests.support.serving import compile_static  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _raylets() -> set[int]:
    """The ids of the raylet processes running now (read from /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and b"raylet" in (entry / "cmdline").read_bytes().split(b"\0")[0]:
                found.add(int(entry.name))
        except OSError:
            continue
    return found


def test_the_serve_command_answers_and_stops_on_sigterm(tmp_path_factory: pytest.TempPathFactory) -> None:
    """``python -m runtime serve`` (its own Ray instance, before the module's starts): the one line
    once the route answers, a real answer, and on SIGTERM the app and its Ray instance gone."""
    folder = compile_batched(tmp_path_factory.mktemp("cli") / "tiny")
    port, before = free_port(), _raylets()
    env = {**os.environ, "PYTHONPATH": REPO}
    proc = subprocess.Popen([sys.executable, "-m", "runtime", "serve", str(folder), "--port", str(port),
                             "--route", "/cli", "--threads", "1", "--max-batch", "4"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once the route answers
        assert line == f"serving {folder} at http://127.0.0.1:{port}/cli\n", line + proc.stderr.read()[-3000:]
        one = sample(np.random.default_rng(5))
        status, answer = post_json(f"http://127.0.0.1:{port}/cli", one)
        assert status == 200
        expected = Session(folder, threads=1).run(None, {k: v[None] for k, v in one.items()})[0][0]
        assert np.array_equal(np.asarray(answer["outputs"]["y"], np.float32), expected)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and f"stopped serving {folder}" in err, err[-3000:]
    assert "replicas answering directly (no proxy hop): http://127.0.0.1:" in err, err[-3000:]
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/cli", timeout=5)
    assert _raylets() <= before, "the Ray instance serve started is still running"


@dataclass
class Apps:
    tiny: Served
    small: Served
    tiny_session: Session
    small_session: Session
    metrics_url: str


@pytest.fixture(scope="module")
def apps(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Apps]:
    root = tmp_path_factory.mktemp("serving")
    tiny, small = compile_batched(root / "tiny"), compile_static(root / "small")
    port, metrics_port = free_port(), free_port()
    common: dict[str, Any] = {"port": port, "threads": 1, "num_cpus": 0.1}
    ray_init = {"num_cpus": 2, "_metrics_export_port": metrics_port,
                "_system_config": {"metrics_report_interval_ms": 500}}
    settings = ServeSettings(str(tiny), route="/tiny", replicas=2, batch_wait_ms=20, name="tiny", **common)
    batched = start(settings, ray_init=ray_init)
    try:
        whole = start(ServeSettings(str(small), route="/small", name="small", verify=True, **common))
    except BaseException:
        stop(batched)
        raise
    try:
        yield Apps(batched, whole, Session(tiny, threads=1), Session(small, threads=1),
                   f"http://127.0.0.1:{metrics_port}/metrics")
    finally:
        stop(whole)
        stop(batched)


def post(url: str, body: bytes, npz: bool = False) -> tuple[int, bytes]:
    kind = "application/octet-stream" if npz else "application/json"
    request = urllib.request.Request(url, body, {"Content-Type": kind})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def post_json(url: str, inputs: dict[str, Any]) -> tuple[int, Any]:
    body = json.dumps({"inputs": {k: np.asarray(v).tolist() for k, v in inputs.items()}}).encode()
    status, body = post(url, body)
    return status, json.loads(body)


def sample(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"x": rng.standard_normal(4).astype(np.float32), "z": rng.standard_normal(3).astype(np.float32)}


def alone(session: Session, one: dict[str, np.ndarray]) -> np.ndarray:
    """The sample's output from a direct, unbatched ``Session.run`` (a batch of 1)."""
    return session.run(None, {k: v[None] for k, v in one.items()})[0][0]


def test_answers_equal_a_direct_session_run(apps: Apps) -> None:
    one = sample(np.random.default_rng(0))
    expected = alone(apps.tiny_session, one)
    status, answer = post_json(apps.tiny.url, one)
    assert status == 200 and np.array_equal(np.asarray(answer["outputs"]["y"], np.float32), expected)
    buffer = io.BytesIO()
    np.savez(buffer, **one)
    status, body = post(apps.tiny.url, buffer.getvalue(), npz=True)
    assert status == 200 and np.array_equal(np.load(io.BytesIO(body))["y"], expected)
    result = apps.tiny.handle.predict.remote(one).result()
    assert set(result) == {"y"} and np.array_equal(result["y"], expected)


def test_each_replica_answers_on_its_own_port_too(apps: Apps) -> None:
    """Direct ingress (the default): both replicas' own URLs answer as the proxy's does."""
    urls = apps.tiny.replica_urls()
    assert len(urls) == 2 and all(url.endswith("/tiny") for url in urls), urls
    assert apps.tiny.url not in urls
    one = sample(np.random.default_rng(7))
    for url in urls:
        status, answer = post_json(url, one)
        assert status == 200 and np.array_equal(np.asarray(answer["outputs"]["y"], np.float32),
                                                alone(apps.tiny_session, one))
        status, answer = post(url, b"not json")
        assert status == 400 and "not JSON" in json.loads(answer)["error"]


def test_an_artifact_without_a_batch_dim_runs_whole_tensors(apps: Apps) -> None:
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    status, answer = post_json(apps.small.url, {"x": x})
    (expected,) = apps.small_session.run(None, {"x": x})
    assert status == 200 and np.array_equal(np.asarray(answer["outputs"]["y"], np.float32), expected)
    with urllib.request.urlopen(apps.small.url, timeout=30) as response:
        info = json.loads(response.read())
    assert "not a dynamic dim" in info["batching"]["off"] and info["inputs"][0]["shape"] == [1, 3, 8, 8]


def _runs_of_more_than_one(metrics_url: str, application: str) -> float:
    """Runs of more than one sample in Ray's batch-size histogram of ``application``."""
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    total = ones = 0.0
    for line in text.splitlines():
        if not line.startswith("ray_onnx_aot_batch_size_") or f'application="{application}"' not in line:
            continue
        if line.startswith("ray_onnx_aot_batch_size_count{"):
            total += float(line.rsplit(" ", 1)[1])
        elif 'le="1.5"' in line:
            ones += float(line.rsplit(" ", 1)[1])
    return total - ones


def test_concurrent_samples_are_batched_and_equal_unbatched_runs(apps: Apps) -> None:
    rng = np.random.default_rng(2)
    samples = [sample(rng) for _ in range(64)]
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda s: post_json(apps.tiny.url, s), samples))
    for one, (status, answer) in zip(samples, answers, strict=True):
        assert status == 200, answer
        assert np.array_equal(np.asarray(answer["outputs"]["y"], np.float32), alone(apps.tiny_session, one))
    deadline = time.monotonic() + 30  # Ray exports metrics every 0.5 s here
    while _runs_of_more_than_one(apps.metrics_url, "tiny") <= 0:
        assert time.monotonic() < deadline, "Ray's batch-size histogram shows no run of more than one sample"
        time.sleep(0.5)


def _replicas(apps: Apps, want: int = 2, tries: int = 60) -> dict[str, dict[str, Any]]:
    """The stats of the tiny app's replicas, by actor name (asked until ``want`` have answered)."""
    seen: dict[str, dict[str, Any]] = {}
    for _ in range(tries):
        stats = apps.tiny.handle.stats.remote().result()
        seen[stats["actor"]] = stats
        if len(seen) >= want:
            break
    return seen


BAD = [
    (b'{"inputs": {"x": [1, 2, 3, 4]}}', "missing input 'z'"),
    (b'{"inputs": {"x": [1, 2, 3], "z": [0, 0, 0]}}', "input 'x'"),
    (b'{"inputs": {"x": [1, 2, 3, 4], "z": [0, 0, 0], "w": [1]}}', "unknown input(s) 'w'"),
    (b'{"inputs": {"x": [[1, 2, 3, 4]], "z": [0, 0, 0]}}', "input 'x'"),
    (b'{"inputs": {"x": "text", "z": [0, 0, 0]}}', "input 'x'"),
    (b"not json", "not JSON"),
]


def test_bad_requests_get_400_and_the_replicas_keep_serving(apps: Apps) -> None:
    before = set(_replicas(apps))
    for body, words in BAD:
        status, answer = post(apps.tiny.url, body)
        assert status == 400 and words in json.loads(answer)["error"], (body, answer)
    buffer = io.BytesIO()
    np.savez(buffer, x=np.ones(4, np.float64), z=np.ones(3, np.float32))
    status, answer = post(apps.tiny.url, buffer.getvalue(), npz=True)
    assert status == 400 and "input 'x': dtype float64, expected float32" in json.loads(answer)["error"]
    status, answer = post_json(apps.small.url, {"x": np.ones((1, 3, 8, 9), np.float32)})
    assert status == 400 and "input 'x'" in answer["error"]
    with pytest.raises(InputError, match="input 'x'"):
        apps.tiny.handle.predict.remote({"x": np.ones(5, np.float32), "z": np.ones(3, np.float32)}).result()
    one = sample(np.random.default_rng(3))
    status, answer = post_json(apps.tiny.url, one)
    assert status == 200 and np.array_equal(np.asarray(answer["outputs"]["y"], np.float32),
                                            alone(apps.tiny_session, one))
    after = _replicas(apps)
    assert set(after) == before, "a replica was replaced after bad requests"
    assert sum(s["requests"]["bad_request"] for s in after.values()) >= len(BAD) + 1


def test_a_tampered_artifact_does_not_start_and_says_why(apps: Apps, tmp_path: Path) -> None:
    folder = tmp_path / "tampered"
    shutil.copytree(apps.tiny_session.path, folder)
    weights = bytearray((folder / "weights.bin").read_bytes())
    weights[0] ^= 0xFF  # same size: only the full hash at the replica's start finds it
    (folder / "weights.bin").write_bytes(bytes(weights))
    settings = ServeSettings(str(folder), port=apps.tiny.settings.port, route="/tampered", name="tampered",
                             threads=1, num_cpus=0.1)
    with pytest.raises(ServingError, match="the application did not start: .*weights.bin"):
        start(settings)
    assert "tampered" not in serve.status().applications
    status, _ = post_json(apps.tiny.url, sample(np.random.default_rng(4)))
    assert status == 200


def test_an_autoscaled_deployment_starts_at_its_minimum_and_answers(apps: Apps) -> None:
    settings = ServeSettings(str(apps.tiny_session.path), port=apps.tiny.settings.port, route="/auto",
                             name="auto", autoscale=(1, 2), threads=1, num_cpus=0.1)
    served = start(settings)
    try:
        assert _running_replicas("auto") == 1
        one = sample(np.random.default_rng(6))
        status, answer = post_json(served.url, one)
        assert status == 200 and np.array_equal(np.asarray(answer["outputs"]["y"], np.float32),
                                                alone(apps.tiny_session, one))
    finally:
        stop(served)
    assert "auto" not in serve.status().applications


class RetryingClient(threading.Thread):
    """Sends samples one after another until told to stop, retrying each until it is answered."""

    def __init__(self, url: str, seed: int, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.url, self.rng, self.stop_event = url, np.random.default_rng(seed), stop
        self.answered: list[tuple[dict[str, np.ndarray], Any]] = []
        self.retries = 0
        self.lost: list[str] = []

    def run(self) -> None:
        while not self.stop_event.is_set():
            one = sample(self.rng)
            for _ in range(200):
                try:
                    status, answer = post_json(self.url, one)
                except (urllib.error.URLError, OSError, ValueError):
                    status, answer = 0, None
                if status == 200:
                    self.answered.append((one, answer))
                    break
                self.retries += 1
                time.sleep(0.05)
            else:
                self.lost.append(f"no answer after 200 tries (last status {status})")


def _running_replicas(name: str) -> int:
    deployment = serve.status().applications[name].deployments["ArtifactModel"]
    return int(deployment.replica_states.get("RUNNING", 0))


def test_a_killed_replica_is_replaced_and_a_retrying_client_loses_nothing(apps: Apps) -> None:
    before = _replicas(apps)
    assert len(before) == 2
    stopping = threading.Event()
    clients = [RetryingClient(apps.tiny.url, 10 + k, stopping) for k in range(4)]
    for client in clients:
        client.start()
    time.sleep(1.0)  # under load
    victim = sorted(before)[0]
    ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
    deadline = time.monotonic() + 90
    replaced: set[str] = set()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        if _running_replicas("tiny") == 2:
            now = _replicas(apps, tries=30)
            replaced = set(now) - set(before)
            if replaced and victim not in now:
                break
    time.sleep(1.0)  # the new replica serving too
    stopping.set()
    for client in clients:
        client.join(120)
    assert replaced, f"Ray did not replace the killed replica {victim} within 90 s"
    assert not [lost for c in clients for lost in c.lost]
    answered = [pair for c in clients for pair in c.answered]
    print(f"{len(answered)} answered, {sum(c.retries for c in clients)} retries")
    assert len(answered) > 20
    for one, answer in answered:
        assert np.array_equal(np.asarray(answer["outputs"]["y"], np.float32), alone(apps.tiny_session, one))
    deadline = time.monotonic() + 30  # the new replica's own port, once allocated
    while len(apps.tiny.replica_urls()) < 2:
        assert time.monotonic() < deadline, f"{apps.tiny.replica_urls()}: the new replica has no port"
        time.sleep(0.5)
    for url in apps.tiny.replica_urls():
        assert post_json(url, one)[0] == 200
