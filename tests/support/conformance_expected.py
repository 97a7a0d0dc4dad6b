"""Node test cases onnx-aot is known to fail, each with its reason.

scripts/conformance.py and tests/test_conformance.py classify a failing case listed here as an
expected failure instead of an error. Keep each reason one line; remove an entry once it passes.
"""

from __future__ import annotations

__all__ = ["EXPECTED_FAILURES"]

_RANDOM = ("Dropout in training mode draws a random mask; the case's outputs come from one "
           "numpy generator stream, which no other implementation reproduces")

# (issue 15) AffineGrid's expanded function gets its sizes out of an If, inlined now; its Range then
# takes a 1-element limit (ONNX wants a scalar; the reference evaluator and onnxruntime accept it),
# and the import infers a node's output shape (onnx's Range inference gives none) before folding it.
_FOLD_RANGE = ("Range with a 1-element limit (out of an inlined If): onnx infers no shape for it, and the "
               "import needs one before it folds the node")

# tests/test_sequences.py compares this case's outputs itself (they equal the reference)
_ZERO_D_IN_SEQUENCE = ("onnx's runner cannot compare a sequence holding a 0-d tensor (len() of a 0-d array "
                       "in assert_similar_outputs), whatever the backend returns")

EXPECTED_FAILURES: dict[str, str] = {
    **{f"test_affine_grid_{case}_expanded": _FOLD_RANGE for case in ("2d", "2d_align_corners", "3d",
                                                                     "3d_align_corners")},
    "test_loop16_seq_none": _ZERO_D_IN_SEQUENCE,
    "test_training_dropout": _RANDOM,
    "test_training_dropout_default": _RANDOM,
    "test_training_dropout_default_mask": _RANDOM,
    "test_training_dropout_mask": _RANDOM,
}
