"""Canonical op forms: each ONNX node rewritten once into the form docs/ops.md describes.

Opset differences (attribute vs input, defaults, negative axes, auto_pad) are resolved here and
nowhere else. A canonicalizer is registered per op type (``registry.register``) and returns the
IR nodes that stand for the ONNX node (usually one); ops without one keep their ONNX attributes.
The op families below register their canonicalizers when imported: ``FAMILIES`` lists them all,
and a test fails when a module of this package is neither listed nor part of the machinery.
"""

from __future__ import annotations

from compiler.frontend.canonical import conv
from compiler.frontend.canonical import elementwise
from compiler.frontend.canonical import index
from compiler.frontend.canonical import math_ops
from compiler.frontend.canonical import movement
from compiler.frontend.canonical import norm_loss
from compiler.frontend.canonical import qoperator
from compiler.frontend.canonical import quantize
from compiler.frontend.canonical import quantize_lstm
from compiler.frontend.canonical import quantize_ms
from compiler.frontend.canonical import recurrent
from compiler.frontend.canonical import reduce
from compiler.frontend.canonical import sampling
from compiler.frontend.canonical import spatial
from compiler.frontend.canonical import spectral
from compiler.frontend.canonical import transformer
from compiler.frontend.canonical.context import CanonContext
from compiler.frontend.canonical.context import np_dtype_of
from compiler.frontend.canonical.context import onnx_attrs
from compiler.frontend.canonical.registry import COMPILE_TIME_INPUTS
from compiler.frontend.canonical.registry import canonical_op_types
from compiler.frontend.canonical.registry import canonicalize

__all__ = ["COMPILE_TIME_INPUTS", "FAMILIES", "CanonContext", "canonical_op_types", "canonicalize",
           "np_dtype_of", "onnx_attrs"]

# The op-family modules, each registering the canonical forms of one family of ONNX ops.
FAMILIES = (elementwise, conv, movement, reduce, math_ops, norm_loss, index, spatial, transformer,
            recurrent, quantize, quantize_ms, quantize_lstm, qoperator, sampling, spectral)
