"""Time and size of the memory planner against the classic planners.

For 1,000 random buffers at several densities (buffers live per step) and for the light zoo's
real lifetimes (tests/data/planner/*.json) it prints: the median time of the default heuristic
(``budget_ms=0``), the time of the full plan with the default search budget, and arena / lower
bound for the heuristic, for the searched plan and for each classic planner of
tests/support/classic_planners.py. Usage:

    python -m scripts.bench_planner [--repeats N] [--hill-climb N] [--skip-classics] [--zoo-only]
    python -m scripts.bench_planner --extract    # rewrite tests/data/planner/ from compile_model
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

from compiler.memory.packing import DEFAULT_BUDGET_MS
from compiler.memory.packing import Buffer
from compiler.memory.packing import plan_offsets
from compiler.memory.packing import verify_plan
from tests.support.classic_planners import CLASSICS
from tests.support.classic_planners import arena_of
from tests.support.classic_planners import tvm_hill_climb

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "planner"
SHORT = {"tflite_greedy_by_size": "tflite", "tflm_greedy_first_fit": "tflm", "tvm_greedy_by_size": "tvm_size",
         "tvm_greedy_by_conflicts": "tvm_confl", "tvm_hill_climb": "tvm_hill", "glow_max_pressure": "glow"}


def random_buffers(seed: int, n: int, mean_life: float, sizes: str) -> list[Buffer]:
    """``n`` buffers over ``n`` steps with exponential lifetimes: about ``mean_life`` live per step."""
    rng = random.Random(seed)
    out = []
    for k in range(n):
        first = rng.randrange(n)
        last = min(n - 1, first + int(rng.expovariate(1 / mean_life)))
        if sizes == "mixed":  # empty, tiny, small or large, as in tests/test_memory_packing.py
            nbytes = rng.choice([0, rng.randint(1, 100), rng.randint(1, 5000), rng.randint(1, 1 << 20)])
        else:
            nbytes = rng.randint(1, 1 << 20)
        out.append(Buffer(k, nbytes, first, last))
    return out


def zoo_instances() -> list[tuple[str, list[Buffer], int]]:
    out = []
    for path in sorted(DATA.glob("*.json")):
        data = json.loads(path.read_text())
        bufs = [Buffer(b["id"], b["nbytes"], b["first_step"], b["last_step"]) for b in data["buffers"]]
        out.append((path.stem, bufs, data["alignment"]))
    return out


def measure(name: str, bufs: list[Buffer], alignment: int, args: argparse.Namespace) -> None:
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        heuristic = plan_offsets(bufs, alignment, budget_ms=0)
        times.append(time.perf_counter() - start)
    start = time.perf_counter()
    searched = plan_offsets(bufs, alignment)
    search_time = time.perf_counter() - start
    verify_plan(bufs, searched, alignment)
    bound = searched.lower_bound_nbytes or 1
    row = (f"{name:<24} {len(bufs):>5} {statistics.median(times) * 1e3:>8.1f} {search_time * 1e3:>8.0f} "
           f"{heuristic.arena_nbytes / bound:>7.4f} {searched.arena_nbytes / bound:>7.4f}")
    if not args.skip_classics:
        for planner in CLASSICS.values():
            if planner is tvm_hill_climb:
                offsets = tvm_hill_climb(bufs, alignment, max_attempts=args.hill_climb)
            else:
                offsets = planner(bufs, alignment)
            arena = -(-arena_of(bufs, offsets, alignment) // alignment) * alignment
            mark = "*" if arena < searched.arena_nbytes else " "
            row += f" {arena / bound:>9.4f}{mark}"
    print(row + f"  {searched.strategy}", flush=True)


def extract() -> None:
    """Compile each light-zoo model and save its arena's buffers (id, nbytes, lifetime) as JSON."""
    from compiler import compile_model
    from tests.support.zoo import ZOO
    from tests.support.zoo import zoo_model

    DATA.mkdir(parents=True, exist_ok=True)
    for name in ZOO:
        with tempfile.TemporaryDirectory() as tmp:
            plan = json.loads((compile_model(zoo_model(name), Path(tmp) / "out") / "plan.json").read_text())
        arena = plan["arenas"][0]
        rows = [json.dumps({"id": b["id"], "nbytes": b["nbytes"], "first_step": b["first_step"],
                            "last_step": b["last_step"]})
                for b in plan["buffers"] if b["arena"] == arena["memory_space"]]
        head = f'{{"model": {json.dumps(name)}, "alignment": {arena["alignment"]}, "buffers": [\n  '
        text = head + ",\n  ".join(rows) + "\n]}\n"
        (DATA / f"{name}.json").write_text(text)
        print(f"{name}: {len(rows)} buffers", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9, help="runs of the default heuristic (median)")
    parser.add_argument("--hill-climb", type=int, default=100, help="TVM hill-climb attempts")
    parser.add_argument("--skip-classics", action="store_true")
    parser.add_argument("--zoo-only", action="store_true")
    parser.add_argument("--extract", action="store_true", help="rewrite tests/data/planner/ and stop")
    args = parser.parse_args()
    if args.extract:
        extract()
        return 0
    print(f"default search budget {DEFAULT_BUDGET_MS:g} ms; heuristic = median ms with budget_ms=0; "
          f"search = ms with the default budget; then arena / lower bound "
          f"(* = a classic beat the searched plan)")
    header = f"{'instance':<24} {'bufs':>5} {'heur ms':>8} {'srch ms':>8} {'heur':>7} {'search':>7}"
    if not args.skip_classics:
        header += "".join(f" {SHORT[c]:>10}" for c in CLASSICS)
    print(header + "  winner")
    if not args.zoo_only:
        for sizes in ("mixed", "uniform"):
            for live in (1, 3, 10, 50, 200):
                measure(f"random {sizes} ~{live}/step", random_buffers(live, 1000, live, sizes), 64, args)
    for name, bufs, alignment in zoo_instances():
        measure(name, bufs, alignment, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
