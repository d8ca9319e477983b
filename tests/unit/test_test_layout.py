"""The test suite's own layout rules: a test file imports no other test file (what tests share lives in
tests/*_helpers.py, tests/sidecar.py and the conftest fixtures), so any file runs, and moves, alone."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
LAYERS = ("unit", "contract", "server", "e2e")


def imported_modules(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level:
            names.append("." * node.level + (node.module or ""))
    return names


def test_no_test_file_imports_another_test_file() -> None:
    offending = [
        f"{path.relative_to(TESTS)} imports {module}"
        for path in sorted(TESTS.rglob("*.py"))
        if "node_modules" not in path.parts
        for module in imported_modules(path)
        if module.startswith(".")
        or module.split(".")[0] in LAYERS
        or module.split(".")[-1].startswith("test_")
        or module.split(".")[0] == "conftest"
    ]
    assert not offending, "\n".join(offending)
