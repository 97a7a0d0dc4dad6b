"""The worker pool (templates/c/workers.c.j2, issue 31): one per process, shared by every library
loaded, and results bit for bit the same whatever the thread count, the chunking and the load."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper
from onnx import numpy_helper

from compiler.driver import compile_model
from runtime.providers import c as c_provider
from runtime.session import Session
from tests.support.encoder_model import encoder_feeds
from tests.support.encoder_model import encoder_model
from tests.support.load import busy_core


def _conv_chain() -> onnx.ModelProto:
    """1x1, 3x3 (Winograd), depthwise, strided and padded-copy convolutions with a residual Add."""
    rng = np.random.default_rng(5)
    inits, nodes = [], []
    layers = [("pw", 48, 1, 1, 1, 0), ("w3", 48, 3, 1, 1, 1), ("dw", 48, 3, 1, 48, 1),
              ("s2", 64, 3, 2, 1, 1), ("st", 32, 5, 1, 1, 2)]
    x, c = "x", 24
    for name, m, k, s, group, pad in layers:
        w = (rng.standard_normal((m, c // group, k, k)) / np.sqrt(c * k * k / group)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"{name}.w"),
                  numpy_helper.from_array(rng.standard_normal(m).astype(np.float32), f"{name}.b")]
        nodes.append(helper.make_node("Conv", [x, f"{name}.w", f"{name}.b"], [f"{name}.c"], name=name,
                                      kernel_shape=[k, k], strides=[s, s], group=group, pads=[pad] * 4))
        nodes.append(helper.make_node("Relu", [f"{name}.c"], [f"{name}.r"], name=f"{name}.relu"))
        if name == "dw":
            nodes.append(helper.make_node("Add", [f"{name}.r", x], [f"{name}.sum"], name=f"{name}.add"))
            x = f"{name}.sum"
        else:
            x = f"{name}.r"
        c = m
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 24, 30, 30])]
    graph = helper.make_graph(nodes, "chain", inputs,
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 32, 15, 15])],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _model(kind: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    if kind == "convs":
        feeds = {"x": np.random.default_rng(1).standard_normal((1, 24, 30, 30)).astype(np.float32)}
        return _conv_chain(), feeds
    model = encoder_model(layers=2, hidden=96, heads=4, ffn=192, seq=24)
    return model, encoder_feeds(model)


@pytest.fixture
def spinning() -> Iterator[None]:
    with busy_core():
        yield


@pytest.mark.parametrize("kind", ["convs", "encoder"])
def test_results_are_bit_identical_at_any_thread_count_and_load(kind: str, tmp_path: Path,
                                                                spinning: None) -> None:
    model, feeds = _model(kind)
    out = compile_model(model, tmp_path / kind, golden_cases=0)
    source = (out / "kernels" / "cpu" / "model.c").read_text()
    assert "onnx_aot_parallel(k_" in source  # some of its steps run on the pool
    one = Session(out, threads=1).run(None, feeds)
    for threads in (2, 3):  # with a process spinning beside them (the fixture)
        session = Session(out, threads=threads)
        for _ in range(3):
            for a, b in zip(one, session.run(None, feeds), strict=True):
                assert np.array_equal(a, b), threads


def test_libraries_share_one_pool_and_concurrent_runs_agree(tmp_path: Path) -> None:
    runs = {}
    for kind in ("convs", "encoder"):
        model, feeds = _model(kind)
        out = compile_model(model, tmp_path / kind, golden_cases=0)
        runs[kind] = (Session(out, threads=2), feeds, Session(out, threads=1).run(None, feeds))
    assert len(c_provider._POOL) == 1  # the first library's pool, handed to the later ones
    failures: list[str] = []

    def drive(kind: str) -> None:
        session, feeds, expected = runs[kind]
        for _ in range(8):  # both at once: one run's job finds the pool busy and runs alone
            got = session.run(None, feeds)
            if not all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True)):
                failures.append(kind)

    threads = [threading.Thread(target=drive, args=(kind,)) for kind in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
