"""A fixed, seeded 500 cases of ``scripts/fuzz_models.py``: mutated ONNX models (truncated and
flipped bytes, wrong attributes, dangling inputs, cycles, huge, negative and zero dims, wrong
initializer sizes, element types, opsets, dropped or duplicated names) compiled in worker
processes with a 10 s limit per case, built, loaded and self-tested when they compile. Only the
project's own exceptions may escape; no crash, no hang, no result that differs from the reference
kernels. ``python -m scripts.fuzz_models --cases 10000`` is the long run."""

from __future__ import annotations

from scripts import fuzz_models


def test_seeded_fuzz_cases_raise_only_project_errors() -> None:
    report = fuzz_models.run(500, seed=20240601, workers=2, timeout=10.0, build=True)
    print(report.table())
    assert len(report.records) == 500
    kinds = {r["kind"] for r in report.records}
    assert kinds == set(fuzz_models.KINDS)
    outcomes = {r["outcome"] for r in report.records}
    assert {"compiled", "rejected"} <= outcomes
    assert not report.bad(), "\n".join(
        f"case {r['case']} ({r['kind']} of {r['seed_model']}): {r['error']}: {r.get('message', '')}"
        for r in report.bad()[:20]
    )


def test_mutations_are_deterministic() -> None:
    for case in (0, 7, 123, 4567):
        assert fuzz_models.make_case(3, case) == fuzz_models.make_case(3, case)
    assert fuzz_models.make_case(3, 1) != fuzz_models.make_case(4, 1)


def test_the_harness_charges_crashes_and_hangs_to_their_case(monkeypatch) -> None:  # noqa: ANN001

    class FakeWorker:
        def __init__(self, seed: int, build: bool) -> None:
            self.proc = type("P", (), {"returncode": -11})()

        def ask(self, case: int, timeout: float) -> dict | None:
            if case == 1:
                return None  # died (a segfault)
            if case == 2:
                import time

                time.sleep(timeout)
                return None  # ran out of time
            return {
                "case": case,
                "kind": "flip",
                "seed_model": "m",
                "outcome": "rejected",
                "error": "ModelError",
                "seconds": 0.0,
            }

        def close(self) -> None:
            pass

    monkeypatch.setattr(fuzz_models, "Worker", FakeWorker)
    report = fuzz_models.run(4, seed=0, workers=1, timeout=0.2)
    outcomes = {r["case"]: r["outcome"] for r in report.records}
    assert outcomes == {0: "rejected", 1: "crash", 2: "hang", 3: "rejected"}
    assert len(report.bad()) == 2 and "crash" in report.table()
