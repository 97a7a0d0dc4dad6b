"""C kernels for onnx_aot.conv_nhwc ops (NHWC layout; see runtime/kernels/nhwc.py)."""
