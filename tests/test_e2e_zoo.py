"""End to end on the nine light-zoo architectures with seeded random weights.

Each model is compiled with the default providers (C, then reference), run by the runtime, and
compared with onnxruntime on the logits (the final Softmax is cut: it saturates) within
rtol 1e-3 / atol 1e-4. Every Conv, Gemm and pooling node of the ONNX model must be run by the C
provider, and the outputs must be finite and change with the input.
"""

from __future__ import annotations

import numpy as np
import pytest

from runtime import Session
from tests.support.models import ort_run
from tests.support.zoo import ZOO

C_OPS = {"Conv", "Gemm", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"}


@pytest.mark.parametrize("name", ZOO)
def test_zoo_matches_onnxruntime(zoo, name: str) -> None:
    model = zoo.model(name)
    session = Session(zoo.artifact(name))
    feeds = zoo.feeds(name, seed=0)
    ours = session.run(None, feeds)
    ref = ort_run(model, feeds)
    assert len(ours) == len(ref)
    for got, want in zip(ours, ref, strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
    other = session.run(None, zoo.feeds(name, seed=1))
    assert not np.allclose(other[0], ours[0], rtol=1e-5, atol=1e-6), "output ignores the input"


@pytest.mark.parametrize("name", ZOO)
def test_zoo_compute_nodes_run_in_c(zoo, name: str) -> None:
    model = zoo.model(name)
    plan = Session(zoo.artifact(name)).plan.to_json()
    onnx_nodes = plan["onnx_nodes"]
    checked = 0
    for k, node in enumerate(model.graph.node):
        if node.op_type not in C_OPS:
            continue
        name_in_plan = node.name or f"{node.op_type}_{k}"
        record = onnx_nodes.get(name_in_plan)
        assert record is not None, f"{name_in_plan} missing from plan.json's onnx_nodes"
        assert record.get("provider") == "c", f"{name_in_plan} ({node.op_type}) ran on {record}"
        checked += 1
    assert checked > 0
    # every original ONNX node is accounted for: run by a provider, or eliminated with a reason
    for k, node in enumerate(model.graph.node):
        record = onnx_nodes.get(node.name or f"{node.op_type}_{k}")
        assert record is not None, f"{node.name} ({node.op_type}) missing from plan.json"
        assert "provider" in record or record.get("eliminated"), record
    # every step of plan.json names its ONNX origin nodes and a provider
    for step in plan["steps"]:
        assert step["provider"] in ("c", "reference")


@pytest.mark.parametrize("name", ["squeezenet", "resnet50", "densenet121"])
def test_zoo_plan_has_no_overlapping_live_buffers(zoo, name: str) -> None:
    from compiler.memory import Buffer
    from compiler.memory import MemoryPlan
    from compiler.memory import verify_plan

    plan = Session(zoo.artifact(name)).plan.to_json()
    for arena in plan["arenas"]:
        records = [b for b in plan["buffers"] if b["arena"] == arena["memory_space"]]
        buffers = [Buffer(b["id"], b["nbytes"], b["first_step"], b["last_step"]) for b in records]
        mplan = MemoryPlan({b["id"]: b["offset"] for b in records}, arena["nbytes"],
                           arena["lower_bound_nbytes"], arena["naive_nbytes"], arena["strategy"])
        verify_plan(buffers, mplan, arena["alignment"])
        assert arena["lower_bound_nbytes"] <= arena["nbytes"] <= arena["naive_nbytes"]
