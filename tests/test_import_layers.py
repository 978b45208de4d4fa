"""The package graph points one way: ``engine/`` never imports the data-parallel
package or the entry points, and beam search (``entrypoints/beam_search.py``) drives
the engine without importing ``LLM`` (both used to import each other)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "minivllm"


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (inside functions and TYPE_CHECKING too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _importers(files: list[Path], forbidden: str) -> list[str]:
    return [
        f"{path.relative_to(PACKAGE.parent)} imports {name}"
        for path in files
        for name in sorted(_imports(path))
        if name == forbidden or name.startswith(forbidden + ".")
    ]


def test_engine_imports_neither_data_parallel_nor_the_entry_points():
    files = sorted((PACKAGE / "engine").glob("*.py"))
    assert _importers(files, "minivllm.data_parallel") == []
    assert _importers(files, "minivllm.entrypoints") == []


def test_data_parallel_only_imports_downward():
    files = sorted((PACKAGE / "data_parallel").glob("*.py"))
    for upper in ("minivllm.entrypoints", "minivllm.serve"):
        assert _importers(files, upper) == []


def test_beam_search_does_not_import_llm():
    assert _importers([PACKAGE / "entrypoints" / "beam_search.py"], "minivllm.entrypoints.llm") == []
