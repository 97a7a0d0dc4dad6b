"""``export-triton DIR -o MODEL_REPO``: a Triton Inference Server Python-backend model repository.

Writes ``MODEL_REPO/NAME/config.pbtxt`` (``backend: "python"``, the inputs and outputs with
Triton's data types and dims, ``-1`` for a dynamic one) and ``MODEL_REPO/NAME/1/`` holding
``model.py`` (``runtime/serving/triton_model.py``: ``TritonPythonModel`` running the artifact with
``runtime.Session``) and a copy of the artifact folder (``1/artifact``). An artifact with a batch
dim (``runtime/serving/batching.py``) gets ``max_batch_size`` = the top of its batch range, dims
without the batch axis and ``dynamic_batching``: Triton gathers requests, the model runs them
stacked; without one, ``max_batch_size: 0`` and the full dims. Triton's Python environment needs
``onnx-aot-runtime`` (numpy) installed.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from runtime.serving import ServingError
from runtime.serving.batching import batching_of

__all__ = ["export_triton", "config_text", "TRITON_TYPES"]

TRITON_TYPES = {
    "bool": "TYPE_BOOL", "uint8": "TYPE_UINT8", "uint16": "TYPE_UINT16", "uint32": "TYPE_UINT32",
    "uint64": "TYPE_UINT64", "int8": "TYPE_INT8", "int16": "TYPE_INT16", "int32": "TYPE_INT32",
    "int64": "TYPE_INT64", "float16": "TYPE_FP16", "float32": "TYPE_FP32", "float64": "TYPE_FP64",
}
MODEL_SOURCE = Path(__file__).with_name("triton_model.py")


def _tensor(spec: Any, skip_batch: bool, where: str) -> str:
    dtype = np.dtype(spec.dtype).name
    if dtype not in TRITON_TYPES:
        raise ServingError(f"{where}: {spec.name!r} is {dtype}, which Triton has no type for")
    dims = list(spec.shape)[1 if skip_batch else 0:]
    text = ", ".join("-1" if d is None else str(d) for d in dims)
    return f'  {{\n    name: "{spec.name}"\n    data_type: {TRITON_TYPES[dtype]}\n    dims: [ {text} ]\n  }}'


def config_text(name: str, inputs: Any, outputs: Any, max_batch: int, queue_delay_us: int,
                instances: int, where: str) -> str:
    """The ``config.pbtxt`` of the model (``max_batch`` 0: no batch dim, no dynamic batching)."""
    batched = max_batch > 0
    parts = [f'name: "{name}"', 'backend: "python"', f"max_batch_size: {max_batch}",
             "input [\n" + ",\n".join(_tensor(s, batched, where) for s in inputs) + "\n]",
             "output [\n" + ",\n".join(_tensor(s, batched, where) for s in outputs) + "\n]"]
    if batched:
        parts.append(f"dynamic_batching {{\n  max_queue_delay_microseconds: {queue_delay_us}\n}}")
    parts.append(f"instance_group [\n  {{\n    count: {instances}\n    kind: KIND_CPU\n  }}\n]")
    return "\n".join(parts) + "\n"


def export_triton(folder: str, repo: str, *, name: str | None = None, max_batch: int | None = None,
                  queue_delay_us: int = 5000, instances: int = 1) -> Path:
    """Write the model repository entry of ``folder`` into ``repo``; returns the model's folder."""
    from runtime.plan_info import load_plan

    plan = load_plan(folder)  # ArtifactError when the folder is no artifact
    model_name = name or re.sub(r"[^A-Za-z0-9_.-]", "_", Path(folder).resolve().name)
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", model_name):
        raise ServingError(f"--name {model_name!r}: a Triton model name uses letters, digits, '_', '.', '-'")
    batch, largest, _ = batching_of(plan.inputs, plan.outputs, max_batch, folder)
    target = Path(repo) / model_name
    if target.exists():
        raise ServingError(f"{target} exists; remove it or give another --name")
    text = config_text(model_name, plan.inputs, plan.outputs, largest if batch is not None else 0,
                       queue_delay_us, instances, folder)
    version = target / "1"
    version.mkdir(parents=True)
    shutil.copytree(folder, version / "artifact")
    shutil.copyfile(MODEL_SOURCE, version / "model.py")
    (target / "config.pbtxt").write_text(text, encoding="utf-8")
    return target
