"""Shared fixtures: the random-weight zoo compiled once per test session, onnxruntime reference."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from zoo import dummy_input, zoo_model  # noqa: E402


def ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run ``model`` with onnxruntime's CPU provider (the whole-model oracle)."""
    import onnxruntime as ort
    from zoo import for_onnxruntime

    m = for_onnxruntime(model)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


class ZooCache:
    """Compiles each zoo model at most once per session."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.models: dict[str, onnx.ModelProto] = {}
        self.paths: dict[str, Path] = {}

    def model(self, name: str) -> onnx.ModelProto:
        if name not in self.models:
            self.models[name] = zoo_model(name)
        return self.models[name]

    def artifact(self, name: str) -> Path:
        if name not in self.paths:
            from compiler import compile_model

            self.paths[name] = compile_model(self.model(name), self.root / name)
        return self.paths[name]

    def feeds(self, name: str, seed: int = 0) -> dict[str, np.ndarray]:
        return dummy_input(self.model(name), seed)


@pytest.fixture(scope="session")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> ZooCache:
    return ZooCache(tmp_path_factory.mktemp("zoo"))
