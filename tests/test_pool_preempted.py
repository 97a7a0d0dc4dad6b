"""Workers that keep losing their core (templates/c/workers.c.j2, issue 31): the caller, its worker
and a spinning process on one CPU, so the worker is preempted again and again, with chunks claimed
and between jobs (where it then sleeps instead of spinning). The results stay bit for bit those of
one thread, every run ends, and the pool reports its count of the callers' waits for a preempted
claimer (``pool_stats().stalls``). The case runs in a fresh process pinned to one CPU, told it has
two ($ONNX_AOT_POOL_CPUS), as a container with a CPU quota below its affinity mask is."""

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

# Runs `art` `runs` times at threads=2 on one CPU beside a spinner, every output compared with a
# threads=1 run; prints the mismatches and the pool's counts.
_DRIVER = r"""
import json, os, subprocess, sys
import numpy as np
from runtime import Session
from runtime.providers.c import pool_stats
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # on the same CPU
art, runs = sys.argv[1], int(sys.argv[2])
feeds = dict(np.load(sys.argv[3]))
expected = Session(art, threads=1).run(None, feeds)
session = Session(art, threads=2)
mismatches = 0
for _ in range(runs):
    got = session.run(None, feeds)
    mismatches += not all(np.array_equal(a, b) for a, b in zip(got, expected))
spinner.kill()
stats = pool_stats()
print(json.dumps({"mismatches": mismatches, "stalls": stats.stalls, "worker_chunks": stats.chunks[1:]}))
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity (Linux)")
def test_workers_preempted_on_a_shared_cpu_leave_results_exact(tmp_path: Path) -> None:
    model, feeds = _model("convs")
    art = compile_model(model, tmp_path / "convs", golden_cases=0)
    np.savez(tmp_path / "feeds.npz", **feeds)
    env = dict(os.environ, ONNX_AOT_POOL_CPUS="2")
    done = subprocess.run([sys.executable, "-c", _DRIVER, str(art), "200", str(tmp_path / "feeds.npz")],
                          capture_output=True, text=True, env=env, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["mismatches"] == 0, result
    assert sum(result["worker_chunks"]) > 0, result  # the worker did run chunks of the jobs
    assert isinstance(result["stalls"], int) and result["stalls"] >= 0, result


# The caller on CPU a, a nice-19 spinner on CPU b, and before each run the worker put on CPU a (its
# mask narrowed to {a} and widened again: the kernel leaves it there), as the kernel itself wakes
# it where no CPU is idle. Prints the mismatches against threads=1 and the pool's collision counts.
_COLLIDE = r"""
import json, os, subprocess, sys
import numpy as np
from runtime import Session
from runtime.providers.c import pool_stats
a, b = sorted(os.sched_getaffinity(0))[:2]
art, runs = sys.argv[1], int(sys.argv[2])
feeds = dict(np.load(sys.argv[3]))
expected = Session(art, threads=1).run(None, feeds)
before = set(os.listdir("/proc/self/task"))
session = Session(art, threads=2)
session.run(None, feeds)  # starts the pool's worker
workers = [int(t) for t in set(os.listdir("/proc/self/task")) - before]
os.sched_setaffinity(0, {a})
spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                           preexec_fn=lambda: (os.sched_setaffinity(0, {b}), os.nice(19)))
def asleep(w):  # the worker is back on its futex, not finishing a late look at the last job
    with open(f"/proc/self/task/{w}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "S"
mismatches = 0
for _ in range(runs):
    for w in workers:
        while not asleep(w):
            pass
        os.sched_setaffinity(w, {a})
        os.sched_setaffinity(w, {a, b})
    got = session.run(None, feeds)
    mismatches += not all(np.array_equal(x, y) for x, y in zip(got, expected))
spinner.kill()
stats = pool_stats()
print(json.dumps({"mismatches": mismatches, "collided": stats.collided, "moved": stats.moved,
                  "workers": len(workers)}))
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs sched_setaffinity (Linux) and two CPUs")
def test_a_worker_on_its_callers_cpu_moves_to_another(tmp_path: Path) -> None:
    """A worker that starts a job on its caller's CPU leaves it for another CPU of its mask
    (``onnx_aot_pool_leave``): every such job counted in ``collided`` is one in ``moved``, and the
    results stay those of one thread."""
    model, feeds = _model("convs")
    art = compile_model(model, tmp_path / "convs", golden_cases=0)
    np.savez(tmp_path / "feeds.npz", **feeds)
    done = subprocess.run([sys.executable, "-c", _COLLIDE, str(art), "30", str(tmp_path / "feeds.npz")],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["mismatches"] == 0, result
    assert result["workers"] >= 1, result
    if result["collided"] == 0:
        pytest.skip(f"this kernel never started the worker on its caller's CPU: {result}")
    assert result["moved"] == result["collided"], result
