"""The IR: Graph, Node, Value with use-def links and a verifier."""

from compiler.ir.graph import AOT_DOMAIN
from compiler.ir.graph import ONNX_DOMAIN
from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Use
from compiler.ir.graph import Value

__all__ = ["Graph", "Node", "Value", "Use", "ONNX_DOMAIN", "AOT_DOMAIN"]
