"""Concurrent jobs on the one pool (templates/c/workers.c.j2, issue 31): two sessions running at once
each get workers of their own where the process's CPUs allow, never more threads inside jobs than
those CPUs, and results bit for bit those of a serial run. Each case runs in a fresh process, since
the pool reads $ONNX_AOT_POOL_CPUS once per process (as a deployment sets it for a container's
CPU quota)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from compiler.driver import compile_model
from tests.test_pool import _model

# Two sessions of `art` at `threads`, each driven by its own Python thread for `runs` runs
# (started together), every output compared with a threads=1 run; then the pool's counts.
_DRIVER = r"""
import json, sys, threading
import numpy as np
from runtime import Session
from runtime.providers.c import pool_stats
art, threads, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
feeds = dict(np.load(sys.argv[4]))
expected = Session(art, threads=1).run(None, feeds)
sessions = [Session(art, threads=threads) for _ in range(2)]
for s in sessions:
    s.run(None, feeds)
before = pool_stats()
start, mismatches = threading.Barrier(2), []
def drive(session):
    start.wait()
    for _ in range(runs):
        got = session.run(None, feeds)
        if not all(np.array_equal(a, b) for a, b in zip(got, expected)):
            mismatches.append(1)
workers = [threading.Thread(target=drive, args=(s,)) for s in sessions]
for w in workers:
    w.start()
for w in workers:
    w.join()
after = pool_stats()
used = [b - a for a, b in zip(before.chunks, after.chunks)] + list(after.chunks[len(before.chunks):])
print(json.dumps({"mismatches": len(mismatches), "used": used, "workers": after.workers,
                  "alone": after.busy - before.busy, "peak": after.peak}))
"""


def _concurrent(tmp_path: Path, cpus: int, threads: int, runs: int) -> dict[str, object]:
    model, feeds = _model("encoder")
    art = compile_model(model, tmp_path / "enc", golden_cases=0)
    np.savez(tmp_path / "feeds.npz", **feeds)
    env = dict(os.environ, ONNX_AOT_POOL_CPUS=str(cpus))
    done = subprocess.run([sys.executable, "-c", _DRIVER, str(art), str(threads), str(runs),
                           str(tmp_path / "feeds.npz")], capture_output=True, text=True, env=env,
                          cwd=Path(__file__).resolve().parent.parent, timeout=600)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_two_concurrent_runs_each_get_workers_where_the_cpus_allow(tmp_path: Path) -> None:
    """Six CPUs, two sessions at threads=3 at once: the second job reserves workers the first one
    does not hold (workers 3 and 4 claim chunks, a team of 3 alone would only ever use 1 and 2),
    and every output is the serial run's."""
    for _ in range(3):  # on a busy 2-core machine a round can pass with workers 3 and 4 never run
        got = _concurrent(tmp_path, cpus=6, threads=3, runs=40)
        used = got["used"]
        assert isinstance(used, list)
        assert got["mismatches"] == 0
        if sum(used[3:]) > 0:
            break
    assert sum(used[3:]) > 0, got  # a second job served at once, beside the first one's workers


@pytest.mark.parametrize("threads", [2, 3])
def test_concurrent_runs_never_keep_more_threads_busy_than_the_cpus(tmp_path: Path, threads: int) -> None:
    """Two sessions at once with the pool allowed as many CPUs as one run's team: a worker joins
    a job only while the threads inside jobs are fewer than those CPUs, so the most ever inside
    at once is the CPUs plus the other session's caller (which runs its job at once, alone, while
    a job holding workers ends), no worker past team - 1 is even started, jobs ran on their caller
    alone, and outputs are the serial run's."""
    got = _concurrent(tmp_path, cpus=threads, threads=threads, runs=30)
    used = got["used"]
    assert isinstance(used, list)
    assert got["mismatches"] == 0
    assert got["workers"] == threads - 1 and sum(used[threads:]) == 0, got
    assert isinstance(got["alone"], int) and got["alone"] > 0, got
    assert isinstance(got["peak"], int) and threads <= got["peak"] <= threads + 1, got
