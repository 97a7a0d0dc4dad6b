"""Dynamic plans at run time (issue 17, format version 3): ``runtime/placement.py``, the schema's
symbolic fields (``runtime/plan_schema.py``, ``runtime/plan_symbols.py``), binding
(``runtime/binding.py``) and ``Session``'s dynamic path (``runtime/dynamic.py``).

The artifacts here are written by hand (``dynamic_artifact``), as the compiler writes a dynamic
plan (docs/dynamic-shapes.md): x [n, 8] @ W [8, 4] + bias [n, 4] -> Relu -> Reshape to
[2*n, 2] (an ``{"expr": ...}`` attribute) written into the first slice of a buffer whose second
slice (offset ``_b2+16*n``) gets -K [3, 2]; Concat of the two along the symbolic axis ->
c [2*n+3, 2]; out = c * c; ``shape_out``, the Identity of a ``symbolic`` value [2*n+3, 2]; and
``half_out``, of a float ``symbolic`` value [n, 0.5, 2] (a dim cast to float).
"""

from __future__ import annotations

import copy
import hashlib
import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from runtime import Session
from runtime import SharedArena
from runtime import load_plan
from runtime.binding import bind_plan
from runtime.cli import main
from runtime.dynamic import CACHE_SIZE
from runtime.errors import ArtifactError
from runtime.errors import InputError
from runtime.placement import lower_bound
from runtime.placement import place
from runtime.plan_schema import FORMAT_VERSION
from runtime.plan_schema import Plan
from runtime.selftest import array_sha256
from runtime.selftest import generate_input
from runtime.symbolic import sym

RNG = np.random.default_rng(7)
W = RNG.standard_normal((8, 4)).astype(np.float32)
K = RNG.standard_normal((3, 2)).astype(np.float32)


def _value(dtype: str, shape: list[Any], location: list[Any]) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "location": location}


def _step(index: int, op: str, inputs: list[str], outputs: list[str], attrs: Any = None) -> dict[str, Any]:
    return {"index": index, "name": f"{op}_{index}", "op_type": op, "domain": "", "provider": "reference",
            "partition": 0, "onnx_nodes": [f"{op}_{index}"], "inputs": inputs, "outputs": outputs,
            "attrs": attrs or {}, "scratch": None}


def dynamic_plan(*, assume_even: bool = False) -> dict[str, Any]:
    """plan.json of the model in the module docstring, n in 1..64."""
    f32 = "float32"
    # y, then "a" written over it (the reference provider copies results after the kernel ran)
    buffers = [("y", "16*n", 0, 2, ["y", "a"]), ("r", "16*n", 2, 3, ["r"]),
               ("tk", "16*n+24", 3, 5, ["t", "k"]), ("c", "16*n+24", 5, 6, ["c"])]
    sizes_at_max = [16 * 64, 16 * 64, 16 * 64 + 24, 16 * 64 + 24]
    firsts, lasts = [b[2] for b in buffers], [b[3] for b in buffers]
    offsets, total = place(sizes_at_max, firsts, lasts, 64)
    assert offsets  # the arena record holds the figures at the max binding
    return {
        "format_version": FORMAT_VERSION, "name": "dyn",
        "symbols": [{"name": "n", "min": 1, "max": 64}],
        "assumptions": [{"node": "Concat_5", "a": "2*(n//2)", "b": "n"}] if assume_even else [],
        "inputs": [{"name": "x", "dtype": f32, "shape": ["n", 8]},
                   {"name": "bias", "dtype": f32, "shape": ["n", 4]}],
        "outputs": [{"name": "out", "dtype": f32, "shape": ["2*n+3", 2], "value": "out"},
                    {"name": "shape_out", "dtype": "int64", "shape": [2], "value": "shape_out"},
                    {"name": "half_out", "dtype": "float32", "shape": [3], "value": "half_out"}],
        "constants": [{"name": "W", "offset": 0, "nbytes": 128, "dtype": f32, "shape": [8, 4]},
                      {"name": "K", "offset": 128, "nbytes": 24, "dtype": f32, "shape": [3, 2]}],
        "weights_nbytes": 152,
        "arenas": [{"memory_space": "host", "nbytes": total, "alignment": 64,
                    "lower_bound_nbytes": lower_bound(sizes_at_max, firsts, lasts, 64),
                    "naive_nbytes": sum(-(-s // 64) * 64 for s in sizes_at_max), "strategy": "runtime"}],
        "buffers": [{"id": name, "arena": "host", "offset": f"_b{k}", "nbytes": nbytes, "first_step": first,
                     "last_step": last, "values": values}
                    for k, (name, nbytes, first, last, values) in enumerate(buffers)],
        "values": {
            "x": _value(f32, ["n", 8], ["ext", "x"]), "bias": _value(f32, ["n", 4], ["ext", "bias"]),
            "W": _value(f32, [8, 4], ["weights", 0]), "K": _value(f32, [3, 2], ["weights", 128]),
            "y": _value(f32, ["n", 4], ["arena", "_b0", "host"]),
            "r": _value(f32, ["n", 4], ["arena", "_b1", "host"]),
            "a": _value(f32, ["n", 4], ["arena", "_b0", "host"]),
            "t": _value(f32, ["2*n", 2], ["arena", "_b2", "host"]),
            "k": _value(f32, [3, 2], ["arena", "_b2+16*n", "host"]),
            "c": _value(f32, ["2*n+3", 2], ["arena", "_b3", "host"]),
            "out": _value(f32, ["2*n+3", 2], ["ext", "out"]),
            "shape_val": _value("int64", [2], ["symbolic", ["2*n+3", 2]]),
            "half": _value("float32", [3], ["symbolic", ["n", 0.5, 2]]),
            "shape_out": _value("int64", [2], ["ext", "shape_out"]),
            "half_out": _value("float32", [3], ["ext", "half_out"]),
        },
        "steps": [_step(0, "MatMul", ["x", "W"], ["y"]), _step(1, "Add", ["y", "bias"], ["a"]),
                  _step(2, "Relu", ["a"], ["r"]),
                  _step(3, "Reshape", ["r"], ["t"], {"shape": [{"expr": "2*n"}, 2]}),
                  _step(4, "Neg", ["K"], ["k"]), _step(5, "Concat", ["t", "k"], ["c"], {"axis": 0}),
                  _step(6, "Mul", ["c", "c"], ["out"]), _step(7, "Identity", ["shape_val"], ["shape_out"]),
                  _step(8, "Identity", ["half"], ["half_out"])],
        "partitions": [{"index": 0, "provider": "reference", "runner": "reference", "memory_space": "host",
                        "entry": "reference_0", "first_step": 0, "last_step": 8,
                        "ext": ["x", "bias", "out", "shape_out", "half_out"]}],
        "onnx_nodes": {},
    }


def expected(x: np.ndarray, bias: np.ndarray) -> list[np.ndarray]:
    t = np.maximum(x @ W + bias, 0).reshape(-1, 2)
    c = np.concatenate([t, -K])
    return [c * c, np.array(c.shape, np.int64), np.array([len(x), 0.5, 2], np.float32)]


def feeds(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed + n)
    return {"x": rng.standard_normal((n, 8)).astype(np.float32),
            "bias": rng.standard_normal((n, 4)).astype(np.float32)}


def _entry(data: bytes) -> dict[str, Any]:
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _golden(ns: list[int]) -> tuple[bytes, bytes]:
    blob = bytearray()
    cases = []
    for n in ns:
        ins = {"x": generate_input("uniform", np.dtype(np.float32), (n, 8), 10 + n),
               "bias": generate_input("uniform", np.dtype(np.float32), (n, 4), 20 + n)}
        records = []
        results = expected(ins["x"], ins["bias"])
        for name, array in zip(("out", "shape_out", "half_out"), results, strict=True):
            records.append({"name": name, "dtype": array.dtype.name, "shape": list(array.shape),
                            "offset": len(blob), "nbytes": array.nbytes, "tolerance": 1e-5})
            blob += array.tobytes()
        cases.append({"inputs": [{"name": name, "dtype": "float32", "shape": list(a.shape),
                                  "generator": "uniform", "seed": (10 if name == "x" else 20) + n,
                                  "sha256": array_sha256(a)} for name, a in ins.items()],
                      "outputs": records})
    return json.dumps({"cases": cases}).encode(), bytes(blob)


def write_artifact(root: Path, plan: dict[str, Any], golden: list[int] | None = None) -> Path:
    """An artifact folder around ``plan`` (weights W and K; golden cases at the sizes given)."""
    root.mkdir(parents=True, exist_ok=True)
    files = {"plan.json": json.dumps(plan).encode(), "weights.bin": W.tobytes() + K.tobytes()}
    if golden:
        files["golden.json"], files["golden.bin"] = _golden(golden)
    for name, data in files.items():
        (root / name).write_bytes(data)
    manifest = {"format_version": FORMAT_VERSION, "files": {name: _entry(d) for name, d in files.items()},
                "options": {"target": "cpu"}, "compiler": {"version": "test"}, "source": {"file": "by hand"}}
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


@pytest.fixture(scope="module")
def art(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_artifact(tmp_path_factory.mktemp("dyn"), dynamic_plan(), golden=[1, 24])


# -- placement -------------------------------------------------------------------------------------
def _lifetimes(rng: np.random.Generator, n: int) -> tuple[list[int], list[int], list[int]]:
    """A network's: each tensor read by the next 1-2 steps, 10% kept for a skip connection,
    sizes in stages that change every ~20 ops."""
    firsts = np.arange(n)
    span = rng.integers(1, 3, n)
    skip = rng.random(n) < 0.1
    span[skip] += rng.integers(2, 30, skip.sum())
    stage = np.cumsum(rng.random(n) < 0.05)
    base = 2.0 ** (20 - stage % 8)
    sizes = (base * rng.choice([0.25, 0.5, 1, 1, 1, 2, 4], n)).astype(int) + rng.integers(0, 64, n) * 64
    return sizes.tolist(), firsts.tolist(), np.minimum(firsts + span, n).tolist()


def _check_placement(sizes: list[int], firsts: list[int], lasts: list[int], alignment: int) -> float:
    offsets, total = place(sizes, firsts, lasts, alignment)
    assert offsets == place(sizes, firsts, lasts, alignment)[0]  # deterministic
    assert total % alignment == 0 and all(o % alignment == 0 for o in offsets)
    assert all(o + s <= total for o, s in zip(offsets, sizes, strict=True))
    for i in range(len(sizes)):
        for j in range(i):
            live_together = firsts[i] <= lasts[j] and firsts[j] <= lasts[i]
            apart = offsets[i] + sizes[i] <= offsets[j] or offsets[j] + sizes[j] <= offsets[i]
            assert apart or not live_together or not sizes[i] or not sizes[j], (i, j)
    bound = lower_bound(sizes, firsts, lasts, alignment)
    brute = max((sum(-(-s // alignment) * alignment for s, f, la in zip(sizes, firsts, lasts, strict=True)
                     if f <= t <= la) for t in range(max(lasts) + 1)), default=0)
    assert bound == brute and total >= bound
    return total / bound if bound else 1.0


def test_placement_is_valid_on_random_lifetimes() -> None:
    rng = np.random.default_rng(3)
    for _ in range(150):
        n = int(rng.integers(1, 60))
        firsts = rng.integers(0, 30, n)
        lasts = firsts + rng.integers(0, 12, n)
        sizes = rng.integers(0, 5000, n)
        _check_placement(sizes.tolist(), firsts.tolist(), lasts.tolist(), int(rng.choice([1, 16, 64, 256])))
    assert place([], [], [], 64) == ([], 0) and lower_bound([], [], [], 64) == 0


def test_placement_is_near_the_lower_bound_on_network_lifetimes() -> None:
    rng = np.random.default_rng(0)
    ratios = [_check_placement(*_lifetimes(rng, int(rng.integers(5, 200))), 64) for _ in range(120)]
    # measured (seeds 0-2, 300 cases of 5-400 buffers): mean 1.004-1.006, 0.7-1.3% of cases above
    # 1.10, worst 1.14-1.17 (the lower bound is not always reachable)
    assert np.mean(ratios) < 1.02
    assert np.mean(np.array(ratios) <= 1.10) >= 0.95


@pytest.mark.parametrize("path", sorted((Path(__file__).parent / "data" / "planner").glob("*.json")),
                         ids=lambda p: p.stem)
def test_placement_of_real_lifetimes_is_at_the_lower_bound(path: Path) -> None:
    """The light zoo's buffers as the compiler planned them (tests/test_planner_vs_classics.py):
    every greedy order leaves ResNet-50 at 1.198x the bound; the local search reaches 1.003x."""
    data = json.loads(path.read_text())
    triples = [(b["nbytes"], b["first_step"], b["last_step"]) for b in data["buffers"]]
    sizes, firsts, lasts = (list(column) for column in zip(*triples, strict=True))
    assert _check_placement(sizes, firsts, lasts, data["alignment"]) <= 1.01


def test_placement_time_for_300_buffers() -> None:
    sizes, firsts, lasts = _lifetimes(np.random.default_rng(11), 300)
    best = min(_timed(lambda: place(sizes, firsts, lasts, 64)) for _ in range(5))
    assert best < 0.01  # ~0.5 ms on a quiet Zen 4; generous for a loaded machine


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# -- the schema ------------------------------------------------------------------------------------
def test_a_dynamic_plan_round_trips() -> None:
    data = dynamic_plan(assume_even=True)
    plan = Plan.from_json(data)
    assert plan.is_dynamic and plan.ranges == {"n": (1, 64)}
    assert plan.to_json() == data and Plan.from_json(plan.to_json()) == plan
    assert list(plan.to_json())[:4] == ["format_version", "name", "symbols", "assumptions"]
    assert plan.values["k"].location.offset == sym("_b2") + 16 * sym("n")
    assert plan.values["shape_val"].location.elements == (2 * sym("n") + 3, 2)
    assert plan.assumptions[0].a == 2 * (sym("n") // 2)


def _drop_key(d: dict[str, Any], key: str) -> None:
    d.pop(key)


BROKEN = [
    ("bad expression", lambda p: p["values"]["y"].update(shape=["n+", 4]),
     r"values\['y'\]\.shape\[0\] must be"),
    ("unknown symbol", lambda p: p["values"]["y"].update(shape=["m", 4]), r"values\['y'\]\.shape names 'm'"),
    ("offset symbol", lambda p: p["values"]["k"]["location"].__setitem__(1, "_b9"),
     r"values\['k'\]\.location names '_b9'"),
    ("placeholder", lambda p: p["buffers"][1].update(offset="_b0"),
     r"buffers\[1\]\.offset must be the placeholder"),
    ("static offset", lambda p: p["buffers"][1].update(offset=0),
     r"buffers\[1\]\.offset must be the placeholder"),
    ("input expr", lambda p: p["inputs"][0].update(shape=["2*n", 8]), r"inputs\[0\]\.shape\[0\] is 2\*n"),
    ("unused symbol", lambda p: p["symbols"].append({"name": "z", "min": 1, "max": 2}),
     r"symbols has 'z', which no graph input"),
    ("unsorted", lambda p: p["symbols"].insert(0, {"name": "z", "min": 1, "max": 2}),
     r"symbols must be sorted"),
    ("private name", lambda p: p["symbols"][0].update(name="_n"),
     r"symbols\[0\]\.name must be a Python identifier"),
    ("range", lambda p: p["symbols"][0].update(min=9, max=3), r"symbols\[0\] has min 9 > max 3"),
    ("symbolic dtype", lambda p: p["values"]["shape_val"].update(dtype="complex64"), r"is a symbolic value"),
    ("symbolic count", lambda p: p["values"]["shape_val"]["location"][1].append(1), r"is a symbolic value"),
    ("C partition without the binding", lambda p: p["partitions"][0].update(runner="c", library="x.so"),
     r"partitions\[0\]\.ext must be '#dyn' first"),
    ("launch symbol", lambda p: p["steps"][3].update(launches=[
        {"kernel": "k", "grid": ["2*q"], "block": [1], "shared": 0, "args": [["i32", "n"]]}]),
     r"steps\[3\]\.launches\[0\] names 'q'"),
    ("launch placeholder", lambda p: p["steps"][3].update(launches=[
        {"kernel": "k", "grid": [1], "block": [1], "shared": 0, "args": [["ptr", "arena", "_b9"]]}]),
     r"steps\[3\]\.launches\[0\] names '_b9'"),
    ("attr expr", lambda p: p["steps"][3]["attrs"].update(shape=[{"expr": 3}, 2]),
     r"steps\[3\]\.attrs shape\[0\]: \{\"expr\": \.\.\.\} must hold"),
    ("attr symbol", lambda p: p["steps"][3]["attrs"].update(shape=[{"expr": "2*q"}, 2]),
     r"steps\[3\]\.attrs names 'q'"),
    ("assumption", lambda p: p["assumptions"].append({"node": "N", "a": "n", "b": "w"}),
     r"assumptions\[0\] names 'w'"),
    ("missing symbols", lambda p: _drop_key(p, "symbols"), r"symbols is missing"),
    ("static plan with an expression", lambda p: p.update(symbols=[]), r"holds .*expression.*no symbols"),
]


@pytest.mark.parametrize("what,change,message", BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_dynamic_plan_names_the_field(what: str, change: Any, message: str) -> None:
    data = copy.deepcopy(dynamic_plan())
    change(data)
    with pytest.raises(ArtifactError, match=message) as info:
        Plan.from_json(data, "art/plan.json")
    assert str(info.value).startswith("art/plan.json: ")


def test_bind_gives_a_static_placed_plan() -> None:
    plan = Plan.from_json(dynamic_plan())
    bound = plan.bind({"n": 5})
    static = bound.plan
    assert not static.is_dynamic and dict(bound.sizes) == {"n": 5}
    assert static.values["c"].shape == (13, 2) and static.output_specs[0].shape == (13, 2)
    assert static.steps[3].attrs == {"shape": [10, 2]}
    np.testing.assert_array_equal(bound.arrays["shape_val"], [13, 2])
    buffers = {b.id: b for b in static.buffers}
    assert static.values["k"].location.offset == buffers["tk"].offset + 16 * 5
    assert [b.nbytes for b in static.buffers] == [80, 80, 104, 104]
    (arena,) = static.arenas
    assert arena.strategy == "runtime" and arena.nbytes >= arena.lower_bound_nbytes == 2 * 128
    assert all(isinstance(d, int) for v in static.values.values() for d in v.shape)
    with pytest.raises(InputError, match=r"symbol 'n' = 65 is outside its range 1\.\.64"):
        bind_plan(plan, {"n": 65})
    with pytest.raises(InputError, match="missing: n"):
        bind_plan(plan, {})


# -- Session ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 7, 33, 64])
def test_runs_match_numpy_at_every_binding(art: Path, n: int) -> None:
    session = Session(art)
    got = session.run(None, feeds(n))
    for g, e in zip(got, expected(**feeds(n)), strict=True):
        assert g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


def test_one_session_runs_bindings_in_any_order(art: Path) -> None:
    session = Session(art)
    for n in (3, 64, 1, 3, 17, 64):
        (out,) = session.run(["out"], feeds(n, seed=n))
        np.testing.assert_allclose(out, expected(**feeds(n, seed=n))[0], rtol=1e-5, atol=1e-6)


def test_specs_report_none_and_the_ranges(art: Path) -> None:
    session = Session(art)
    x, bias = session.inputs
    assert x.shape == (None, 8) and x.ranges == ((1, 64), (8, 8)) and x.dims == (sym("n"), 8) and x.is_dynamic
    out, shape_out, _ = session.outputs
    assert out.shape == (None, 2) and out.ranges == ((5, 131), (2, 2))
    assert shape_out.shape == (2,) and shape_out.ranges is None and not shape_out.is_dynamic
    info = load_plan(art)
    assert info.inputs == tuple(session.inputs) and info.outputs == tuple(session.outputs)
    assert info.symbols == {"n": (1, 64)}
    assert info.arenas["host"] == Plan.from_json(json.loads((art / "plan.json").read_text())).arenas[0].nbytes


def test_shapes_outside_the_ranges_name_the_input_and_dim(art: Path) -> None:
    session = Session(art)
    with pytest.raises(InputError, match=r"input 'x': dim 0 \(n\) is 65, outside its range 1\.\.64"):
        session.run(None, feeds(65))
    with pytest.raises(InputError, match=r"input 'x': dim 0 \(n\) is 0, outside its range 1\.\.64"):
        session.run(None, {"x": np.zeros((0, 8), np.float32), "bias": np.zeros((0, 4), np.float32)})
    with pytest.raises(InputError, match=r"input 'x': dim 1 is 9, expected 8"):
        session.run(None, {"x": np.zeros((2, 9), np.float32), "bias": np.zeros((2, 4), np.float32)})
    with pytest.raises(InputError, match=r"input 'bias': shape \(2,\) has 1 dims, expected 2"):
        session.run(None, {"x": np.zeros((2, 8), np.float32), "bias": np.zeros(2, np.float32)})
    with pytest.raises(InputError, match=r"input 'bias' dim 0 is 4 but input 'x' dim 0 is 3: both are 'n'"):
        session.run(None, {"x": np.zeros((3, 8), np.float32), "bias": np.zeros((4, 4), np.float32)})
    with pytest.raises(InputError, match=r"input 'x': dtype float64"):
        session.run(None, {"x": np.zeros((3, 8)), "bias": np.zeros((3, 4), np.float32)})


def test_a_failed_assumption_names_the_node_and_both_sides(tmp_path: Path) -> None:
    session = Session(write_artifact(tmp_path, dynamic_plan(assume_even=True)))
    with pytest.raises(InputError, match=r"node 'Concat_5' needs 2\*\(n//2\) == n, but at n=3 they are 2 "
                                         r"and 3: the model cannot take this shape; input shapes x \(3, 8\)"):
        session.run(None, feeds(3))
    (out, *_) = session.run(None, feeds(4))
    np.testing.assert_allclose(out, expected(**feeds(4))[0], rtol=1e-5, atol=1e-6)


def test_bound_plans_are_cached_per_binding(art: Path) -> None:
    session = Session(art)
    dyn = session._dyn
    assert dyn is not None
    session.run(None, feeds(5))
    session.run(None, feeds(5, seed=9))
    assert dyn.binds == 1
    session.run(None, feeds(6))
    assert dyn.binds == 2 and dyn.cached() == [(5,), (6,)]
    for n in range(1, 25):
        session.run(None, feeds(n))
    assert len(dyn.cached()) == CACHE_SIZE and dyn.cached()[-1] == (24,)


def test_concurrent_runs_at_several_bindings(art: Path) -> None:
    session = Session(art)
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for n in (k + 1, 40 - k, k + 1, 64):
                (out,) = session.run(["out"], feeds(n, seed=k))
                np.testing.assert_allclose(out, expected(**feeds(n, seed=k))[0], rtol=1e-5, atol=1e-6)
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_the_first_run_at_a_new_binding_costs_little(art: Path) -> None:
    session = Session(art)
    session.run(None, feeds(2))  # first run of the session: imports and kernels' first calls
    firsts, warms = [], []
    for n in range(40, 50):
        f = feeds(n)
        firsts.append(_timed(lambda f=f: session.run(None, f)))
        warms.append(min(_timed(lambda f=f: session.run(None, f)) for _ in range(5)))
    # issue 17: at most 2x a warm run + 5 ms (medians: the machine is shared)
    assert np.median(firsts) <= 2 * np.median(warms) + 0.005, (np.median(firsts), np.median(warms))


def test_io_binding_follows_the_bound_shapes(art: Path) -> None:
    session = Session(art)
    binding = session.io_binding()
    for n in (5, 9, 5):
        for name, array in feeds(n).items():
            binding.bind_input(name, array)
        binding.bind_output("out")
        session.run_with_iobinding(binding)
        out, shape_out, _ = binding.get_outputs()
        np.testing.assert_allclose(out, expected(**feeds(n))[0], rtol=1e-5, atol=1e-6)
        assert out.shape == (2 * n + 3, 2) and list(shape_out) == [2 * n + 3, 2]
    mine = np.empty((13, 2), np.float32)
    binding.bind_output("out", mine)
    session.run_with_iobinding(binding)
    np.testing.assert_allclose(mine, expected(**feeds(5))[0], rtol=1e-5, atol=1e-6)
    for name, array in feeds(6).items():
        binding.bind_input(name, array)
    with pytest.raises(InputError, match=r"output 'out' is bound to an array of shape \(13, 2\); at the "
                                         r"bound inputs' shapes it has shape \(15, 2\)"):
        session.run_with_iobinding(binding)
    with pytest.raises(InputError, match=r"input 'x': shape \(70, 8\) is outside the ranges \(1\.\.64, 8\)"):
        binding.bind_input("x", np.zeros((70, 8), np.float32))


def test_a_caller_owned_arena_is_checked_per_binding(art: Path) -> None:
    small = bytearray(1024)
    session = Session(art, arena=small)
    (out, *_) = session.run(None, feeds(2))
    np.testing.assert_allclose(out, expected(**feeds(2))[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(InputError, match=r"'host' arena given to this session has \d+ bytes; the run at n=60 "
                                         r"needs \d+"):
        session.run(None, feeds(60))


def test_verify_runs_golden_cases_of_different_shapes(art: Path, tmp_path: Path) -> None:
    report = Session(art).verify()
    assert report.ok and report.cases == 2 and {c.case for c in report.checks} == {0, 1}
    bad = write_artifact(tmp_path / "bad", dynamic_plan(), golden=[1, 24])
    golden = json.loads((bad / "golden.json").read_text())
    golden["cases"][1]["outputs"][0]["shape"] = [49, 2]  # n=24 gives 51 rows
    golden["cases"][1]["outputs"][0]["nbytes"] = 49 * 2 * 4
    data = json.dumps(golden).encode()
    (bad / "golden.json").write_bytes(data)
    manifest = json.loads((bad / "manifest.json").read_text())
    manifest["files"]["golden.json"] = _entry(data)
    (bad / "manifest.json").write_text(json.dumps(manifest))
    assert not Session(bad).verify(raise_on_mismatch=False).ok


def test_profiling_a_dynamic_session(art: Path, tmp_path: Path) -> None:
    session = Session(art, profile=True)
    session.run(None, feeds(3))
    session.run(None, feeds(4))
    trace = json.loads(Path(session.end_profiling(tmp_path / "trace.json")).read_text())
    assert trace


def test_a_shared_arena_sized_for_the_max_binding(art: Path) -> None:
    shared = SharedArena.for_artifacts([art])
    session = Session(art, shared_arena=shared)
    for n in (64, 1, 30):
        (out, *_) = session.run(None, feeds(n))
        np.testing.assert_allclose(out, expected(**feeds(n))[0], rtol=1e-5, atol=1e-6)


def test_cli_run_and_inspect_print_the_ranges(art: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(art)]) == 0
    out = capsys.readouterr().out
    assert "input x: float32 [n in 1..64, 8] (random at [1, 8])" in out and "out: float32 [5, 2]" in out
    np.save(tmp_path / "x.npy", feeds(6)["x"])
    np.save(tmp_path / "bias.npy", feeds(6)["bias"])
    assert main(["run", str(art), "--input", f"x={tmp_path / 'x.npy'}", "--input",
                 f"bias={tmp_path / 'bias.npy'}"]) == 0
    assert "out: float32 [15, 2]" in capsys.readouterr().out
    report = art.parent / "with_report"
    plan = dynamic_plan()
    write_artifact(report, plan)
    (report / "report").mkdir()
    steps = [{"index": t, "name": s["name"], "op_type": s["op_type"], "provider": "reference",
              "live_nbytes": 0} for t, s in enumerate(plan["steps"])]
    (report / "report" / "memory.json").write_text(json.dumps({"arenas": {}, "steps": steps}))
    assert main(["inspect", str(report)]) == 0
    text = capsys.readouterr().out
    assert "input  x: float32 [n in 1..64, 8]" in text and "output out: float32 [2*n+3 in 5..131, 2]" in text
    assert "symbols: n in 1..64" in text
