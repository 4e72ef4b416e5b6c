"""Find uses of another package's private names in zcnet's sources, from the AST.

A package is a first-level part of zcnet (``zcnet.bench``, ``zcnet.rx`` ...; a top-level module
is a package of its own). A private name starts with one underscore (dunders, ctypes'
``_fields_`` and the headers' ``__NR_*`` are not private).
Three kinds of use are found:

- ``from zcnet.pkg.mod import _name`` (or ``zcnet.pkg.mod._name``) in a module of another package;
- ``module._name`` where ``module`` is a zcnet module of another package imported by name;
- ``obj._name`` (``obj`` not ``self``/``cls``) where ``_name`` is defined (a ``def``, a class
  attribute, or ``self._name = ...``) only in other packages' classes: the object must be one of
  theirs. A name that this package defines too is taken as the package's own.

Static analysis cannot know every object's class; the third rule is a heuristic that errs
towards silence. ``python tests/private_access.py [SRC]`` prints what it finds.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


@dataclass(frozen=True, order=True)
class Use:
    path: str         # relative to the source root
    line: int
    name: str         # the private name
    owner: str        # the package(s) that define it
    how: str          # "import", "module" or "attribute"

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.how} {self.name} of {self.owner}"


def _private(name: str) -> bool:
    """One leading underscore; not a dunder, not a ctypes/enum ``_sunder_`` (``_fields_``: a
    public protocol), not a uapi name spelled as in the headers (``__NR_io_uring_enter``)."""
    if not name.startswith("_") or name.startswith("__NR_"):
        return False
    return not (name.endswith("_") and len(name) > 2)


def package_of(module: str) -> str:
    """``zcnet.rx.zc.area`` -> ``rx``; ``zcnet.netns`` -> ``netns``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _defined_privates(tree: ast.AST) -> set[str]:
    """Private names a module defines as members of its classes (methods, class attributes,
    ``self._x`` assignments)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(
                        item.name):
                    out.add(item.name)
                targets = (item.targets if isinstance(item, ast.Assign)
                           else [item.target] if isinstance(item, ast.AnnAssign) else [])
                out |= {t.id for t in targets if isinstance(t, ast.Name) and _private(t.id)}
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                        and t.value.id in ("self", "cls") and _private(t.attr)):
                    out.add(t.attr)
    return out


def find(root: Path = SRC) -> list[Use]:
    trees = {_module_name(p, root): (p, ast.parse(p.read_text(), str(p)))
             for p in sorted((root / "zcnet").rglob("*.py"))}
    owners: dict[str, set[str]] = defaultdict(set)  # private member name -> packages
    for module, (_, tree) in trees.items():
        for name in _defined_privates(tree):
            owners[name].add(package_of(module))
    uses: list[Use] = []
    for module, (path, tree) in trees.items():
        here = package_of(module)
        rel = str(path.relative_to(root))
        imported: dict[str, str] = {}  # local name -> zcnet module of another package
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and \
                    node.module.startswith("zcnet"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if full in trees and package_of(full) != here:
                        imported[alias.asname or alias.name] = full
                    elif _private(alias.name) and package_of(node.module) != here:
                        uses.append(Use(rel, node.lineno, alias.name,
                                        package_of(node.module), "import"))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("zcnet") and package_of(alias.name) != here:
                        imported[alias.asname or alias.name] = alias.name
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _private(node.attr)):
                continue
            base = node.value
            if isinstance(base, ast.Name) and base.id in imported:
                uses.append(Use(rel, node.lineno, node.attr, package_of(imported[base.id]),
                                "module"))
            elif isinstance(base, ast.Name) and base.id in ("self", "cls"):
                continue
            elif (by := owners.get(node.attr)) and here not in by:
                uses.append(Use(rel, node.lineno, node.attr, ",".join(sorted(by)), "attribute"))
    return sorted(set(uses))


if __name__ == "__main__":
    found = find(Path(sys.argv[1]) if len(sys.argv) > 1 else SRC)
    for use in found:
        print(use)
    by_package: dict[str, int] = defaultdict(int)
    for use in found:
        by_package[use.path.split("/")[1]] += 1
    print(f"{len(found)} uses: " + ", ".join(f"{k} {v}" for k, v in sorted(by_package.items())))
