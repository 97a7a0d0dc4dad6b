"""Build and run the Ray Serve application of one artifact folder (``onnx-aot serve``).

``ServeSettings`` holds what the command line gives; ``check_settings`` refuses what cannot work
before Ray starts (the folder, ``--max-batch`` against its batch range, replica and thread
counts); ``build_app`` turns the settings into a bound ``ArtifactModel`` with Ray's options;
``start`` starts Ray locally (or joins ``address``), runs the application and waits until the
route answers; ``stop`` deletes the application and shuts down the Ray instance ``start`` began.
``ingress`` (``direct`` by default, or ``proxy``) is the Ray instance's way in for HTTP
(runtime/serving/ingress.py): with ``direct`` each replica also answers on its own port
(``Served.replica_urls``), without the proxy's hop.

Defaults that do not oversubscribe the machine: one replica; each replica's kernels get
``cpus // replicas`` threads (``cpus // max_replicas`` when autoscaling; at least one) and
reserve as many of Ray's CPUs, so replicas x threads stays within the cores.
"""

from __future__ import annotations

import os
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.errors import OnnxAotError
from runtime.serving import ServingError
from runtime.serving import require_ray
from runtime.serving.batching import batching_of
from runtime.serving.ingress import INGRESS_MODES
from runtime.serving.ingress import ingress_environment
from runtime.serving.ingress import ray_environment
from runtime.serving.ingress import replica_urls
from runtime.threads import available_cpus

__all__ = ["ServeSettings", "Served", "check_settings", "build_app", "start", "stop", "default_threads"]

DEFAULT_PORT = 8000
READY_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class ServeSettings:
    """What ``onnx-aot serve`` takes; ``num_cpus`` (Ray CPUs reserved per replica, default the
    thread count) and ``session_factory`` (another session class: the benchmark's onnxruntime one)
    are for tests and benchmarks."""

    folder: str
    port: int = DEFAULT_PORT
    route: str = "/"
    address: str | None = None
    replicas: int = 1
    autoscale: tuple[int, int] | None = None
    max_batch: int | None = None
    batch_wait_ms: float = 5.0
    threads: int | None = None
    verify: bool = False
    name: str = "onnx-aot"
    ingress: str = "direct"
    num_cpus: float | None = None
    session_factory: Any = None


def default_threads(settings: ServeSettings, cpus: int | None = None) -> int:
    """Kernel threads per replica: the given count, else the CPUs shared by the most replicas."""
    if settings.threads is not None:
        return settings.threads
    most = settings.autoscale[1] if settings.autoscale is not None else settings.replicas
    return max(1, (available_cpus() if cpus is None else cpus) // most)


def check_settings(settings: ServeSettings) -> int:
    """Refuse settings that cannot work (``ServingError``), before Ray starts; the largest run."""
    from runtime.plan_info import load_plan

    if settings.replicas < 1:
        raise ServingError(f"--replicas {settings.replicas}: give at least 1")
    if settings.autoscale is not None:
        lo, hi = settings.autoscale
        if not 0 <= lo <= hi or hi < 1:
            raise ServingError(f"--autoscale {lo}..{hi}: give MIN..MAX with 0 <= MIN <= MAX and MAX >= 1")
    if settings.batch_wait_ms < 0:
        raise ServingError(f"--batch-wait-ms {settings.batch_wait_ms}: give 0 or more")
    if settings.ingress not in INGRESS_MODES:
        raise ServingError(f"--ingress {settings.ingress}: give one of {', '.join(INGRESS_MODES)}")
    if not settings.route.startswith("/"):
        raise ServingError(f"--route {settings.route}: a route starts with '/' (e.g. /model)")
    plan = load_plan(settings.folder)  # ArtifactError when the folder is no artifact
    _, max_batch, _ = batching_of(plan.inputs, plan.outputs, settings.max_batch, settings.folder)
    return max_batch


def build_app(settings: ServeSettings) -> Any:
    """The bound deployment (a Ray Serve application) for ``settings``."""
    require_ray()
    from runtime.serving.deployment import ArtifactModel

    max_batch = check_settings(settings)
    threads = default_threads(settings)
    options: dict[str, Any] = {
        "ray_actor_options": {"num_cpus": threads if settings.num_cpus is None else settings.num_cpus},
        # full batches in flight: the one running and the next ones gathering (deployment.py)
        "max_ongoing_requests": max(8, 4 * max_batch),
        "health_check_period_s": 2.0,
        "health_check_timeout_s": 30.0,
    }
    if settings.autoscale is not None:
        lo, hi = settings.autoscale
        options["autoscaling_config"] = {"min_replicas": lo, "max_replicas": hi,
                                         "target_ongoing_requests": max(2, max_batch)}
    else:
        options["num_replicas"] = settings.replicas
    deployment: Any = ArtifactModel  # a ray.serve Deployment (the decorator's type is not the class's)
    return deployment.options(**options).bind(
        str(Path(settings.folder).absolute()), threads, settings.verify, settings.max_batch,
        settings.batch_wait_ms / 1000, settings.session_factory)


@dataclass
class Served:
    """A running application: its URL, its handle, and whether ``start`` started Ray."""

    url: str
    handle: Any
    settings: ServeSettings
    started_ray: bool

    def replica_urls(self) -> list[str]:
        """The replicas' own URLs (direct ingress, runtime/serving/ingress.py), asked now: a
        replaced replica may answer on another port; none with ``ingress="proxy"``."""
        return replica_urls(self.settings.name, self.settings.route)


def _runtime_root() -> str:
    """The folder that holds this ``runtime`` package: the replicas import the same code."""
    import runtime

    return str(Path(runtime.__file__).resolve().parent.parent)


def start(settings: ServeSettings, *, ray_init: dict[str, Any] | None = None) -> Served:
    """Start Ray (locally, or join ``settings.address``), run the application and wait until it
    answers on ``http://127.0.0.1:PORT/ROUTE``. ``ray_init``: more ``ray.init`` arguments (tests)."""
    app = build_app(settings)
    import ray
    from ray import serve

    started = not ray.is_initialized()
    if started:
        _init_ray(settings, ray_init or {})
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": settings.port})
        try:
            handle = serve.run(app, name=settings.name, route_prefix=settings.route)
        except OnnxAotError:
            raise
        except Exception as exc:  # a replica that did not start: Ray's report, ending in our error
            cause = _cause(f"{exc}\n{_deployment_messages(serve, settings.name)}")
            serve.delete(settings.name)
            raise ServingError(f"{settings.folder}: the application did not start: {cause}") from None
        url = f"http://127.0.0.1:{settings.port}{settings.route}"
        _wait_until_answering(url)
    except BaseException:
        if started:
            ray.shutdown()
        raise
    return Served(url, handle, settings, started)


def _init_ray(settings: ServeSettings, ray_init: dict[str, Any]) -> None:
    """``ray.init``: a new local instance (never a cluster that happens to run on this machine)
    whose processes get the ingress mode's variables, or the cluster at ``settings.address``."""
    import ray

    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, **ray_init}
    if settings.address is not None:
        ray.init(address=settings.address, **kwargs)
        return
    env = {"PYTHONPATH": os.pathsep.join(p for p in (_runtime_root(), os.environ.get("PYTHONPATH")) if p),
           **ingress_environment(settings.ingress)}
    kwargs.setdefault("runtime_env", {"env_vars": env})
    with ray_environment(env):  # the controller and the proxy are Ray's processes too
        ray.init(address="local", **kwargs)


def _deployment_messages(serve: Any, name: str) -> str:
    """What Ray says of the application's deployments (a replica's constructor error, traceback)."""
    try:
        app = serve.status().applications.get(name)
    except Exception:  # (status is only a better message; the failure is reported either way)
        return ""
    return "" if app is None else "\n".join(d.message for d in app.deployments.values() if d.message)


def _cause(report: str) -> str:
    """The last ``...Error: message`` line of Ray's report on a replica that failed to start."""
    lines = [line.strip() for line in report.splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[\w.]+(Error|Exception): ", line)]
    return (errors or lines or ["unknown"])[-1]


def _wait_until_answering(url: str, timeout_s: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise ServingError(f"{url} did not answer within {timeout_s:.0f} s of the application starting")
        time.sleep(0.2)


def stop(served: Served) -> None:
    """Delete the application; shut down Serve and Ray where ``start`` started them."""
    import ray
    from ray import serve

    try:
        serve.delete(served.settings.name)
        if served.started_ray:
            serve.shutdown()
    finally:
        if served.started_ray:
            ray.shutdown()
