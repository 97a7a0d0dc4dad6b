"""Adaptive thread counts (runtime/threads.py, issue 22): a run's thread count follows measured
run times, and a run's results do not depend on it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from compiler.driver import compile_model
from runtime.session import Session
from runtime.threads import EXPLORE_EVERY
from runtime.threads import ThreadChoice
from tests.support.commands import REPO
from tests.support.zoo import dummy_input
from tests.support.zoo import zoo_model


def _drive(choice: ThreadChoice, seconds: dict[int, float], runs: int) -> list[int]:
    picked = []
    for _ in range(runs):
        n = choice.choose()
        choice.record(n, seconds[n])
        picked.append(n)
    return picked


def test_the_faster_count_wins_and_a_change_of_load_is_followed() -> None:
    choice = ThreadChoice(2)
    assert choice.candidates == (2, 1)
    quiet = _drive(choice, {2: 1.0, 1: 1.9}, 5 * EXPLORE_EVERY)
    assert choice.current == 2 and quiet[-EXPLORE_EVERY:].count(1) == 1  # one re-measurement per 16 runs
    busy = _drive(choice, {2: 6.0, 1: 1.9}, 3 * EXPLORE_EVERY)  # another process takes a core
    assert choice.current == 1 and busy[-EXPLORE_EVERY:].count(1) >= EXPLORE_EVERY - 1
    _drive(choice, {2: 1.0, 1: 1.9}, 6 * EXPLORE_EVERY)  # and leaves it again
    assert choice.current == 2


def test_after_a_burst_of_load_two_threads_come_back_within_one_exploring_period() -> None:
    """A burst that made two threads look slow (every one of their samples) is forgotten as soon as
    one re-measurement beats one thread: the next run measures two threads again and takes them."""
    choice = ThreadChoice(2)
    _drive(choice, {2: 1.0, 1: 1.9}, 3 * EXPLORE_EVERY)
    _drive(choice, {2: 6.0, 1: 1.9}, 6 * EXPLORE_EVERY)  # long enough to fill two threads' window
    assert choice.current == 1 and all(t == 6.0 for t in choice._times[2])
    back = _drive(choice, {2: 1.0, 1: 1.9}, EXPLORE_EVERY + 2)
    assert choice.current == 2
    assert back[-2:] == [2, 2]  # not one exploring period per sample of the median (5 x 16 runs)
    stays = _drive(choice, {2: 6.0, 1: 1.9}, 4 * EXPLORE_EVERY)  # a slower re-measurement changes nothing
    assert choice.current == 1 and stays[-EXPLORE_EVERY:].count(2) == 1


def test_one_core_has_nothing_to_choose() -> None:
    choice = ThreadChoice(1)
    assert _drive(choice, {1: 1.0}, 20) == [1] * 20


@pytest.mark.parametrize("name", ["squeezenet", "resnet50"])
def test_results_do_not_depend_on_the_thread_count(tmp_path: Path, name: str) -> None:
    model = zoo_model(name)
    out = compile_model(model, tmp_path / name, golden_cases=0)
    feeds = dummy_input(model)
    one, two = Session(out, threads=1).run(None, feeds), Session(out, threads=2).run(None, feeds)
    for a, b in zip(one, two, strict=True):
        assert np.array_equal(a, b)
    session = Session(out)  # adaptive: both counts get measured within the first runs
    for _ in range(6):
        assert np.array_equal(session.run(None, feeds)[0], one[0])
    choice = session._static.choice  # type: ignore[union-attr]  # the static plan's bound plan's
    assert all(t is not None for t in choice.estimates().values())


def test_bench_busy_script_smoke() -> None:
    command = [sys.executable, "-m", "scripts.bench_busy", "--smoke"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "| squeezenet | none | default |" in result.stdout and "median / ORT" in result.stdout
