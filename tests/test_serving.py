"""Serving without a server (issue 33): the batch dim, one sample's checks, stacking, the bodies,
export-triton driven by a stand-in of triton_python_backend_utils, and the serve command's
refusals before Ray starts. The real Ray Serve application: tests/test_serving_ray.py."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from runtime import Session
from runtime.cli import main as runtime_main
from runtime.errors import InputError
from runtime.serving import ServingError
from runtime.serving import bodies
from runtime.serving.batching import batch_dim
from runtime.serving.batching import check_sample
from runtime.serving.batching import groups
from runtime.serving.batching import no_batch_reason
from runtime.serving.batching import run_stacked
from runtime.serving.triton import export_triton
from tests.support.serving import compile_batched
from tests.support.serving import compile_static
from tests.support.serving import compile_unsplittable

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def batched(tmp_path_factory: pytest.TempPathFactory) -> Session:
    return Session(compile_batched(tmp_path_factory.mktemp("batched") / "tiny"), threads=1)


@pytest.fixture(scope="module")
def static(tmp_path_factory: pytest.TempPathFactory) -> Session:
    return Session(compile_static(tmp_path_factory.mktemp("static") / "small"), threads=1)


def test_batch_dim_is_the_shared_leading_symbol(batched: Session, static: Session, tmp_path: Path) -> None:
    found = batch_dim(batched.inputs, batched.outputs)
    assert found is not None and (found.symbol, found.max_size) == ("batch", 8)
    assert batch_dim(static.inputs, static.outputs) is None
    assert "axis 0 of 'x' is not a dynamic dim" in str(no_batch_reason(static.inputs, static.outputs))
    summed = Session(compile_unsplittable(tmp_path / "sum"), threads=1)  # ReduceSum over the batch
    assert batch_dim(summed.inputs, summed.outputs) is None
    assert "'total'" in str(no_batch_reason(summed.inputs, summed.outputs))


@pytest.mark.parametrize(("feeds", "words"), [
    ({"x": np.ones(4, np.float32)}, ["missing input 'z'"]),
    ({"x": np.ones(4, np.float32), "z": np.ones(3, np.float32), "q": np.ones(1)}, ["unknown input", "'q'"]),
    ({"x": np.ones(4, np.float64), "z": np.ones(3, np.float32)}, ["input 'x'", "dtype float64"]),
    ({"x": np.ones((1, 4), np.float32), "z": np.ones(3, np.float32)}, ["input 'x'", "no batch axis"]),
    ({"x": np.ones(5, np.float32), "z": np.ones(3, np.float32)}, ["input 'x'", "dim 0", "is 5, expected 4"]),
])
def test_a_bad_sample_is_an_input_error_naming_the_input(batched: Session, feeds: dict, words: list) -> None:
    with pytest.raises(InputError) as caught:
        check_sample(batched.inputs, feeds)
    assert all(w in str(caught.value) for w in words), str(caught.value)


def test_stacked_runs_equal_runs_one_by_one(batched: Session) -> None:
    rng = np.random.default_rng(1)
    samples = [{"x": rng.standard_normal(4).astype(np.float32),
                "z": rng.standard_normal(3).astype(np.float32)} for _ in range(11)]
    assert groups(samples, 8) == [list(range(8)), [8, 9, 10]]
    stacked = [out for run in groups(samples, 8)
               for out in run_stacked(lambda f: batched.run(None, f), [samples[i] for i in run])]
    for sample, (y,) in zip(samples, stacked, strict=True):
        (alone,) = batched.run(None, {k: v[None] for k, v in sample.items()})
        assert y.shape == (3,) and np.array_equal(y, alone[0])


def test_samples_of_different_shapes_run_apart() -> None:
    a, b = np.zeros((2, 5)), np.zeros((2, 7))
    assert groups([{"t": a}, {"t": b}, {"t": a}], 4) == [[0, 2], [1]]
    assert groups([{"t": np.zeros((3, 5))}, {"t": np.zeros((2, 5))}], 4, batched=True) == [[0], [1]]


def test_bodies_round_trip_and_refuse_malformed_ones(batched: Session) -> None:
    feeds = bodies.decode_json(b'{"inputs": {"x": [1, 2, 3, 4], "z": [0, 0, 0]}}', batched.inputs)
    assert feeds["x"].dtype == np.float32 and feeds["x"].tolist() == [1, 2, 3, 4]
    out = {"y": np.array([1.5, np.nan], np.float32)}
    assert json.loads(bodies.encode_json(out))["outputs"]["y"][0] == 1.5
    assert np.array_equal(bodies.decode_npz(bodies.encode_npz(out))["y"], out["y"], equal_nan=True)
    assert bodies.is_npz("application/octet-stream") and not bodies.is_npz("application/json")
    for body, words in [(b"nope", "not JSON"), (b'{"x": 1}', '{"inputs"'),
                        (b'{"inputs": {"x": [[1, 2], [3]]}}', "input 'x'"),
                        (b'{"inputs": {"x": ["a"]}}', "input 'x'")]:
        with pytest.raises(InputError, match=words):
            bodies.decode_json(body, batched.inputs)
    single = io.BytesIO()
    np.save(single, np.ones(3))
    for body, words in [(b"junk", "not a zip"), (single.getvalue(), "name each input")]:
        with pytest.raises(InputError, match=words):
            bodies.decode_npz(body)


def _triton_stand_in() -> types.ModuleType:
    """What model.py uses of triton_python_backend_utils, with Triton's names and behaviour."""
    pb = types.ModuleType("triton_python_backend_utils")

    class Tensor:
        def __init__(self, name: str, array: np.ndarray) -> None:
            self._name, self._array = name, np.asarray(array)

        def name(self) -> str:
            return self._name

        def as_numpy(self) -> np.ndarray:
            return self._array

    class TritonError(Exception):
        def message(self) -> str:
            return str(self.args[0])

    class InferenceResponse:
        def __init__(self, output_tensors: list, error: TritonError | None = None) -> None:
            self.tensors, self.error = {t.name(): t for t in output_tensors}, error

    class InferenceRequest:
        def __init__(self, tensors: list) -> None:
            self.tensors = {t.name(): t for t in tensors}

    pb.Tensor, pb.TritonError, pb.InferenceResponse, pb.InferenceRequest = (  # type: ignore[attr-defined]
        Tensor, TritonError, InferenceResponse, InferenceRequest)
    pb.get_input_tensor_by_name = lambda request, name: request.tensors.get(name)  # type: ignore[attr-defined]
    pb.get_output_tensor_by_name = lambda response, name: response.tensors.get(name)  # type: ignore[attr-defined]
    return pb


def _load_model_py(path: Path, pb: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    import importlib.util

    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
    spec = importlib.util.spec_from_file_location("exported_model", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_export_triton_writes_a_repository_its_model_py_serves(batched: Session, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    repo = str(tmp_path / "repo")
    assert runtime_main(["export-triton", str(batched.path), "-o", repo, "--name", "tiny"]) == 0
    model_dir = tmp_path / "repo" / "tiny"
    config = (model_dir / "config.pbtxt").read_text()
    assert 'backend: "python"' in config and "max_batch_size: 8" in config
    assert "dims: [ 4 ]" in config and "TYPE_FP32" in config
    assert "max_queue_delay_microseconds: 5000" in config
    pb = _triton_stand_in()
    model = _load_model_py(model_dir / "1" / "model.py", pb, monkeypatch).TritonPythonModel()
    model.initialize({"model_config": json.dumps({"max_batch_size": 8}), "model_repository": str(model_dir),
                      "model_version": "1"})
    rng = np.random.default_rng(2)
    feeds = [{"x": rng.standard_normal((n, 4)).astype(np.float32),
              "z": rng.standard_normal((n, 3)).astype(np.float32)} for n in (2, 1, 3)]
    bad = {"x": np.ones((1, 5), np.float32), "z": np.ones((1, 3), np.float32)}
    requests = [pb.InferenceRequest([pb.Tensor(k, v) for k, v in f.items()]) for f in (*feeds, bad)]
    responses = model.execute(requests)
    for f, response in zip(feeds, responses, strict=False):
        assert response.error is None
        assert np.array_equal(pb.get_output_tensor_by_name(response, "y").as_numpy(), batched.run(None, f)[0])
    assert "input 'x'" in responses[3].error.message()
    model.finalize()
    with pytest.raises(ServingError, match="exists"):
        export_triton(str(batched.path), str(tmp_path / "repo"), name="tiny")


def test_export_triton_without_a_batch_dim_sets_max_batch_size_0(static: Session, tmp_path: Path) -> None:
    model_dir = export_triton(str(static.path), str(tmp_path / "repo"))
    config = (model_dir / "config.pbtxt").read_text()
    assert "max_batch_size: 0" in config and "dims: [ 1, 3, 8, 8 ]" in config
    assert "dynamic_batching" not in config


def test_serve_refuses_bad_settings_before_ray_starts(batched: Session,
                                                      capsys: pytest.CaptureFixture) -> None:
    assert runtime_main(["serve", str(batched.path), "--max-batch", "9"]) == 1
    err = capsys.readouterr().err
    assert "max batch 9" in err and "1..8" in err
    assert runtime_main(["serve", str(batched.path), "--route", "nope"]) == 1
    assert "--route nope" in capsys.readouterr().err
    from compiler.cli import main as onnx_aot_main  # the full CLI has the same command

    assert onnx_aot_main(["serve", str(batched.path), "--max-batch", "9"]) == 1
    assert "onnx-aot: error: max batch 9" in capsys.readouterr().err
    assert onnx_aot_main(["serve", str(batched.path.parent / "nothing")]) == 1
    assert "nothing" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        runtime_main(["serve", str(batched.path), "--replicas", "2", "--autoscale", "1..3"])
    with pytest.raises(SystemExit):
        runtime_main(["serve", str(batched.path), "--autoscale", "3..1"])


def test_serve_without_ray_says_how_to_install_it(batched: Session) -> None:
    script = (f"import sys; sys.modules['ray'] = None; sys.path.insert(0, {str(REPO)!r}); "
              f"from runtime.cli import main; sys.exit(main(['serve', {str(batched.path)!r}]))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "onnx-aot: error: serving needs Ray Serve" in done.stderr and "[serve]" in done.stderr


def test_the_cli_and_the_runtime_import_no_ray() -> None:
    script = (f"import sys; sys.path.insert(0, {str(REPO)!r}); import runtime, runtime.cli; "
              f"import runtime.serving.cli, runtime.serving.batching, runtime.serving.triton; "
              f"print([m for m in sys.modules if m.split('.')[0] in ('ray', 'starlette')])")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


def test_default_threads_share_the_cores_among_the_replicas(batched: Session) -> None:
    from runtime.serving.app import ServeSettings
    from runtime.serving.app import default_threads

    folder = str(batched.path)
    assert default_threads(ServeSettings(folder, replicas=2), cpus=8) == 4
    assert default_threads(ServeSettings(folder, autoscale=(1, 3)), cpus=8) == 2
    assert default_threads(ServeSettings(folder, replicas=4), cpus=2) == 1
    assert default_threads(ServeSettings(folder, replicas=4, threads=3), cpus=2) == 3


def test_the_ingress_modes_set_ray_serves_variables_and_leave_the_callers(
        batched: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime.serving.app import ServeSettings
    from runtime.serving.app import check_settings
    from runtime.serving.ingress import ingress_environment
    from runtime.serving.ingress import ray_environment

    monkeypatch.delenv("RAY_SERVE_ENABLE_DIRECT_INGRESS", raising=False)
    monkeypatch.setenv("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "7")
    assert ingress_environment("direct") == {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
                                             "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "7"}
    assert ingress_environment("proxy") == {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "0"}
    with ray_environment(ingress_environment("direct")):
        assert os.environ["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "1"
    assert "RAY_SERVE_ENABLE_DIRECT_INGRESS" not in os.environ
    assert os.environ["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"] == "7"
    with pytest.raises(ServingError, match="--ingress sideways: give one of direct, proxy"):
        check_settings(ServeSettings(str(batched.path), ingress="sideways"))
    with pytest.raises(SystemExit):
        runtime_main(["serve", str(batched.path), "--ingress", "sideways"])


def test_replica_urls_warns_naming_the_app_where_the_controller_cannot_be_asked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ray = pytest.importorskip("ray", reason="ray[serve] is the serving extra; not installed here")
    from runtime.serving.ingress import replica_urls

    def no_controller(name: str, namespace: str | None = None) -> None:
        raise ValueError(f"Failed to look up actor with name '{name}'")

    monkeypatch.setattr(ray, "get_actor", no_controller)
    with pytest.warns(RuntimeWarning, match=r"tiny: could not list the replicas' own URLs .*"
                                            r"ValueError: Failed to look up actor"):
        assert replica_urls("tiny", "/") == []
