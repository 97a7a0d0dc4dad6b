"""C kernels for onnx_aot.pool_nhwc ops (NHWC layout; see runtime/kernels/nhwc.py)."""
