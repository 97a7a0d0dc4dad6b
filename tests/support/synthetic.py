"""Synthetic inputs that drive the real models as real data would: scanned pages, printed text
lines, speech-like audio, file bytes; prepared the way the shipping projects prepare real data
(tests/support/real_models.py says which model gets which).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "document_page", "imagenet_normalize", "magika_features",
           "orientation_input", "paddle_normalize", "resize_bilinear", "speech_like", "text_line",
           "text_line_input", "whisper_log_mel"]

IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)


# -- images ------------------------------------------------------------------------------------

def _draw_strokes(page: np.ndarray, starts: np.ndarray, ends: np.ndarray, ink: np.ndarray) -> None:
    """Draw 2-pixel-wide straight strokes (rows of ``starts``/``ends`` are (y, x)) onto ``page``."""
    t = np.linspace(0.0, 1.0, 24)[None, :, None]
    points = np.rint(starts[:, None, :] * (1 - t) + ends[:, None, :] * t).astype(np.int64)
    colours = np.broadcast_to(ink[:, None], points.shape[:2])
    h, w = page.shape[:2]
    for dy, dx in ((0, 0), (0, 1), (1, 0), (1, 1)):
        y = np.clip(points[..., 0] + dy, 0, h - 1)
        x = np.clip(points[..., 1] + dx, 0, w - 1)
        page[y, x] = np.minimum(page[y, x], colours[..., None])


def _text_block(page: np.ndarray, rng: np.random.Generator, top: int, left: int, bottom: int,
                right: int, glyph: int) -> None:
    """Lines of words of stroke glyphs (height ``glyph``) filling the box."""
    starts: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    line = top
    while line + glyph < bottom:
        x = left + int(rng.integers(0, glyph))
        line_end = right - int(rng.integers(0, 6 * glyph)) if rng.random() < 0.3 else right
        while x + glyph < line_end:
            for _ in range(int(rng.integers(2, 9))):          # one word
                width = int(glyph * rng.uniform(0.45, 0.8))
                box = np.array([line, x, line + glyph, x + width], np.float64)
                for _ in range(int(rng.integers(2, 5))):      # one glyph
                    y0, x0, y1, x1 = box
                    a = rng.uniform([y0, x0], [y1, x1])
                    kind = rng.integers(0, 3)
                    b = (np.array([y1 if a[0] - y0 < y1 - a[0] else y0, a[1]]) if kind == 0 else
                         np.array([a[0], x1 if a[1] - x0 < x1 - a[1] else x0]) if kind == 1 else
                         rng.uniform([y0, x0], [y1, x1]))
                    starts.append(a)
                    ends.append(b)
                x += width + max(1, glyph // 6)
                if x + glyph >= line_end:
                    break
            x += glyph // 2                                    # the space between words
        line += int(glyph * rng.uniform(1.5, 1.9))
    if starts:
        ink = rng.integers(15, 70, len(starts)).astype(np.uint8)
        _draw_strokes(page, np.array(starts), np.array(ends), ink)


def _blur(img: np.ndarray) -> np.ndarray:
    """A 3x3 box blur (the softness of a scan or a photo), uint8 in and out."""
    padded = np.pad(img.astype(np.float32), ((1, 1), (1, 1), (0, 0)), mode="edge")
    h, w = img.shape[:2]
    acc = sum(padded[dy:dy + h, dx:dx + w] for dy in range(3) for dx in range(3))
    return np.clip(np.rint(acc / 9.0), 0, 255).astype(np.uint8)


def _paper(height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    tint = np.array([250, 248, 243], np.float32)
    noise = rng.normal(0.0, 3.0, (height, width, 1))
    return np.clip(tint + noise, 0, 255).astype(np.uint8)


def document_page(height: int = 960, width: int = 720, seed: int = 0, *, figures: bool = False) -> np.ndarray:
    """A synthetic scanned page, HxWx3 uint8 RGB: a title, text blocks and (with ``figures``) a
    ruled table and a shaded figure."""
    rng = np.random.default_rng(seed)
    page = _paper(height, width, rng)
    margin = width // 12
    _text_block(page, rng, margin, margin, margin + height // 14, width - margin, glyph=height // 32)
    top = margin + height // 10
    if figures:
        fig_bottom = top + height // 4
        ramp = np.linspace(60, 200, width // 2 - margin, dtype=np.float32)
        page[top:fig_bottom, margin:width // 2] = np.clip(
            ramp[None, :, None] + rng.normal(0, 8, (fig_bottom - top, 1, 3)), 0, 255).astype(np.uint8)
        _text_block(page, rng, top, width // 2 + margin // 2, fig_bottom, width - margin, glyph=height // 60)
        table_top = fig_bottom + height // 20
        table_bottom = table_top + height // 5
        page[table_top:table_bottom:height // 40, margin:width - margin] = 40
        page[table_top:table_bottom, margin:width - margin:width // 6] = 40
        top = table_bottom + height // 20
    _text_block(page, rng, top, margin, height - margin, width - margin, glyph=height // 60)
    return _blur(page)


# seven-segment glyphs: segments a (top), b, c (right, top to bottom), d (bottom), e, f (left,
# bottom to top) and g (middle) of each character
_SEGMENTS = {"0": "abcdef", "1": "bc", "2": "abged", "3": "abgcd", "4": "fgbc", "5": "afgcd", "6": "afgedc",
             "7": "abc", "8": "abcdefg", "9": "abcdfg", "E": "afged", "H": "fbgec", "L": "fed", "P": "abfge",
             "U": "fedcb"}


Point = tuple[float, float]


def _segment_ends(top: float, left: float, height: float, width: float) -> dict[str, tuple[Point, Point]]:
    mid, bottom, right = top + height / 2, top + height, left + width
    return {"a": ((top, left), (top, right)), "b": ((top, right), (mid, right)),
            "c": ((mid, right), (bottom, right)), "d": ((bottom, left), (bottom, right)),
            "e": ((mid, left), (bottom, left)), "f": ((top, left), (mid, left)),
            "g": ((mid, left), (mid, right))}


def text_line(text: str, height: int = 40, seed: int = 0) -> np.ndarray:
    """A tight crop of one printed line (what a detector's box hands a recognizer), HxWx3 uint8:
    ``text`` of digits, spaces and the letters E H L P U drawn as seven-segment strokes, which
    PP-OCR's recognizer reads as characters."""
    rng = np.random.default_rng(seed)
    glyph_h = int(height * 0.6)
    glyph_w = glyph_h // 2
    pitch = glyph_w + glyph_w // 2 + 2
    crop = _paper(height, len(text) * pitch + 10, rng)
    starts: list[Point] = []
    ends: list[Point] = []
    for k, char in enumerate(text):
        segments = _segment_ends((height - glyph_h) // 2, 5 + k * pitch, glyph_h, glyph_w)
        for name in _SEGMENTS.get(char, ""):
            starts.append(segments[name][0])
            ends.append(segments[name][1])
    _draw_strokes(crop, np.array(starts), np.array(ends), rng.integers(15, 50, len(starts)).astype(np.uint8))
    return _blur(crop)


def resize_bilinear(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear resize with half-pixel centres (OpenCV's INTER_LINEAR), HxWxC -> float32."""
    src = img.astype(np.float32)

    def axis(n_out: int, n_in: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        pos = np.clip((np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5, 0, n_in - 1)
        lo = np.floor(pos).astype(np.int64)
        return lo, np.minimum(lo + 1, n_in - 1), (pos - lo).astype(np.float32)

    y0, y1, fy = axis(height, img.shape[0])
    x0, x1, fx = axis(width, img.shape[1])
    top = src[y0][:, x0] * (1 - fx)[None, :, None] + src[y0][:, x1] * fx[None, :, None]
    bottom = src[y1][:, x0] * (1 - fx)[None, :, None] + src[y1][:, x1] * fx[None, :, None]
    return top * (1 - fy)[:, None, None] + bottom * fy[:, None, None]


def paddle_normalize(img: np.ndarray) -> np.ndarray:
    """HxWx3 (0..255) -> 3xHxW float32, (x/255 - 0.5) / 0.5 as PaddleOCR's det/rec/cls do."""
    return ((img.astype(np.float32) / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)


def imagenet_normalize(img: np.ndarray) -> np.ndarray:
    """HxWx3 (0..255) -> 3xHxW float32 with ImageNet's mean/std (PaddleDetection, PaddleClas)."""
    return ((img.astype(np.float32) / 255.0 - IMAGENET_MEAN) / IMAGENET_STD).transpose(2, 0, 1)


def text_line_input(crop: np.ndarray, height: int, width: int) -> np.ndarray:
    """PaddleOCR's rec/cls input: resize to ``height`` keeping the ratio (at most ``width``),
    normalize, zero-pad on the right; 1x3xHxW."""
    resized_w = min(width, math.ceil(height * crop.shape[1] / crop.shape[0]))
    out = np.zeros((1, 3, height, width), np.float32)
    out[0, :, :, :resized_w] = paddle_normalize(resize_bilinear(crop, height, resized_w))
    return out


def orientation_input(page: np.ndarray, size: int = 224) -> np.ndarray:
    """PaddleClas's input: short side to 256, centre crop ``size``, ImageNet normalization."""
    scale = 256 / min(page.shape[:2])
    h, w = round(page.shape[0] * scale), round(page.shape[1] * scale)
    resized = resize_bilinear(page, h, w)
    top, left = (h - size) // 2, (w - size) // 2
    return imagenet_normalize(resized[top:top + size, left:left + size])[None]


# -- audio and bytes ---------------------------------------------------------------------------

def speech_like(n_samples: int, seed: int = 0, rate: int = 16000) -> np.ndarray:
    """A speech-like float32 signal in [-1, 1]: a quarter second of room noise, then syllables
    (harmonics of a gliding 100-220 Hz pitch shaped by two formants, with breath noise) separated
    by short pauses, ending in noise again."""
    rng = np.random.default_rng(seed)
    t = np.arange(n_samples) / rate
    envelope = np.zeros(n_samples)
    start = int(0.25 * rate)
    while start < n_samples - int(0.2 * rate):
        length = int(rate * rng.uniform(0.12, 0.25))
        stop = min(start + length, n_samples)
        envelope[start:stop] = np.sin(np.linspace(0, np.pi, stop - start)) ** 0.7
        start = stop + int(rate * rng.uniform(0.03, 0.12))
    f0 = 150 + 45 * np.sin(2 * np.pi * 1.3 * t + rng.uniform(0, np.pi)) + 5 * np.sin(2 * np.pi * 5.5 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    formants = rng.uniform([450, 1300], [800, 2200])
    voiced = np.zeros(n_samples)
    for k in range(1, 31):
        freq = k * f0
        gain = sum(np.exp(-((freq - f) / 180.0) ** 2) for f in formants) + 0.3 / k
        voiced += np.where(freq < rate / 2, gain, 0.0) * np.sin(k * phase)
    breath = np.convolve(rng.normal(0, 1, n_samples), np.ones(4) / 4, mode="same")
    signal = envelope * (voiced / np.abs(voiced).max() + 0.08 * breath) + rng.normal(0, 0.004, n_samples)
    return np.clip(0.6 * signal / np.abs(signal).max(), -1.0, 1.0).astype(np.float32)


def _slaney_mel(hz: float | np.ndarray) -> np.ndarray:
    """Hertz -> mel on the Slaney scale (linear to 1 kHz, logarithmic above)."""
    hz = np.asarray(hz, np.float64)
    log_part = 15.0 + np.log(np.maximum(hz, 1e-9) / 1000.0) * 27.0 / np.log(6.4)
    return np.where(hz < 1000.0, 3.0 * hz / 200.0, log_part)


def _slaney_hz(mel: np.ndarray) -> np.ndarray:
    return np.where(mel < 15.0, 200.0 * mel / 3.0, 1000.0 * np.exp((mel - 15.0) * np.log(6.4) / 27.0))


def whisper_log_mel(audio: np.ndarray, seconds: int = 8, rate: int = 16000, n_fft: int = 400, hop: int = 160,
                    n_mels: int = 80) -> np.ndarray:
    """Whisper's input features for ``audio`` (left-padded with silence to ``seconds``, the way
    Pipecat's Smart Turn keeps the last 8 s): the waveform normalized to zero mean and unit
    variance, a centred periodic-Hann STFT (reflect padding), the power spectrum through an
    area-normalized Slaney mel filterbank, log10 floored 8 decades below the peak, scaled
    (x + 4) / 4; 1 x n_mels x (seconds * rate / hop) float32."""
    n = seconds * rate
    x = np.pad(audio.astype(np.float32), (max(0, n - audio.size), 0))[-n:]
    x = (x - x.mean()) / np.sqrt(x.var() + 1e-7)
    padded = np.pad(x.astype(np.float64), n_fft // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, n_fft)[::hop]
    power = np.abs(np.fft.rfft(frames * np.hanning(n_fft + 1)[:-1], axis=-1)) ** 2   # frames x bins
    edges = _slaney_hz(np.linspace(_slaney_mel(0.0), _slaney_mel(rate / 2), n_mels + 2))
    bins = np.linspace(0, rate // 2, n_fft // 2 + 1)
    rise = (bins[:, None] - edges[None, :-2]) / np.diff(edges)[None, :-1]
    fall = (edges[None, 2:] - bins[:, None]) / np.diff(edges)[None, 1:]
    filters = np.maximum(0.0, np.minimum(rise, fall)) * (2.0 / (edges[2:] - edges[:-2]))[None, :]
    log_spec = np.log10(np.maximum(power @ filters, 1e-10)).T[:, :-1]
    log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).astype(np.float32)[None]


def magika_features(data: bytes, size: int = 1024, block: int = 4096, padding: int = 256) -> np.ndarray:
    """Magika's v3 features: the first and last ``size`` bytes of the whitespace-stripped ends of
    the content, padded with ``padding``; 1x(2*size) int32."""
    beg = list(data[:block].lstrip()[:size])
    tail = data[-block:].rstrip()
    end = list(tail[-size:]) if tail else []
    row = beg + [padding] * (size - len(beg)) + [padding] * (size - len(end)) + end
    return np.array([row], np.int32)
