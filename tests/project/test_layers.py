"""The package's shape: no import cycles between modules, few imports inside functions.

``lint-imports`` (scripts/test.sh, contracts in pyproject.toml) checks the layers; these tests
say the same of the module graph directly and count what import-linter does not: imports of
zcnet modules made inside functions, which hide cycles from a reader.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import grimp
import pytest

import zcnet

SRC = Path(zcnet.__file__).parent
FUNCTION_IMPORT_LIMIT = 10
# Packages with no function-level import of zcnet modules at all (bench and cli keep a few, each
# with its reason; the whole-package limit below covers them).
CLEAN = ("zcnet.tx", "zcnet.nic", "zcnet.lab", "zcnet.uapi", "zcnet.netns",
         "zcnet.caps", "zcnet.errors", "zcnet.sockcheck", "zcnet.quantities")


def _imports(package: str) -> dict[str, set[str]]:
    """Module -> the modules it imports, as grimp finds them (module level, inside functions
    and under TYPE_CHECKING alike)."""
    graph = grimp.build_graph(package, cache_dir=None)
    return {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)

    for root in sorted(edges):
        if root in index:
            continue
        visit(root)
        work = [(root, iter(sorted(edges[root])))]  # (node, its imports not yet visited)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    visit(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def _module_cycles(package: str = "zcnet") -> list[list[str]]:
    return _cycles(_imports(package))


def _package_cycles(package: str = "zcnet") -> list[list[str]]:
    """Cycles between the package's direct children (``zcnet.bench`` -> ``zcnet.report`` ->
    ``zcnet.bench``), each child standing for everything inside it."""
    def child(module: str) -> str:
        return ".".join(module.split(".")[:2])

    edges: dict[str, set[str]] = {}
    for module, imported in _imports(package).items():
        edges.setdefault(child(module), set()).update(
            child(m) for m in imported if child(m) != child(module))
    return _cycles(edges)


def _function_imports(src: Path = SRC, package: str = "zcnet"
                      ) -> list[tuple[str, int, str, bool]]:
    """(file, line, module, has a reason) for each import of one of the package's modules inside
    a function; the reason is a comment on the import's line or the line above it."""
    found = []
    for path in sorted(src.rglob("*.py")):
        text = path.read_text()
        lines = text.splitlines()
        for fn in ast.walk(ast.parse(text)):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom):
                    names = [("." * node.level) + (node.module or "")]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                else:
                    continue
                for name in names:
                    if name.startswith((package, ".")):
                        around = lines[node.lineno - 2:node.lineno]
                        reason = any(re.search(r"#\s*\S", line) for line in around)
                        found.append((str(path.relative_to(src)), node.lineno, name, reason))
    return found


def _in(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def test_no_cycle_touches_the_clean_packages() -> None:
    bad = [c for c in _module_cycles() if any(_in(m, CLEAN) for m in c)]
    assert not bad, f"import cycles: {bad}"


def test_no_function_level_zcnet_imports_in_the_clean_packages() -> None:
    clean_dirs = tuple(p.removeprefix("zcnet.").replace(".", "/") for p in CLEAN)
    bad = [f for f in _function_imports()
           if f[0].removesuffix(".py").startswith(clean_dirs)]
    assert not bad, f"imports inside functions: {bad}"


def test_no_module_import_cycles() -> None:
    assert _module_cycles() == []


def test_no_package_import_cycles() -> None:
    assert _package_cycles() == []


def test_few_function_level_imports_each_with_a_reason() -> None:
    found = _function_imports()
    assert len(found) <= FUNCTION_IMPORT_LIMIT, (
        f"{len(found)} function-level imports of zcnet modules (limit "
        f"{FUNCTION_IMPORT_LIMIT}): {[f'{f}:{line} {m}' for f, line, m, _ in found]}")
    unexplained = [f"{f}:{line} {m}" for f, line, m, reason in found if not reason]
    assert not unexplained, f"function-level imports without a comment saying why: {unexplained}"


def test_the_checks_can_fail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A two-module cycle through a function-level import is found, and so is the import."""
    pkg = tmp_path / "cyclepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cyclepkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from cyclepkg import a\n    return a\n\n\n"
                              "def g():\n    # the reason\n    from cyclepkg import a\n")
    (pkg / "c.py").write_text("from cyclepkg import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _module_cycles("cyclepkg") == [["cyclepkg.a", "cyclepkg.b"]]
    assert _package_cycles("cyclepkg") == [["cyclepkg.a", "cyclepkg.b"]]
    assert _function_imports(pkg, "cyclepkg") == [("b.py", 2, "cyclepkg", False),
                                                   ("b.py", 8, "cyclepkg", True)]
