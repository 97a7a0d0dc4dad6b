"""Reference kernels of the signal ops: DFT, STFT, HannWindow, HammingWindow, BlackmanWindow and
MelWeightMatrix (canonical forms in compiler/frontend/canonical/spectral.py).

Signals are real (last dimension 1) or complex (last dimension 2: real, imaginary); transforms
run through ``xp.fft`` in the signal's precision (complex64, or complex128 for float64) and are
cast to the output type at the end.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from runtime.errors import RuntimeKernelError
from runtime.kernels.common import fill_optional
from runtime.kernels.common import finish
from runtime.kernels.registry import OutputSpec
from runtime.kernels.registry import register

__all__: list[str] = []


def _complex(xp: Any, x: Any) -> Any:
    """(..., 1 or 2) real / interleaved complex values -> a complex array without that axis.

    float64 signals become complex128, narrower ones complex64: transforms run in the signal's
    own precision, as numpy and onnxruntime do.
    """
    dtype = np.complex128 if x.dtype == np.float64 else np.complex64
    z = x[..., 0].astype(dtype)
    if x.shape[-1] == 2:
        z = z + dtype(1j) * x[..., 1].astype(dtype)
    return z


def _interleave(xp: Any, z: Any) -> Any:
    """A complex array -> (..., 2) real, imaginary."""
    return xp.stack([xp.real(z), xp.imag(z)], axis=-1)


def _onesided(xp: Any, z: Any, length: int, axis: int) -> Any:
    return xp.take(z, xp.arange(length // 2 + 1), axis=axis)


@register("DFT")
def dft_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """DFT: input -> its (inverse) discrete Fourier transform along ``axis``, ``length`` points.

    A forward one-sided DFT keeps the first length // 2 + 1 frequencies; an inverse one-sided DFT
    reads those and returns the real signal (last dimension 1).
    """
    signal = _complex(xp, inputs[0])
    axis, length = int(attrs["axis"]), int(attrs["length"])
    if not attrs["inverse"]:
        spectrum = xp.fft.fft(signal, n=length, axis=axis)
        result = _interleave(xp, _onesided(xp, spectrum, length, axis) if attrs["onesided"] else spectrum)
    elif attrs["onesided"]:
        result = xp.fft.irfft(signal, n=length, axis=axis)[..., None]
    else:
        result = _interleave(xp, xp.fft.ifft(signal, n=length, axis=axis))
    return finish(xp, "DFT", [result], outputs)


@register("STFT")
def stft_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
    """STFT: signal (batch, length, 1 or 2), window? -> (batch, frames, bins, 2).

    Frame f covers samples [f * frame_step, f * frame_step + frame_length), weighted by the window.
    """
    signal, window = fill_optional("STFT", inputs, 2)
    signal = _complex(xp, signal)
    step, length = int(attrs["frame_step"]), int(attrs["frame_length"])
    frames = 1 + (int(signal.shape[1]) - length) // step
    index = xp.arange(frames)[:, None] * step + xp.arange(length)[None, :]
    framed = signal[:, index]  # (batch, frames, frame_length)
    if window is not None:
        framed = framed * window.astype(framed.real.dtype)
    spectrum = xp.fft.fft(framed, n=length, axis=-1)
    if attrs["onesided"]:
        spectrum = _onesided(xp, spectrum, length, -1)
    return finish(xp, "STFT", [_interleave(xp, spectrum)], outputs)


# cosine-sum windows: w[n] = sum_k (-1)^k a_k cos(2 pi k n / N)
_WINDOW_COEFFICIENTS = {
    "HannWindow": (0.5, 0.5),
    "HammingWindow": (25.0 / 46.0, 21.0 / 46.0),
    "BlackmanWindow": (0.42, 0.5, 0.08),
}


def _window(kind: str) -> Any:
    coefficients = _WINDOW_COEFFICIENTS[kind]

    def kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any], outputs: list[OutputSpec]) -> list[Any]:
        size = int(attrs["size"])
        period = size if attrs["periodic"] else size - 1
        n = xp.arange(size, dtype=np.float64)
        if period == 0:  # a symmetric window of one point
            return finish(xp, kind, [xp.ones(size)], outputs)
        w = xp.zeros(size)
        for k, a in enumerate(coefficients):
            w = w + (-1) ** k * a * xp.cos(2 * math.pi * k * n / period)
        return finish(xp, kind, [w], outputs)

    kernel.__doc__ = f"{kind}: (no inputs) -> the window of ``size`` points (``periodic`` or symmetric)."
    return kernel


for _kind in _WINDOW_COEFFICIENTS:
    register(_kind)(_window(_kind))


def _mel_edges(attrs: dict[str, Any]) -> np.ndarray:
    """The spectrogram bin of each of num_mel_bins + 2 points evenly spaced on the mel scale."""
    bins = int(attrs["num_mel_bins"])
    low, high = (2595.0 * math.log10(1.0 + float(attrs[k]) / 700.0)
                 for k in ("lower_edge_hertz", "upper_edge_hertz"))
    mels = np.arange(bins + 2) * ((high - low) / (bins + 2)) + low
    hertz = 700.0 * np.expm1(mels / 2595.0 * math.log(10.0))
    return np.floor((int(attrs["dft_length"]) + 1) * hertz / int(attrs["sample_rate"])).astype(np.int64)


@register("MelWeightMatrix")
def mel_weight_matrix_kernel(xp: Any, inputs: list[Any], attrs: dict[str, Any],
                             outputs: list[OutputSpec]) -> list[Any]:
    """MelWeightMatrix: (no inputs) -> (dft_length // 2 + 1, num_mel_bins) triangular filters.

    Filter i rises from edge i to a peak of 1 at edge i + 1 and falls to 0 at edge i + 2 (the
    edges as the ONNX reference computes them).
    """
    edges = _mel_edges(attrs)
    spectrogram_bins = int(attrs["dft_length"]) // 2 + 1
    if edges.min() < 0 or edges.max() >= spectrogram_bins:
        raise RuntimeKernelError(f"MelWeightMatrix: the mel range falls outside the {spectrogram_bins} "
                                 f"spectrogram bins (upper_edge_hertz above sample_rate / 2?)")
    weights = np.zeros((spectrogram_bins, int(attrs["num_mel_bins"])))
    for i in range(weights.shape[1]):
        left, center, right = (int(e) for e in edges[i:i + 3])
        rise = np.arange(left, center + 1)
        weights[rise, i] = (rise - left) / (center - left) if center > left else 1.0
        fall = np.arange(center, right)
        weights[fall, i] = (right - fall) / (right - center)
    return finish(xp, "MelWeightMatrix", [xp.asarray(weights)], outputs)
