"""The CUDA execution provider: ``provider`` (claims, renders model.cu, builds cubins + PTX),
``common`` (kernel records), and one module per op family, listed in ``provider.KERNEL_MODULES``."""
