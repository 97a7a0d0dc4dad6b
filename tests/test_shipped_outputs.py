"""The light models as shipped (ConstantOfShape weights) reproduce their shipped outputs.

Inputs are made exactly as onnx's own backend test runner makes them for these models
(``Runner.generate_dummy_data(..., random=False)``); tolerances are the runner's (rtol 1e-3,
2e-3 for DenseNet; atol 1e-7).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from onnx.backend.test.runner import Runner

from compiler import compile_model
from runtime import Session
from tests.support.zoo import LIGHT_DIR
from tests.support.zoo import ZOO

RTOL = {"densenet121": 2e-3}


@pytest.mark.parametrize("name", ZOO)
def test_shipped_model_matches_shipped_output(tmp_path, name: str) -> None:
    path = LIGHT_DIR / f"light_{name}.onnx"
    model = onnx.load(str(path))
    inits = {t.name for t in model.graph.initializer}
    feeds = {i.name: Runner.generate_dummy_data(i, seed=0, random=False)
             for i in model.graph.input if i.name not in inits}
    session = Session(compile_model(path, tmp_path / name))
    got = session.run(None, feeds)[0]
    want = numpy_helper.to_array(onnx.load_tensor(str(LIGHT_DIR / f"light_{name}_output_0.pb")))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=RTOL.get(name, 1e-3), atol=1e-7)
