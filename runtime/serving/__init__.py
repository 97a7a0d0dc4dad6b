"""Serving compiled artifacts on Ray Serve (issue 33; docs/serving.md).

``runtime.serving.deployment.ArtifactModel`` is a Ray Serve deployment that loads one artifact
folder per replica and batches one-sample requests over the artifact's batch dim
(``runtime/serving/batching.py``); ``runtime.serving.app`` builds and runs the application (what
``onnx-aot serve`` / ``python -m runtime serve`` call); ``runtime.serving.triton`` writes a Triton
Python-backend model repository. Only this package imports Ray, and only when serving: the
deploy-only install stays numpy-only, and ``pip install 'onnx-aot-runtime[serve]'`` (or
``onnx-aot[serve]``) adds Ray Serve.
"""

from __future__ import annotations

from typing import Any

from runtime.errors import OnnxAotError

__all__ = ["ServingError", "require_ray"]

class ServingError(OnnxAotError):
    """Serving cannot start: Ray Serve is not installed, a setting is out of range, or the artifact
    does not allow what the settings ask (``--max-batch`` past its batch range)."""


def require_ray() -> Any:
    """``ray.serve``, or a ``ServingError`` saying how to install it."""
    try:
        from ray import serve
    except ImportError as exc:
        raise ServingError(f"serving needs Ray Serve, which is not importable here ({exc}); install the "
                           f"'serve' extra: pip install 'onnx-aot-runtime[serve]' (or 'onnx-aot[serve]')"
                           ) from None
    return serve
