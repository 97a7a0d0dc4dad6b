"""QLookup on AVX512-VBMI byte permutes (compiler/providers/c/qlookup.py, templates/c/qlookup.c.j2):
an x86-64-v4 build carries the VBMI loop behind a target attribute and takes it where the CPU has
VBMI; every build gives the reference kernels' bits (the table's entries), at 1 and 2 threads, over
chunks and a tail that are not multiples of 64."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import onnx
import pytest

from compiler import compile_model
from compiler.driver import import_model
from compiler.ir.evaluate import evaluate
from compiler.passes import optimize
from runtime import Session
from tests.cpu_targets import host_runs
from tests.support.qdq_models import QdqBuilder

SHAPE = (1, 12, 41, 77)  # 37,884 codes: three work items, a tail of 60


def _divided(dtype: type) -> onnx.ModelProto:
    """Dequantized codes divided by a constant and quantized again (the attention's scaled scores)."""
    b = QdqBuilder(seed=11, dtype=dtype)
    z = 0 if dtype == np.int8 else 128
    y = b.node("Div", [b.qdq("x", 0.173, z + 2), b.const(np.float32(5.656854), "sqrt_head")])
    return b.model({"x": SHAPE}, [b.qdq(y, 0.0437, z - 3)])


@pytest.mark.parametrize("cpu", ["x86-64-v2", "x86-64-v4"])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8], ids=["s8", "u8"])
def test_lookup_gives_the_table_entries(tmp_path, cpu: str, dtype: type) -> None:  # type: ignore[no-untyped-def]
    if not host_runs(cpu):
        pytest.skip(f"this host does not run {cpu} code")
    model = _divided(dtype)
    graph = optimize(import_model(model), 3, target="cpu")
    assert [node.op_type for node in graph].count("QLookup") == 1
    art = compile_model(model, tmp_path / "a", cpu=cpu, golden_cases=0)
    if shutil.which("objdump"):  # the library itself: the VBMI permutes in the AVX-512 build only
        library = str(art / "kernels" / "cpu" / "model.so")
        code = subprocess.run(["objdump", "-d", library], capture_output=True, text=True, check=True).stdout
        assert ("vpermt2b" in code or "vpermi2b" in code) == (cpu == "x86-64-v4")
    x = {"x": (np.random.default_rng(4).standard_normal(SHAPE) * 20).astype(np.float32)}
    want = evaluate(graph, x)[0]
    for threads in (1, 2):
        assert np.array_equal(Session(art, threads=threads).run(None, x)[0], want), threads
