"""onnx-aot's test suite (a package, so tests and scripts import shared code by its full name:
``tests.support.zoo``, ``scripts.conformance``; pytest puts the repository root on ``sys.path``)."""
