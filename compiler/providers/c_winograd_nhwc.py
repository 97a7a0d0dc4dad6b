"""C kernels for onnx_aot.winograd_nhwc ops (NHWC layout; see runtime/kernels/nhwc.py)."""
