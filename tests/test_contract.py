"""The contract module (runtime/contract.py): op names only through its constants, an op table that
covers every op the kernels know, and Graph.verify checking our ops' attributes against it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from compiler.ir.graph import Graph
from compiler.ir.graph import Node
from compiler.ir.graph import Value
from compiler.providers.c.provider import KERNELS as C_KERNELS
from compiler.providers.cuda.provider import KERNELS as CUDA_KERNELS
from runtime import contract
from runtime.errors import InternalError
from runtime.kernels import supported_kinds

ROOT = Path(__file__).resolve().parents[1]
PREFIX = f"{contract.AOT_DOMAIN}."
F32 = np.dtype(np.float32)


def _names_the_domain(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "AOT_DOMAIN") or (
        isinstance(node, ast.Constant) and node.value == contract.AOT_DOMAIN)


def _dotted(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(".")


def _op_literals(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string constant starting with the domain's prefix (plain literals,
    docstrings and each literal part of an f-string: ``f"onnx_aot.{x}"`` included), of the domain
    itself spelled as a literal, and of an op name put together from the domain
    (``f"{AOT_DOMAIN}.X"``, ``AOT_DOMAIN + ".X"``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                node.value.startswith(PREFIX) or node.value == contract.AOT_DOMAIN):
            found.append((node.lineno, node.value))
        elif isinstance(node, ast.JoinedStr) and any(
                isinstance(v, ast.FormattedValue) and _names_the_domain(v.value) and _dotted(after)
                for v, after in zip(node.values, node.values[1:], strict=False)):
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and _names_the_domain(node.left):
            found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def test_the_literal_finder_sees_plain_and_f_strings() -> None:
    source = 'A = "onnx_aot.Copy"\nB = f"onnx_aot.{k}: bad"\nC = f"{k} onnx_aot.X"\nD = "x onnx_aot.Y"\n'
    assert _op_literals(source) == [(1, "onnx_aot.Copy"), (2, "onnx_aot.")]


def test_the_literal_finder_sees_the_domain_and_names_made_from_it() -> None:
    source = ('A = "onnx_aot"\nB = f"{AOT_DOMAIN}.Copy"\nC = AOT_DOMAIN + ".Copy"\n'
              'D = node.domain == AOT_DOMAIN\nE = f"not in the {AOT_DOMAIN} domain"\n')
    assert _op_literals(source) == [(1, "onnx_aot"), (2, "f'{AOT_DOMAIN}.Copy'"), (3, "AOT_DOMAIN + '.Copy'")]


def test_no_op_name_literals_outside_the_contract() -> None:
    offenders = []
    for folder in ("compiler", "runtime"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == ROOT / "runtime" / "contract.py":
                continue
            for line, text in _op_literals(path.read_text()):
                offenders.append(f"{path.relative_to(ROOT)}:{line}: {text[:40]!r}")
    assert not offenders, "name ops through runtime/contract.py's constants:\n" + "\n".join(offenders)


def _op_type_literals(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, text) of every string constant that is exactly one of ``names`` (an op_type of ours),
    outside ``__all__`` (where a class may share an op's name)."""
    tree = ast.parse(source)
    exported = {id(node) for stmt in tree.body if isinstance(stmt, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "__all__" for t in stmt.targets)
                for node in ast.walk(stmt.value)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and node.value in names and id(node) not in exported]


def test_the_op_type_finder_sees_bare_names_outside_all() -> None:
    source = '__all__ = ["Copy"]\nA = Node("Copy", [])\nB = "Copy this"\nC = {"LRN": "LRNNhwc"}\n'
    assert _op_type_literals(source, {"Copy", "LRNNhwc"}) == [(2, "Copy"), (4, "LRNNhwc")]


def test_no_op_type_literals_outside_the_contract() -> None:
    """A node of ours is made with ``op_name(KIND)``, not its op_type spelled again (If / Loop / Scan
    share their op_type with the ONNX op they come from, so they are not ours to look for)."""
    ours = {op.name for op in contract.OPS.values() if not onnx.defs.has(op.name)}
    assert {"Copy", "FusedConv", "LRNNhwc"} <= ours and "If" not in ours
    offenders = []
    for folder in ("compiler", "runtime"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == ROOT / "runtime" / "contract.py":
                continue
            for line, text in _op_type_literals(path.read_text(), ours):
                offenders.append(f"{path.relative_to(ROOT)}:{line}: {text!r}")
    assert not offenders, "make our nodes with runtime.contract.op_name(KIND):\n" + "\n".join(offenders)


def test_every_op_the_kernels_and_providers_know_is_in_the_table() -> None:
    known = set(supported_kinds()) | C_KERNELS.kinds() | CUDA_KERNELS.kinds() | {contract.TRANSFER}
    ours = {kind for kind in known if kind.startswith(PREFIX)}
    assert ours, "no onnx_aot op found: the scan is broken"
    assert ours <= set(contract.OPS), sorted(ours - set(contract.OPS))
    # and every op of the table runs on the reference kernels (Transfer: the reference provider's)
    assert set(contract.OPS) - {contract.TRANSFER} <= set(supported_kinds())


def test_table_entries_are_consistent() -> None:
    for kind, op in contract.OPS.items():
        assert op.kind == kind and contract.op_name(kind) == op.name
        assert op.inputs and all(name.rstrip("?.") for name in op.inputs), kind
    assert contract.FUSED_CONV == "onnx_aot.FusedConv" and contract.CONTROL_KINDS == (
        contract.IF, contract.LOOP, contract.SCAN)
    assert contract.OPS[contract.FUSED_GEMM].attrs["activation"] == ""
    assert contract.OPS[contract.MULTI_HEAD_ATTENTION].required == ("scale",)


def test_plan_format_names() -> None:
    assert contract.placeholder(3) == "_b3"
    assert contract.placeholder_index("_b12") == 12
    assert [contract.placeholder_index(n) for n in ("_b", "_bx", "b3", "W")] == [None] * 4
    assert [contract.round_up(n, 64) for n in (0, 1, 64, 65)] == [0, 64, 64, 128]
    assert contract.round_up(np.array([0, 1, 64, 65]), 64).tolist() == [0, 64, 64, 128]


def _graph_with(attrs: dict[str, object]) -> Graph:
    graph = Graph()
    q, k, v = (graph.add_input(Value(name, F32, (1, 4, 2, 8))) for name in "qkv")
    y = Value("y", F32, (1, 4, 2, 8))
    graph.add_node(Node("MultiHeadAttention", [q, k, v], [y], attrs, name="mha", domain=contract.AOT_DOMAIN))
    graph.add_output(y)
    return graph


def test_verify_accepts_the_table_s_attributes() -> None:
    _graph_with({"scale": 0.5}).verify()


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"scale": 0.5, "heads": 2}, "node 'mha' (MultiHeadAttention): unknown attribute 'heads'"),
        ({}, "node 'mha' (MultiHeadAttention): missing attribute 'scale'"),
    ],
)
def test_verify_rejects_attributes_off_the_table(attrs: dict[str, object], message: str) -> None:
    with pytest.raises(InternalError, match="IR verification failed") as info:
        _graph_with(attrs).verify()
    assert message in str(info.value)


def test_verify_rejects_an_op_not_in_the_table() -> None:
    graph = Graph()
    x = graph.add_input(Value("x", F32, (2,)))
    y = Value("y", F32, (2,))
    graph.add_node(Node("Frobnicate", [x], [y], name="f", domain=contract.AOT_DOMAIN))
    graph.add_output(y)
    with pytest.raises(InternalError, match="'onnx_aot.Frobnicate' is not an op of the 'onnx_aot' domain"):
        graph.verify()


def test_the_contract_loads_without_the_compiler() -> None:
    code = "import sys, runtime.contract, runtime.plan_symbols; assert 'compiler' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
