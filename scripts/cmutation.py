"""Mutation testing of a C accelerator: scripts/mutation.sh's runner for the .c modules (mutmut
mutates Python only).

Usage (mutation.sh calls it; by hand from a work copy of the tree):
    python scripts/cmutation.py --work DIR --file src/zcnet/rx/zc/_c/chunks.c \
        --tests "tests/rx/test_zc_api.py ..." [--sample N] [--seed S] [--only NAME ...] \
        [--equivalent scripts/mutation-equivalent.txt] [--timeout SECONDS]

One textual mutation at a time, in code only (comments, strings and preprocessor lines are left
alone): a comparison turned (< <=, > >=, == !=), a logical operator swapped (&& ||), a binary
+ or - swapped, a condition negated (if (c) -> if (!(c))), a returned 0/1 or
Py_RETURN_TRUE/FALSE swapped. Each mutant is built in place in DIR (setup.py build_ext
--inplace: only the extension whose source changed is rebuilt), then the tests run against it
with the compiled path on (-x: the first failure kills it). A mutant that does not compile is
not counted; one whose tests crash the interpreter or run past the timeout is killed. The
source is restored after each mutant. Prints one line per mutant and the score, and the
survivors with their change; exits non-zero when no mutant could be scored (nothing built or
every build failed), as mutation.sh does for a module that yields no score.

Mutant names: c:<file>:<line>:<col>:<op>, for the equivalents list (NAME  reason).
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

#: (name, regex on code with comments and literals blanked, replacement)
OPERATORS: list[tuple[str, str, str]] = [
    ("le->lt", r"<=", "<"),
    ("ge->gt", r">=", ">"),
    ("lt->le", r"(?<![<-])<(?![<=])", "<="),
    ("gt->ge", r"(?<![>-])>(?![>=])", ">="),
    ("eq->ne", r"==", "!="),
    ("ne->eq", r"!=", "=="),
    ("and->or", r"&&", "||"),
    ("or->and", r"\|\|", "&&"),
    ("add->sub", r"(?<=\w|\)) \+ (?=[\w(])", " - "),
    ("sub->add", r"(?<=\w|\)) - (?=[\w(])", " + "),
    ("ret0->1", r"\breturn 0;", "return 1;"),
    ("ret1->0", r"\breturn 1;", "return 0;"),
    ("true->false", r"\bPy_RETURN_TRUE\b", "Py_RETURN_FALSE"),
    ("false->true", r"\bPy_RETURN_FALSE\b", "Py_RETURN_TRUE"),
]


@dataclass
class Mutant:
    name: str
    line: int  # 0-based
    old: str
    new: str


def blank(src: str) -> list[str]:
    """The source's lines with comments, string and char literals and preprocessor lines
    replaced by spaces (same lengths), so operators are found in code only."""
    out = []
    i, n = 0, len(src)
    chars = list(src)
    while i < n:
        c = src[i]
        if src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            for k in range(i, j):
                if chars[k] != "\n":
                    chars[k] = " "
            i = j
        elif src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            for k in range(i, j):
                chars[k] = " "
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == "\\" else 1
            for k in range(i + 1, min(j, n)):
                if chars[k] != "\n":
                    chars[k] = " "
            i = j + 1
        else:
            i += 1
    for line in "".join(chars).split("\n"):
        out.append(" " * len(line) if line.lstrip().startswith("#") else line)
    # continuation lines of a macro definition are preprocessor lines too
    raw = src.split("\n")
    for k in range(1, len(raw)):
        if raw[k - 1].rstrip().endswith("\\") and raw[k - 1].lstrip().startswith("#"):
            out[k] = " " * len(out[k])
            raw[k] = "#" + raw[k]  # so a further continuation is seen as one too
    return out


def mutants(path: Path, rel: str) -> list[Mutant]:
    src = path.read_text()
    lines = src.split("\n")
    found: list[Mutant] = []
    for no, code in enumerate(blank(src)):
        line = lines[no]
        for name, rx, repl in OPERATORS:
            for m in re.finditer(rx, code):
                new = line[:m.start()] + repl + line[m.end():]
                found.append(Mutant(f"c:{rel}:{no + 1}:{m.start() + 1}:{name}", no, line, new))
        for m in re.finditer(r"\bif \(", code):  # negate the whole condition on its line
            depth, end = 0, -1
            for k in range(m.end() - 1, len(code)):
                depth += {"(": 1, ")": -1}.get(code[k], 0)
                if depth == 0:
                    end = k
                    break
            if end > 0:
                new = line[:m.end()] + "!(" + line[m.end():end] + ")" + line[end:]
                found.append(Mutant(f"c:{rel}:{no + 1}:{m.start() + 1}:negate-if", no, line,
                                    new))
    return found


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float) -> tuple[str, str]:
    """("ok"|"failed"|"crashed"|"timeout", output tail); the command runs in a process group
    that a timeout kills whole."""
    p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        return "timeout", out[-2000:]
    if p.returncode == 0:
        return "ok", out[-2000:]
    crashed = p.returncode < 0 or "Fatal Python error" in out or "Segmentation fault" in out
    return ("crashed" if crashed else "failed"), out[-2000:]


def built_at(source: Path) -> float:
    """When the extension module built from ``source`` was written: the one in the nearest
    directory above it that holds one (next to it, or its package's for a ``_c/`` source)."""
    for d in source.parents:
        times = [so.stat().st_mtime for so in d.glob("*.so")]
        if times:
            return max(times)
    return 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, required=True, help="a copy of the tree, built")
    ap.add_argument("--file", required=True, help="the C file, relative to --work")
    ap.add_argument("--tests", required=True, help="test files (space separated)")
    ap.add_argument("--sample", type=int, default=0, help="this many mutants at random (0: all)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", nargs="*", default=[], help="mutant names to run")
    ap.add_argument("--equivalent", type=Path, help="NAME  reason lines, not counted")
    ap.add_argument("--timeout", type=float, default=300)
    a = ap.parse_args()

    work, path = a.work.resolve(), (a.work / a.file).resolve()
    original = path.read_text()
    every = mutants(path, a.file)
    chosen = [m for m in every if m.name in set(a.only)] if a.only else every
    if a.sample and a.sample < len(chosen):
        chosen = random.Random(a.seed).sample(chosen, a.sample)
        chosen.sort(key=lambda m: (m.line, m.name))
    equivalent = {}
    if a.equivalent and a.equivalent.exists():
        for ln in a.equivalent.read_text().splitlines():
            if ln.strip() and not ln.startswith("#"):
                name, _, why = ln.strip().partition(" ")
                equivalent[name] = why.strip()
    env = {**os.environ, "PYTHONPATH": str(work / "src"), "ZCNET_PURE": "0"}
    build = [sys.executable, "setup.py", "-q", "build_ext", "--inplace"]
    tests = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
             *a.tests.split()]
    print(f"== {a.file}: {len(chosen)} of {len(every)} mutants, tests: {a.tests}", flush=True)
    status: dict[str, str] = {}
    lines = original.split("\n")
    try:
        for m in chosen:
            mutated = lines.copy()
            mutated[m.line] = m.new
            path.write_text("\n".join(mutated))
            t0 = time.monotonic()
            before = built_at(path)
            built, out = run(build, work, env, a.timeout)
            # The extensions are optional: a failed build leaves the old module and says so
            # only in its output. A module not rebuilt would test the unmutated code.
            if built != "ok" or "error:" in out or built_at(path) == before:
                st = "uncompilable"
            else:
                got, out = run(tests, work, env, a.timeout)
                st = {"ok": "survived", "failed": "killed", "crashed": "killed (crash)",
                      "timeout": "killed (timeout)"}[got]
            status[m.name] = st
            print(f"  {st:17} {m.name}  ({time.monotonic() - t0:.0f} s)", flush=True)
    finally:
        path.write_text(original)
        run(build, work, env, a.timeout)
    killed = sum(st.startswith("killed") for st in status.values())
    survived = [n for n, st in status.items() if st == "survived"]
    excused = [n for n in survived if n in equivalent]
    counted = killed + len(survived) - len(excused)
    if not counted:
        print(f"score {a.file}: none (no mutant built and ran; see the lines above)")
        return 1
    print(f"score {a.file} {100.0 * killed / counted:.1f} % without {len(excused)} equivalent "
          f"({killed} killed of {counted}; "
          f"{sum(st == 'uncompilable' for st in status.values())} did not compile)")
    by_name = {m.name: m for m in chosen}
    for n in survived:
        if n not in equivalent:
            m = by_name[n]
            print(f"  survived: {n}\n    - {m.old.strip()}\n    + {m.new.strip()}")
    for n, st in status.items():
        if n in equivalent and st != "survived":
            print(f"  listed as equivalent but {st}: {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
