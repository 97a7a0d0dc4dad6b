"""Realistic inputs for the pinned real models (``scripts/fetch_models.py``) and their comparison
with onnxruntime.

Inputs are synthesized, seeded, and prepared the way the shipping project prepares real data:
- ``document-page``: a white page with dark text-like strokes (lines of "words" of 2-4 stroke
  glyphs, slightly blurred like a scan), resized and normalized as PaddleOCR does ((x/255-0.5)/0.5);
- ``text-line``: a crop of one printed line (digits and a few letters in seven-segment strokes, which
  the recognizer reads as characters), resized to the model's height keeping its aspect ratio,
  normalized the same way, zero-padded on the right (PaddleOCR's rec/cls preprocessing);
- ``layout-page`` / ``photo-crop``: a page with text blocks, a table and a figure, resized (layout)
  or resized to a short side of 256 and centre-cropped (orientation), ImageNet mean/std;
- ``vad-context``: a speech-like signal (harmonics of a gliding pitch shaped by formants, syllable
  envelopes and pauses, plus noise; float32 in [-1, 1]) in 30 chunks of 512 samples, each prefixed
  with the previous chunk's last 64 samples as Silero's own wrapper does (1x576), streamed with the
  model's state carried from each run to the next (each engine carries its own state);
- ``vad-stream``: the same 30 chunks of 512 samples without the context (the issue's 1x512 form);
- ``vad-sequence``: the same 30 frames of 64 + 512 samples, in three blocks of ten, LSTM h/c carried;
- ``file-bytes``: Magika's features (first and last 1024 bytes, whitespace-stripped, padded with
  256) of three files of this repository (Python, TOML, Markdown);
- ``log-mel``: Whisper's log-mel features of 3, 6 and 10 s of speech-like audio (left-padded with
  silence to 8 s, or its last 8 s), as Pipecat's Smart Turn computes them.

``compare`` runs both engines on every step and checks every output (rtol 1e-3, atol 1e-4 unless
the model's entry says otherwise); ``survey`` is the table behind ``python -m scripts.fetch_models
--survey``. The model records are ``scripts.fetch_models.RealModel`` objects (not imported here:
the script imports this module).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterable
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any
from typing import Protocol

import numpy as np

from tests.support.commands import REPO
from tests.support.range_feeds import feeds_at
from tests.support.synthetic import document_page
from tests.support.synthetic import imagenet_normalize
from tests.support.synthetic import magika_features
from tests.support.synthetic import orientation_input
from tests.support.synthetic import paddle_normalize
from tests.support.synthetic import resize_bilinear
from tests.support.synthetic import speech_like
from tests.support.synthetic import text_line
from tests.support.synthetic import text_line_input
from tests.support.synthetic import whisper_log_mel

__all__ = ["RTOL", "ATOL", "VAD_CHUNKS", "Comparison", "CompileCache", "compare", "document_page",
           "feeds_for", "speech_like", "survey"]

RTOL = 1e-3
ATOL = 1e-4
VAD_CHUNKS = 30
CHUNK = 512
CONTEXT = 64


class ModelSpec(Protocol):
    """What this module reads of ``scripts.fetch_models.RealModel``."""

    @property
    def name(self) -> str: ...

    @property
    def feed(self) -> str: ...

    @property
    def shape_options(self) -> dict[str, tuple[int, ...]]: ...

    @property
    def bind_options(self) -> dict[str, int]: ...

    @property
    def tolerance(self) -> tuple[float, float]: ...


# -- feeds per kind ----------------------------------------------------------------------------

@dataclass
class Feeds:
    """What a model is run on: one step per entry of ``steps`` (the inputs not carried), with each
    output named in ``carry`` fed back as its input on the next step (first values in ``state``);
    ``chunks``: the audio chunks or images these steps cover."""

    steps: list[dict[str, np.ndarray]]
    state: dict[str, np.ndarray] = field(default_factory=dict)
    carry: dict[str, str] = field(default_factory=dict)
    chunks: int = 0


def _frames(audio: np.ndarray) -> np.ndarray:
    """30 frames of the previous frame's last 64 samples + 512 new ones (zeros before the first)."""
    chunks = audio.reshape(VAD_CHUNKS, CHUNK)
    context = np.zeros((VAD_CHUNKS, CONTEXT), np.float32)
    context[1:] = chunks[:-1, -CONTEXT:]
    return np.concatenate([context, chunks], axis=1)


def _vad_feeds(kind: str, shapes: Mapping[str, tuple[int, ...]]) -> Feeds:
    audio = speech_like(VAD_CHUNKS * CHUNK, seed=1)
    if kind == "vad-stream":
        steps = [{"input": c[None]} for c in audio.reshape(VAD_CHUNKS, CHUNK)]
        return Feeds(steps, {"state": np.zeros((2, 1, 128), np.float32)}, {"stateN": "state"}, VAD_CHUNKS)
    frames = _frames(audio)
    if kind == "vad-context":
        steps = [{"input": f[None]} for f in frames]
        return Feeds(steps, {"state": np.zeros((2, 1, 128), np.float32)}, {"stateN": "state"}, VAD_CHUNKS)
    block = shapes["input"][0]
    steps = [{"input": frames[i:i + block]} for i in range(0, VAD_CHUNKS, block)]
    zeros = np.zeros((1, 1, 128), np.float32)
    return Feeds(steps, {"h": zeros, "c": zeros.copy()}, {"hn": "h", "cn": "c"}, VAD_CHUNKS)


def feeds_for(model: ModelSpec) -> Feeds:
    """The realistic input of ``model`` (its ``feed`` kind at its ``--shape`` sizes)."""
    shapes = model.shape_options
    kind = model.feed
    if kind.startswith("vad-"):
        return _vad_feeds(kind, shapes)
    if kind == "document-page":
        _, _, h, w = shapes["x"]
        return Feeds([{"x": paddle_normalize(resize_bilinear(document_page(seed=2), h, w))[None]}], chunks=1)
    if kind == "text-line":
        _, _, h, w = shapes["x"]
        crops = [text_line("2024 0815 7736", 40, seed=3), text_line("HELP 42 UP", 32, seed=4)]
        return Feeds([{"x": text_line_input(c, h, w)} for c in crops], chunks=len(crops))
    if kind == "layout-page":
        page = document_page(1100, 850, seed=5, figures=True)
        return Feeds([{"image": imagenet_normalize(resize_bilinear(page, 800, 608))[None]}], chunks=1)
    if kind == "photo-crop":
        page = document_page(640, 480, seed=6, figures=True)
        pages = [page, np.rot90(page).copy()]                 # upright, and turned a quarter
        return Feeds([{"x": orientation_input(p)} for p in pages], chunks=len(pages))
    if kind == "log-mel":
        clips = [speech_like(seconds * 16000, seed=seed) for seed, seconds in ((7, 3), (8, 6), (9, 10))]
        return Feeds([{"input_features": whisper_log_mel(c)} for c in clips], chunks=len(clips))
    if kind == "file-bytes":
        files = [REPO / "runtime" / "session.py", REPO / "pyproject.toml", REPO / "README.md"]
        return Feeds([{"bytes": magika_features(f.read_bytes())} for f in files], chunks=len(files))
    if kind in ("photo", "audio", "thai-chars", "t5-encoder", "t5-decoder"):  # the second wave's kinds
        return Feeds([feeds_at(model, shapes, seed=k) for k in range(2)], chunks=2)
    raise ValueError(f"model {model.name}: unknown feed kind {kind!r}")


# -- comparison --------------------------------------------------------------------------------

@dataclass
class Comparison:
    """Both engines over every step: the largest absolute error, the largest relative error (over
    reference elements of magnitude >= 1e-3), and a line per output that is not within tolerance."""

    chunks: int = 0
    rtol: float = RTOL
    atol: float = ATOL
    max_abs: float = 0.0
    max_rel: float = 0.0
    mismatches: list[str] = field(default_factory=list)

    def add(self, where: str, got: np.ndarray, want: np.ndarray) -> None:
        if got.shape != want.shape or got.dtype != want.dtype:
            self.mismatches.append(f"{where}: {got.dtype}{list(got.shape)} vs onnxruntime's "
                                   f"{want.dtype}{list(want.shape)}")
            return
        if not np.isfinite(got).all():
            self.mismatches.append(f"{where}: non-finite values")
            return
        err = np.abs(got.astype(np.float64) - want.astype(np.float64))
        big = np.abs(want) >= 1e-3
        self.max_abs = max(self.max_abs, float(err.max(initial=0.0)))
        self.max_rel = max(self.max_rel, float((err[big] / np.abs(want[big])).max(initial=0.0)))
        bad = err > self.atol + self.rtol * np.abs(want.astype(np.float64))
        if bad.any():
            self.mismatches.append(f"{where}: {int(bad.sum())} of {bad.size} elements off "
                                   f"(max abs error {float(err.max()):.3g})")


def _ort_session(path: Path) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _bound_feeds(session: Any, binds: Mapping[str, int]) -> dict[str, np.ndarray]:
    """The ``--bind`` values as onnxruntime's feeds, in each input's declared element type."""
    types = {i.name: i.type for i in session.get_inputs()}
    dtype = {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(float)": np.float32}
    return {k: np.array(v, dtype[types[k]]) for k, v in binds.items()}


def compare(model: ModelSpec, onnx_path: Path, artifact: Path) -> Comparison:
    """Run the artifact and onnxruntime (on the model file as shipped) over ``model``'s realistic
    input, each carrying its own state between steps; compare every output at every step."""
    from runtime import Session

    feeds = feeds_for(model)
    ours = Session(artifact)
    ort = _ort_session(onnx_path)
    binds = _bound_feeds(ort, model.bind_options)
    out_names = [o.name for o in ort.get_outputs()]
    our_state = dict(feeds.state)
    ort_state = dict(feeds.state)
    rtol, atol = model.tolerance
    result = Comparison(chunks=feeds.chunks, rtol=rtol, atol=atol)
    for k, step in enumerate(feeds.steps):
        want = dict(zip(out_names, ort.run(None, {**step, **ort_state, **binds}), strict=True))
        got = dict(zip([s.name for s in ours.outputs], ours.run(None, {**step, **our_state}), strict=True))
        for name in out_names:
            result.add(f"step {k} output {name!r}", got[name], want[name])
        for out, inp in feeds.carry.items():
            our_state[inp] = got[out]
            ort_state[inp] = want[out]
    return result


class CompileCache:
    """Each model compiled at most once (its failure remembered and raised again)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.done: dict[str, Path | Exception] = {}

    def artifact(self, model: ModelSpec, onnx_path: Path) -> Path:
        if model.name not in self.done:
            from compiler import compile_model

            try:
                self.done[model.name] = compile_model(onnx_path, self.root / model.name,
                                                      shapes=model.shape_options or None,
                                                      binds=model.bind_options or None, golden_cases=0)
            except Exception as exc:  # remembered: a second test of the model fails the same way
                self.done[model.name] = exc
        done = self.done[model.name]
        if isinstance(done, Exception):
            raise done
        return done


def survey(models: Iterable[ModelSpec], paths: Mapping[str, Path]) -> bool:
    """Compile each model and compare it with onnxruntime; print a table; True when all match."""
    rows = [("model", "compiles", "compile s", "steps", "max abs err", "max rel err", "result")]
    ok = True
    with tempfile.TemporaryDirectory(prefix="onnx-aot-survey-") as tmp:
        cache = CompileCache(Path(tmp))
        for model in models:
            start = time.perf_counter()
            try:
                artifact = cache.artifact(model, paths[model.name])
            except Exception as exc:
                message = " ".join(str(exc).split())
                rows.append((model.name, "no", f"{time.perf_counter() - start:.1f}", "", "", "",
                             f"{type(exc).__name__}: {message[:160]}"))
                ok = False
                continue
            seconds = f"{time.perf_counter() - start:.1f}"
            result = compare(model, paths[model.name], artifact)
            own = model.tolerance != (RTOL, ATOL)
            within = f" (atol {result.atol:g}, rtol {result.rtol:g})" if own else ""
            verdict = f"matches{within}" if not result.mismatches else f"MISMATCH {result.mismatches[0]}"
            ok = ok and not result.mismatches
            rows.append((model.name, "yes", seconds, str(result.chunks), f"{result.max_abs:.2e}",
                         f"{result.max_rel:.2e}", verdict))
            print(f"  {model.name}: {verdict}", flush=True)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1])
    return ok
