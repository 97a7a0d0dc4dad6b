"""How HTTP requests reach the replicas: through Ray Serve's proxy only, or also straight to them.

``proxy``: Ray Serve's proxy actor answers ``--port`` and hands each request to a replica over a
Ray call — two hops and a third process per request, which on a small machine takes its CPU from
the replicas (about 5 ms of a request's p50 on 2 cores, docs/serving.md).

``direct`` (the default): Ray Serve's direct ingress (``RAY_SERVE_ENABLE_DIRECT_INGRESS=1``, set
in the environment of the Ray instance ``start`` begins): the proxy still answers ``--port`` as
before, and each replica also runs its own HTTP server on a port of its node (from
``RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT``, 30000), serving the same route without the proxy hop.
``replica_urls`` lists those (a load balancer in front of them, or clients spreading themselves,
gets the throughput); a replaced replica may come back on another port. A replica going away
keeps its server open ``RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S`` (Ray's default 30 s, 2 s
here unless the environment says otherwise) for load balancers to drop it.

The mode belongs to the Ray instance, not to one application: it applies where ``start`` starts
Ray; a cluster joined with ``--address`` has the mode its ``ray start`` environment gave it.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["INGRESS_MODES", "ingress_environment", "ray_environment", "replica_urls"]

INGRESS_MODES = ("direct", "proxy")
DIRECT = {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1", "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2"}


def ingress_environment(mode: str) -> dict[str, str]:
    """The Ray Serve variables of ``mode`` (``direct`` or ``proxy``); the caller's own values of
    them win."""
    wanted = DIRECT if mode == "direct" else {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "0"}
    return {key: os.environ.get(key, value) for key, value in wanted.items()}


@contextmanager
def ray_environment(env: dict[str, str]) -> Iterator[None]:
    """``env`` in this process's environment while Ray starts (its processes, and the workers
    they start later, inherit it), the previous values back afterwards."""
    previous = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def replica_urls(app_name: str, route: str) -> list[str]:
    """``http://127.0.0.1:PORT/ROUTE`` of each running replica of ``app_name`` that answers HTTP
    itself (direct ingress; the servers listen where the proxy does, on 127.0.0.1); none where the
    proxy is the only way in. Asks Serve's controller (``get_target_groups``: what an external load
    balancer reads), whose targets are the replicas in direct mode and the proxy otherwise; where
    it cannot be asked, a ``RuntimeWarning`` names the application and the reason."""
    import ray
    from ray.serve._private.common import RequestProtocol

    try:
        controller: Any = ray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")
        groups = ray.get(controller.get_target_groups.remote(app_name), timeout=30)
    except Exception as exc:  # no controller, or a Ray without direct ingress: no direct way in
        warnings.warn(f"{app_name}: could not list the replicas' own URLs (direct ingress), only the "
                      f"proxy serves: {type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)
        return []
    return sorted(f"http://127.0.0.1:{target.port}{route}" for group in groups
                  if group.protocol == RequestProtocol.HTTP for target in group.targets
                  if str(target.name).startswith("SERVE_REPLICA"))
