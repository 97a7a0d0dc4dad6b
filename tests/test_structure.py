"""Structure gates (issues 14 and 30): no import cycles across compiler/, runtime/, scripts/ and
tests/; no function in compiler/ or runtime/ longer than 60 lines; runtime/ never imports the
compiler side; no branch on whether a graph has symbols outside the memory-policy module and the
frontend (compiler/memory_policy.py picks the policy once; code that reads the ranges is fine).

Imports are read from the source text (every ``import`` statement anywhere in a file: module
level, inside functions, under ``TYPE_CHECKING``; relative imports resolved), not by importing.
``from P import x`` depends on ``P`` (its ``__init__`` runs and must already hold ``x``) and, where
``P.x`` is a module, on ``P.x`` too; ``import P.x`` and ``from P.x import y`` depend on ``P.x``.

Both lists of known offenders that the refactor worked through are empty now: a cycle or a long
function fails the suite.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import networkx as nx

REPO = Path(__file__).resolve().parent.parent
IMPORT_ROOTS = ("compiler", "runtime", "scripts", "tests")
LENGTH_ROOTS = ("compiler", "runtime")
MAX_FUNCTION_LINES = 60



def _module_name(path: Path, top: Path) -> str:
    parts = list(path.relative_to(top).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(top: Path, roots: tuple[str, ...]) -> dict[str, Path]:
    return {_module_name(p, top): p for root in roots for p in sorted((top / root).rglob("*.py"))}


def _imported(name: str, path: Path, modules: dict[str, Path]) -> Iterator[str]:
    """Every module of ``modules`` that an import statement in ``path`` (module ``name``) names."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            yield source
            yield from (f"{source}.{alias.name}" for alias in node.names
                        if f"{source}.{alias.name}" in modules)


def import_graph(top: Path = REPO, roots: tuple[str, ...] = IMPORT_ROOTS) -> nx.DiGraph:
    """The module graph of the packages ``roots`` under ``top`` (edges: importer -> imported)."""
    modules = _modules(top, roots)
    graph = nx.DiGraph()
    for name, path in modules.items():
        graph.add_node(name)
        for target in _imported(name, path, modules):
            if target in modules and target != name:
                graph.add_edge(name, target)
    return graph


def import_cycles(graph: nx.DiGraph) -> list[str]:
    """One cycle of each strongly connected component of ``graph``, as ``a -> b -> a``."""
    found = []
    for component in nx.strongly_connected_components(graph):
        if len(component) > 1:
            cycle = nx.find_cycle(graph.subgraph(component))
            found.append(" -> ".join([a for a, _ in cycle] + [cycle[0][0]])
                         + f" (one cycle of {len(component)} modules: {', '.join(sorted(component))})")
    return sorted(found)


def test_import_graph_sees_nested_relative_and_type_checking_imports(tmp_path: Path) -> None:
    """Each kind of import statement alone closes a cycle the walk must report."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from pkg import b\n")  # inside a function
    (pkg / "b.py").write_text("from . import a\n")  # relative
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.d\n")
    (pkg / "d.py").write_text("from pkg.c import x\n")
    graph = import_graph(tmp_path, ("pkg",))
    assert graph.has_edge("pkg.a", "pkg.b") and graph.has_edge("pkg.b", "pkg.a")
    assert graph.has_edge("pkg.c", "pkg.d") and graph.has_edge("pkg.d", "pkg.c")
    cycles = import_cycles(graph)
    assert len(cycles) == 2 and all("pkg." in c for c in cycles), cycles


def test_no_import_cycles() -> None:
    cycles = import_cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.AST]]:
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + child.name, child
            yield from _functions(child, f"{prefix}{child.name}.")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, f"{prefix}{child.name}.")
        else:
            yield from _functions(child, prefix)


def long_functions() -> dict[str, int]:
    """``path::qualified.name`` -> lines from the ``def`` line to the last, over the limit."""
    found = {}
    for root in LENGTH_ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for qualname, node in _functions(tree):
                assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    found[f"{path.relative_to(REPO).as_posix()}::{qualname}"] = lines
    return found


def test_no_function_longer_than_60_lines() -> None:
    found = [f"{key} ({lines} lines)" for key, lines in sorted(long_functions().items())]
    assert not found, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(found)


def test_runtime_imports_nothing_from_the_compiler_side() -> None:
    # The import-blocking run in test_runtime_api covers one path through the runtime; this
    # covers every import statement in runtime/, including the lazy ones.
    banned = {"compiler", "onnx", "onnxruntime", "networkx", "jinja2"}
    offenders = []
    for path in sorted((REPO / "runtime").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            offenders += [f"{path.relative_to(REPO)}:{node.lineno}: {n}" for n in names
                          if n.split(".")[0] in banned]
    assert not offenders, "\n".join(offenders)


SYMBOLS_DECIDED_IN = ("compiler/memory_policy.py", "compiler/frontend/")


def _is_graph_symbols(node: ast.AST) -> bool:
    """``graph.symbols`` or ``<x>.graph.symbols`` (``len(...)`` of either too)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("len", "bool"):
        return len(node.args) == 1 and _is_graph_symbols(node.args[0])
    if not (isinstance(node, ast.Attribute) and node.attr == "symbols"):
        return False
    owner = node.value
    return (isinstance(owner, ast.Name) and owner.id.endswith("graph")) or (
        isinstance(owner, ast.Attribute) and owner.attr == "graph")


def symbols_branches(source: str) -> list[int]:
    """Lines where whether a graph has symbols is tested: ``if`` / ``while`` / ``assert`` / a
    conditional expression / ``and`` / ``or`` / ``not`` / a comprehension's ``if`` over it."""
    tests: list[ast.AST] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)):
            tests.append(node.test)
        elif isinstance(node, ast.BoolOp):
            tests.extend(node.values)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            tests.append(node.operand)
        elif isinstance(node, ast.comprehension):
            tests.extend(node.ifs)
        elif isinstance(node, ast.Compare) and _is_graph_symbols(node.left):
            tests.append(node.left)
    return sorted({t.lineno for t in tests if _is_graph_symbols(t)})


def test_the_symbols_branch_finder() -> None:
    source = ("if graph.symbols:\n    pass\n"  # 1
              "x = a if not node.graph.symbols else b\n"  # 3
              "ranges = graph.symbols\n"  # reading the ranges: fine
              "y = len(body.graph.symbols) > 0\n"  # 5
              "z = plan.symbols or {}\n")  # a plan's, not a graph's
    assert symbols_branches(source) == [1, 3, 5]


def test_no_branch_on_graph_symbols_outside_the_memory_policy() -> None:
    offenders = []
    for root in LENGTH_ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel.startswith(SYMBOLS_DECIDED_IN):
                continue
            offenders += [f"{rel}:{line}" for line in symbols_branches(path.read_text(encoding="utf-8"))]
    assert not offenders, "decide static / symbolic in compiler/memory_policy.py:\n" + "\n".join(offenders)
