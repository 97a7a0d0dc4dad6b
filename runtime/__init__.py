"""onnx-aot's deploy-time runtime: load a compiled artifact folder and run it.

Needs numpy only (cupy, lazily, for CUDA artifacts). It never imports the compiler, onnx,
networkx or jinja2. The import name is ``runtime``; the distribution is ``onnx-aot``.
"""

from __future__ import annotations

from runtime.errors import ArtifactError
from runtime.errors import ConcurrentRunError
from runtime.errors import InputError
from runtime.errors import OnnxAotError
from runtime.io_binding import IOBinding
from runtime.memory import MemorySpace
from runtime.memory import register_space_factory
from runtime.plan_info import PlanInfo
from runtime.plan_info import load_plan
from runtime.plan_schema import TensorSpec
from runtime.session import Session
from runtime.shared_arena import SharedArena

__version__ = "0.1.0"


def _cuda_space() -> MemorySpace:
    """The "cuda" memory space (cupy is imported on first use), made when a plan first names it."""
    from runtime.providers.cuda import CudaSpace

    return CudaSpace()


register_space_factory("cuda", _cuda_space)

__all__ = ["Session", "TensorSpec", "PlanInfo", "load_plan", "SharedArena", "IOBinding",
           "OnnxAotError", "ArtifactError", "InputError", "ConcurrentRunError", "__version__"]
