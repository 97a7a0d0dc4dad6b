"""onnx-aot's deploy-time runtime: load a compiled artifact folder and run it.

Needs numpy only (cupy, lazily, for CUDA artifacts). It never imports the compiler, onnx,
networkx or jinja2. The import name is ``runtime``; the distribution is ``onnx-aot``.
"""

from __future__ import annotations

from runtime.errors import (
    ArtifactError,
    ConcurrentRunError,
    InputError,
    OnnxAotError,
)
from runtime.io_binding import IOBinding
from runtime.plan_info import PlanInfo, load_plan
from runtime.session import Session, TensorSpec
from runtime.shared_arena import SharedArena

__version__ = "0.1.0"

__all__ = ["Session", "TensorSpec", "PlanInfo", "load_plan", "SharedArena", "IOBinding",
           "OnnxAotError", "ArtifactError", "InputError", "ConcurrentRunError", "__version__"]
