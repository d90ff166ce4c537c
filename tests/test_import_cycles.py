"""No import cycle among a backend's modules (function-level imports included: a cycle
hidden in a function still ties the modules into one)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path, package: str) -> set[str]:
    """The sibling modules ``path`` imports, at any depth of its code."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                names = [node.module] if node.module else [a.name for a in node.names]
            elif node.module and node.module.startswith(package + "."):
                names = [node.module[len(package) + 1:]]
            else:
                continue
            found.update(n.split(".")[0] for n in names)
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> list[str]:
        state[m] = 1
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n):] + [n] if n in path else [m, n]
            if n not in state:
                found = visit(n, path + [n])
                if found:
                    return found
        state[m] = 2
        return []

    for m in sorted(graph):
        if m not in state:
            found = visit(m, [m])
            if found:
                return found
    return []


@pytest.mark.parametrize("backend", ["torch", "jax", "tvm"])
def test_no_import_cycle_among_a_backends_modules(backend):
    folder = ROOT / "backends" / backend
    modules = {p.stem: p for p in folder.glob("*.py") if p.stem != "__init__"}
    graph = {m: _imports(p, f"metaspmd.backends.{backend}") & set(modules) for m, p in modules.items()}
    assert _cycle(graph) == []


def test_the_cycle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
