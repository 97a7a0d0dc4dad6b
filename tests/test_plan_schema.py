"""plan.json's typed records (``runtime/plan_schema.py``): what the compiler writes reads back into
the same records and serializes to the same bytes, and a broken plan names the file and the field.

The cases the runtime's old hand-written checks rejected (``runtime/plan_check.py``, removed) are in
``test_integrity.py::test_malformed_but_rehashed_plan_is_an_artifact_error``, through a whole load.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from compiler import compile_model
from compiler.artifact.writer import dump_json
from compiler.codegen.options import BuildOptions
from runtime.errors import ArtifactError
from runtime.json_fields import Where
from runtime.json_fields import optional_json
from runtime.plan_schema import FORMAT_VERSION
from runtime.plan_schema import OLDEST_FORMAT_VERSION
from runtime.plan_schema import Plan
from runtime.plan_schema import ValueLocation
from tests.support.models import small_model


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("schema")
    return {
        "cpu": compile_model(small_model(), root / "cpu", golden_cases=0),
        "cuda": compile_model(small_model(), root / "cuda", target="cuda", golden_cases=0,
                              build=BuildOptions(extra={"nvcc": "none"})),
    }


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_a_compiled_plan_round_trips_to_the_same_bytes(plans: dict[str, Path], target: str) -> None:
    raw = (plans[target] / "plan.json").read_bytes()
    plan = Plan.from_json(json.loads(raw))
    assert dump_json(plan.to_json()) == raw
    assert Plan.from_json(plan.to_json()) == plan
    assert plan.format_version == OLDEST_FORMAT_VERSION  # no narrow weights: the version older runtimes read
    runners = {p.runner for p in plan.partitions}
    if target == "cpu":
        assert runners == {"c"} and all(p.library for p in plan.partitions)
        assert all(s.launches is None for s in plan.steps)
    else:
        assert runners == {"cuda"} and all(p.module is not None for p in plan.partitions)
        assert all(s.launches is not None for s in plan.steps)
        args = [a for s in plan.steps for launch in s.launches or () for a in launch.args]
        assert args and all(a.kind == "ptr" or a.kind in ("i32", "i64", "f32") for a in args)


def test_records_give_attributes_the_runtime_uses(plans: dict[str, Path]) -> None:
    plan = Plan.from_json(json.loads((plans["cpu"] / "plan.json").read_text()))
    (x,) = plan.inputs
    assert (x.name, x.dtype.name, x.shape, x.nbytes) == ("x", "float32", (1, 3, 8, 8), 768)
    assert plan.output_specs[0].shape == (1, 10) and plan.outputs[0].value in plan.values
    (part,) = plan.partitions
    assert plan.partition_steps(part) == plan.steps and list(part.step_range) == list(range(len(plan.steps)))
    assert plan.values["x"].location == ValueLocation("ext", ext="x")
    arena = plan.arena("host")
    assert arena is not None and arena.nbytes > 0 and plan.arena("cuda") is None
    assert {n.step for n in plan.onnx_nodes.values() if n.eliminated is None} <= set(range(len(plan.steps)))


def _broken(plan: dict[str, Any], change: Any) -> dict[str, Any]:
    data = copy.deepcopy(plan)
    change(data)
    return data


def _first_launch(p: dict[str, Any]) -> dict[str, Any]:
    return next(s for s in p["steps"] if s.get("launches"))["launches"][0]


# (what, change, the message: the field's path)
BROKEN = [
    ("not an object", lambda p: p.clear() or p.update(format_version=FORMAT_VERSION, inputs=[]),
     "values is missing"),
    ("name", lambda p: p.update(name=3), "name must be a string"),
    ("constant dtype", lambda p: p["constants"][0].update(dtype="complex7"), r"constants\[0\]\.dtype"),
    ("weights size", lambda p: p.update(weights_nbytes=-3), "weights_nbytes must be an integer >= 0"),
    ("alignment", lambda p: p["arenas"][0].update(alignment=0), r"arenas\[0\]\.alignment must be a positive"),
    ("buffer values", lambda p: p["buffers"][0].update(values="a"), r"buffers\[0\]\.values must be a list"),
    ("value shape", lambda p: p["values"]["x"].update(shape=[1, -3]), r"values\['x'\]\.shape"),
    ("value location", lambda p: p["values"]["x"].update(location=["ext", 4]), r"values\['x'\]\.location"),
    ("step attrs", lambda p: p["steps"][0].update(attrs=[]), r"steps\[0\]\.attrs must be an object"),
    ("step scratch", lambda p: p["steps"][0].update(scratch={"offset": 0}),
     r"steps\[0\]\.scratch\.nbytes is missing"),
    ("step operand", lambda p: p["steps"][0].update(inputs=["nowhere"]), r"steps\[0\] names value 'nowhere'"),
    ("step outputs", lambda p: p["steps"][0].update(outputs=[None]), r"steps\[0\]\.outputs"),
    ("partition range", lambda p: p["partitions"][0].update(last_step=999),
     r"partitions\[0\] covers steps"),
    ("partition index", lambda p: p["partitions"][0].update(index=1), r"partitions\[0\]\.index must be 0"),
    ("onnx node", lambda p: p["onnx_nodes"].update(conv={"provider": "c"}),
     r"onnx_nodes\['conv'\]\.partition"),
]


@pytest.mark.parametrize("what,change,message", BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_plan_names_the_file_and_the_field(plans: dict[str, Path], what: str, change: Any,
                                                    message: str) -> None:
    plan = json.loads((plans["cpu"] / "plan.json").read_text())
    with pytest.raises(ArtifactError, match=message) as info:
        Plan.from_json(_broken(plan, change), "art/plan.json")
    assert str(info.value).startswith("art/plan.json: ")


CUDA_BROKEN = [
    ("module", lambda p: p["partitions"][0].pop("module"), r"partitions\[0\]\.module is missing"),
    ("cubins", lambda p: p["partitions"][0]["module"].update(cubins=[]), r"module\.cubins must be an object"),
    ("kernel", lambda p: _first_launch(p).update(kernel=""), r"launches\[0\]\.kernel is empty"),
    ("block", lambda p: _first_launch(p).update(block=[1, 1, 1, 1]), r"launches\[0\]\.block must be 1-3"),
    ("shared", lambda p: _first_launch(p).update(shared=-1), r"launches\[0\]\.shared"),
    ("arg", lambda p: _first_launch(p)["args"].append(["f32", "one"]), r"args\[\d+\] is an unknown argument"),
]


@pytest.mark.parametrize("what,change,message", CUDA_BROKEN, ids=[b[0] for b in CUDA_BROKEN])
def test_a_broken_cuda_plan_names_the_field(plans: dict[str, Path], what: str, change: Any,
                                            message: str) -> None:
    plan = json.loads((plans["cuda"] / "plan.json").read_text())
    with pytest.raises(ArtifactError, match=message):
        Plan.from_json(_broken(plan, change))


def test_where_names_nested_fields() -> None:
    where = Where("a/plan.json").key("values").item("x").key("shape")
    assert str(where.wrong("a list", 3)) == "a/plan.json: values['x'].shape must be a list, got 3"
    assert str(Where().key("steps").item(2).error("is missing")) == "plan.json: steps[2] is missing"


def test_optional_json_leaves_out_what_is_not_set() -> None:
    at = ValueLocation("arena", 64)  # a record: written by its to_json; a tuple of them as a list
    assert optional_json(a=None, b=0, c="", d=(), e=(at,), f=at) == {
        "b": 0, "c": "", "d": [], "e": [["arena", 64, "host"]], "f": ["arena", 64, "host"]}
    assert list(optional_json(z=1, y=None, x=2)) == ["z", "x"]  # in the order given
