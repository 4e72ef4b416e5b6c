"""Use after close: every object with a close() raises ClosedError from every public method
afterwards (a few documented read-outs still work), and close() is idempotent. Each case runs in
a child process (tests/closed_cases.py), so an interpreter crash fails its test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import zcnet
from closed_cases import CASES
from paths import TESTS

SRC = str(Path(zcnet.__file__).resolve().parents[1])
HERE = str(TESTS)


def _params() -> list[object]:
    return [pytest.param(name, marks=[pytest.mark.root] if case.root else [], id=name)
            for name, case in CASES.items()]


@pytest.mark.parametrize("name", _params())
def test_every_method_after_close(name: str) -> None:
    case = CASES[name]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((SRC, HERE))}
    proc = subprocess.run([sys.executable, os.path.join(HERE, "closed_cases.py"), name],
                          capture_output=True, text=True, env=env, timeout=120)
    if proc.returncode < 0:
        pytest.fail(f"{name}: the interpreter died of {signal.Signals(-proc.returncode).name}"
                    f"\n{proc.stderr[-2000:]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got.pop(f"{case.close} (again)") == "ok", "close() must be idempotent"
    if name != "dmabuf-binding":  # a binding is only held, then closed
        assert got, f"{name}: no public method found to call"
    want = {m: "ok" if m in case.allowed else "closed" for m in got}
    assert got == want
    assert set(case.allowed) <= set(got), "an allowed method no longer exists"
