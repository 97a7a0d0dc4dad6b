"""The YOLOv8n-style detector of issues 17 and 19 (``tests/support/yolo_model.py``): it is YOLOv8n
(Ultralytics' parameter count, the ops its export has), onnx-aot matches onnxruntime on the static
export at two sizes and on the dynamic export compiled at one shape, and the dynamic export imports
with ranged image dims, every value's shape the static import's at each size.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

from compiler.driver import compile_model
from compiler.frontend.importer import import_model
from compiler.ir.graph import Graph
from runtime.session import Session
from runtime.symbolic import evaluate
from runtime.symbolic import sym
from tests.support.commands import REPO
from tests.support.models import ort_run
from tests.support.yolo_model import STRIDES
from tests.support.yolo_model import yolov8n_input
from tests.support.yolo_model import yolov8n_model

RANGES = {"images": ((1, 8), 3, (320, 640), (320, 640))}
# the static export's nodes: 57 Conv + SiLU (Sigmoid, Mul), the head's six last convs and the DFL's
STATIC_OPS = {"Conv": 64, "Sigmoid": 58, "Mul": 58, "Constant": 22, "Concat": 19, "Split": 9, "Add": 8,
              "Reshape": 5, "MaxPool": 3, "Resize": 2, "Slice": 2, "Sub": 2, "Transpose": 1, "Softmax": 1,
              "Div": 1}


def _anchors(height: int, width: int) -> int:
    return sum((height // s) * (width // s) for s in STRIDES)


def _compare(model: onnx.ModelProto, feeds: dict[str, np.ndarray], out_dir: Path) -> None:
    out = compile_model(model, out_dir, golden_cases=0,
                        shapes={"images": feeds["images"].shape})
    plan = json.loads((out / "plan.json").read_text())
    assert {s["provider"] for s in plan["steps"]} == {"c"}
    (got,) = Session(out).run(None, feeds)
    (want,) = ort_run(model, feeds)
    b, _, h, w = feeds["images"].shape
    assert got.shape == want.shape == (b, 84, _anchors(h, w))
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)


def test_the_model_is_yolov8n_as_exported() -> None:
    static = yolov8n_model()
    weights = [t for t in static.graph.initializer if t.name.startswith("model.")]
    assert sum(int(np.prod(t.dims)) for t in weights) == 3_151_904  # Ultralytics' fused YOLOv8n
    assert Counter(n.op_type for n in static.graph.node) == STATIC_OPS
    grid = {t.name: t.dims for t in static.graph.initializer if not t.name.startswith("model.")}
    assert grid == {"/model.22/anchors": [1, 2, 2100], "/model.22/strides": [1, 2100]}
    dynamic = yolov8n_model(dynamic=True)
    kinds = Counter(n.op_type for n in dynamic.graph.node)
    assert kinds["Range"] == kinds["Expand"] == 6 and kinds["ConstantOfShape"] == 3  # make_anchors traced
    assert kinds["Shape"] == 16 and not set(kinds) - {*STATIC_OPS, "Shape", "Gather", "Unsqueeze", "Cast",
                                                       "Range", "Expand", "ConstantOfShape"}
    dims = [d.dim_param or d.dim_value for d in dynamic.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", 3, "height", "width"]
    with pytest.raises(ValueError, match="multiples of 32"):
        yolov8n_model(height=300)


def test_the_dynamic_export_computes_the_static_export_s_grids() -> None:
    feeds = yolov8n_input(yolov8n_model(dynamic=True), 2, 256, 384, seed=1)
    (dynamic,) = ort_run(yolov8n_model(dynamic=True), feeds)
    (static,) = ort_run(yolov8n_model(height=256, width=384, batch=2), feeds)
    np.testing.assert_allclose(dynamic, static, rtol=1e-6, atol=1e-6)
    centers = dynamic[0, :2]
    assert 0 < centers.mean() < 384 and np.ptp(dynamic[0, 4:]) > 0.5  # boxes on the image, scores vary


@pytest.mark.parametrize(("height", "width"), [(320, 320), (256, 384)])
def test_static_export_matches_onnxruntime(height: int, width: int, tmp_path: Path) -> None:
    model = yolov8n_model(height=height, width=width)
    _compare(model, yolov8n_input(model, 1, height, width, seed=2), tmp_path / "yolo")


def test_dynamic_export_compiled_at_one_shape_matches_onnxruntime(tmp_path: Path) -> None:
    """The anchor grids computed in the graph (Shape, Range, meshgrid) fold at a fixed shape."""
    model = yolov8n_model(dynamic=True)
    _compare(model, yolov8n_input(model, 1, 256, 384, seed=3), tmp_path / "yolo")


def _node_shapes(graph: Graph) -> dict[str, tuple[object, ...]]:
    return {v.name: v.shape for n in graph.nodes for v in n.outputs if v is not None and v.shape is not None}


@pytest.mark.parametrize(("batch", "height", "width"), [(1, 320, 640), (8, 640, 320), (3, 480, 416)])
def test_dynamic_export_imports_with_ranged_image_dims(batch: int, height: int, width: int) -> None:
    model = yolov8n_model(dynamic=True)
    dynamic = import_model(model, RANGES)
    assert dynamic.symbols == {"batch": (1, 8), "height": (320, 640), "width": (320, 640)}
    assert dynamic.inputs[0].shape == (sym("batch"), 3, sym("height"), sym("width"))
    bound = {"batch": batch, "height": height, "width": width}
    assert tuple(evaluate(d, bound) for d in dynamic.outputs[0].shape) == (batch, 84, _anchors(height, width))
    static = import_model(model, {"images": (batch, 3, height, width)})
    # the static import folds make_anchors into constants; the dynamic one keeps those nodes (their
    # inputs are symbols only) and has every other node of the static import, at the same shapes
    names = {n.name for n in static.nodes}
    assert names <= {n.name for n in dynamic.nodes}
    kept = Counter(n.kind for n in dynamic.nodes if n.name not in names)
    assert kept == {"Reshape": 22, "Range": 6, "Add": 6, "Expand": 6, "Concat": 5, "ConstantOfShape": 3,
                    "Transpose": 2}
    shapes = _node_shapes(dynamic)
    symbolic = 0
    for name, shape in _node_shapes(static).items():
        assert tuple(evaluate(d, bound) for d in shapes[name]) == shape, name
        symbolic += shape != shapes[name]
    assert symbolic > 200
    # the upsampled maps concatenated with the backbone's: equal at the multiples of 32 the model takes
    assert sorted({name for name, *_ in dynamic.assumptions}) == ["/model.11/Concat", "/model.14/Concat"]


def test_bench_yolo_script_smoke() -> None:
    command = [sys.executable, "-m", "scripts.bench_yolo", "--smoke", "--threads", "1"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "threads 1: onnx-aot" in result.stdout and "ratio" in result.stdout
    assert "(within rtol 0.001 / atol 0.0001)" in result.stdout
