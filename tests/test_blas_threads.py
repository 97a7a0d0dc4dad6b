"""numpy's BLAS threads while a session's reference steps run beside C kernels (runtime/blas.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto
from onnx import helper

from compiler.driver import compile_model
from runtime import Session
from runtime.blas import blas_threads
from runtime.blas import set_blas_threads
from runtime.blas import single_threaded_blas
from runtime.providers.reference import ReferencePartition

pytestmark = pytest.mark.skipif(blas_threads() is None, reason="numpy's BLAS here is not a loaded OpenBLAS")


def test_the_guard_sets_one_thread_and_restores_the_count() -> None:
    before = blas_threads()
    with single_threaded_blas():
        assert blas_threads() == 1
    assert blas_threads() == before


def test_reference_steps_beside_c_kernels_run_with_one_blas_thread(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # Relu runs on C; Det (a batched determinant) only on the reference kernels, through numpy
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Det", ["r"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    out = compile_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "a",
                        golden_cases=0)
    session = Session(out, threads=2)
    assert {kind for kind, _ in session._partitions} == {"c", "reference"}
    seen: list[int | None] = []
    run = ReferencePartition._run

    def spy(self: ReferencePartition, *args: Any) -> None:
        seen.append(blas_threads())
        run(self, *args)

    monkeypatch.setattr(ReferencePartition, "_run", spy)
    before = blas_threads()
    assert set_blas_threads(2)  # two BLAS threads, so that one inside the step is the guard's doing
    try:
        x = np.random.default_rng(0).standard_normal((3, 4, 4)).astype(np.float32)
        (y,) = session.run(None, {"x": x})
        assert seen == [1] and blas_threads() == 2
    finally:
        set_blas_threads(before or 1)
    np.testing.assert_allclose(y, np.linalg.det(np.maximum(x, 0).astype(np.float64)), rtol=1e-4, atol=1e-5)
