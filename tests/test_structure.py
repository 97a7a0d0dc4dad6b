"""Structure gates (issue 14): no import cycles across compiler/, runtime/, scripts/ and tests/; no
function in compiler/ or runtime/ longer than 80 lines; runtime/ never imports the compiler side.

Imports are read from the source text (every ``import`` statement anywhere in a file: module
level, inside functions, under ``TYPE_CHECKING``; relative imports resolved), not by importing.
``from P import x`` depends on ``P`` (its ``__init__`` runs and must already hold ``x``) and, where
``P.x`` is a module, on ``P.x`` too; ``import P.x`` and ``from P.x import y`` depend on ``P.x``.

The two lists of known offenders below can only shrink: a test fails when an entry is no longer
needed, so whoever removes a cycle or splits a function also removes its entry.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import networkx as nx

REPO = Path(__file__).resolve().parent.parent
IMPORT_ROOTS = ("compiler", "runtime", "scripts", "tests")
LENGTH_ROOTS = ("compiler", "runtime")
MAX_FUNCTION_LINES = 80

# Import cycles still to remove, each as the set of modules of one strongly connected component
# (a component that shrinks stays covered by its entry; one that disappears fails below).
KNOWN_CYCLES: list[frozenset[str]] = [
]

# Functions longer than MAX_FUNCTION_LINES still to split: "path::qualified.name".
KNOWN_LONG_FUNCTIONS: set[str] = set()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for root in IMPORT_ROOTS for p in sorted((REPO / root).rglob("*.py"))}


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


def import_graph() -> nx.DiGraph:
    """The module graph of compiler/, runtime/, scripts/ and tests/ (edges: importer -> imported)."""
    modules = _modules()
    graph = nx.DiGraph()
    for name, path in modules.items():
        graph.add_node(name)
        for target in _imported(name, path, modules):
            if target in modules and target != name:
                graph.add_edge(name, target)
    return graph


def test_import_graph_sees_nested_and_relative_imports() -> None:
    graph = import_graph()
    # compiler.backend imports compiler.driver inside a function; runtime/__init__ uses both forms.
    assert graph.has_edge("runtime", "runtime.session")
    assert any(target.startswith("compiler.") for target in graph.successors("compiler.cli"))


def test_no_import_cycles() -> None:
    graph = import_graph()
    components = [frozenset(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    new = []
    for component in components:
        if not any(component <= known for known in KNOWN_CYCLES):
            cycle = nx.find_cycle(graph.subgraph(component))
            new.append(" -> ".join([a for a, _ in cycle] + [cycle[0][0]])
                       + f" (one cycle of {len(component)} modules: {', '.join(sorted(component))})")
    stale = [sorted(known) for known in KNOWN_CYCLES if not any(c <= known for c in components)]
    assert not new, "import cycles:\n" + "\n".join(new)
    assert not stale, f"no longer cycles, remove from KNOWN_CYCLES: {stale}"


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


def test_no_function_longer_than_80_lines() -> None:
    found = long_functions()
    new = [f"{key} ({lines} lines)" for key, lines in sorted(found.items())
           if key not in KNOWN_LONG_FUNCTIONS]
    stale = sorted(KNOWN_LONG_FUNCTIONS - set(found))
    assert not new, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(new)
    assert not stale, f"no longer too long (or gone), remove from KNOWN_LONG_FUNCTIONS: {stale}"


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
