"""The C execution provider: ``provider`` (claims, renders model.c, builds model.so), ``common``
(kernel records), and one module per op family, listed in ``provider.KERNEL_MODULES``."""
