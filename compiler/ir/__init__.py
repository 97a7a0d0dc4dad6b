"""The IR: Graph, Node, Value with use-def links and a verifier."""

from compiler.ir.graph import AOT_DOMAIN, ONNX_DOMAIN, Graph, Node, Use, Value

__all__ = ["Graph", "Node", "Value", "Use", "ONNX_DOMAIN", "AOT_DOMAIN"]
