"""onnxruntime's ``quantize_static`` with a calibration method, on given feeds (the oracle of --quantize).

QDQ, S8S8, per channel, after the quantizer's recommended ``quant_pre_process`` (BatchNormalization
folded into the Conv, as ``compiler/quantize/prepare.py`` does), calibrated on exactly ``feeds``
with ``method`` (minmax, entropy, percentile; onnxruntime's default parameters for each).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

__all__ = ["ort_quantized"]


def ort_quantized(fp32: Path, out: Path, feeds: list[dict[str, np.ndarray]], method: str) -> Path:
    """onnxruntime's quantize_static (QDQ, S8S8, per channel, quant_pre_process first) on ``feeds``."""
    from onnxruntime.quantization import CalibrationDataReader
    from onnxruntime.quantization import CalibrationMethod
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization import quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.left = list(feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return self.left.pop(0) if self.left else None

    methods = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
               "percentile": CalibrationMethod.Percentile}
    pre = out.with_name(out.stem + ".pre.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quant_pre_process(str(fp32), str(pre), skip_symbolic_shape=True)
        quantize_static(str(pre), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                        calibrate_method=methods[method])
    return out
