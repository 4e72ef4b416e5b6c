"""Guards on the shape of the code, so what the last refactor cleaned stays clean: counts that
may only fall. When a change lowers a count, lower its limit here in the same commit.

- ``except BaseException`` in src (cleanup belongs in ExitStack/context managers; the few left
  must re-raise after undoing something a context manager cannot reach);
- ``Any`` in src (annotations say what a value is);
- Python modules over 500 lines, C files over 1,000 lines (both by name, current size as cap);
- private names of another package used across packages (tests/private_access.py);
- C that names a private Python attribute (the compiled halves are handed their state once:
  member descriptors, bound callables and state records with public fields);
- modules no test imports, directly or through the package that re-exports them (today's
  exceptions listed, the list only shrinks).
"""

from __future__ import annotations

import ast
import importlib
import re
import types
from pathlib import Path

import pytest

import private_access
from paths import ROOT, TESTS

SRC = ROOT / "src"

MAX_BASE_EXCEPTION = 4
MAX_ANY = 13
MAX_PY_LINES = 500
MAX_C_LINES = 1000
# Over the limit today: each may shrink, none may grow, and no other may join.
BIG_PY = {"zcnet/uring/ring.py": 518}
BIG_C: dict[str, int] = {}
MAX_PRIVATE_ACROSS = 0
# Reached by tests only through the command line (subprocess or cli.main) or as a package's
# own entry point.
CLI_ONLY = {
    "zcnet.__main__", "zcnet.cli._args", "zcnet.cli.lab", "zcnet.cli.nic",
    "zcnet.cli.reproduce", "zcnet.cli.run", "zcnet.cli.server", "zcnet.cli.vm",
    "zcnet.bench.flow_worker", "zcnet.vm.child",
}
# Today's modules that tests reach only through other modules: this list may only shrink (a
# new module needs a test that imports it).
INDIRECT = {
    "zcnet.aio.keep", "zcnet.aio.receiver",
    "zcnet.aio.sockets", "zcnet.aio.wakeup", "zcnet.bench.hist",
    "zcnet.bench.meta",
    "zcnet.bench.metrics", "zcnet.bench.proto.auth", "zcnet.bench.proto.channel",
    "zcnet.bench.proto.schema", "zcnet.bench.stream", "zcnet.bench.tcpinfo", "zcnet.jsonvalue",
    "zcnet.lab.registry", "zcnet.nic.ifname", "zcnet.nic.steps",
    "zcnet.report.labels", "zcnet.report.warning_notes", "zcnet.rx.copying",
    "zcnet.rx.zc.debugviews", "zcnet.rx.zc.soft_inc", "zcnet.tx.mmsg",
    "zcnet.tx.payload", "zcnet.tx.slots", "zcnet.uapi.mman", "zcnet.uapi.sched",
    "zcnet.uapi.tcp", "zcnet.uapi.udp",
    "zcnet.uring.layout", "zcnet.vm.caps", "zcnet.vm.integrity",
}


def _sources(suffixes: tuple[str, ...]) -> list[Path]:
    return sorted(p for p in (SRC / "zcnet").rglob("*") if p.suffix in suffixes
                  and "__pycache__" not in p.parts and "build" not in p.parts)


def _trees() -> dict[Path, ast.Module]:
    return {p: ast.parse(p.read_text(), str(p)) for p in _sources((".py",))}


def base_exception_handlers() -> list[str]:
    out = []
    for path, tree in _trees().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ExceptHandler) and node.type is not None and any(
                    isinstance(n, ast.Name) and n.id == "BaseException"
                    for n in ast.walk(node.type)):
                out.append(f"{path.relative_to(SRC)}:{node.lineno}")
    return out


def any_uses() -> list[str]:
    """``Any`` as a name or ``typing.Any``, outside import statements."""
    out = []
    for path, tree in _trees().items():
        for node in ast.walk(tree):
            if _is_any(node):
                out.append(f"{path.relative_to(SRC)}:{node.lineno}")
    return out


def _is_any(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return "Any" in node.value and _is_annotation_string(node.value)
    return (isinstance(node, ast.Name) and node.id == "Any") or (
        isinstance(node, ast.Attribute) and node.attr == "Any")


def _is_annotation_string(text: str) -> bool:
    try:
        expr = ast.parse(text, mode="eval")
    except SyntaxError:
        return False
    return any(isinstance(n, ast.Name) and n.id == "Any" for n in ast.walk(expr))


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_except_base_exception_count_only_falls() -> None:
    found = base_exception_handlers()
    assert len(found) <= MAX_BASE_EXCEPTION, (
        f"{len(found)} `except BaseException` in src (limit {MAX_BASE_EXCEPTION}): use an "
        "ExitStack or a context manager for cleanup\n" + "\n".join(found))


def test_any_count_only_falls() -> None:
    found = any_uses()
    assert len(found) <= MAX_ANY, (
        f"{len(found)} uses of Any in src (limit {MAX_ANY}): annotate what the value is\n"
        + "\n".join(found))


@pytest.mark.parametrize(("suffixes", "limit", "known"), [
    ((".py",), MAX_PY_LINES, BIG_PY), ((".c", ".h"), MAX_C_LINES, BIG_C)])
def test_no_file_grows_past_its_limit(suffixes: tuple[str, ...], limit: int,
                                      known: dict[str, int]) -> None:
    sizes = {str(p.relative_to(SRC)): _lines(p) for p in _sources(suffixes)}
    over = {name: n for name, n in sizes.items() if n > max(limit, known.get(name, 0))}
    assert not over, f"over {limit} lines (split by what each part holds): {over}"
    gone = {name for name in known if name not in sizes or sizes[name] <= limit}
    assert not gone, f"now within the limit or gone: drop them from the known list: {gone}"


def test_private_names_across_packages_only_fall() -> None:
    found = private_access.find(SRC)
    assert len(found) <= MAX_PRIVATE_ACROSS, (
        f"{len(found)} uses of another package's private names (limit {MAX_PRIVATE_ACROSS}): "
        "use or add a public name\n" + "\n".join(map(str, found)))


# A whole C string literal that is a private Python name (one leading underscore, not a dunder).
_C_PRIVATE_NAME = re.compile(r'"(_[A-Za-z][A-Za-z0-9_]*)"')
_C_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)


def c_private_names(root: Path = SRC) -> list[str]:
    """``file:line: name`` for each string literal in the C sources under ``root`` that names
    a private Python attribute (comments left out, their lines kept)."""
    out = []
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".c", ".h")
                       and "build" not in p.parts):
        text = _C_COMMENT.sub(lambda m: "\n" * m.group().count("\n"), path.read_text())
        for m in _C_PRIVATE_NAME.finditer(text):
            if not m.group(1).endswith("__"):
                line = text.count("\n", 0, m.start()) + 1
                out.append(f"{path.relative_to(root)}:{line}: {m.group(1)}")
    return out


def test_c_names_no_private_python_attribute() -> None:
    found = c_private_names()
    assert not found, (
        "C names a private Python attribute: hand it over once instead (a member descriptor, "
        "a bound callable, or a state record's public field, declared in the stub)\n"
        + "\n".join(found))


def test_the_c_guard_finds_a_private_name(tmp_path: Path) -> None:
    (tmp_path / "x.c").write_text('/* "_in_a_comment" */\nstatic const char *n[] = {"fd",\n'
                                  '    "__dict__", "_rx"};\nPyObject_GetAttrString(o, "_tok");\n')
    (tmp_path / "y.h").write_text('#include "_cqe.h"\n')
    assert c_private_names(tmp_path) == ["x.c:3: _rx", "x.c:4: _tok"]


def _module_names() -> set[str]:
    names = set()
    for p in _sources((".py",)):
        parts = list(p.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names.add(".".join(parts))
    return names


def _imported_by_tests() -> set[str]:
    """The zcnet modules tests import, following a name imported from a package to the module
    that defines it (``from zcnet.rx.zc import Receiver`` reaches zcnet.rx.zc.receiver)."""
    seen: set[str] = set()
    modules = _module_names()
    for path in TESTS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                seen |= {a.name for a in node.names if a.name.startswith("zcnet")}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                    node.module.startswith("zcnet"):
                seen.add(node.module)
                module = importlib.import_module(node.module)
                for alias in node.names:
                    if f"{node.module}.{alias.name}" in modules:  # a submodule, by name
                        seen.add(f"{node.module}.{alias.name}")
                        continue
                    value = getattr(module, alias.name, None)
                    if isinstance(value, types.ModuleType):
                        seen.add(value.__name__)
                    elif (owner := getattr(value, "__module__", None)) and \
                            isinstance(owner, str):
                        seen.add(owner)
    return seen


def test_every_module_is_imported_by_a_test() -> None:
    imported = _imported_by_tests()
    packages = {m.rsplit(".", 1)[0] for m in imported if "." in m}
    untested = sorted(m for m in _module_names() - imported - CLI_ONLY - INDIRECT
                      if m not in packages)
    assert not untested, ("modules no test imports (directly, or a name they define through "
                          "their package): " + ", ".join(untested))
    stale = sorted((CLI_ONLY | INDIRECT) & (imported | packages))
    assert not stale, f"imported by tests now: drop them from the lists here: {stale}"
    gone = sorted((CLI_ONLY | INDIRECT) - _module_names())
    assert not gone, f"no such module any more: drop them from the lists here: {gone}"
