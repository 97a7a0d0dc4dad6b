"""Shared fixtures: the random-weight zoo compiled once per test session, onnxruntime reference."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest

from runtime.isa import TEST_FLAGS_ENV
from runtime.isa import host_x86_level
from tests.cpu_targets import LEVELS
from tests.cpu_targets import features_of
from tests.support.zoo import dummy_input
from tests.support.zoo import zoo_model


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--host-cpu",
        choices=LEVELS,
        default=None,
        help="run the suite as on a host of this x86-64 level (at most the real one): default "
        "builds, the runtime's choice of build and the tests' run/compile-only choices all "
        "follow it (sets the test-only $ONNX_AOT_TEST_CPU_FLAGS, subprocesses included)",
    )


def pytest_configure(config: pytest.Config) -> None:
    level = config.getoption("--host-cpu")
    if level is None:
        return
    real = host_x86_level()
    if real is None or LEVELS.index(level) > LEVELS.index(real):
        raise pytest.UsageError(
            f"--host-cpu {level}: this host is {real or 'not x86-64'}; "
            "a level above the real one would run instructions it lacks"
        )
    os.environ[TEST_FLAGS_ENV] = features_of(level)


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
