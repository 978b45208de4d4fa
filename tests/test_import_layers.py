"""The package graph points one way: ``engine/`` never imports the data-parallel
package or the entry points, and beam search (``entrypoints/beam_search.py``) drives
the engine without importing ``LLM`` (both used to import each other)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

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


def test_no_import_cycles_at_any_depth():
    """No module of the package reaches itself through its imports (annotations under
    ``TYPE_CHECKING`` aside): so no two packages, at any depth, import each other either."""
    grimp = pytest.importorskip("grimp", reason="grimp comes with import-linter, a dev dependency")
    graph = grimp.build_graph("minivllm", exclude_type_checking_imports=True)
    modules = sorted(graph.modules)
    imports = {m: set(graph.find_modules_directly_imported_by(m)) for m in modules}
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for imported in sorted(imports[module]):
            if state.get(imported) == 1:
                cycles.append(path[path.index(imported) :] + [imported] if imported in path else [module, imported])
            elif imported not in state:
                visit(imported, path + [imported])
        state[module] = 2

    for module in modules:
        if module not in state:
            visit(module, [module])
    assert cycles == []


_NOT_MIXINS = {"ABC", "Protocol", "Generic", "Enum", "IntEnum", "str", "int", "NamedTuple", "TypedDict"}


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Subscript):
        return _base_name(node.value)
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def _is_mixin(cls: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> bool:
    """A class that only lends methods to the classes that inherit it: a plain class with no
    ``__init__``, not a dataclass or an abstract base, whose methods read state (``self.x``)
    that it neither sets nor defines, leaving it for its heirs to provide."""
    if cls.bases:
        return False  # a subclass of something (nn.Module, a base model, an ABC): an is-a
    if any("dataclass" in ast.unparse(d) for d in cls.decorator_list):
        return False
    methods = [n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if any(m.name == "__init__" for m in methods):
        return False
    if any("abstractmethod" in map(ast.unparse, m.decorator_list) for m in methods):
        return False  # an abstract base: its heirs are what it describes
    defined = {m.name for m in methods}
    for base in cls.bases:  # what its own bases define is its own too
        if _base_name(base) in classes and classes[_base_name(base)] is not cls:
            defined |= _defined_names(classes[_base_name(base)])
    defined |= {t.id for n in cls.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    defined |= {
        n.target.id
        for n in cls.body
        if isinstance(n, ast.AnnAssign) and n.value is not None and isinstance(n.target, ast.Name)
    }
    read = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            (defined if isinstance(node.ctx, ast.Store) else read).add(node.attr)
    return bool(read - defined)


def _defined_names(cls: ast.ClassDef) -> set[str]:
    names = {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    names |= {t.id for n in cls.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    for node in ast.walk(cls):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and getattr(node.value, "id", "") == "self"
        ):
            names.add(node.attr)
    return names


def test_no_class_is_spread_over_files_by_mixins():
    """A class lives in one file: it inherits from at most one class besides ABC, Protocol,
    Generic and the like, and never from a mixin (a base that declares state for its heirs)."""
    classes: dict[str, ast.ClassDef] = {}
    trees = {path: ast.parse(path.read_text()) for path in sorted(PACKAGE.rglob("*.py"))}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, node)
    several, mixins = [], []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            names = [_base_name(b) for b in node.bases]
            where = f"{path.relative_to(PACKAGE.parent)}: {node.name}({', '.join(names)})"
            if len([n for n in names if n not in _NOT_MIXINS]) > 1:
                several.append(where)
            if any(n in classes and _is_mixin(classes[n], classes) for n in names):
                mixins.append(where)
    assert several == []
    assert mixins == []
