"""zcnet.bench.cbuild: the benchmarks' C baselines are built with the system compiler, and a
machine without one gets a note instead of a failure."""

from __future__ import annotations

import subprocess

import pytest

from zcnet.bench import cbuild


def test_builds_a_program_that_runs(tmp_path) -> None:
    exe, note = cbuild.compile_c('#include <stdio.h>\nint main(void){puts("ok");return 0;}\n',
                                 str(tmp_path), "hello", "C baseline")
    if exe is None and note.startswith("no C compiler"):
        pytest.skip(note)
    assert exe is not None and note.startswith("C baseline: ") and note.endswith(" -O2")
    assert subprocess.run([exe], capture_output=True, text=True).stdout == "ok\n"


def test_no_compiler_is_a_note(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(cbuild.shutil, "which", lambda name: None)
    assert cbuild.compile_c("int main(void){return 0;}", str(tmp_path), "x", "c-pair") == (
        None, "no C compiler (cc/gcc/clang) found: c-pair skipped")


def test_a_compile_error_is_a_note(tmp_path) -> None:
    exe, note = cbuild.compile_c("this is not C", str(tmp_path), "bad", "C baseline")
    if note.startswith("no C compiler"):
        pytest.skip(note)
    assert exe is None and note.startswith("C baseline failed to compile, skipped: ")
