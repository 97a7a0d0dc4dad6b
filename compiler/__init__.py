"""onnx-aot's offline compiler: ONNX model -> artifact folder (plan, weights, kernels, report).

The import name is ``compiler``; the distribution is ``onnx-aot``. ``compile_model`` is the entry
point; ``python -m compiler`` (or ``onnx-aot``) is the command line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any

from compiler.version import __version__

if TYPE_CHECKING:
    from compiler.driver import compile_model

__all__ = ["compile_model", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "compile_model":
        from compiler.driver import compile_model

        return compile_model
    raise AttributeError(name)
