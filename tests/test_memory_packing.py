"""Tests for the static memory planner: hand-built instances, random interval sets, the search, the verifier.

Comparisons against the classic planners are in test_planner_vs_classics.py.
"""

from __future__ import annotations

import itertools
import json
import random
import time
from pathlib import Path

import pytest

from compiler.memory import greedy
from compiler.memory import packing
from compiler.memory import placement_c
from compiler.memory.exact import BranchAndBound
from compiler.memory.exact import Budget
from compiler.memory.packing import DEFAULT_BUDGET_MS
from compiler.memory.packing import Buffer
from compiler.memory.packing import MemoryPlan
from compiler.memory.packing import lower_bound
from compiler.memory.packing import plan_offsets
from compiler.memory.packing import verify_plan
from runtime.errors import InternalError

STRATEGIES = tuple(greedy.STRATEGIES)

# (first_step, last_step, nbytes) from Pisarchyk & Lee 2020, "Efficient Memory Management for
# Deep Neural Net Inference": naive 234, lower bound 124, Greedy by Size 124.
PAPER = [(0, 1, 32), (1, 4, 28), (2, 5, 36), (3, 5, 16), (4, 5, 8), (5, 7, 64), (6, 8, 10), (7, 8, 40)]


def buffers(triples: list[tuple[int, int, int]]) -> list[Buffer]:
    return [Buffer(f"t{k}", nbytes, first, last) for k, (first, last, nbytes) in enumerate(triples)]


def random_buffers(
    seed: int, n: int | None = None, steps: int | None = None, mean_life: int | None = None
) -> list[Buffer]:
    """Random lifetimes (exponential lengths) and sizes from empty to 1 MiB, all from ``seed``."""
    rng = random.Random(seed)
    n = rng.randint(1, 80) if n is None else n
    steps = rng.randint(1, 2 * n) if steps is None else steps
    mean_life = rng.choice([1, 3, 10, steps]) if mean_life is None else mean_life
    out = []
    for k in range(n):
        first = rng.randrange(steps)
        last = min(steps - 1, first + int(rng.expovariate(1 / mean_life)))
        nbytes = rng.choice([0, rng.randint(1, 100), rng.randint(1, 5000), rng.randint(1, 1 << 20)])
        out.append(Buffer(k, nbytes, first, last))
    return out


def brute_lower_bound(bufs: list[Buffer], alignment: int) -> int:
    steps = {s for b in bufs for s in range(b.first_step, b.last_step + 1)}
    aligned = [-(-b.nbytes // alignment) * alignment for b in bufs]
    return max(
        (
            sum(a for a, b in zip(aligned, bufs, strict=True) if b.first_step <= s <= b.last_step)
            for s in steps
        ),
        default=0,
    )


def plan_and_verify(bufs: list[Buffer], alignment: int) -> MemoryPlan:
    plan = plan_offsets(bufs, alignment)
    verify_plan(bufs, plan, alignment)
    assert list(plan.offsets) == [b.id for b in bufs]
    assert plan.lower_bound_nbytes <= plan.arena_nbytes <= plan.naive_nbytes
    assert plan.arena_nbytes % alignment == 0
    return plan


# ---- hand-built instances ----


def test_paper_instance_reaches_lower_bound() -> None:
    bufs = buffers(PAPER)
    plan = plan_and_verify(bufs, alignment=1)
    assert plan.naive_nbytes == 234
    assert plan.lower_bound_nbytes == 124 == lower_bound(bufs, 1)
    assert plan.arena_nbytes == 124
    assert plan.strategy == "size_best_fit"


@pytest.mark.parametrize("name", STRATEGIES)
def test_paper_instance_every_strategy_is_valid(name: str) -> None:
    bufs = buffers(PAPER)
    plan = packing._plan_with(bufs, 1, (name,))
    verify_plan(bufs, plan, 1)
    assert plan.strategy == name
    assert plan.arena_nbytes >= 124


def test_empty_input() -> None:
    plan = plan_and_verify([], alignment=64)
    assert plan.offsets == {}
    assert (plan.arena_nbytes, plan.lower_bound_nbytes, plan.naive_nbytes) == (0, 0, 0)
    assert plan.strategy == STRATEGIES[0]
    assert lower_bound([], 64) == 0


def test_one_buffer() -> None:
    plan = plan_and_verify([Buffer("x", 100, 3, 7)], alignment=64)
    assert plan.offsets == {"x": 0}
    assert (plan.arena_nbytes, plan.lower_bound_nbytes, plan.naive_nbytes) == (128, 128, 128)


def test_zero_size_buffers_get_an_offset_and_take_no_space() -> None:
    bufs = [Buffer("a", 0, 0, 5), Buffer("b", 64, 0, 5), Buffer("c", 0, 2, 3), Buffer("d", 64, 1, 2)]
    plan = plan_and_verify(bufs, alignment=64)
    assert set(plan.offsets) == {"a", "b", "c", "d"}
    assert plan.arena_nbytes == plan.lower_bound_nbytes == plan.naive_nbytes == 128
    only_empty = [Buffer("a", 0, 0, 1), Buffer("b", 0, 0, 1)]
    plan = plan_and_verify(only_empty, alignment=64)
    assert plan.offsets == {"a": 0, "b": 0}
    assert plan.arena_nbytes == 0


def test_alignment_rounds_sizes_up() -> None:
    together = [Buffer("a", 1, 0, 1), Buffer("b", 65, 1, 2)]
    plan = plan_and_verify(together, alignment=64)
    assert (plan.arena_nbytes, plan.lower_bound_nbytes, plan.naive_nbytes) == (192, 192, 192)
    assert all(offset % 64 == 0 for offset in plan.offsets.values())
    apart = [Buffer("a", 1, 0, 0), Buffer("b", 65, 1, 1)]
    plan = plan_and_verify(apart, alignment=64)
    assert plan.offsets == {"a": 0, "b": 0}
    assert (plan.arena_nbytes, plan.lower_bound_nbytes, plan.naive_nbytes) == (128, 128, 192)


def test_disjoint_lifetimes_share_one_slot() -> None:
    bufs = [Buffer(k, 10 * (k + 1), k, k) for k in range(6)]
    plan = plan_and_verify(bufs, alignment=1)
    assert set(plan.offsets.values()) == {0}
    assert plan.arena_nbytes == 60


def test_all_live_together_needs_the_naive_size() -> None:
    bufs = [Buffer(k, 7 * (k + 1), 0, 3) for k in range(5)]
    plan = plan_and_verify(bufs, alignment=1)
    assert plan.arena_nbytes == plan.naive_nbytes == 105


def test_chain_reuses_memory() -> None:
    # Each op reads the previous tensor and writes the next: two tensors alive at a time.
    sizes = [100, 300, 200, 400, 50, 250]
    bufs = [Buffer(f"v{k}", size, k, k + 1) for k, size in enumerate(sizes)]
    plan = plan_and_verify(bufs, alignment=1)
    assert plan.arena_nbytes == plan.lower_bound_nbytes == 600


def test_accepts_any_iterable_and_mixed_ids() -> None:
    bufs = [Buffer("a", 8, 0, 1), Buffer(7, 8, 1, 2), Buffer(("x", 1), 8, 2, 3)]
    plan = plan_offsets(iter(bufs), 8)
    verify_plan(bufs, plan, 8)
    assert list(plan.offsets) == ["a", 7, ("x", 1)]


def test_duplicate_ids_raise() -> None:
    bufs = [Buffer("a", 8, 0, 1), Buffer("b", 8, 0, 1), Buffer("a", 16, 2, 3)]
    with pytest.raises(ValueError, match="duplicate buffer id 'a'"):
        plan_offsets(bufs)
    with pytest.raises(ValueError, match="duplicate"):
        lower_bound(bufs, 64)


def test_bad_buffers_and_alignment_raise() -> None:
    with pytest.raises(ValueError, match="'neg'.*negative"):
        Buffer("neg", -1, 0, 0)
    with pytest.raises(ValueError, match="'back'.*before first_step"):
        Buffer("back", 4, 3, 2)
    with pytest.raises(TypeError, match="'half'"):
        Buffer("half", 4.5, 0, 1)  # type: ignore[arg-type]
    for alignment in (0, -64, 1.5):
        with pytest.raises(ValueError, match="alignment"):
            plan_offsets([Buffer("a", 1, 0, 0)], alignment)  # type: ignore[arg-type]


# ---- random interval sets ----


@pytest.mark.parametrize("seed", range(300))
def test_random_plans_are_valid_and_deterministic(seed: int) -> None:
    bufs = random_buffers(seed)
    alignment = random.Random(seed).choice([1, 8, 64, 256])
    plan = plan_and_verify(bufs, alignment)
    assert plan.lower_bound_nbytes == lower_bound(bufs, alignment) == brute_lower_bound(bufs, alignment)
    again = plan_offsets(random_buffers(seed), alignment)
    assert again == plan
    assert list(again.offsets.items()) == list(plan.offsets.items())


@pytest.mark.parametrize("seed", range(100))
def test_random_every_strategy_is_valid_and_the_best_wins(seed: int) -> None:
    bufs = random_buffers(seed)
    arenas = {}
    for name in STRATEGIES:
        plan = packing._plan_with(bufs, 64, (name,))
        verify_plan(bufs, plan, 64)
        arenas[name] = plan.arena_nbytes
    greedy_plan = plan_offsets(bufs, 64, budget_ms=0)  # the default heuristic alone
    assert greedy_plan.arena_nbytes == min(arenas.values())
    first_best = next(name for name in STRATEGIES if arenas[name] == greedy_plan.arena_nbytes)
    assert greedy_plan.strategy == first_best
    searched = plan_and_verify(bufs, 64)
    assert searched.arena_nbytes <= greedy_plan.arena_nbytes
    if searched.arena_nbytes < greedy_plan.arena_nbytes:
        assert searched.strategy not in STRATEGIES  # found by the search, and says so


def test_thousand_buffers_plan_quickly() -> None:
    # about 50 buffers live per step; the default heuristic is measured at ~3 ms here by
    # scripts/bench_planner.py, this only catches a blow-up on a busy machine
    bufs = random_buffers(12345, n=1000, steps=1000, mean_life=50)
    start = time.perf_counter()
    plan = plan_offsets(bufs, budget_ms=0)
    elapsed = time.perf_counter() - start
    verify_plan(bufs, plan, 64)
    assert elapsed < 0.2, f"the default heuristic took {elapsed:.3f} s for 1,000 buffers"
    start = time.perf_counter()
    searched = plan_offsets(bufs)
    elapsed = time.perf_counter() - start
    verify_plan(bufs, searched, 64)
    assert searched.arena_nbytes <= plan.arena_nbytes
    assert elapsed < 6 * DEFAULT_BUDGET_MS / 1000, f"the search took {elapsed:.3f} s"


# ---- the C placement loop against its Python specification ----


def _c_loop_or_skip() -> None:
    if not placement_c.c_loop_available():
        pytest.skip("the planner's C loop could not be built here (no C compiler)")


@pytest.mark.parametrize("mode", ["scan", "lists"])
@pytest.mark.parametrize("seed", range(40))
def test_c_placement_equals_the_python_loop(seed: int, mode: str, monkeypatch) -> None:
    _c_loop_or_skip()
    # force one of the two C algorithms whatever the instance's size
    monkeypatch.setattr(greedy, "SCAN_LIMIT", 1 << 30 if mode == "scan" else 0)
    monkeypatch.setattr(greedy, "SCAN_RATIO", 0)
    rng = random.Random(seed)
    n = rng.choice([1, 2, 7, 40, 300])
    bufs = random_buffers(seed, n=n, mean_life=rng.choice([1, 3, 10, 50]))
    p = packing._problem(bufs, rng.choice([1, 8, 64, 256]))
    for name, (order_fn, fit) in {**greedy.STRATEGIES, **greedy.MORE_STRATEGIES}.items():
        order = order_fn(p)
        expected = greedy.place_fresh_python(p, order, fit)
        assert greedy.place_fresh(p, order, fit) == expected, name
        # the limit cuts a placement off at the same point in both
        for limit in (expected[1], max(0, expected[1] - 64), 0):
            assert greedy.place_fresh(p, order, fit, limit) == greedy.place_fresh_python(p, order, fit, limit)


def test_planner_without_the_c_loop_gives_the_same_plan(monkeypatch) -> None:
    _c_loop_or_skip()
    bufs = random_buffers(7, n=400, steps=400, mean_life=20)
    with_c = plan_offsets(bufs, 64)
    monkeypatch.setenv("ONNX_AOT_PLANNER", "python")
    placement_c._library.cache_clear()
    try:
        assert not placement_c.c_loop_available()
        without = plan_offsets(bufs, 64)
    finally:
        monkeypatch.delenv("ONNX_AOT_PLANNER")
        placement_c._library.cache_clear()
    assert without == with_c
    assert placement_c.c_loop_available()


# ---- the search ----


def test_budget_must_be_a_finite_non_negative_number() -> None:
    bufs = [Buffer("a", 8, 0, 1)]
    for bad in (-1, -0.5, float("nan"), float("inf"), True, "100"):
        with pytest.raises(ValueError, match="budget_ms"):
            plan_offsets(bufs, 8, budget_ms=bad)  # type: ignore[arg-type]
    assert plan_offsets(bufs, 8, budget_ms=0) == plan_offsets(bufs, 8, budget_ms=12.5)


def test_search_reaches_the_bound_where_every_greedy_order_misses() -> None:
    bufs = random_buffers(54)  # 18 buffers; every greedy strategy is above the bound
    greedy_plan = plan_offsets(bufs, 64, budget_ms=0)
    assert greedy_plan.arena_nbytes > greedy_plan.lower_bound_nbytes
    plan = plan_and_verify(bufs, 64)
    assert plan.arena_nbytes == plan.lower_bound_nbytes
    assert plan.strategy == "exact_search"


def test_local_search_on_resnet50() -> None:
    # ResNet-50's real lifetimes: every greedy order is 20% above the bound, the search reaches it
    data = (Path(__file__).parent / "data" / "planner" / "resnet50.json").read_text()
    instance = json.loads(data)
    bufs = [Buffer(b["id"], b["nbytes"], b["first_step"], b["last_step"]) for b in instance["buffers"]]
    greedy_plan = plan_offsets(bufs, instance["alignment"], budget_ms=0)
    assert greedy_plan.arena_nbytes > 1.1 * greedy_plan.lower_bound_nbytes
    plan = plan_and_verify(bufs, instance["alignment"])
    assert plan.arena_nbytes == plan.lower_bound_nbytes
    assert plan.strategy == "local_search"


def test_search_is_deterministic_and_never_worse() -> None:
    # the budget is counted in work units, not time: the same budget gives the same plan
    for seed in (29, 116, 193, 12345):
        bufs = random_buffers(seed, n=200 if seed == 12345 else None)
        for budget in (0, 5, 50):
            plans = [plan_offsets(bufs, 64, budget_ms=budget) for _ in range(2)]
            assert plans[0] == plans[1]
            verify_plan(bufs, plans[0], 64)
        arenas = [plan_offsets(bufs, 64, budget_ms=b).arena_nbytes for b in (0, 5, 50)]
        assert max(arenas) == arenas[0]  # the search never returns more than the heuristic


def brute_force_optimum(bufs: list[Buffer], alignment: int) -> int:
    """The smallest arena over every placement order with first fit: some order is optimal."""
    p = packing._problem(bufs, alignment)
    orders = itertools.permutations(p.nonempty)
    return min((greedy.place_fresh(p, list(o), greedy.first_fit)[1] for o in orders), default=0)


@pytest.mark.parametrize("seed", range(60))
def test_tiny_instances_are_planned_optimally(seed: int) -> None:
    rng = random.Random(seed)
    steps = rng.randint(2, 5)
    bufs = []
    for k in range(rng.randint(1, 6)):
        first = rng.randrange(steps)
        bufs.append(Buffer(k, rng.randint(0, 100), first, min(steps - 1, first + rng.randrange(3))))
    assert plan_and_verify(bufs, 1).arena_nbytes == brute_force_optimum(bufs, 1)


def test_branch_and_bound_proves_a_bound_unreachable() -> None:
    # staircase: the bound (30) cannot be met; a complete search finds nothing at it
    bufs = [Buffer(k, 1 << (k % 5), k, k + 3) for k in range(20)]
    p = packing._problem(bufs, 1)
    exact = BranchAndBound(p, Budget(1 << 40), 1 << 40)
    assert exact.run(p.lower_bound) is None and exact.work > 0  # finished, not out of work
    found = exact.run(p.lower_bound + 1)
    assert found is not None
    offsets = dict(enumerate(found))
    verify_plan(bufs, MemoryPlan(offsets, p.lower_bound + 1, p.lower_bound, sum(p.size), "exact"), 1)
    assert plan_and_verify(bufs, 1).arena_nbytes == p.lower_bound + 1


# ---- the verifier ----


def good_pair() -> tuple[list[Buffer], MemoryPlan]:
    bufs = [Buffer("a", 64, 0, 2), Buffer("b", 64, 2, 4)]
    return bufs, MemoryPlan({"a": 0, "b": 64}, 128, 128, 128, "hand")


def test_verifier_accepts_a_good_plan() -> None:
    bufs, plan = good_pair()
    verify_plan(bufs, plan, 64)
    # sharing addresses is fine when lifetimes do not meet, and empty buffers occupy nothing
    apart = [Buffer("a", 64, 0, 1), Buffer("b", 64, 2, 3), Buffer("z", 0, 0, 3)]
    verify_plan(apart, MemoryPlan({"a": 0, "b": 0, "z": 0}, 64, 64, 128, "hand"), 64)


def test_verifier_catches_overlap_and_names_both_buffers() -> None:
    bufs, _ = good_pair()
    overlapping = MemoryPlan({"a": 0, "b": 0}, 128, 128, 128, "hand")
    with pytest.raises(InternalError) as info:
        verify_plan(bufs, overlapping, 64)
    message = str(info.value)
    assert "'a'" in message and "'b'" in message
    assert "bytes [0, 64)" in message and "steps [0, 2]" in message and "steps [2, 4]" in message


def test_verifier_catches_partial_overlap() -> None:
    bufs = [Buffer("a", 100, 0, 5), Buffer("b", 100, 3, 3)]
    with pytest.raises(InternalError, match="'a'.*'b'.*overlap"):
        verify_plan(bufs, MemoryPlan({"a": 0, "b": 96}, 256, 256, 256, "hand"), 16)


def test_verifier_catches_misaligned_offset() -> None:
    bufs, _ = good_pair()
    with pytest.raises(InternalError, match="'b'.*not a multiple of alignment 64"):
        verify_plan(bufs, MemoryPlan({"a": 0, "b": 65}, 192, 128, 128, "hand"), 64)


def test_verifier_catches_missing_unknown_and_out_of_arena() -> None:
    bufs, _ = good_pair()
    with pytest.raises(InternalError, match="'b'.*no offset"):
        verify_plan(bufs, MemoryPlan({"a": 0}, 128, 128, 128, "hand"), 64)
    with pytest.raises(InternalError, match="unknown buffer 'c'"):
        verify_plan(bufs, MemoryPlan({"a": 0, "b": 64, "c": 0}, 128, 128, 128, "hand"), 64)
    with pytest.raises(InternalError, match="'b'.*past the arena of 64 bytes"):
        verify_plan(bufs, MemoryPlan({"a": 0, "b": 64}, 64, 128, 128, "hand"), 64)
    with pytest.raises(InternalError, match="arena size 100"):
        verify_plan(bufs, MemoryPlan({"a": 0, "b": 64}, 100, 128, 128, "hand"), 64)
