"""onnx-aot's deploy-time runtime: load a compiled artifact folder and run it.

Needs numpy only (cupy, lazily, for CUDA artifacts). It never imports the compiler, onnx,
networkx or jinja2. The import name is ``runtime``; the distribution is ``onnx-aot``.
"""

from __future__ import annotations

from runtime.errors import (
    ArtifactError,
    InputError,
    OnnxAotError,
)
from runtime.session import Session, TensorSpec

__version__ = "0.1.0"

__all__ = ["Session", "TensorSpec", "OnnxAotError", "ArtifactError", "InputError", "__version__"]
