"""The server package's import graph, read from the source with ast (nothing is imported): no import circles,
counting imports inside functions too, and the storage backend chosen in one module only."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "server" / "src" / "ragsidecar"
NAME = "ragsidecar"
# The one module that may name both storage backends: it picks one at start-up.
BACKEND_FACTORY = "ragsidecar.store.factory"
BACKENDS = ("ragsidecar.store.embedded", "ragsidecar.store.postgres")
STORE = "ragsidecar.store."


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    """Every module of the package but the generated stubs (ragsidecar.v1)."""
    found = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {name: path for name, path in found.items() if not name.startswith(f"{NAME}.v1")}


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that `name` imports anywhere in its body (functions included); `from a import b`
    counts a.b when that is a module, else a. Imports under `if TYPE_CHECKING:` count too: a circle of types
    is still a circle to whoever reads the code."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, package)
            targets |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names}
    return {_nearest_module(target, known) for target in targets if target.split(".")[0] == NAME} - {"", name}


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
    return f"{base}.{node.module}" if node.module else base


def _nearest_module(target: str, known: set[str]) -> str:
    """`ragsidecar.a.b.Name` -> the longest prefix that is a module of the package."""
    parts = target.split(".")
    while parts and ".".join(parts) not in known:
        parts.pop()
    return ".".join(parts)


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imported(name, path, known) for name, path in found.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str]:
    """One import circle as its modules in order (the first repeated at the end), or [] when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return []

    for start in sorted(edges):
        if start not in state and (cycle := visit(start)):
            return cycle
    return []


def test_the_reader_finds_a_circle_and_a_function_level_import() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []
    edges = graph()
    # cli imports the catalog inside a command's function only: it must still count.
    assert "ragsidecar.knowledge.catalog" in edges["ragsidecar.cli"]


def test_no_module_of_the_server_imports_itself_in_a_circle() -> None:
    cycle = find_cycle(graph())
    assert not cycle, "import circle: " + " -> ".join(cycle)


def test_only_the_backend_factory_names_both_storage_backends() -> None:
    edges = graph()
    both = [name for name, targets in edges.items() if set(BACKENDS) <= targets]
    assert both in ([], [BACKEND_FACTORY]), f"modules that import both backends: {both}"
    # Outside the store, code asks the storage interface, never a backend, which backend is running.
    outside = [name for name, targets in edges.items() if targets & set(BACKENDS) and not name.startswith(STORE)]
    assert not outside, f"modules outside the store that import a backend: {outside}"
